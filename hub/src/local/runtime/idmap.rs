//! Which host uids and gids a sandbox's ids map to.
//!
//! As root every sandbox maps ids 0..65536 inside to one fixed, unprivileged
//! host range starting at [`HOST_ID_BASE`]. The range is shared by all
//! sandboxes rather than allocated per sandbox because files cross
//! sandboxes: a template's seed layer, a snapshot of one sandbox's upper
//! layer that becomes another's lower layer (fork), a state dir reused by a
//! resume. Per-sandbox ranges would need every such layer re-chowned or
//! idmapped on each launch. Sandboxes still cannot reach each other: each
//! has its own PID, mount, IPC and network namespace, so there is nothing of
//! another sandbox to name.
//!
//! Without root only the caller's own uid and gid can be mapped (to 0).

use std::{io, os::unix::fs::MetadataExt, path::Path};

use serde::{Deserialize, Serialize};

/// First host uid/gid of the sandbox id range as root. Chosen far above
/// the ranges `useradd` hands out in `/etc/subuid` (100000..600100000 by
/// default), so rootless containers of host users never share ids with
/// sandboxes, and below 2^31 so no tool mistakes it for a negative id.
pub const HOST_ID_BASE: u32 = 1_000_000_000;

/// Ids mapped per sandbox as root: the classic 16-bit range.
pub const ID_RANGE: u32 = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdMap {
    /// `0..count` inside is `base..base+count` on the host (needs root).
    Range { base: u32, count: u32 },
    /// Only 0 inside, which is the caller's own uid/gid (rootless).
    Single { uid: u32, gid: u32 },
}

impl IdMap {
    /// The range as root, the own ids otherwise.
    pub fn for_current_user() -> Self {
        let (uid, gid) = super::sys::effective_ids();
        if uid == 0 {
            IdMap::Range {
                base: HOST_ID_BASE,
                count: ID_RANGE,
            }
        } else {
            IdMap::Single { uid, gid }
        }
    }

    /// The host uid and gid of root inside the sandbox.
    pub fn host_root(&self) -> (u32, u32) {
        match *self {
            IdMap::Range { base, .. } => (base, base),
            IdMap::Single { uid, gid } => (uid, gid),
        }
    }

    /// Whether the sandbox may call setgroups(2). A single-id map must deny
    /// it: otherwise an unprivileged mapper could drop a group that was
    /// denying it access.
    pub fn allows_setgroups(&self) -> bool {
        matches!(self, IdMap::Range { .. })
    }

    /// Group of `/dev/pts/*` inside (the conventional `tty` gid 5), when
    /// it is mapped.
    pub fn tty_gid(&self) -> Option<u32> {
        match self {
            IdMap::Range { count, .. } if *count > 5 => Some(5),
            _ => None,
        }
    }

    /// Writes `/proc/<pid>/{uid_map,setgroups,gid_map}` for a process that
    /// just unshared its user namespace.
    pub fn write(&self, pid: i32) -> io::Result<()> {
        let (uid_line, gid_line) = match *self {
            IdMap::Range { base, count } => {
                (format!("0 {base} {count}\n"), format!("0 {base} {count}\n"))
            }
            IdMap::Single { uid, gid } => (format!("0 {uid} 1\n"), format!("0 {gid} 1\n")),
        };
        write_proc(pid, "uid_map", &uid_line)?;
        if !self.allows_setgroups() {
            write_proc(pid, "setgroups", "deny\n")?;
        }
        write_proc(pid, "gid_map", &gid_line)
    }

    /// The host id a file owned by `id` outside should get so that it is
    /// owned by `id` inside, if that is representable.
    fn shifted(&self, id: u32) -> Option<u32> {
        match *self {
            IdMap::Range { base, count } if id < count => Some(base + id),
            _ => None,
        }
    }

    /// The host owner an image file owned by `uid:gid` gets: the same
    /// ids inside the sandbox when mapped, else the overflow id 65534
    /// (`nobody`) inside, so no image id can ever name a host id outside
    /// the range. Rootless, everything belongs to the one mapped id.
    pub fn image_owner(&self, uid: u64, gid: u64) -> (u32, u32) {
        match *self {
            IdMap::Range { base, count } => {
                let shift = |id: u64| {
                    base + u32::try_from(id)
                        .ok()
                        .filter(|i| *i < count)
                        .unwrap_or(65_534.min(count - 1))
                };
                (shift(uid), shift(gid))
            }
            IdMap::Single { uid, gid } => (uid, gid),
        }
    }

    /// Chowns everything under `dir` (not following symlinks) from host
    /// ids `0..65536` into the sandbox range, so a layer prepared by host
    /// root is owned by root inside the sandbox instead of `nobody`
    /// (unmapped owners show up as 65534 and cannot be written to, even by
    /// root inside). Ids already in the range are left alone, so this is
    /// idempotent. Rootless, files already belong to the one mapped id.
    pub fn shift_tree(&self, dir: &Path) -> io::Result<()> {
        if matches!(self, IdMap::Single { .. }) {
            return Ok(());
        }
        self.shift_one(dir)?;
        let meta = std::fs::symlink_metadata(dir)?;
        if !meta.is_dir() {
            return Ok(());
        }
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if std::fs::symlink_metadata(&path)?.is_dir() {
                self.shift_tree(&path)?;
            } else {
                self.shift_one(&path)?;
            }
        }
        Ok(())
    }

    fn shift_one(&self, path: &Path) -> io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        let uid = self.shifted(meta.uid());
        let gid = self.shifted(meta.gid());
        if uid.is_none() && gid.is_none() {
            return Ok(());
        }
        // chown clears setuid/setgid bits on files; put them back.
        let mode = meta.mode() & 0o7777;
        std::os::unix::fs::lchown(path, uid, gid)?;
        if !meta.file_type().is_symlink() && mode & 0o6000 != 0 {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(())
    }
}

fn write_proc(pid: i32, file: &str, content: &str) -> io::Result<()> {
    let path = format!("/proc/{pid}/{file}");
    // One write(2): the kernel accepts a map only in a single write.
    std::fs::write(&path, content).map_err(|e| super::error::annotate(format!("writing {path}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_shifts_low_ids_only() {
        let m = IdMap::Range {
            base: HOST_ID_BASE,
            count: ID_RANGE,
        };
        assert_eq!(m.shifted(0), Some(HOST_ID_BASE));
        assert_eq!(m.shifted(1000), Some(HOST_ID_BASE + 1000));
        assert_eq!(m.shifted(HOST_ID_BASE), None);
        assert_eq!(m.host_root(), (HOST_ID_BASE, HOST_ID_BASE));
        assert_eq!(m.tty_gid(), Some(5));
        let single = IdMap::Single {
            uid: 1000,
            gid: 1000,
        };
        assert_eq!(single.shifted(0), None);
        assert!(!single.allows_setgroups());
        assert_eq!(single.tty_gid(), None);
    }
}
