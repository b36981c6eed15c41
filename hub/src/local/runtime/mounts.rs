//! The sandbox's root filesystem, built by its PID 1:
//!
//! ```text
//! /            tmpfs, read-only once built
//! /usr /bin /sbin /lib*   host's, read-only (symlinks recreated: merged /usr)
//! /etc         the sanitized host copy, read-only
//!   (or, with a template root_fs: each top-level entry of it, read-only)
//! /proc        a fresh procfs of the sandbox's PID namespace
//! /dev         tmpfs: null zero full random urandom tty (host nodes bound),
//!              pts (new devpts instance), ptmx -> pts/ptmx, shm (tmpfs)
//! /tmp /root   tmpfs, sized (see [`TmpfsSizes`])
//! /workspace   overlay (see workspace.rs)
//! /.sandhub    layers and the overlay dir (see workspace.rs)
//! <mounts>     named volumes, each at its path (see volumes.rs)
//! ```
//!
//! Host directories are opened as `O_PATH` fds by the shim right after it
//! unshared its namespaces and before it becomes root inside: at that
//! moment it still has the hub's host uid, so it can walk paths (state
//! dirs under a 0700 parent, say) that the sandbox's mapped root could not.
//! PID 1 then clones each fd into a detached mount (`open_tree`), makes it
//! read-only recursively (`mount_setattr`) and attaches it (`move_mount`).

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::DirBuilderExt,
    },
    path::{Path, PathBuf},
};

use rustix::{
    fs::{self as rfs, Mode, OFlags, CWD},
    mount::{
        fsconfig_create, fsconfig_set_string, fsmount, fsopen, mount, mount_change, move_mount,
        open_tree, FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MountPropagationFlags,
        MoveMountFlags, OpenTreeFlags,
    },
};

use super::{
    channel::InitConfig,
    error::annotate,
    sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY},
    volumes::{OpenVolume, VolumeBind},
    workspace::{WorkspaceLayout, LAYERS_DIR, OVERLAY_DIR, SANDHUB_DIR, WORKSPACE},
};

/// Top-level names a template root_fs cannot provide: the runtime mounts
/// its own there.
const RESERVED: &[&str] = &["proc", "dev", "sys", "tmp", "root", "workspace", ".sandhub"];

/// Sizes of the sandbox's tmpfs mounts, in KiB. tmpfs pages are charged
/// to the sandbox's memory cgroup but belong to no process, so a full
/// tmpfs at the memory limit leaves the OOM killer only the sandbox's own
/// init and sandboxd to kill. Together the mounts stay at half the memory
/// limit: a workload filling them all gets `ENOSPC` and its sandbox lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TmpfsSizes {
    pub tmp_kib: u64,
    pub shm_kib: u64,
    pub root_kib: u64,
}

impl TmpfsSizes {
    /// Without a memory limit (no cgroups), the kernel's default (half of
    /// RAM each) would let one sandbox take the host's memory: a quarter of
    /// the RAM in all instead.
    pub fn for_memory(memory_mb: Option<u64>) -> Self {
        let kib = memory_mb.map_or_else(|| host_memory_kib() / 2, |mb| mb * 1024);
        TmpfsSizes {
            tmp_kib: (kib / 4).max(1024),
            shm_kib: (kib / 8).max(1024),
            root_kib: (kib / 8).max(1024),
        }
    }
}

/// This machine's memory in KiB (`MemTotal`; 4 GiB if unreadable).
pub fn host_memory_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(4 << 20)
}

/// Host device nodes every sandbox gets.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

enum RootEntry {
    /// Bind `fd` read-only at `/<name>`.
    Bind {
        name: String,
        fd: OwnedFd,
        dir: bool,
    },
    /// Recreate a symlink (`/bin -> usr/bin` on merged-/usr hosts).
    Symlink { name: String, target: PathBuf },
}

/// Host files and directories a sandbox's root is assembled from.
pub(crate) struct HostFds {
    rootfs: OwnedFd,
    overlay: OwnedFd,
    lowers: Vec<OwnedFd>,
    entries: Vec<RootEntry>,
    devices: Vec<(&'static str, OwnedFd)>,
    volumes: Vec<OpenVolume>,
}

fn open_path(path: &Path, what: &str) -> io::Result<OwnedFd> {
    open_with(path, what, OFlags::empty())
}

/// `O_PATH` open; `extra` may add `O_NOFOLLOW | O_DIRECTORY` for paths
/// whose last component must be a real directory.
fn open_with(path: &Path, what: &str, extra: OFlags) -> io::Result<OwnedFd> {
    rfs::open(path, OFlags::PATH | OFlags::CLOEXEC | extra, Mode::empty()).map_err(|e| {
        annotate(
            format!(
                "opening {what} {} (every parent directory must be searchable by the hub's user)",
                path.display()
            ),
            e.into(),
        )
    })
}

impl HostFds {
    /// Opens everything while the process still has the hub's host ids.
    pub fn open(cfg: &InitConfig) -> io::Result<Self> {
        let state = &cfg.state_dir;
        let lowers = cfg
            .lower_layers
            .iter()
            // Hub-made directories (seed copies, snapshots): never a link.
            .map(|p| open_with(p, "lower layer", OFlags::NOFOLLOW | OFlags::DIRECTORY))
            .collect::<io::Result<Vec<_>>>()?;
        let entries = match &cfg.root_fs {
            Some(root) => root_fs_entries(root)?,
            None => host_entries(&cfg.host_etc)?,
        };
        let devices = DEVICES
            .iter()
            .map(|d| Ok((*d, open_path(&Path::new("/dev").join(d), "device")?)))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(HostFds {
            rootfs: open_with(
                &state.join("rootfs"),
                "root mount point",
                OFlags::NOFOLLOW | OFlags::DIRECTORY,
            )?,
            overlay: open_with(
                &state.join("overlay"),
                "overlay dir",
                OFlags::NOFOLLOW | OFlags::DIRECTORY,
            )?,
            lowers,
            entries,
            devices,
            volumes: cfg
                .volumes
                .iter()
                .map(VolumeBind::open)
                .collect::<io::Result<Vec<_>>>()?,
        })
    }
}

/// `/usr`, `/bin`, `/sbin`, `/lib*` of the host, plus the sanitized `/etc`.
fn host_entries(host_etc: &Path) -> io::Result<Vec<RootEntry>> {
    let mut out = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir("/")?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| matches!(n.as_str(), "usr" | "bin" | "sbin") || n.starts_with("lib"))
        .collect();
    names.sort();
    for name in names {
        let path = Path::new("/").join(&name);
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path)?;
            out.push(RootEntry::Symlink { name, target });
        } else if meta.is_dir() {
            let fd = open_path(&path, "host directory")?;
            out.push(RootEntry::Bind {
                name,
                fd,
                dir: true,
            });
        }
    }
    out.push(RootEntry::Bind {
        name: "etc".into(),
        fd: open_path(host_etc, "sanitized /etc copy")?,
        dir: true,
    });
    Ok(out)
}

/// Every top-level entry of a template's root filesystem.
fn root_fs_entries(root: &Path) -> io::Result<Vec<RootEntry>> {
    let mut out = Vec::new();
    let dir = std::fs::read_dir(root)
        .map_err(|e| annotate(format!("reading root_fs {}", root.display()), e))?;
    for entry in dir {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if RESERVED.contains(&name.as_str()) {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            out.push(RootEntry::Symlink {
                name,
                target: std::fs::read_link(&path)?,
            });
        } else if meta.is_dir() || meta.is_file() {
            let fd = open_path(&path, "root_fs entry")?;
            out.push(RootEntry::Bind {
                name,
                fd,
                dir: meta.is_dir(),
            });
        }
    }
    Ok(out)
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in fixed path")
}

/// Clones `fd`'s mount subtree, sets `attrs` on all of it and attaches it
/// at `target` (relative to the cwd).
fn bind(fd: &OwnedFd, target: &str, attrs: u64) -> io::Result<()> {
    let tree = open_tree(
        fd,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH
            | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(|e| annotate(format!("open_tree for /{target}"), e.into()))?;
    if attrs != 0 {
        sys::mount_setattr(tree.as_fd(), &cstr(""), true, true, attrs)
            .map_err(|e| annotate(format!("mount_setattr on /{target}"), e))?;
    }
    move_mount(
        tree.as_fd(),
        "",
        CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| annotate(format!("move_mount to /{target}"), e.into()))
}

fn mkdir(path: &str, mode: u32) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(|e| annotate(format!("mkdir /{path}"), e))
}

fn mount_fs(fstype: &str, target: &str, flags: MountFlags, data: &str) -> io::Result<()> {
    let data = CString::new(data).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    mount(fstype, target, fstype, flags, data.as_c_str()).map_err(|e| {
        let e: io::Error = e.into();
        let hint = if fstype == "proc" && e.raw_os_error() == Some(libc::EPERM) {
            " (the kernel refuses a new procfs in a user namespace when the host's \
             /proc has paths mounted over, as inside many containers)"
        } else {
            ""
        };
        annotate(format!("mounting {fstype} on /{target}{hint}"), e)
    })
}

/// Builds the root filesystem and pivots into it. Runs as PID 1 of the
/// sandbox, root in its user namespace; consumes the host fds.
pub(crate) fn build_root(cfg: &InitConfig, host: HostFds) -> io::Result<()> {
    // Nothing done here may propagate back to the host's mount table.
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| annotate("making / private", e.into()))?;

    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| annotate("fsopen tmpfs", e.into()))?;
    fsconfig_set_string(&fs, "mode", "0755").map_err(|e| annotate("tmpfs mode", e.into()))?;
    fsconfig_set_string(&fs, "size", "4m").map_err(|e| annotate("tmpfs size", e.into()))?;
    fsconfig_create(&fs).map_err(|e| annotate("creating root tmpfs", e.into()))?;
    let root = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(|e| annotate("fsmount root tmpfs", e.into()))?;
    move_mount(
        &root,
        "",
        &host.rootfs,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| annotate("attaching root tmpfs", e.into()))?;
    // From here every relative path is inside the new root.
    sys::fchdir(root.as_fd()).map_err(|e| annotate("entering the new root", e))?;

    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    for entry in &host.entries {
        match entry {
            RootEntry::Symlink { name, target } => std::os::unix::fs::symlink(target, name)
                .map_err(|e| annotate(format!("symlink /{name}"), e))?,
            RootEntry::Bind { name, fd, dir } => {
                if *dir {
                    mkdir(name, 0o755)?;
                } else {
                    std::fs::File::create(name)
                        .map_err(|e| annotate(format!("creating /{name}"), e))?;
                }
                bind(fd, name, ro)?;
            }
        }
    }

    // /.sandhub: layers and the overlay's own dirs.
    let rel = |p: &str| p.trim_start_matches('/').to_string();
    mkdir(&rel(SANDHUB_DIR), 0o755)?;
    mkdir(&rel(LAYERS_DIR), 0o755)?;
    if host.lowers.is_empty() {
        mkdir(&format!("{}/empty", rel(LAYERS_DIR)), 0o755)?;
    }
    for (i, fd) in host.lowers.iter().enumerate() {
        let target = format!("{}/lower-{i}", rel(LAYERS_DIR));
        mkdir(&target, 0o755)?;
        bind(fd, &target, ro)?;
    }
    mkdir(&rel(OVERLAY_DIR), 0o755)?;
    bind(
        &host.overlay,
        &rel(OVERLAY_DIR),
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    )?;
    mkdir(&rel(WORKSPACE), 0o755)?;

    mkdir("proc", 0o555)?;
    mount_fs(
        "proc",
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "",
    )?;
    let sizes = TmpfsSizes::for_memory(cfg.memory_mb);
    build_dev(cfg, &host, &sizes)?;
    mkdir("tmp", 0o1777)?;
    mount_fs(
        "tmpfs",
        "tmp",
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=1777,size={}k", sizes.tmp_kib),
    )?;
    mkdir("root", 0o700)?;
    mount_fs(
        "tmpfs",
        "root",
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=0700,size={}k", sizes.root_kib),
    )?;
    // Cloned while the host's mounts are still in this namespace.
    let volumes = host
        .volumes
        .iter()
        .map(OpenVolume::detach)
        .collect::<io::Result<Vec<_>>>()?;
    drop(host);

    // pivot_root(".", "."): the old root ends up stacked on the new one
    // and is detached at once, so no host path stays reachable.
    rustix::process::pivot_root(".", ".").map_err(|e| annotate("pivot_root", e.into()))?;
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| annotate("detaching the host root", e.into()))?;
    std::env::set_current_dir("/").map_err(|e| annotate("chdir /", e))?;

    super::workspace::mount_workspace(&WorkspaceLayout::inside(cfg.lower_layers.len()))?;
    // After the workspace: a volume may be mounted below it.
    for v in &volumes {
        v.attach()?;
    }
    sys::mount_setattr(CWD, &cstr("/"), false, false, MOUNT_ATTR_RDONLY)
        .map_err(|e| annotate("making / read-only", e))?;
    Ok(())
}

fn build_dev(cfg: &InitConfig, host: &HostFds, sizes: &TmpfsSizes) -> io::Result<()> {
    mkdir("dev", 0o755)?;
    mount_fs(
        "tmpfs",
        "dev",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "mode=0755,size=64k",
    )?;
    for (name, fd) in &host.devices {
        let target = format!("dev/{name}");
        std::fs::File::create(&target).map_err(|e| annotate(format!("creating /{target}"), e))?;
        bind(fd, &target, 0)?;
    }
    mkdir("dev/pts", 0o755)?;
    let mut pts = String::from("newinstance,ptmxmode=0666,mode=0620");
    if let Some(gid) = cfg.idmap.tty_gid() {
        pts.push_str(&format!(",gid={gid}"));
    }
    mount_fs(
        "devpts",
        "dev/pts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        &pts,
    )?;
    mkdir("dev/shm", 0o1777)?;
    mount_fs(
        "tmpfs",
        "dev/shm",
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=1777,size={}k", sizes.shm_kib),
    )?;
    for (link, target) in [
        ("dev/ptmx", "pts/ptmx"),
        ("dev/fd", "/proc/self/fd"),
        ("dev/stdin", "/proc/self/fd/0"),
        ("dev/stdout", "/proc/self/fd/1"),
        ("dev/stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, link)
            .map_err(|e| annotate(format!("symlink /{link}"), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_mounts_stay_below_the_memory_limit() {
        let s = TmpfsSizes::for_memory(Some(128));
        assert_eq!((s.tmp_kib, s.shm_kib, s.root_kib), (32768, 16384, 16384));
        assert!(s.tmp_kib + s.shm_kib + s.root_kib <= 128 * 1024 / 2);
        let tiny = TmpfsSizes::for_memory(Some(1));
        assert_eq!(tiny.tmp_kib, 1024);
        let unlimited = TmpfsSizes::for_memory(None);
        assert!(unlimited.tmp_kib > 0 && unlimited.tmp_kib <= host_memory_kib() / 8);
    }
}
