//! The egress gateway (issue #27): the only way out of a sandbox whose
//! network is `egress`.
//!
//! The sandbox keeps its own network namespace. Its one interface besides
//! `lo` is a TUN device whose other end is a file descriptor the hub holds;
//! its default route points there. Every packet it sends reaches this
//! crate, which runs a user-space TCP stack (smoltcp) on it, answers DNS
//! itself, and opens real connections from the host only for flows the
//! policy allows. Nothing the workload does inside (it may be root there)
//! opens another path: it can delete the route (then nothing leaves), add
//! addresses or devices (they lead nowhere: there is no other link), or
//! send to any address (it all arrives here).
//!
//! # Layout
//!
//! ```text
//! lib.rs      Config, Limits, start() -> Gateway (drop stops it), host_addresses()
//! meter.rs    counters and the bounded decision log (issue part 4)
//! policy.rs   the decision: always-closed and private ranges, deny and
//!             allow layers (pure; unit-tested); PolicyCell (lib.rs) holds
//!             a running gateway's swappable copy
//! dns/        wire.rs (parse/build the few DNS messages), fakeip.rs (the
//!             per-sandbox name <-> fake IP pool), cache.rs (the
//!             per-sandbox upstream answer cache: TTLs, LRU), mod.rs (the
//!             sandbox-side responder, the upstream resolve)
//! tun.rs      making and configuring the TUN device inside a namespace;
//!             TunFd, which closes it on the blocking pool
//! stack.rs    the per-sandbox loop: TUN <-> smoltcp <-> real sockets;
//!             re-judges open flows when the policy changes
//! udp.rs      UDP flows the policy names (`udp:HOST:PORT`): judged on
//!             the first datagram, one connected host socket each
//! broker/     brokered secrets: the per-hub CA, TLS toward the sandbox
//!             and upstream, the header rewrite, masking echoed values
//! proxy/      the same gateway as an HTTP CONNECT / SOCKS5 proxy, for
//!             Kubernetes Pods (no TUN there): per-sandbox credentials,
//!             the same decision and dial (stack::connect), the broker
//! ```
//!
//! # Why smoltcp
//!
//! The gateway must decide, and connect upstream, *before* the workload's
//! handshake completes: a denied or unreachable destination must look
//! refused (RST), never accepted-then-dropped. smoltcp lets the loop hold a
//! SYN and make a socket listen on exactly that destination only once the
//! real connection exists; stacks that accept every SYN by themselves
//! (the `ipstack` family) cannot. It is also poll-driven and
//! single-threaded, with socket buffers we size, so each sandbox's memory
//! has a bound we set, and it needs no other dependency.
//!
//! Depends on `api` (the policy language) only: never on `hub`.

pub mod broker;
pub mod dns;
pub mod meter;
pub mod policy;
pub mod proxy;
mod stack;
pub mod tun;
mod udp;

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::OwnedFd,
    sync::{Arc, RwLock},
    time::Duration,
};

pub use meter::Meter;
pub use policy::{OperatorPolicy, SandboxPolicy};

/// Per-sandbox bounds.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Flows open or connecting at once; more SYNs are refused.
    pub max_flows: usize,
    /// smoltcp's buffer per direction per flow, in bytes.
    pub socket_buffer: usize,
    /// The larger buffer per direction a flow gets instead while the
    /// sandbox's [`Limits::bulk_budget`] allows: at the TUN's 64 KiB
    /// packets, [`Limits::socket_buffer`] holds one segment in flight, and
    /// a bulk transfer stalls on every ACK.
    pub bulk_buffer: usize,
    /// Bytes of bulk buffers (both directions) one sandbox's open flows
    /// hold at once; later flows get `socket_buffer`.
    pub bulk_budget: usize,
    /// Names holding a fake IP at once.
    pub fake_pool: u32,
    /// One upstream DNS try (there are two).
    pub dns_timeout: Duration,
    /// One upstream connect.
    pub connect_timeout: Duration,
    /// An open flow that moves no byte either way this long is reset, so
    /// forgotten connections give their slot back.
    pub idle_timeout: Duration,
    /// `--egress-rate-mbit`: while the payload rate (both ways) since the
    /// start of the current window (renewed each second) is above this,
    /// new connections are refused.
    pub rate_mbit: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_flows: 256,
            socket_buffer: 64 * 1024,
            bulk_buffer: 1024 * 1024,
            bulk_budget: 4 * 1024 * 1024,
            fake_pool: 4096,
            dns_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(3600),
            rate_mbit: None,
        }
    }
}

/// What every sandbox's gateway on one hub shares.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--egress-dns`: where names are resolved.
    pub upstream_dns: SocketAddr,
    pub operator: OperatorPolicy,
    pub limits: Limits,
    /// The hub's secrets broker (its CA, upstream trust); `None`: no
    /// flow is ever intercepted.
    pub broker: Option<Arc<broker::Broker>>,
}

/// A running gateway; dropping it stops the loop, closes every flow and
/// the TUN fd (the kernel then removes the device: the sandbox is
/// offline).
pub struct Gateway {
    task: tokio::task::JoinHandle<()>,
    meter: Arc<Meter>,
    policy: PolicyCell,
    /// Wakes the loop, which then judges its open flows again.
    wake: Arc<tokio::sync::Notify>,
}

/// A sandbox's policy as its running gateway reads it: once per new flow
/// and per DNS query, so a [`Gateway::set_policy`] applies to the next
/// connection and the next name at once (`PATCH /v1/sandboxes/{id}/network`).
/// The loop also judges its open flows again when the policy changes:
/// those the new one refuses are reset (TCP) or closed (UDP).
#[derive(Debug, Clone, Default)]
pub struct PolicyCell(Arc<RwLock<Arc<SandboxPolicy>>>);

impl PolicyCell {
    pub fn new(policy: SandboxPolicy) -> Self {
        PolicyCell(Arc::new(RwLock::new(Arc::new(policy))))
    }

    /// The policy now (a cheap clone of an `Arc`; the lock is held only
    /// for that clone, never across a decision).
    pub fn load(&self) -> Arc<SandboxPolicy> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn store(&self, policy: SandboxPolicy) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gateway {
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Its counters and decision log.
    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    /// Replaces the sandbox's policy: new flows and DNS queries are judged
    /// by it from now on (see [`PolicyCell`]), and open flows it refuses
    /// are reset at once.
    pub fn set_policy(&self, policy: SandboxPolicy) {
        self.policy.store(policy);
        self.wake.notify_one();
    }

    /// The policy it enforces now.
    pub fn policy(&self) -> Arc<SandboxPolicy> {
        self.policy.load()
    }
}

/// Starts the loop for one sandbox on `tun` (from [`tun::create_in`]),
/// answering DNS on `loopback_dns` too when given. Must be called inside
/// a tokio runtime.
pub fn start(
    tun: OwnedFd,
    loopback_dns: Option<std::net::UdpSocket>,
    cfg: Arc<Config>,
    policy: SandboxPolicy,
    sandbox: String,
) -> io::Result<Gateway> {
    start_metered(
        tun,
        loopback_dns,
        cfg,
        policy,
        sandbox,
        Metering::default(),
        Vec::new(),
    )
}

/// How one sandbox's gateway counts and caps.
#[derive(Debug, Clone, Default)]
pub struct Metering {
    /// Counters and log (pass the old one on a re-attach to keep them).
    pub meter: Arc<Meter>,
    /// `egress_mb` in bytes: past it (payload both ways, see [`meter`]),
    /// new connections are refused.
    pub cap_bytes: Option<u64>,
}

/// [`start`] with the counters and cap given, and the secrets the
/// gateway brokers for this sandbox (used only when `cfg.broker` is set).
pub fn start_metered(
    tun: OwnedFd,
    loopback_dns: Option<std::net::UdpSocket>,
    cfg: Arc<Config>,
    policy: SandboxPolicy,
    sandbox: String,
    metering: Metering,
    secrets: Vec<broker::Secret>,
) -> io::Result<Gateway> {
    let lo_dns = loopback_dns
        .map(tokio::net::UdpSocket::from_std)
        .transpose()?;
    let meter = metering.meter.clone();
    let policy = PolicyCell::new(policy);
    let l = stack::Loop::new(sandbox, cfg, policy.clone(), tun, lo_dns, metering, secrets)?;
    let wake = l.waker();
    Ok(Gateway {
        task: tokio::spawn(l.run()),
        meter,
        policy,
        wake,
    })
}

/// The host's own addresses (every interface's): always closed, since
/// the hub and anything else on the host listen there.
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we walk read-only and free once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let a = (*cur).ifa_addr;
            if !a.is_null() {
                match (*a).sa_family as libc::c_int {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(u32::from_be(sin.sin_addr.s_addr).into()));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(sin6.sin6_addr.s6_addr.into()));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}
