//! Reaps the shims this hub started.
//!
//! Stage 1 stays on as its sandbox's shim: that spares a fork on every
//! cold create (0.3-0.5 ms each on the development VM, issue #34 §4). So a
//! running sandbox's shim is a child of the hub that started it, and it
//! must be waited for once it exits. Until then it is a zombie: `is_alive`
//! already reads a zombie as dead, but its pid would stay taken.
//!
//! One thread for the whole process, started with the first shim, polls a
//! pidfd per shim (a pidfd turns readable when its process exits) and
//! reaps the ones that did. A new shim wakes it through an eventfd. The
//! shims of an earlier hub are not this process's children: init (or a
//! subreaper) reaps them, and `is_alive` goes by `/proc` as for any other.
//! Where pidfds or the thread are unavailable, a shim gets a small thread
//! of its own that blocks in `wait`.

use std::{
    io,
    os::fd::OwnedFd,
    process::Child,
    sync::{Mutex, OnceLock},
};

use rustix::{
    event::{eventfd, poll, EventfdFlags, PollFd, PollFlags},
    process::{pidfd_open, Pid, PidfdFlags},
};

/// Stack of a thread that only waits for one child.
const WAITER_STACK: usize = 64 * 1024;

/// The process's reaper: shims handed over and not yet watched, and the
/// eventfd that tells its thread about them.
struct Reaper {
    handed: Mutex<Vec<Child>>,
    wake: OwnedFd,
}

/// Hands `child` (a shim: a launched sandbox's stage 1) over to be reaped
/// once it exits. Never blocks on the child.
pub(super) fn adopt(child: Child) {
    match reaper() {
        Some(r) => {
            r.handed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(child);
            if let Err(e) = rustix::io::write(&r.wake, &1u64.to_ne_bytes()) {
                tracing::warn!(error = %e, "waking the shim reaper");
            }
        }
        None => wait_on_thread(child),
    }
}

fn reaper() -> Option<&'static Reaper> {
    static REAPER: OnceLock<Option<&'static Reaper>> = OnceLock::new();
    *REAPER.get_or_init(|| match start() {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "no shim reaper thread: one waiting thread per shim");
            None
        }
    })
}

fn start() -> io::Result<&'static Reaper> {
    let wake = eventfd(0, EventfdFlags::CLOEXEC)?;
    let r: &'static Reaper = Box::leak(Box::new(Reaper {
        handed: Mutex::new(Vec::new()),
        wake,
    }));
    std::thread::Builder::new()
        .name("sandhub-reaper".into())
        .stack_size(WAITER_STACK)
        .spawn(move || run(r))?;
    Ok(r)
}

fn run(r: &'static Reaper) -> ! {
    let mut watched: Vec<(Child, OwnedFd)> = Vec::new();
    loop {
        let handed: Vec<Child> = std::mem::take(
            &mut *r
                .handed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for child in handed {
            // A child that exited is still a zombie here (only we reap it),
            // so its pidfd opens, and reads as readable at once.
            match pidfd_open(Pid::from_child(&child), PidfdFlags::empty()) {
                Ok(fd) => watched.push((child, fd)),
                Err(_) => wait_on_thread(child),
            }
        }
        let exited = match wait_for_exits(&r.wake, &watched) {
            Ok(exited) => exited,
            Err(e) => {
                tracing::warn!(error = %e, "the shim reaper's poll failed");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        let mut i = 0;
        watched.retain_mut(|(child, _)| {
            let readable = exited.get(i).copied().unwrap_or(false);
            i += 1;
            // Readable means exited; try_wait reaps it without blocking.
            !readable || matches!(child.try_wait(), Ok(None))
        });
    }
}

/// Blocks until a watched shim exits or a new one is handed over; returns
/// which of `watched` are readable.
fn wait_for_exits(wake: &OwnedFd, watched: &[(Child, OwnedFd)]) -> io::Result<Vec<bool>> {
    let mut fds: Vec<PollFd<'_>> = std::iter::once(wake)
        .chain(watched.iter().map(|(_, fd)| fd))
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    match poll(&mut fds, None) {
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Ok(vec![false; watched.len()]),
        Err(e) => return Err(e.into()),
    }
    if !fds[0].revents().is_empty() {
        let mut counter = [0u8; 8];
        rustix::io::read(wake, &mut counter)?;
    }
    Ok(fds[1..].iter().map(|f| !f.revents().is_empty()).collect())
}

fn wait_on_thread(mut child: Child) {
    let waited = std::thread::Builder::new()
        .name("sandhub-reap-1".into())
        .stack_size(WAITER_STACK)
        .spawn(move || {
            let _ = child.wait();
        });
    if let Err(e) = waited {
        tracing::warn!(error = %e, "no thread to reap a shim: it stays a zombie until the hub exits");
    }
}

#[cfg(test)]
mod tests {
    use std::{
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use super::*;

    /// The state letter of `pid` in /proc, or None once it is reaped.
    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    fn gone_within(pid: u32, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if state(pid).is_none() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn children_are_reaped_when_they_exit_and_not_before() {
        let spawn = |secs: &str| {
            Command::new("sleep")
                .arg(secs)
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sleep")
        };
        // One already exited (a zombie when handed over), one exiting
        // soon, one that outlives the test's look.
        let quick = spawn("0");
        let quick_pid = quick.id();
        while state(quick_pid) != Some('Z') {
            std::thread::sleep(Duration::from_millis(2));
        }
        let soon = spawn("0.3");
        let soon_pid = soon.id();
        let long = spawn("30");
        let long_pid = long.id();
        adopt(quick);
        adopt(soon);
        assert!(
            gone_within(quick_pid, Duration::from_secs(5)),
            "zombie not reaped"
        );
        assert!(
            gone_within(soon_pid, Duration::from_secs(5)),
            "exit not reaped"
        );
        assert!(
            state(long_pid).is_some_and(|s| s != 'Z'),
            "a running child was touched"
        );
        // Killed after it was handed over: reaped too. The pidfd, opened
        // while we still hold the child, pins it for the kill.
        let long_pidfd = pidfd_open(Pid::from_child(&long), PidfdFlags::empty()).unwrap();
        adopt(long);
        rustix::process::pidfd_send_signal(&long_pidfd, rustix::process::Signal::KILL).unwrap();
        assert!(
            gone_within(long_pid, Duration::from_secs(5)),
            "killed child not reaped"
        );
    }
}
