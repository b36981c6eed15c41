//! What this host offers the local backend, feature by feature, with a
//! message that says what exactly is missing.
//!
//! The namespace checks are real: a forked child unshares a user and mount
//! namespace, maps its own id, mounts an overlay (with `userxattr`, as the
//! workspace does) and clones a read-only bind with the new mount API.
//! The cgroup check prepares `<mount>/sandhub`, as launching would.

use std::{
    ffi::CString,
    io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::{cgroup, sys};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub ok: bool,
    /// What works, or exactly what is missing.
    pub detail: String,
}

impl Check {
    fn ok(detail: impl Into<String>) -> Self {
        Check {
            ok: true,
            detail: detail.into(),
        }
    }
    fn missing(detail: impl Into<String>) -> Self {
        Check {
            ok: false,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HostSupport {
    /// Running as root: full id range, cgroups anywhere.
    pub root: bool,
    pub user_namespaces: Check,
    pub overlay_in_userns: Check,
    /// `open_tree`/`move_mount`/`mount_setattr` (Linux 5.12).
    pub mount_api: Check,
    pub seccomp: Check,
    pub cgroup_v2: Check,
    pub cgroup_v1: Check,
}

impl HostSupport {
    /// The first missing feature that makes launching impossible, as
    /// (feature, detail).
    pub fn blocker(&self) -> Option<(&'static str, String)> {
        [
            ("user namespaces", &self.user_namespaces),
            ("overlayfs in a user namespace", &self.overlay_in_userns),
            ("the new mount API", &self.mount_api),
            ("seccomp filters", &self.seccomp),
        ]
        .into_iter()
        .find(|(_, c)| !c.ok)
        .map(|(f, c)| (f, c.detail.clone()))
    }

    /// Whether some cgroup version can enforce memory, pids and cpu limits.
    pub fn cgroup_limits(&self) -> bool {
        self.cgroup_v1.ok || self.cgroup_v2.ok
    }

    /// One line per feature, for `sandhub serve` to log at startup.
    pub fn lines(&self) -> Vec<String> {
        let mark = |c: &Check| if c.ok { "ok" } else { "MISSING" };
        [
            ("user namespaces", &self.user_namespaces),
            ("overlayfs in userns", &self.overlay_in_userns),
            ("mount API", &self.mount_api),
            ("seccomp", &self.seccomp),
            ("cgroup v2", &self.cgroup_v2),
            ("cgroup v1", &self.cgroup_v1),
        ]
        .into_iter()
        .map(|(name, c)| format!("{name}: {} ({})", mark(c), c.detail))
        .collect()
    }
}

/// Probes this host, using a scratch directory under the system temp dir.
pub fn probe() -> HostSupport {
    probe_at(&std::env::temp_dir())
}

/// Probes with scratch files under `dir` (use the state dir: the overlay
/// check then runs on the filesystem real workspaces will use).
pub fn probe_at(dir: &Path) -> HostSupport {
    let (uid, _) = sys::effective_ids();
    let (user_namespaces, overlay_in_userns, mount_api) = match namespace_probe(dir) {
        Ok(r) => r,
        Err(e) => {
            let c = Check::missing(format!("probe could not run: {e}"));
            (c.clone(), c.clone(), c)
        }
    };
    let (_, findings) = cgroup::detect();
    let as_check = |r: &Result<(), String>, what: &str| match r {
        Ok(()) => Check::ok(format!("{what}: memory, pids and cpu controllers usable")),
        Err(e) => Check::missing(e.clone()),
    };
    HostSupport {
        root: uid == 0,
        user_namespaces,
        overlay_in_userns,
        mount_api,
        seccomp: seccomp_check(),
        cgroup_v2: as_check(&findings.v2, "cgroup v2"),
        cgroup_v1: as_check(&findings.v1, "cgroup v1"),
    }
}

fn seccomp_check() -> Check {
    // SAFETY: PR_GET_SECCOMP takes no pointers.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } < 0 {
        return Check::missing("the kernel is built without CONFIG_SECCOMP");
    }
    match std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail") {
        Ok(a) if a.contains("errno") && a.contains("kill_process") => {
            Check::ok("filter mode with errno and kill_process actions")
        }
        Ok(a) => Check::missing(format!(
            "seccomp lacks the errno or kill_process action (has: {})",
            a.trim()
        )),
        Err(_) => Check::missing(
            "no /proc/sys/kernel/seccomp/actions_avail: kernel older than 4.14 or \
             without CONFIG_SECCOMP_FILTER",
        ),
    }
}

/// Stages of the forked probe, reported with errno through a pipe.
const STAGE_UNSHARE: u32 = 1;
const STAGE_MAP: u32 = 2;
const STAGE_PRIVATE: u32 = 3;
const STAGE_OVERLAY: u32 = 4;
const STAGE_OPEN_TREE: u32 = 5;
const STAGE_SETATTR: u32 = 6;
const STAGE_DONE: u32 = 100;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn namespace_probe(dir: &Path) -> io::Result<(Check, Check, Check)> {
    let scratch = Scratch(dir.join(format!(".sandhub-probe-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    for sub in ["l", "u", "w", "m"] {
        std::fs::create_dir_all(scratch.0.join(sub))?;
    }
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (uid, gid) = sys::effective_ids();
    // Everything the child touches is prepared here: after fork in a
    // multi-threaded caller only raw syscalls are safe.
    let uid_map = CString::new(format!("0 {uid} 1")).map_err(io::Error::other)?;
    let gid_map = CString::new(format!("0 {gid} 1")).map_err(io::Error::other)?;
    let opts = CString::new(format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        scratch.0.join("l").display(),
        scratch.0.join("u").display(),
        scratch.0.join("w").display()
    ))
    .map_err(io::Error::other)?;
    let target = c(&scratch.0.join("m"))?;
    let lower = c(&scratch.0.join("l"))?;
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the child runs only async-signal-safe syscalls on data
    // prepared above and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing our own pipe fds.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        return Err(e);
    }
    if pid == 0 {
        probe_child(wr, &uid_map, &gid_map, &opts, &target, &lower)
    }
    // SAFETY: closing the parent's copy of the write end.
    unsafe { libc::close(wr) };
    let mut report = [0u8; 8];
    // SAFETY: reading into a local buffer of the given size.
    let n = unsafe { libc::read(rd, report.as_mut_ptr().cast(), report.len()) };
    // SAFETY: closing our read end.
    unsafe { libc::close(rd) };
    let _ = sys::waitpid(pid, 0);
    let (stage, errno) = if n == 8 {
        (
            u32::from_le_bytes(report[..4].try_into().unwrap_or_default()),
            i32::from_le_bytes(report[4..].try_into().unwrap_or_default()),
        )
    } else {
        (0, 0)
    };
    let err = io::Error::from_raw_os_error(errno);
    let skipped = || Check::missing("not checked: user namespaces are unavailable");
    Ok(match stage {
        STAGE_DONE => (
            Check::ok("unshare(CLONE_NEWUSER|CLONE_NEWNS) and id maps work"),
            Check::ok("overlay with userxattr mounts inside a user namespace"),
            Check::ok("open_tree + mount_setattr work"),
        ),
        STAGE_UNSHARE => (
            Check::missing(format!(
                "unshare(CLONE_NEWUSER|CLONE_NEWNS) failed: {err}; check \
                 /proc/sys/user/max_user_namespaces (must be > 0), \
                 kernel.unprivileged_userns_clone (Debian) and \
                 kernel.apparmor_restrict_unprivileged_userns (Ubuntu)"
            )),
            skipped(),
            skipped(),
        ),
        STAGE_MAP | STAGE_PRIVATE => (
            Check::missing(format!(
                "writing the id maps of a new user namespace failed: {err}"
            )),
            skipped(),
            skipped(),
        ),
        STAGE_OVERLAY => (
            Check::ok("unshare(CLONE_NEWUSER|CLONE_NEWNS) and id maps work"),
            Check::missing(format!(
                "mounting overlayfs with userxattr inside a user namespace failed: {err} \
                 (needs Linux 5.11+ and user xattrs on {})",
                dir.display()
            )),
            Check::missing("not checked: overlay failed first"),
        ),
        STAGE_OPEN_TREE | STAGE_SETATTR => (
            Check::ok("unshare(CLONE_NEWUSER|CLONE_NEWNS) and id maps work"),
            Check::ok("overlay with userxattr mounts inside a user namespace"),
            Check::missing(format!(
                "{} failed: {err} (needs Linux 5.12+)",
                if stage == STAGE_OPEN_TREE {
                    "open_tree(OPEN_TREE_CLONE)"
                } else {
                    "mount_setattr"
                }
            )),
        ),
        _ => {
            let c = Check::missing("the probe child died without reporting");
            (c.clone(), c.clone(), c)
        }
    })
}

/// The forked probe. Only raw syscalls on prepared data; never returns.
fn probe_child(
    report: i32,
    uid_map: &CString,
    gid_map: &CString,
    opts: &CString,
    target: &CString,
    lower: &CString,
) -> ! {
    // SAFETY: every pointer passed below refers to live NUL-terminated or
    // sized data; nothing allocates; the process leaves through _exit.
    unsafe {
        let done = |stage: u32, errno: i32| -> ! {
            let mut buf = [0u8; 8];
            buf[..4].copy_from_slice(&stage.to_le_bytes());
            buf[4..].copy_from_slice(&errno.to_le_bytes());
            libc::write(report, buf.as_ptr().cast(), 8);
            libc::_exit(0)
        };
        let errno = || *libc::__errno_location();
        let write_file = |path: &[u8], data: &[u8]| -> bool {
            let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return false;
            }
            let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
            libc::close(fd);
            ok
        };
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
            done(STAGE_UNSHARE, errno());
        }
        if !write_file(b"/proc/self/setgroups\0", b"deny")
            || !write_file(b"/proc/self/uid_map\0", uid_map.as_bytes())
            || !write_file(b"/proc/self/gid_map\0", gid_map.as_bytes())
        {
            done(STAGE_MAP, errno());
        }
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            done(STAGE_PRIVATE, errno());
        }
        if libc::mount(
            c"overlay".as_ptr(),
            target.as_ptr(),
            c"overlay".as_ptr(),
            0,
            opts.as_ptr().cast(),
        ) != 0
        {
            done(STAGE_OVERLAY, errno());
        }
        let tree = libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            lower.as_ptr(),
            1u32 /* OPEN_TREE_CLONE */ | libc::O_CLOEXEC as u32,
        );
        if tree < 0 {
            done(STAGE_OPEN_TREE, errno());
        }
        let attr: [u64; 4] = [sys::MOUNT_ATTR_RDONLY, 0, 0, 0];
        if libc::syscall(
            libc::SYS_mount_setattr,
            tree as i32,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as u32,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        ) != 0
        {
            done(STAGE_SETATTR, errno());
        }
        done(STAGE_DONE, 0)
    }
}
