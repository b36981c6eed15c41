//! Thin wrappers over the few syscalls neither std nor rustix covers (or
//! covers with the wrong process-wide semantics). Every `unsafe` block of
//! the local backend that is not about seccomp lives here.

use std::{
    ffi::CStr,
    io,
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicI32, Ordering},
};

/// Result of [`fork`].
pub(crate) enum Forked {
    Parent(i32),
    Child,
}

/// `fork(2)`. Only called from single-threaded processes (stage 1, the
/// shim, the sandbox's PID 1) or followed by async-signal-safe code only,
/// so the child never inherits a lock held by another thread.
pub(crate) fn fork() -> io::Result<Forked> {
    // SAFETY: callers uphold the single-threaded / async-signal-safe
    // contract described above; fork itself has no memory-safety
    // preconditions.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// `_exit(2)`: leaves without running atexit handlers or flushing stdio
/// buffers that belong to the parent's copy of the process.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// `waitpid(2)`, retried on EINTR. Returns the reaped pid and raw status.
pub(crate) fn waitpid(pid: i32, flags: i32) -> io::Result<(i32, i32)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r >= 0 {
            return Ok((r, status));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// The exit code a shell would report for a raw wait status.
pub(crate) fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

/// `kill(2)`; a process that is already gone is not an error.
pub(crate) fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(e)
    }
}

/// The target of [`forward_signal`]; 0 while unset.
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe and has no memory preconditions.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Makes `signals` be forwarded to `pid` (PID 1 forwards SIGTERM to
/// sandboxd, the shim forwards it to PID 1) so a graceful stop reaches the
/// daemon that knows how to drain.
pub(crate) fn forward_signals_to(pid: i32, signals: &[i32]) -> io::Result<()> {
    FORWARD_TO.store(pid, Ordering::Relaxed);
    for &sig in signals {
        set_handler(sig, forward_signal as *const () as libc::sighandler_t)?;
    }
    Ok(())
}

/// Ignores `sig` (SIG_IGN survives fork; exec resets only handled signals).
pub(crate) fn ignore_signal(sig: i32) -> io::Result<()> {
    set_handler(sig, libc::SIG_IGN)
}

/// Restores the default action of `sig`.
pub(crate) fn default_signal(sig: i32) -> io::Result<()> {
    set_handler(sig, libc::SIG_DFL)
}

fn set_handler(sig: i32, handler: libc::sighandler_t) -> io::Result<()> {
    // SAFETY: sigaction is plain data; zeroed is a valid initial value.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    // No SA_RESTART: waitpid loops want EINTR to re-check state.
    action.sa_flags = 0;
    // SAFETY: `action` is fully initialised and outlives the call; a null
    // old-action pointer is allowed.
    if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_PDEATHSIG, sig)`.
pub(crate) fn set_parent_death_signal(sig: i32) -> io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes plain integers.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `setsid(2)`: the shim leaves the hub's session and process group, so a
/// Ctrl-C or SIGHUP aimed at the hub never reaches a sandbox.
pub(crate) fn setsid() -> io::Result<()> {
    // SAFETY: setsid has no preconditions.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unshare(2)` with raw `CLONE_*` flags. Process-wide on purpose (rustix's
/// wrapper is per-thread for some flags); callers are single-threaded.
pub(crate) fn unshare(flags: i32) -> io::Result<()> {
    // SAFETY: unshare takes a plain integer; the caller is single-threaded,
    // as CLONE_NEWUSER requires.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Becomes uid/gid 0 of the current user namespace, for the whole process
/// (glibc's setres*id broadcast to all threads; there is only one).
pub(crate) fn become_root(drop_groups: bool) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    if unsafe { libc::setresgid(0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if drop_groups {
        // SAFETY: a zero-length list with a null pointer is allowed.
        if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: plain integer arguments.
    if unsafe { libc::setresuid(0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `dup2(2)` of `/dev/null` over `target`: drops the sync socket from the
/// stdio slot it came in on without leaving the slot empty.
pub(crate) fn null_over(target: i32) -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // SAFETY: both fds are valid; dup2 atomically replaces `target`.
    if unsafe { libc::dup2(null.as_raw_fd(), target) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fchdir(2)`.
pub(crate) fn fchdir(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: the fd is valid for the call's duration.
    if unsafe { libc::fchdir(fd.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `struct mount_attr` of `mount_setattr(2)` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `mount_setattr(dirfd, path, flags, {attr_set})`: sets mount flags, on
/// the whole tree when `recursive`. Unlike `MS_REMOUNT|MS_BIND` it leaves
/// every other (possibly locked) flag alone.
pub(crate) fn mount_setattr(
    dirfd: BorrowedFd<'_>,
    path: &CStr,
    empty_path: bool,
    recursive: bool,
    attr_set: u64,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = 0;
    if empty_path {
        flags |= libc::AT_EMPTY_PATH;
    }
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    // SAFETY: `path` is NUL-terminated, `attr` is a valid mount_attr whose
    // size we pass, and the fd is valid for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd.as_raw_fd(),
            path.as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The current process's effective uid and gid.
pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// `getpid(2)`.
pub(crate) fn getpid() -> i32 {
    std::process::id() as i32
}
