//! Named volumes inside a sandbox (issue #32 §1): each one a btrfs
//! subvolume on the hub's quota volume, bound at the path its mount names.
//!
//! ```text
//! stage 1 (hub's host ids)   VolumeBind::open: the quota root, then
//!                            openat2(BENEATH|NO_SYMLINKS|NO_XDEV) of
//!                            volumes/<tenant dir>/<name>; must be a subvolume root
//! PID 1, before pivot_root   detach(): a detached clone of each, with
//!                            nosuid,nodev (and rdonly when read-only)
//! PID 1, after /workspace    attach(): the mount point made (or found) by a
//!                            walk from / that follows no link, then move_mount
//! sandboxd, on reset         clone_below(/workspace), then attach(): the volumes below
//!                            /workspace go with the old overlay, so they are
//!                            cloned first and attached again on the new one
//! ```
//!
//! Nothing here resolves a path a workload wrote while following links:
//! the volume's own path is the hub's (hex and DNS-label names under 0700
//! directories), and a mount point below `/workspace` (which a workload
//! writes, and a resumed or forked sandbox brings back) is reached one
//! component at a time with `RESOLVE_NO_SYMLINKS`, so a planted link
//! cannot move a volume over another path, even inside the sandbox.
//! Workloads cannot mount (seccomp), so a read-only volume stays so.

use std::{
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use rustix::{
    fs::{self as rfs, Mode, OFlags, ResolveFlags},
    mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags},
};
use serde::{Deserialize, Serialize};

use super::{
    error::annotate,
    sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY},
};

/// btrfs gives every subvolume's root this inode number.
const SUBVOLUME_ROOT_INO: u64 = 256;

/// One volume a sandbox mounts, as the runtime gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeBind {
    /// The quota volume's root on the host.
    pub root: PathBuf,
    /// The volume below it (`volumes/<tenant dir>/<name>`).
    pub rel: String,
    /// Where it appears inside: absolute and normalized (checked by
    /// `validate::volume_mounts` before it gets here).
    pub path: String,
    pub read_only: bool,
}

/// A volume's directory, opened by stage 1.
pub(crate) struct OpenVolume {
    fd: OwnedFd,
    path: String,
    read_only: bool,
}

impl VolumeBind {
    /// Opens the volume's root as `O_PATH` without following any link or
    /// crossing any mount below the quota root, and checks it is a
    /// subvolume's root (not a directory a workload made in one).
    pub(crate) fn open(&self) -> io::Result<OpenVolume> {
        let root = rfs::open(
            &self.root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| annotate(format!("opening {}", self.root.display()), e.into()))?;
        let fd = rfs::openat2(
            &root,
            &self.rel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::BENEATH
                | ResolveFlags::NO_SYMLINKS
                | ResolveFlags::NO_MAGICLINKS
                | ResolveFlags::NO_XDEV,
        )
        .map_err(|e| annotate(format!("opening volume {}", self.rel), e.into()))?;
        if rfs::fstat(&fd)?.st_ino != SUBVOLUME_ROOT_INO {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("volume {} is not a subvolume", self.rel),
            ));
        }
        Ok(OpenVolume {
            fd,
            path: self.path.clone(),
            read_only: self.read_only,
        })
    }
}

/// A volume cloned off the host's mount table, waiting to be attached.
pub(crate) struct DetachedVolume {
    tree: OwnedFd,
    path: String,
}

impl OpenVolume {
    /// A detached clone of the volume with its flags set. Must run before
    /// the host's root is detached: only a mount of the caller's own
    /// namespace can be cloned.
    pub(crate) fn detach(&self) -> io::Result<DetachedVolume> {
        let tree = open_tree(
            &self.fd,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_EMPTY_PATH,
        )
        .map_err(|e| annotate(format!("open_tree for volume at {}", self.path), e.into()))?;
        let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        if self.read_only {
            attrs |= MOUNT_ATTR_RDONLY;
        }
        sys::mount_setattr(tree.as_fd(), c"", true, false, attrs)
            .map_err(|e| annotate(format!("mount_setattr on volume at {}", self.path), e))?;
        Ok(DetachedVolume {
            tree,
            path: self.path.clone(),
        })
    }
}

impl DetachedVolume {
    /// Attaches the volume at its path in the sandbox's root (the cwd's
    /// `/` once pivoted), making missing directories on the way.
    pub(crate) fn attach(&self) -> io::Result<()> {
        let target = mount_point(&self.path, true)?;
        move_mount(
            self.tree.as_fd(),
            "",
            &target,
            "",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(|e| annotate(format!("mounting a volume at {}", self.path), e.into()))
    }
}

/// The directory at `path` (absolute, normalized), reached from `/` one
/// component at a time without following links; with `make`, a missing
/// component is made (0755). A file or a link where a directory belongs
/// is an error.
fn mount_point(path: &str, make: bool) -> io::Result<OwnedFd> {
    let mut dir = rfs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        dir = match step(dir.as_fd(), name) {
            Err(e) if make && e.kind() == io::ErrorKind::NotFound => {
                match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => {
                        return Err(annotate(
                            format!("making the mount point {path} (at {name:?})"),
                            e.into(),
                        ))
                    }
                }
                step(dir.as_fd(), name)
            }
            other => other,
        }
        .map_err(|e| annotate(format!("reaching the mount point {path} (at {name:?})"), e))?;
    }
    Ok(dir)
}

fn step(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(rfs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// The mounts strictly below `root` (the workspace), from
/// `/proc/self/mountinfo`: only volumes are mounted there (workloads
/// cannot mount).
fn mounted_below(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out: Vec<PathBuf> = super::quota::plan::mount_points(&mountinfo)
        .filter(|p| p != root && p.starts_with(root))
        .collect();
    out.dedup();
    Ok(out)
}

/// Before the workspace's overlay (at `workspace`) is detached: a clone
/// of every volume mounted below it, to attach again with [`DetachedVolume::attach`] on
/// the new one. A mount point a workload has since made unreachable
/// without a link (a parent renamed and replaced) is left out.
pub(crate) fn clone_below(workspace: &Path) -> io::Result<Vec<DetachedVolume>> {
    let mut out = Vec::new();
    for p in mounted_below(workspace)? {
        let Some(path) = p.to_str() else { continue };
        let Ok(at) = mount_point(path, false) else {
            tracing::warn!(
                path,
                "a volume's mount point moved; not mounted again after the reset"
            );
            continue;
        };
        let tree = open_tree(
            &at,
            "",
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_EMPTY_PATH,
        )
        .map_err(|e| annotate(format!("open_tree for the volume at {path}"), e.into()))?;
        out.push(DetachedVolume {
            tree,
            path: path.to_string(),
        });
    }
    Ok(out)
}
