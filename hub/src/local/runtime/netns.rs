//! Reaching a sandbox's TCP ports without changing its isolation: the
//! sandbox keeps a network namespace with only `lo`, and nothing is
//! published on the host. The hub makes its sockets *inside* that namespace
//! instead: the calling thread `setns()`es into it, creates the socket (a
//! socket belongs to the namespace it was created in, for good) or reads
//! `/proc/thread-self/net/tcp{,6}`, and goes back to the hub's namespace
//! before anything else runs on it. If it could not go back, the hub aborts
//! rather than let that thread make another socket in the sandbox's network.
//! Entering in place costs two system calls; a thread of its own per
//! connection (as before) cost ~70 µs and two thread hand-offs on every dial
//! of the port proxy.
//!
//! The namespace is opened through `/proc/<shim pid>` as a directory fd:
//! once that process is gone, `openat` on the fd fails instead of reaching a
//! reused pid, and the shim's start time is checked through the same fd.
//! Nothing the sandbox can write is resolved.

use std::{
    io::{self, Read},
    os::fd::{AsRawFd, OwnedFd},
    sync::OnceLock,
};

use rustix::fs::{self as rfs, Mode, OFlags};
use sandhub_api::hub::ListeningPort;

use super::{procfs, Launched};

/// An open handle on one sandbox's network namespace.
pub struct NetNs(OwnedFd);

impl NetNs {
    /// The network namespace of the sandbox `l` describes, if it still runs
    /// and has one of its own (a `network_host` sandbox shares the hub's,
    /// where "its" ports would be the host's: refused).
    /// Errors: `NotFound` when the sandbox's process is gone, `Unsupported`
    /// for a `network_host` sandbox.
    pub fn of(l: &Launched) -> io::Result<NetNs> {
        Self::of_process(l.shim_pid, l.start_time)
    }

    /// As [`NetNs::of`], for the shim `pid` that started at `start_time`.
    pub fn of_process(pid: i32, start_time: u64) -> io::Result<NetNs> {
        let gone = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("sandbox process {pid} is gone"),
            )
        };
        let dir = rfs::open(
            format!("/proc/{pid}"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| gone())?;
        let stat = rfs::openat(
            &dir,
            "stat",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| gone())?;
        let mut raw = Vec::new();
        std::fs::File::from(stat)
            .read_to_end(&mut raw)
            .map_err(|_| gone())?;
        match procfs::parse_stat(&raw) {
            Some(s) if s.start_time == start_time && s.is_running() => {}
            _ => return Err(gone()),
        }
        let ns = rfs::openat(
            &dir,
            "ns/net",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| gone())?;
        let own = rfs::fstat(home()?)?;
        let theirs = rfs::fstat(&ns)?;
        if (own.st_dev, own.st_ino) == (theirs.st_dev, theirs.st_ino) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the sandbox shares the host's network (network_host); connect to its ports directly",
            ));
        }
        Ok(NetNs(ns))
    }

    /// A new network namespace holding only `lo`, of nobody's but this
    /// handle's (the egress probe's, and tests'): made by a short-lived
    /// thread that unshares, so no thread of the caller's moves.
    pub fn fresh() -> io::Result<NetNs> {
        use std::os::fd::FromRawFd;
        std::thread::Builder::new()
            .name("sandhub-netns-new".into())
            .spawn(|| {
                // SAFETY: unshare affects this short-lived thread only; the
                // fd opened is owned at once.
                unsafe {
                    if libc::unshare(libc::CLONE_NEWNET) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let fd = libc::open(
                        c"/proc/thread-self/ns/net".as_ptr(),
                        libc::O_RDONLY | libc::O_CLOEXEC,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(NetNs(OwnedFd::from_raw_fd(fd)))
                }
            })?
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
    }

    /// The namespace's fd (for the egress gateway's TUN device).
    pub fn fd(&self) -> &OwnedFd {
        &self.0
    }

    /// Runs `f` on this thread inside this namespace, then brings the
    /// thread back to the hub's own (see the module's notes). `f` must not
    /// block for long: it holds whichever thread called.
    fn inside<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let home = home()?;
        // SAFETY: setns on this thread only; a namespace fd we own. When it
        // fails the thread has not moved.
        if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let _back = GoHome(home);
        f()
    }

    /// An unconnected non-blocking TCP socket (`AF_INET` or `AF_INET6`)
    /// inside the namespace.
    pub fn socket(&self, family: libc::c_int) -> io::Result<std::net::TcpStream> {
        self.inside(|| tcp_socket(family))
    }

    /// The TCP sockets listening in the namespace, one entry per port
    /// (IPv4 first), sorted by port.
    pub fn listening(&self) -> io::Result<Vec<ListeningPort>> {
        let (v4, v6) = self.inside(|| {
            let v4 = std::fs::read_to_string("/proc/thread-self/net/tcp")?;
            let v6 = std::fs::read_to_string("/proc/thread-self/net/tcp6").unwrap_or_default();
            Ok((v4, v6))
        })?;
        Ok(sandhub_api::proc_net::listening(&v4, &v6))
    }
}

/// The hub's own network namespace: that of its main thread, which never
/// leaves it (`/proc/self` is the thread group's leader, whichever thread
/// asks). Opened once.
fn home() -> io::Result<&'static OwnedFd> {
    static HOME: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = HOME.get() {
        return Ok(fd);
    }
    let fd = rfs::open(
        "/proc/self/ns/net",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(HOME.get_or_init(|| fd))
}

/// Brings the thread back to the hub's namespace when dropped, `f` panicking
/// or not.
struct GoHome(&'static OwnedFd);

impl Drop for GoHome {
    fn drop(&mut self) {
        // setns into a namespace we hold open, with the rights we just used
        // to leave it, does not fail short of a kernel out of memory. A
        // thread that stayed in a sandbox's network would make the hub's
        // next socket there: not worth the risk of running on.
        for _ in 0..3 {
            // SAFETY: setns on this thread only; a namespace fd we own.
            if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
                return;
            }
        }
        let e = io::Error::last_os_error();
        tracing::error!(error = %e, "could not return a thread to the hub's network namespace; aborting");
        std::process::abort();
    }
}

fn tcp_socket(family: libc::c_int) -> io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2); the fd is owned by the TcpStream at once.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { std::net::TcpStream::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    /// `SIOCGSKNS` (linux/sockios.h): an fd of the network namespace a
    /// socket belongs to.
    const SIOCGSKNS: libc::c_ulong = 0x894C;

    fn ino(fd: &impl std::os::fd::AsFd) -> (u64, u64) {
        let st = rfs::fstat(fd).unwrap();
        (st.st_dev, st.st_ino)
    }

    fn this_threads_ns() -> (u64, u64) {
        let st = rfs::stat("/proc/thread-self/ns/net").unwrap();
        (st.st_dev, st.st_ino)
    }

    fn fresh_namespace() -> NetNs {
        NetNs::fresh().expect("a new network namespace (needs root)")
    }

    #[test]
    fn sockets_are_made_in_the_sandboxs_namespace_and_the_thread_comes_home() {
        let ns = fresh_namespace();
        let home_before = this_threads_ns();
        assert_eq!(
            home_before,
            ino(home().unwrap()),
            "the test runs in the hub's namespace"
        );
        assert_ne!(ino(&ns.0), home_before);

        let v4 = ns.socket(libc::AF_INET).unwrap();
        assert_eq!(this_threads_ns(), home_before, "the thread went back");
        // IPv6 may be disabled on the test's machine.
        let v6 = ns.socket(libc::AF_INET6).ok();
        assert_eq!(this_threads_ns(), home_before);
        for socket in std::iter::once(&v4).chain(v6.as_ref()) {
            // SAFETY: an ioctl that returns a new fd or -1.
            let fd = unsafe { libc::ioctl(socket.as_raw_fd(), SIOCGSKNS) };
            assert!(fd >= 0, "{}", io::Error::last_os_error());
            let theirs = unsafe { OwnedFd::from_raw_fd(fd) };
            assert_eq!(ino(&theirs), ino(&ns.0), "the socket is the sandbox's");
        }
        // What listens there is read there too, and the thread comes back.
        assert_eq!(ns.listening().unwrap(), Vec::new());
        assert_eq!(this_threads_ns(), home_before);
    }

    #[test]
    fn a_thread_that_cannot_enter_stays_home() {
        let home_before = this_threads_ns();
        let not_a_namespace =
            NetNs(rfs::open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap());
        assert!(not_a_namespace.socket(libc::AF_INET).is_err());
        assert_eq!(this_threads_ns(), home_before);
    }

    #[test]
    fn a_panic_inside_still_brings_the_thread_home() {
        let ns = fresh_namespace();
        let home_before = this_threads_ns();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ns.inside(|| -> io::Result<()> { panic!("inside the sandbox's namespace") })
        }));
        assert!(caught.is_err());
        assert_eq!(this_threads_ns(), home_before);
    }
}
