//! Disk quotas for local sandboxes: everything a sandbox can write (its
//! workspace layer, sockets and log) lives in its own btrfs subvolume with
//! a qgroup limit, so a write past the sandbox's `disk_mb` fails with
//! `EDQUOT` inside and the host's disk never fills.
//!
//! # API
//!
//! ```text
//! DiskQuotas::detect_or_create(state_dir, &VolumeOptions) -> DiskQuotas
//!   the state dir's own btrfs when it has quotas on; otherwise a sparse
//!   btrfs image <state_dir>/disk.img on a loop device, mounted at
//!   <run_dir>/<hash of state_dir> (found and reused after a restart)
//! quotas.root()                        where sandbox and snapshot dirs go
//! quotas.confine(state_dir, bytes)     make/limit a sandbox's dir (launch)
//! quotas.limit(parent_fd, name, bytes) the same, from a directory fd
//! quotas.usage(id) -> bytes            what the quota counts now
//! quotas.release(state_dir)            delete a sandbox's dir at once
//! quotas.detach()                      unmount when the hub stops
//! ```
//!
//! # Why btrfs qgroups, not project quotas
//!
//! Project quotas (ext4 `-O project` with `prjquota`, or XFS `pquota`)
//! need a kernel built with `CONFIG_QFMT_V2` (ext4) or `CONFIG_XFS_QUOTA`;
//! the reference host (6.18) has neither, so ext4 refuses to mount a
//! quota-enabled image at all. btrfs accounts per subvolume without the
//! generic quota code, and its limits bind root inside a sandbox as well
//! (no `CAP_SYS_RESOURCE` bypass). A qgroup limits *referenced* bytes, so
//! a reflinked copy counts in full for each side and deleting files gives
//! the quota back at once.
//!
//! A sparse image file per state dir (rather than one file per sandbox)
//! keeps the per-sandbox cost at two ioctls (subvolume create, qgroup
//! limit) instead of an mkfs and a mount.
//!
//! # What a workload could try
//!
//! - Creating a subvolume of its own inside its layer (any user may, on
//!   btrfs): the new subvolume's qgroup would have no limit. Workloads run
//!   under a seccomp filter that refuses every btrfs ioctl (see
//!   `seccomp.rs`); changing qgroups needs `CAP_SYS_ADMIN` in the initial
//!   user namespace anyway.
//! - Many empty files: inodes are btrfs metadata in the subvolume's tree,
//!   which its qgroup counts too.
//! - Filling the whole volume: each sandbox stops at its limit; the volume
//!   (and so the host) stops at the volume's size.

mod btrfs;
mod loopdev;
pub mod plan;

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
};

use rustix::fs::{Mode, OFlags, ResolveFlags};

pub use plan::{limit_bytes, MIB};

use super::error::annotate;

/// Where volumes are mounted unless told otherwise: `/run` is cleared at
/// boot, as are the mounts themselves.
pub const DEFAULT_RUN_DIR: &str = "/run/sandhub/volumes";
/// The image's name in the state dir.
pub const IMAGE_NAME: &str = "disk.img";

/// How to make the volume when it does not exist yet.
#[derive(Debug, Clone)]
pub struct VolumeOptions {
    /// Size of a new image in MiB; `None`: nine tenths of the space free
    /// on the state dir's filesystem.
    pub size_mb: Option<u64>,
    /// Parent of the volumes' mount points ([`DEFAULT_RUN_DIR`]).
    pub run_dir: PathBuf,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            size_mb: None,
            run_dir: PathBuf::from(DEFAULT_RUN_DIR),
        }
    }
}

/// The qgroup id of a sandbox's directory (its subvolume id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaId(pub u64);

/// A btrfs filesystem with qgroups on, whose subdirectory `root()` holds
/// the hub's sandbox and snapshot directories.
#[derive(Debug)]
pub struct DiskQuotas {
    root: PathBuf,
    root_fd: OwnedFd,
    fsid: String,
    /// Mounted by the hub (the loop volume), so [`DiskQuotas::detach`]
    /// unmounts it; false on the state dir's own btrfs.
    mounted: bool,
    detached: AtomicBool,
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| annotate(format!("opening {}", path.display()), e.into()))
}

/// `openat2(dir, name, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: a
/// directory below `dir` reached without following any link, however the
/// path's components were renamed or replaced.
fn open_beneath(dir: BorrowedFd<'_>, name: &Path) -> io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| annotate(format!("opening {}", name.display()), e.into()))
}

fn is_btrfs(path: &Path) -> io::Result<bool> {
    let st = rustix::fs::statfs(path)?;
    Ok(st.f_type as i64 == btrfs::SUPER_MAGIC)
}

impl DiskQuotas {
    /// Finds or makes the filesystem that enforces sandbox quotas for
    /// `state_dir` (see the module docs). Needs root; making a volume
    /// needs `mkfs.btrfs` (btrfs-progs) once.
    pub fn detect_or_create(state_dir: &Path, options: &VolumeOptions) -> io::Result<Self> {
        let state_dir = state_dir
            .canonicalize()
            .map_err(|e| annotate(format!("state dir {}", state_dir.display()), e))?;
        if let Some(native) = Self::native(&state_dir)? {
            return Ok(native);
        }
        let image = state_dir.join(IMAGE_NAME);
        let mount_point = plan::mount_point(&options.run_dir, &state_dir);
        let at = what_is_mounted_at(&mount_point, &image)?;
        let attached = if image.exists() {
            loopdev::find_attached(&image)
                .map_err(|e| annotate("looking for the volume's loop device", e))?
        } else {
            None
        };
        let step = plan::plan(&at, attached.as_deref(), image.exists()).map_err(|msg| {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: {msg}", mount_point.display()),
            )
        })?;
        tracing::debug!(?step, mount_point = %mount_point.display(), "disk volume");
        match step {
            plan::Step::Reuse => {}
            plan::Step::Mount(dev) => mount_volume(&dev, &mount_point)?,
            plan::Step::AttachAndMount => attach_and_mount(&image, &mount_point)?,
            plan::Step::Create => {
                let avail = rustix::fs::statvfs(&state_dir)
                    .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
                    .map_err(|e| annotate("statvfs of the state dir", e.into()))?;
                let size = plan::volume_size(options.size_mb, avail)
                    .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
                make_image(&image, size)?;
                attach_and_mount(&image, &mount_point)?;
                tracing::info!(
                    image = %image.display(),
                    size_mb = size / MIB,
                    mount_point = %mount_point.display(),
                    "created the sandboxes' disk volume"
                );
            }
        }
        let quotas = Self::on(mount_point, true)?;
        btrfs::enable_quota(quotas.root_fd.as_fd())
            .map_err(|e| annotate("enabling btrfs quotas on the volume", e))?;
        Ok(quotas)
    }

    /// The state dir's own filesystem, when it is btrfs with quotas on
    /// (the operator's choice: the hub never turns quotas on for a
    /// filesystem it did not make).
    fn native(state_dir: &Path) -> io::Result<Option<Self>> {
        if !is_btrfs(state_dir)? {
            return Ok(None);
        }
        let fd = open_dir(state_dir)?;
        let fsid = plan::uuid_text(&btrfs::fsid(fd.as_fd())?);
        if !Path::new("/sys/fs/btrfs")
            .join(&fsid)
            .join("qgroups")
            .is_dir()
        {
            return Ok(None);
        }
        let root = state_dir.join("volume");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&root)
            .or_else(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        tracing::info!(root = %root.display(), "disk quotas on the state dir's own btrfs");
        Self::on(root, false).map(Some)
    }

    fn on(root: PathBuf, mounted: bool) -> io::Result<Self> {
        let root_fd = open_dir(&root)?;
        if mounted {
            // mkfs.btrfs leaves the root 0755; only the hub looks inside.
            rustix::fs::fchmod(&root_fd, Mode::from_raw_mode(0o700))?;
        }
        let fsid = plan::uuid_text(&btrfs::fsid(root_fd.as_fd())?);
        for dir in ["sandboxes", "snapshots", VOLUMES_DIR, VOLUME_SNAPSHOTS_DIR] {
            match rustix::fs::mkdirat(root_fd.as_fd(), dir, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(annotate(format!("creating {dir} on the volume"), e.into())),
            }
        }
        Ok(DiskQuotas {
            root,
            root_fd,
            fsid,
            mounted,
            detached: AtomicBool::new(false),
        })
    }

    /// The directory that holds `sandboxes/` and `snapshots/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes `parent/name` a directory whose whole contents may take at
    /// most `bytes` (a new subvolume), or sets that limit on it when it
    /// exists (a resumed sandbox; the template may have changed).
    pub fn limit(&self, parent: BorrowedFd<'_>, name: &str, bytes: u64) -> io::Result<QuotaId> {
        self.check_attached()?;
        checked_name(name)?;
        let created = match btrfs::create_subvolume(parent, name) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(annotate(format!("creating subvolume {name}"), e)),
        };
        let dir = open_beneath(parent, Path::new(name))?;
        let st = rustix::fs::fstat(&dir)?;
        if st.st_ino != btrfs::FIRST_FREE_OBJECTID {
            // A plain directory where a subvolume belongs: its writes
            // would count against nothing.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} exists but is not a subvolume, so no quota can apply to it"),
            ));
        }
        if created {
            // Made with the hub's umask; only root may look inside.
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))?;
        }
        let id = btrfs::subvolume_id(dir.as_fd())?;
        btrfs::limit_qgroup(self.root_fd.as_fd(), id, bytes)
            .map_err(|e| annotate(format!("limiting {name} to {bytes} bytes"), e))?;
        Ok(QuotaId(id))
    }

    /// [`DiskQuotas::limit`] for a sandbox's state dir, a direct child of
    /// a hub-owned directory under [`DiskQuotas::root`]. Launch calls this
    /// before creating anything in the state dir, so all of it counts.
    pub fn confine(&self, state_dir: &Path, bytes: u64) -> io::Result<QuotaId> {
        let (parent, name) = self.split(state_dir)?;
        self.limit(parent.as_fd(), name, bytes)
    }

    /// Bytes the quota of `id` counts, as of the filesystem's last commit
    /// (btrfs settles qgroup numbers at each transaction commit, every 30 s
    /// at most).
    pub fn usage(&self, id: QuotaId) -> io::Result<u64> {
        let path = Path::new("/sys/fs/btrfs")
            .join(&self.fsid)
            .join("qgroups")
            .join(format!("0_{}", id.0))
            .join("referenced");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| annotate(format!("reading {}", path.display()), e))?;
        text.trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path:?}: {e}")))
    }

    /// The sysfs directory of quota `id`'s qgroup, opened once so the
    /// usage sampler reads `referenced` through it each second
    /// ([`read_qgroup`]). sysfs is the kernel's: nothing a sandbox writes.
    pub fn qgroup_dir(&self, id: QuotaId) -> io::Result<OwnedFd> {
        let path = Path::new("/sys/fs/btrfs")
            .join(&self.fsid)
            .join("qgroups")
            .join(format!("0_{}", id.0));
        rustix::fs::open(
            &path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC
                | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| annotate(format!("opening {}", path.display()), e.into()))
    }

    /// The quota of an existing sandbox dir.
    pub fn quota_of(&self, state_dir: &Path) -> io::Result<QuotaId> {
        let (parent, name) = self.split(state_dir)?;
        let dir = open_beneath(parent.as_fd(), Path::new(name))?;
        Ok(QuotaId(btrfs::subvolume_id(dir.as_fd())?))
    }

    /// Deletes a sandbox's dir and everything in it at once (btrfs frees
    /// the space in the background; the kernel drops the qgroup when that
    /// is done). Call only once nothing runs in the sandbox. A dir that
    /// is gone already is fine.
    pub fn release(&self, state_dir: &Path) -> io::Result<()> {
        let (parent, name) = self.split(state_dir)?;
        match btrfs::destroy_subvolume(parent.as_fd(), name) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            // Not a subvolume (a plain dir), or one holding subvolumes
            // (which workloads cannot make, see the module docs): the slow
            // way, which never follows a link.
            Err(e) => {
                tracing::debug!(error = %e, dir = %state_dir.display(), "subvolume delete; removing file by file");
                match std::fs::remove_dir_all(state_dir) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Unmounts a volume the hub mounted (lazily: sandboxes still running
    /// keep their own mounts of it, and the next start mounts the same
    /// loop device again). Launches fail from here on.
    pub fn detach(&self) -> io::Result<()> {
        if !self.mounted || self.detached.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        rustix::mount::unmount(&self.root, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| annotate(format!("unmounting {}", self.root.display()), e.into()))?;
        let _ = std::fs::remove_dir(&self.root);
        tracing::info!(mount_point = %self.root.display(), "detached the sandboxes' disk volume");
        Ok(())
    }

    fn check_attached(&self) -> io::Result<()> {
        if self.detached.load(Ordering::SeqCst) {
            return Err(io::Error::other(
                "the disk volume is detached: the hub is stopping",
            ));
        }
        Ok(())
    }

    /// `dir`'s parent, opened beneath the root, and its name.
    fn split<'a>(&self, dir: &'a Path) -> io::Result<(OwnedFd, &'a str)> {
        let rel = dir.strip_prefix(&self.root).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not under the disk volume {}",
                    dir.display(),
                    self.root.display()
                ),
            )
        })?;
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name().and_then(|n| n.to_str()))
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no directory under the volume", dir.display()),
            ));
        };
        let parent = if parent.as_os_str().is_empty() {
            rustix::io::dup(&self.root_fd)?
        } else {
            open_beneath(self.root_fd.as_fd(), parent)?
        };
        Ok((parent, name))
    }
}

/// [`plan::check_name`] as an I/O error (`InvalidInput`).
fn checked_name(name: &str) -> io::Result<()> {
    plan::check_name(name).map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))
}

/// The directory under [`DiskQuotas::root`] that holds named volumes:
/// `volumes/<tenant dir>/<name>`, each a subvolume with a qgroup limit.
pub const VOLUMES_DIR: &str = "volumes";

/// The directory under [`DiskQuotas::root`] that holds named volumes'
/// snapshots: `volume-snapshots/<tenant dir>/<volume>@<snapshot>`, each a
/// read-only subvolume. Apart from `volumes/` so that neither tree's
/// start-up reconciliation mistakes the other's entries for its own.
pub const VOLUME_SNAPSHOTS_DIR: &str = "volume-snapshots";

/// `openat2(dir, name, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_XDEV)`: [`open_beneath`] that also never crosses a mount.
fn open_beneath_same_fs(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS
            | ResolveFlags::NO_XDEV,
    )
    .map_err(|e| annotate(format!("opening {name}"), e.into()))
}

/// Named volumes on the quota volume (issue #32 §1). Every step goes
/// through directory fds opened beneath the root without following links
/// or crossing mounts; the tenant directories are the hub's (0700), and a
/// volume's own contents, which sandboxes write, are never walked here.
impl DiskQuotas {
    /// `volumes/<tenant_dir>`, made when missing.
    fn tenant_volumes(&self, tenant_dir: &str, create: bool) -> io::Result<Option<OwnedFd>> {
        self.tenant_dir_in(VOLUMES_DIR, tenant_dir, create)
    }

    /// `<top>/<tenant_dir>` (`top` one of [`VOLUMES_DIR`] and
    /// [`VOLUME_SNAPSHOTS_DIR`]), made when missing.
    fn tenant_dir_in(
        &self,
        top: &str,
        tenant_dir: &str,
        create: bool,
    ) -> io::Result<Option<OwnedFd>> {
        self.check_attached()?;
        checked_name(tenant_dir)?;
        let volumes = open_beneath_same_fs(self.root_fd.as_fd(), top)?;
        if create {
            match rustix::fs::mkdirat(&volumes, tenant_dir, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(annotate(format!("creating {top}/{tenant_dir}"), e.into())),
            }
        }
        match open_beneath_same_fs(volumes.as_fd(), tenant_dir) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes the volume `volumes/<tenant_dir>/<name>`: an empty subvolume
    /// limited to `bytes`. With `fresh`, whatever is there already (left
    /// by a hub killed while deleting a volume of that name) goes first,
    /// so a new volume never starts with an old one's files; without it,
    /// an existing volume keeps its files and gets the limit again (the
    /// start-up reconciliation).
    pub fn create_volume(
        &self,
        tenant_dir: &str,
        name: &str,
        bytes: u64,
        fresh: bool,
    ) -> io::Result<QuotaId> {
        let parent = self
            .tenant_volumes(tenant_dir, true)?
            .expect("made when missing");
        if fresh {
            match btrfs::destroy_subvolume(parent.as_fd(), name) {
                Ok(()) => tracing::info!(tenant_dir, name, "removed a volume left behind"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(annotate(format!("removing the old volume {name}"), e)),
            }
        }
        self.limit(parent.as_fd(), name, bytes)
    }

    /// The volume's directory (its subvolume's root), opened without
    /// following links or crossing mounts: the handle to mount or to reach
    /// its files through, never a path a sandbox could have replaced.
    pub fn open_volume(&self, tenant_dir: &str, name: &str) -> io::Result<OwnedFd> {
        checked_name(name)?;
        let parent = self.tenant_volumes(tenant_dir, false)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("volumes/{tenant_dir}"))
        })?;
        let dir = open_beneath_same_fs(parent.as_fd(), name)?;
        if rustix::fs::fstat(&dir)?.st_ino != btrfs::FIRST_FREE_OBJECTID {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("volume {name} is not a subvolume"),
            ));
        }
        Ok(dir)
    }

    /// Deletes a volume and its files at once; one that is gone is fine.
    pub fn release_volume(&self, tenant_dir: &str, name: &str) -> io::Result<()> {
        checked_name(name)?;
        let Some(parent) = self.tenant_volumes(tenant_dir, false)? else {
            return Ok(());
        };
        match btrfs::destroy_subvolume(parent.as_fd(), name) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(annotate(format!("deleting volume {name}"), e)),
        }
    }

    /// Every `(tenant_dir, name)` on disk, for the start-up reconciliation.
    pub fn list_volumes(&self) -> io::Result<Vec<(String, String)>> {
        self.list_in(VOLUMES_DIR)
    }

    /// Every `(tenant_dir, <volume>@<snapshot>)` on disk.
    pub fn list_volume_snapshots(&self) -> io::Result<Vec<(String, String)>> {
        self.list_in(VOLUME_SNAPSHOTS_DIR)
    }

    /// Makes `volume-snapshots/<tenant_dir>/<key>` a read-only snapshot
    /// of the volume `name`, taken at once. The volume is reached as
    /// [`DiskQuotas::open_volume`] reaches it; an existing `key` is
    /// EEXIST, never replaced.
    pub fn snapshot_volume(&self, tenant_dir: &str, name: &str, key: &str) -> io::Result<()> {
        checked_name(key)?;
        let source = self.open_volume(tenant_dir, name)?;
        let parent = self
            .tenant_dir_in(VOLUME_SNAPSHOTS_DIR, tenant_dir, true)?
            .expect("made when missing");
        btrfs::snapshot_subvolume(source.as_fd(), parent.as_fd(), key, true)
            .map_err(|e| annotate(format!("snapshotting volume {name} as {key}"), e))
    }

    /// Whether the snapshot `key` is on disk (a subvolume's root).
    pub fn has_volume_snapshot(&self, tenant_dir: &str, key: &str) -> io::Result<bool> {
        checked_name(key)?;
        let Some(parent) = self.tenant_dir_in(VOLUME_SNAPSHOTS_DIR, tenant_dir, false)? else {
            return Ok(false);
        };
        match open_beneath_same_fs(parent.as_fd(), key) {
            Ok(fd) => Ok(rustix::fs::fstat(&fd)?.st_ino == btrfs::FIRST_FREE_OBJECTID),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes a volume snapshot at once; one that is gone is fine.
    pub fn release_volume_snapshot(&self, tenant_dir: &str, key: &str) -> io::Result<()> {
        checked_name(key)?;
        let Some(parent) = self.tenant_dir_in(VOLUME_SNAPSHOTS_DIR, tenant_dir, false)? else {
            return Ok(());
        };
        match btrfs::destroy_subvolume(parent.as_fd(), key) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(annotate(format!("deleting volume snapshot {key}"), e)),
        }
    }

    /// Makes the volume `volumes/<tenant_dir>/<name>` a writable snapshot
    /// of the volume snapshot `key`, limited to `bytes`: whatever is at
    /// `name` goes first (a crashed delete's or clone's leftover), so the
    /// new volume holds exactly the snapshot's files. The two share blocks
    /// until either changes, and changes on one side never show on the
    /// other.
    pub fn clone_volume(
        &self,
        tenant_dir: &str,
        key: &str,
        name: &str,
        bytes: u64,
    ) -> io::Result<QuotaId> {
        checked_name(key)?;
        checked_name(name)?;
        let snaps = self
            .tenant_dir_in(VOLUME_SNAPSHOTS_DIR, tenant_dir, false)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("snapshot {key}")))?;
        let source = open_beneath_same_fs(snaps.as_fd(), key)?;
        if rustix::fs::fstat(&source)?.st_ino != btrfs::FIRST_FREE_OBJECTID {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("volume snapshot {key} is not a subvolume"),
            ));
        }
        let parent = self
            .tenant_volumes(tenant_dir, true)?
            .expect("made when missing");
        match btrfs::destroy_subvolume(parent.as_fd(), name) {
            Ok(()) => tracing::info!(tenant_dir, name, "removed a volume left behind"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(annotate(format!("removing the old volume {name}"), e)),
        }
        btrfs::snapshot_subvolume(source.as_fd(), parent.as_fd(), name, false)
            .map_err(|e| annotate(format!("cloning {key} as volume {name}"), e))?;
        self.limit(parent.as_fd(), name, bytes)
    }

    /// `(tenant_dir, name)` of every entry two levels below `top`.
    fn list_in(&self, top: &str) -> io::Result<Vec<(String, String)>> {
        self.check_attached()?;
        let volumes = open_beneath_same_fs(self.root_fd.as_fd(), top)?;
        let mut out = Vec::new();
        for tenant in entries(volumes.as_fd())? {
            let Some(dir) = self.tenant_dir_in(top, &tenant, false)? else {
                continue;
            };
            for name in entries(dir.as_fd())? {
                out.push((tenant.clone(), name));
            }
        }
        Ok(out)
    }
}

/// The names in directory `dir` (no `.`/`..`, nothing that is not UTF-8:
/// the hub makes only hex and DNS-label names here).
fn entries(dir: BorrowedFd<'_>) -> io::Result<Vec<String>> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(&fd)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name != "." && name != ".." {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// What is mounted at the volume's mount point, judged against `image`.
fn what_is_mounted_at(mount_point: &Path, image: &Path) -> io::Result<plan::AtMountPoint> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let Some(entry) = plan::find_mount(&mountinfo, mount_point) else {
        return Ok(plan::AtMountPoint::Nothing);
    };
    let ours = entry.fstype == "btrfs"
        && entry.source.starts_with("/dev/loop")
        && image.exists()
        && loopdev::is_backed_by(Path::new(&entry.source), image).unwrap_or(false);
    Ok(if ours {
        plan::AtMountPoint::OurVolume
    } else {
        plan::AtMountPoint::Other(format!("{} ({})", entry.source, entry.fstype))
    })
}

/// A sparse file of `size` bytes with a fresh btrfs inside, made under a
/// temporary name so a crash never leaves a half-made image behind.
fn make_image(image: &Path, size: u64) -> io::Result<()> {
    let tmp = image.with_extension("img.new");
    let _ = std::fs::remove_file(&tmp);
    {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| annotate(format!("creating {}", tmp.display()), e))?;
        file.set_len(size)?;
    }
    let mkfs = find_mkfs_btrfs().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "mkfs.btrfs not found: install btrfs-progs to give sandboxes disk quotas",
        )
    })?;
    // Single data and metadata profiles: one device, and DUP metadata
    // would only double what the volume's own bookkeeping takes. No
    // discard: a fresh sparse file has nothing to trim.
    let out = Command::new(&mkfs)
        .args([
            "-q", "-f", "-K", "-m", "single", "-d", "single", "-L", "sandhub",
        ])
        .arg(&tmp)
        .output()
        .map_err(|e| annotate(format!("running {}", mkfs.display()), e))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::other(format!(
            "{} {}: {}",
            mkfs.display(),
            tmp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::rename(&tmp, image)
}

fn find_mkfs_btrfs() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(PathBuf::from)
        .chain(from_path)
        .map(|d| d.join("mkfs.btrfs"))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
}

fn attach_and_mount(image: &Path, mount_point: &Path) -> io::Result<()> {
    let (dev, _held) = loopdev::attach(image)
        .map_err(|e| annotate(format!("attaching {} to a loop device", image.display()), e))?;
    // `_held` keeps the device from autoclearing until the mount holds it.
    mount_volume(&dev, mount_point)
}

fn mount_volume(dev: &Path, mount_point: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(mount_point)
        .map_err(|e| annotate(format!("creating {}", mount_point.display()), e))?;
    use rustix::mount::{mount, MountFlags};
    // discard=async hands freed blocks back to the image file as holes, so
    // the host gets its space back when sandboxes delete files.
    let data = CString::new("discard=async").expect("no NUL");
    mount(
        dev,
        mount_point,
        "btrfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME,
        data.as_c_str(),
    )
    .map_err(|e| {
        annotate(
            format!("mounting {} at {}", dev.display(), mount_point.display()),
            e.into(),
        )
    })
}

/// `referenced` alone of a qgroup directory, for a reader that knows the
/// limit already (see [`read_qgroup`]).
pub fn read_qgroup_used(dir: &mut sandboxd::usage::cgroup::Files) -> io::Result<u64> {
    let mut buf = [0u8; 64];
    String::from_utf8_lossy(dir.read("referenced", &mut buf)?)
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("referenced: {e}")))
}

/// `(referenced, max_referenced)` of a qgroup directory from
/// [`DiskQuotas::qgroup_dir`]; the limit is None when the qgroup has none.
/// btrfs settles `referenced` at each transaction commit (30 s at most).
pub fn read_qgroup(dir: &mut sandboxd::usage::cgroup::Files) -> io::Result<(u64, Option<u64>)> {
    let mut buf = [0u8; 64];
    let mut read = |name: &'static str| -> io::Result<String> {
        Ok(String::from_utf8_lossy(dir.read(name, &mut buf)?)
            .trim()
            .to_string())
    };
    // "none" when unlimited.
    let max = read("max_referenced").ok().and_then(|v| v.parse().ok());
    Ok((read_qgroup_used(dir)?, max))
}
