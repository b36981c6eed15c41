//! The sandbox's only way out: a TUN device made inside its network
//! namespace, whose fd the hub keeps.
//!
//! A short-lived thread `setns()`es into the namespace (the hub's tokio
//! threads never change namespace), opens `/dev/net/tun` (a path of the
//! host's mount namespace: the thread changed only its network namespace),
//! names the device [`IFNAME`], gives it [`internal::SANDBOX`]/16, brings it
//! up and points the default route at it, all with plain ioctls on a
//! socket made in the namespace.
//!
//! The device is not persistent: when the hub closes the fd (it stops the
//! gateway, or dies), the kernel removes the device and its routes, and
//! the sandbox is offline: it fails closed. A running gateway holds its fd
//! as a [`TunFd`], which does that close off the event loop.

use std::{
    io,
    net::Ipv4Addr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use crate::policy::internal;

/// The device's name inside the sandbox.
pub const IFNAME: &str = "egress0";
/// Its MTU, the largest IPv4 packet; the user-space stack uses the same,
/// so TCP segments are about 64 KiB (MSS 65495) both ways. The link exists
/// only between the sandbox's kernel and this process, so nothing on a
/// real wire limits it, and the gateway's cost is per packet (TUN reads
/// and writes, wake-ups: 86% of its samples in a profile at 1500). A
/// 256 MiB download through the gateway ran at 0.03-0.16x of the host's
/// at 1500, about 0.3-0.4x at 9000 and 0.55-0.62x at 65535 (`bench/`,
/// phase `egress`; docs/benchmarks.md).
pub const MTU: usize = 65535;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// `struct ifreq`: a name and a 24-byte union, of which we use the
/// address, the flags and the MTU.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new() -> Self {
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        r.name[..IFNAME.len()].copy_from_slice(IFNAME.as_bytes());
        r
    }

    fn with_short(v: libc::c_short) -> Self {
        let mut r = Self::new();
        r.data[..2].copy_from_slice(&v.to_ne_bytes());
        r
    }

    fn with_int(v: libc::c_int) -> Self {
        let mut r = Self::new();
        r.data[..4].copy_from_slice(&v.to_ne_bytes());
        r
    }

    fn with_addr(a: Ipv4Addr) -> Self {
        let mut r = Self::new();
        let sin = sockaddr_in(a);
        // SAFETY: sockaddr_in is 16 plain bytes, the union holds 24.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&sin as *const libc::sockaddr_in).cast::<u8>(),
                std::mem::size_of::<libc::sockaddr_in>(),
            )
        };
        r.data[..bytes.len()].copy_from_slice(bytes);
        r
    }
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// A TUN device's fd that, dropped inside a tokio runtime, is closed on
/// the runtime's blocking pool.
///
/// Closing the last fd of a TUN device unregisters the device, and the
/// kernel waits out RCU grace periods inside that `close` (six
/// `synchronize_rcu_expedited` and an `rcu_barrier` per device in a
/// `perf` of the hub). A gateway is dropped when its sandbox stops, on an
/// event-loop thread: each close stalled that thread, and every request
/// it was serving, for milliseconds (docs/benchmarks.md, issue #34 §0).
/// The sandbox is already offline once the gateway's loop is gone
/// (nothing reads the device), so a later close changes nothing it can
/// reach.
pub(crate) struct TunFd(Option<OwnedFd>);

impl TunFd {
    pub(crate) fn new(fd: OwnedFd) -> Self {
        TunFd(Some(fd))
    }
}

impl AsRawFd for TunFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        // Some until drop: only Drop takes it.
        self.0.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }
}

impl Drop for TunFd {
    fn drop(&mut self) {
        let Some(fd) = self.0.take() else { return };
        // Outside a runtime (or once it shuts down, when the pool drops
        // the closure unrun) the fd closes here, as a plain drop would.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn_blocking(move || drop(fd)));
        }
    }
}

/// What the gateway holds inside one sandbox's namespace.
pub struct Device {
    /// The TUN device's fd (non-blocking).
    pub tun: OwnedFd,
    /// A UDP socket bound to `127.0.0.1:53` inside the namespace, so a
    /// workload whose `/etc/resolv.conf` names no server (glibc and musl
    /// then ask the local machine: typical of container images, whose
    /// `/etc` is their own) still reaches the gateway's responder. `None`
    /// when the port was taken.
    pub loopback_dns: Option<std::net::UdpSocket>,
}

/// Makes and configures the device inside the namespace `netns` (an fd
/// of `/proc/<pid>/ns/net`), and the loopback DNS socket.
pub fn create_in(netns: &OwnedFd) -> io::Result<Device> {
    let ns = netns.try_clone()?;
    std::thread::Builder::new()
        .name("sandhub-egress-tun".into())
        .spawn(move || {
            // SAFETY: setns on this thread only, with a namespace fd we own.
            check(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                "setns",
            )?;
            let tun = create_here()?;
            // The hub attaches while the sandbox is still starting, maybe
            // before its init brings `lo` up (which gives it 127.0.0.1);
            // up twice is harmless.
            let _ = loopback_up();
            let loopback_dns = std::net::UdpSocket::bind("127.0.0.1:53")
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .ok();
            Ok(Device { tun, loopback_dns })
        })?
        .join()
        .map_err(|_| io::Error::other("the TUN thread panicked"))?
}

/// Brings `lo` up in the current thread's network namespace (a new one
/// starts with it down, and many programs expect 127.0.0.1 to work); a
/// sandbox's init calls it too, and up twice is harmless.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes plain integers; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; zeroed is valid (empty name, no flags).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS, which
    // read and write only its name and flags.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The same in the current thread's network namespace.
fn create_here() -> io::Result<OwnedFd> {
    // SAFETY: plain syscalls; every fd is owned at once.
    unsafe {
        let fd = libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        );
        check(fd, "opening /dev/net/tun")?;
        let tun = OwnedFd::from_raw_fd(fd);
        let mut req = IfReq::with_short((libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short);
        check(
            libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req),
            "TUNSETIFF",
        )?;
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(s, "socket")?;
        let sock = OwnedFd::from_raw_fd(s);
        let s = sock.as_raw_fd();
        let mut r = IfReq::with_addr(internal::SANDBOX);
        check(libc::ioctl(s, libc::SIOCSIFADDR, &mut r), "SIOCSIFADDR")?;
        let mask = Ipv4Addr::from(u32::MAX << (32 - internal::PREFIX as u32));
        let mut r = IfReq::with_addr(mask);
        check(
            libc::ioctl(s, libc::SIOCSIFNETMASK, &mut r),
            "SIOCSIFNETMASK",
        )?;
        let mut r = IfReq::with_int(MTU as libc::c_int);
        check(libc::ioctl(s, libc::SIOCSIFMTU, &mut r), "SIOCSIFMTU")?;
        let mut r = IfReq::with_short((libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short);
        check(libc::ioctl(s, libc::SIOCSIFFLAGS, &mut r), "SIOCSIFFLAGS")?;
        // default via the gateway's address, on the device.
        let mut name = *b"egress0\0";
        let mut rt: libc::rtentry = std::mem::zeroed();
        let any = sockaddr_in(Ipv4Addr::UNSPECIFIED);
        let gw = sockaddr_in(internal::GATEWAY);
        std::ptr::copy_nonoverlapping(
            (&any as *const libc::sockaddr_in).cast::<u8>(),
            (&mut rt.rt_dst as *mut libc::sockaddr).cast::<u8>(),
            std::mem::size_of::<libc::sockaddr_in>(),
        );
        std::ptr::copy_nonoverlapping(
            (&any as *const libc::sockaddr_in).cast::<u8>(),
            (&mut rt.rt_genmask as *mut libc::sockaddr).cast::<u8>(),
            std::mem::size_of::<libc::sockaddr_in>(),
        );
        std::ptr::copy_nonoverlapping(
            (&gw as *const libc::sockaddr_in).cast::<u8>(),
            (&mut rt.rt_gateway as *mut libc::sockaddr).cast::<u8>(),
            std::mem::size_of::<libc::sockaddr_in>(),
        );
        rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        rt.rt_dev = name.as_mut_ptr().cast();
        check(
            libc::ioctl(s, libc::SIOCADDRT, &mut rt),
            "adding the default route",
        )?;
        Ok(tun)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `/proc/self/fd/{fd}` names: a pipe's inode while it is open.
    fn names(fd: std::os::fd::RawFd) -> Option<std::path::PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
    }

    /// The close waits for the runtime's blocking pool: with the pool's
    /// one thread held, the fd is still open after the drop returns, and
    /// closed once the pool runs. Dropped outside a runtime, it closes at
    /// once.
    #[test]
    fn a_tun_fd_dropped_in_a_runtime_closes_on_the_blocking_pool() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let (read, write) = std::io::pipe().unwrap();
        let fd: OwnedFd = read.into();
        let raw = fd.as_raw_fd();
        let pipe = names(raw).unwrap();
        assert!(pipe.to_string_lossy().starts_with("pipe:"), "{pipe:?}");
        let (hold, held) = std::sync::mpsc::channel::<()>();
        rt.block_on(async move {
            let busy = tokio::task::spawn_blocking(move || held.recv());
            drop(TunFd::new(fd));
            assert_eq!(names(raw), Some(pipe.clone()), "closed on the event loop");
            hold.send(()).unwrap();
            busy.await.unwrap().unwrap();
            // The close was queued behind the held task; wait for it.
            for _ in 0..200 {
                if names(raw).as_ref() != Some(&pipe) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_ne!(names(raw), Some(pipe), "never closed");
        });
        drop(write);

        let (read, _write) = std::io::pipe().unwrap();
        let fd: OwnedFd = read.into();
        let raw = fd.as_raw_fd();
        let pipe = names(raw);
        drop(TunFd::new(fd));
        assert_ne!(names(raw), pipe, "a drop outside a runtime closes at once");
    }
}
