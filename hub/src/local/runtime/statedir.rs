//! A sandbox's state directory on the host, and the only ways the hub (as
//! root) touches what is inside it.
//!
//! ```text
//! <state_dir>/                 hub only (0700)
//! <state_dir>/rootfs/          mount point of the sandbox's root (empty on the host)
//! <state_dir>/sock/            hub only (0700): sandboxd's rest.sock, grpc.sock
//! <state_dir>/sandbox.log      stderr of the sandbox's init and sandboxd
//! <state_dir>/overlay/         the sandbox's root owns it: /.sandhub/overlay inside
//! <state_dir>/overlay/upper/   the workspace's writes
//! <state_dir>/overlay/work/    overlayfs scratch
//! ```
//!
//! Everything under `overlay/` can be renamed, replaced or turned into a
//! symlink by the workload at any moment. So the hub never resolves a path
//! there by name: each directory is opened from its parent's fd with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`,
//! checked with `fstat`, and changed through the fd (`fchown`). The
//! sockets live in `sock/`, which the sandbox cannot see at all (its
//! sandboxd gets the listening sockets as inherited fds), so connecting to
//! them cannot be redirected.

use std::{
    io,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::fs::DirBuilderExt,
    },
    path::{Path, PathBuf},
};

use rustix::{
    fs::{self as rfs, FileType, Mode, OFlags, ResolveFlags},
    io::Errno,
};

use super::idmap::IdMap;

/// How every per-sandbox path is resolved: no symlink (not even in the
/// middle), no `..` above the starting fd, no mount crossing.
const CONFINED: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Binds `rest.sock` and `grpc.sock` in `dir` (the hub-only `sock/`),
/// replacing stale ones from an earlier run of the sandbox. The hub binds
/// them as host root, so the sandbox's mapped root does not own them, and
/// hands them to stage 1 (inherited down to sandboxd as fds).
pub(super) fn bind_listeners(dir: &Path) -> io::Result<sandboxd::server::UnixListeners> {
    let bind = |name: &str| {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::os::unix::net::UnixListener::bind(&path)
    };
    Ok(sandboxd::server::UnixListeners {
        rest: bind(sandhub_api::sandboxd::REST_SOCKET)?,
        grpc: bind(sandhub_api::sandboxd::GRPC_SOCKET)?,
    })
}

/// The per-sandbox directory, on the host.
pub(crate) struct StateDir {
    pub root: PathBuf,
    /// `/.sandhub/overlay` inside.
    pub overlay: PathBuf,
    /// The listening sockets of the sandbox's sandboxd.
    pub sock: PathBuf,
    pub log: PathBuf,
}

/// Opens `path` under `dir` as a directory, refusing symlinks anywhere on
/// the way and anything that is not a directory.
pub(crate) fn open_dir_beneath(dir: BorrowedFd<'_>, path: &str) -> io::Result<OwnedFd> {
    rfs::openat2(
        dir,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        CONFINED,
    )
    .map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR | Errno::XDEV => io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{path} is not a plain directory (a symlink, a file or a mount point \
                 put there by the sandbox's workload); refusing to use it"
            ),
        ),
        e => io::Error::from(e),
    })
}

/// Opens a hub-owned directory (its path has no component a sandbox can
/// write) without following a symlink at its last component.
pub(crate) fn open_hub_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `mkdirat` that accepts an existing entry, then [`open_dir_beneath`].
fn ensure_dir(parent: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<OwnedFd> {
    match rfs::mkdirat(parent, name, Mode::from_raw_mode(mode)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    open_dir_beneath(parent, name)
}

/// Whether `uid` is the hub's own or one of the sandbox's: anything else in
/// a sandbox-writable place was not made by the sandbox or the hub.
fn owned_by_us(uid: u32, idmap: &IdMap) -> bool {
    let hub = rustix::process::geteuid().as_raw();
    uid == hub
        || match *idmap {
            IdMap::Range { base, count } => (base..base.saturating_add(count)).contains(&uid),
            IdMap::Single { uid: own, .. } => uid == own,
        }
}

impl StateDir {
    pub fn new(root: &Path) -> Self {
        StateDir {
            root: root.to_path_buf(),
            overlay: root.join("overlay"),
            sock: root.join("sock"),
            log: root.join("sandbox.log"),
        }
    }

    /// Creates what is missing and hands the overlay's directories to the
    /// sandbox's root (its processes write them from inside). Fails, and
    /// changes nothing, when the workload replaced `upper` or `work` with
    /// something other than a directory of its own.
    pub fn prepare(&self, idmap: &IdMap) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)?;
        let root = open_hub_dir(&self.root)?;
        ensure_dir(root.as_fd(), "rootfs", 0o755)?;
        // Hub only: a state dir from an older layout had it owned by the
        // sandbox's root; take it back.
        let sock = ensure_dir(root.as_fd(), "sock", 0o700)?;
        rfs::fchown(
            &sock,
            Some(rustix::process::geteuid()),
            Some(rustix::process::getegid()),
        )?;
        rfs::fchmod(&sock, Mode::from_raw_mode(0o700))?;
        let overlay = ensure_dir(root.as_fd(), "overlay", 0o755)?;
        let upper = ensure_dir(overlay.as_fd(), "upper", 0o755)?;
        let work = ensure_dir(overlay.as_fd(), "work", 0o700)?;
        for (fd, name) in [(&overlay, "overlay"), (&upper, "upper"), (&work, "work")] {
            let st = rfs::fstat(fd)?;
            if !owned_by_us(st.st_uid, idmap) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{name} of {} is owned by uid {}, neither the hub nor the sandbox",
                        self.root.display(),
                        st.st_uid
                    ),
                ));
            }
        }
        if matches!(idmap, IdMap::Range { .. }) {
            let (uid, gid) = idmap.host_root();
            for fd in [&overlay, &upper, &work] {
                rfs::fchown(
                    fd,
                    Some(rfs::Uid::from_raw(uid)),
                    Some(rfs::Gid::from_raw(gid)),
                )?;
            }
        }
        Ok(())
    }

    /// The sandbox's upper layer, open for reading: a real directory below
    /// `overlay/`, owned by the sandbox's root.
    pub fn open_upper(&self, idmap: &IdMap) -> io::Result<OwnedFd> {
        let root = open_hub_dir(&self.root)?;
        let upper = open_dir_beneath(root.as_fd(), "overlay/upper")?;
        let st = rfs::fstat(&upper)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory
            || !owned_by_us(st.st_uid, idmap)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the upper layer of {} is not the sandbox's directory",
                    self.root.display()
                ),
            ));
        }
        Ok(upper)
    }
}

/// Checks that `dir` is usable as a layer made by the hub: a directory (not
/// a symlink to one), on the same filesystem as `parent`, owned by the
/// hub or the sandbox id range. Returns it open.
pub(crate) fn open_layer(dir: &Path, idmap: &IdMap) -> io::Result<OwnedFd> {
    let fd = open_hub_dir(dir).map_err(|e| {
        super::error::annotate(
            format!("layer {} (must be a real directory)", dir.display()),
            e,
        )
    })?;
    let st = rfs::fstat(&fd)?;
    if !owned_by_us(st.st_uid, idmap) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "layer {} is owned by uid {}, neither the hub nor the sandbox",
                dir.display(),
                st.st_uid
            ),
        ));
    }
    if let Some(parent) = dir.parent() {
        let pst = rfs::stat(parent)?;
        if pst.st_dev != st.st_dev {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("layer {} is a mount point", dir.display()),
            ));
        }
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn prepare_refuses_symlinked_layer_dirs() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::new(&t.path().join("sb"));
        let idmap = IdMap::for_current_user();
        sd.prepare(&idmap).unwrap();
        // What a workload did: upper swapped for a link to a host dir.
        let victim = t.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::rename(sd.overlay.join("upper"), sd.overlay.join("upper.real")).unwrap();
        symlink(&victim, sd.overlay.join("upper")).unwrap();
        let before = std::fs::metadata(&victim).unwrap();
        let err = sd.prepare(&idmap).unwrap_err();
        assert!(err.to_string().contains("not a plain directory"), "{err}");
        assert!(sd.open_upper(&idmap).is_err());
        use std::os::unix::fs::MetadataExt;
        let after = std::fs::metadata(&victim).unwrap();
        assert_eq!((before.uid(), before.gid()), (after.uid(), after.gid()));
    }

    #[test]
    fn a_symlinked_layer_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let idmap = IdMap::for_current_user();
        std::fs::create_dir(t.path().join("real")).unwrap();
        symlink(t.path().join("real"), t.path().join("snap")).unwrap();
        assert!(open_layer(&t.path().join("real"), &idmap).is_ok());
        assert!(open_layer(&t.path().join("snap"), &idmap).is_err());
    }
}
