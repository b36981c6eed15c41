//! Reaching a sandbox's TCP ports without changing its isolation: the
//! sandbox keeps a network namespace with only `lo`, and nothing is
//! published on the host. The hub makes its sockets *inside* that namespace
//! instead: a short-lived thread `setns()`es into it, creates the socket
//! (a socket belongs to the namespace it was created in, for good) or reads
//! `/proc/thread-self/net/tcp{,6}`, and exits. The tokio threads never
//! change namespace.
//!
//! The namespace is opened through `/proc/<shim pid>` as a directory fd:
//! once that process is gone, `openat` on the fd fails instead of reaching a
//! reused pid, and the shim's start time is checked through the same fd.
//! Nothing the sandbox can write is resolved.

use std::{
    io::{self, Read},
    os::fd::{AsRawFd, OwnedFd},
};

use rustix::fs::{self as rfs, Mode, OFlags};
use sandhub_api::hub::ListeningPort;

use super::{procfs, Launched};

/// An open handle on one sandbox's network namespace.
pub struct NetNs(OwnedFd);

/// The two sockets (IPv4 and IPv6) a connection may use, both made inside
/// the sandbox's namespace, not yet connected.
pub struct NsSockets {
    pub v4: std::net::TcpStream,
    pub v6: Option<std::net::TcpStream>,
}

impl NetNs {
    /// The network namespace of the sandbox `l` describes, if it still runs
    /// and has one of its own (a `network_host` sandbox shares the hub's,
    /// where "its" ports would be the host's: refused).
    /// Errors: `NotFound` when the sandbox's process is gone, `Unsupported`
    /// for a `network_host` sandbox.
    pub fn of(l: &Launched) -> io::Result<NetNs> {
        let gone = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("sandbox process {} is gone", l.shim_pid),
            )
        };
        let dir = rfs::open(
            format!("/proc/{}", l.shim_pid),
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
            Some(s) if s.start_time == l.start_time && s.is_running() => {}
            _ => return Err(gone()),
        }
        let ns = rfs::openat(
            &dir,
            "ns/net",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| gone())?;
        let own = rfs::stat("/proc/self/ns/net")?;
        let theirs = rfs::fstat(&ns)?;
        if (own.st_dev, own.st_ino) == (theirs.st_dev, theirs.st_ino) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the sandbox shares the host's network (network_host); connect to its ports directly",
            ));
        }
        Ok(NetNs(ns))
    }

    /// The namespace's fd (for the egress gateway's TUN device).
    pub fn fd(&self) -> &OwnedFd {
        &self.0
    }

    /// Runs `f` on a fresh thread that has entered this namespace.
    fn inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let fd = self.0.try_clone()?;
        std::thread::Builder::new()
            .name("sandhub-netns".into())
            .spawn(move || {
                // SAFETY: setns on this thread only; fd is a namespace fd we own.
                if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                f()
            })?
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
    }

    /// Unconnected non-blocking TCP sockets inside the namespace.
    pub fn sockets(&self) -> io::Result<NsSockets> {
        self.inside(|| {
            let v4 = tcp_socket(libc::AF_INET)?;
            // IPv6 may be disabled; then only IPv4 is tried.
            let v6 = tcp_socket(libc::AF_INET6).ok();
            Ok(NsSockets { v4, v6 })
        })
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
