//! The signals that stop sandboxd: SIGTERM or SIGINT, as for every Sandhub
//! server, except that as its PID namespace's init (a sandbox's PID 1, a
//! Pod's first process) only those sent from outside the namespace count.
//!
//! The kernel already drops what a workload sends its init for signals the
//! init does not handle, which is why a workload's `kill -9 -1` or
//! `kill -9 1` passes sandboxd over. A handled SIGTERM is delivered from
//! anyone, though, so before this a workload's `kill 1` drained and ended
//! its own sandbox.
//!
//! A `kill(2)` carries its sender's pid in `si_pid`, written by the kernel
//! as this namespace sees the sender: 0 for one in an ancestor namespace
//! (the hub's shim, containerd, the kubelet), which no workload can reach.
//! So as init only `SI_USER` with `si_pid` 0 counts. Every other kind can
//! come from a workload: `sigqueue`/`rt_sigqueueinfo` (`SI_QUEUE` and the
//! like) take `si_pid` as the caller wrote it, `tgkill` names its sender,
//! and the kernel's own codes (`SI_KERNEL`, the `POLL_*` of an fd whose
//! `F_SETOWN` a workload pointed at PID 1) do not say who asked.

use std::{
    io,
    os::{fd::AsRawFd, unix::net::UnixStream as StdStream},
};

use sandhub_common::{StopSignals, Terminated};
use signal_hook_registry::SigId;
use tokio::{io::AsyncReadExt, net::UnixStream};

/// What stops sandboxd.
pub enum Stop {
    /// Not an init: any SIGTERM or SIGINT.
    Any(StopSignals),
    /// An init: those from outside its PID namespace.
    FromOutside(FromOutside),
}

impl Stop {
    /// Installs the handlers (before binding, as [`StopSignals::install`]
    /// says why), choosing by whether this process is PID 1.
    pub fn install() -> io::Result<Stop> {
        if crate::process::is_init() {
            FromOutside::install().map(Stop::FromOutside)
        } else {
            StopSignals::install().map(Stop::Any)
        }
    }

    /// Resolves at the first signal that counts.
    pub async fn recv(self) -> Terminated {
        match self {
            Stop::Any(signals) => signals.recv().await,
            Stop::FromOutside(mut signals) => signals.recv().await,
        }
    }
}

/// SIGTERM and SIGINT from outside this PID namespace: the handler writes
/// each one that counts to a socket pair this end reads.
pub struct FromOutside {
    read: UnixStream,
    handlers: Vec<SigId>,
}

impl FromOutside {
    pub fn install() -> io::Result<FromOutside> {
        let (write, read) = StdStream::pair()?;
        write.set_nonblocking(true)?;
        read.set_nonblocking(true)?;
        let mut this = FromOutside {
            read: UnixStream::from_std(read)?,
            handlers: Vec::new(),
        };
        for sig in [libc::SIGTERM, libc::SIGINT] {
            let write = write.try_clone()?;
            let handler = move |info: &libc::siginfo_t| {
                if !sent_from_inside(info) {
                    let byte = sig as u8;
                    // SAFETY: write(2) is async-signal-safe; a full socket
                    // (a signal is pending already) drops this one.
                    unsafe { libc::write(write.as_raw_fd(), (&raw const byte).cast(), 1) };
                }
            };
            // SAFETY: the handler only reads the siginfo and calls write(2),
            // both async-signal-safe; it allocates and locks nothing.
            let id = unsafe { signal_hook_registry::register_sigaction(sig, handler) }?;
            this.handlers.push(id);
        }
        Ok(this)
    }

    async fn recv(&mut self) -> Terminated {
        let mut byte = [0u8];
        match self.read.read(&mut byte).await {
            Ok(1) if i32::from(byte[0]) == libc::SIGINT => Terminated::Sigint,
            Ok(1) => Terminated::Sigterm,
            // The write end lives in the handlers, which live as long as
            // this: EOF or an error cannot happen; wait on rather than
            // stop unasked.
            _ => std::future::pending().await,
        }
    }
}

impl Drop for FromOutside {
    fn drop(&mut self) {
        for id in self.handlers.drain(..) {
            signal_hook_registry::unregister(id);
        }
    }
}

/// Whether the signal may have come from inside this PID namespace: all
/// but a `kill(2)` whose sender the namespace cannot see (see the notes).
fn sent_from_inside(info: &libc::siginfo_t) -> bool {
    // SAFETY: SI_USER's siginfo has si_pid, filled by the kernel.
    info.si_code != libc::SI_USER || unsafe { info.si_pid() } != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // One test: the handlers are process-wide, and `Stop::install` in a
    // parallel test would see these signals.
    #[tokio::test]
    async fn only_a_kill_from_outside_the_namespace_stops_an_init() {
        let mut signals = FromOutside::install().unwrap();
        // `raise` is a tgkill naming this process, which sees itself, as a
        // workload is seen in the sandbox's namespace.
        // SAFETY: raise only sends a signal to this thread.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert_eq!(unsafe { libc::raise(libc::SIGINT) }, 0);
        // A forged sender: sigqueue's si_pid is whatever its caller wrote,
        // and the kernel's own codes name none.
        for code in [libc::SI_QUEUE, libc::SI_KERNEL] {
            assert_eq!(
                queue(libc::SIGTERM, code),
                0,
                "{}",
                io::Error::last_os_error()
            );
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(100), signals.recv())
                .await
                .is_err(),
            "a signal a workload could send stopped it"
        );
        // A kill from an ancestor namespace: SI_USER with si_pid 0. Only
        // the kernel writes that for another process; to itself a process
        // may queue any siginfo, which stands in for the shim's kill here.
        assert_eq!(
            queue(libc::SIGINT, libc::SI_USER),
            0,
            "{}",
            io::Error::last_os_error()
        );
        let got = tokio::time::timeout(Duration::from_secs(5), signals.recv()).await;
        assert_eq!(
            got.expect("the outside signal stops it"),
            Terminated::Sigint
        );
    }

    /// `rt_sigqueueinfo` to this process, with `code` and no sender's pid.
    /// The kernel takes a code it would write itself only from a caller
    /// naming its own thread, so the target is this thread's id (the
    /// signal still goes to the whole process).
    fn queue(sig: i32, code: i32) -> libc::c_long {
        // SAFETY: siginfo_t is plain data; zeroed is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        info.si_signo = sig;
        info.si_code = code;
        // SAFETY: rt_sigqueueinfo reads `info`, which outlives the call.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigqueueinfo,
                libc::gettid(),
                sig,
                &raw const info,
            )
        }
    }
}
