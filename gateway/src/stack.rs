//! Size: one sandbox's loop and every state it owns (held SYNs, open
//! flows, their channels and brokers): a flow's whole life reads in order
//! here, from its SYN to its last byte.
//!
//! One sandbox's gateway loop: packets from the TUN fd in, through a
//! smoltcp interface, and out to real sockets the hub opens.
//!
//! # A connection's life
//!
//! 1. The workload's SYN arrives. It never reaches smoltcp directly:
//!    [`Loop::on_packet`] takes every SYN aside, finds the name behind a
//!    fake IP, and asks the policy (lists and static ranges). A refusal
//!    feeds the SYN to smoltcp with no socket listening, and smoltcp
//!    answers RST at once: the workload sees "connection refused".
//! 2. Allowed so far: the SYN is held (its retransmissions dropped) while
//!    a task resolves the name upstream, checks every address again
//!    (closed ranges, the host's own addresses, deny CIDRs: DNS rebinding
//!    stops here) and connects, within `connect_timeout`.
//! 3. Connected: a smoltcp socket listens on exactly that destination, the
//!    held SYN goes in, and the handshake completes, so the workload never
//!    sees an accepted connection that goes nowhere. Failed: the SYN goes
//!    in with no listener, and RST.
//! 4. Data moves through two bounded channels per flow, one task reading
//!    the real socket and one writing it; the loop moves bytes between the
//!    channels and the smoltcp socket buffers only while the other side
//!    has room, so a slow side closes the TCP window instead of growing a
//!    buffer.
//!
//! Bounds: at most `max_flows` flows (open or connecting), `socket_buffer`
//! bytes per direction per flow in smoltcp (`bulk_buffer` instead while the
//! flows' bulk buffers stay within `bulk_budget`) plus [`CHANNEL_CHUNKS`]
//! chunks of [`CHUNK`] bytes per direction in the channels; the fake-IP
//! pool at `fake_pool` names; [`MAX_TX_QUEUE`] packets waiting for the TUN.
//!
//! Throughput: the cost is per packet (syscalls, wake-ups), so the TUN's
//! MTU is 65535, a wake-up reads up to [`READ_BATCH`] packets and sends
//! every segment the windows allow ([`EGRESS_PASSES`]) before sleeping.

use std::{
    collections::{HashMap, VecDeque},
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::{AsRawFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use smoltcp::{
    iface::{Config as IfaceConfig, Interface, SocketHandle, SocketSet},
    phy::{Device, DeviceCapabilities, Medium},
    socket::tcp,
    time::Instant as SmolInstant,
    wire::{
        HardwareAddress, IpAddress, IpCidr, IpListenEndpoint, IpProtocol, Ipv4Packet, TcpPacket,
        UdpPacket,
    },
};
use tokio::{
    io::{unix::AsyncFd, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::{mpsc, Notify},
    task::{AbortHandle, JoinSet},
};

use crate::{
    broker::Secret,
    dns::{self, cache::DnsCache, fakeip::FakePool},
    meter::Meter,
    policy::{self, internal, Flow as PolicyFlow, Proto, SandboxPolicy},
    tun::{TunFd, MTU},
    udp, Config, PolicyCell,
};

/// Bytes one read of a real socket moves at most: one full TUN packet's
/// worth, so a bulk download costs one channel message per segment.
const CHUNK: usize = 64 * 1024;
/// Chunks queued per direction per flow.
const CHANNEL_CHUNKS: usize = 2;
/// Packets read from the TUN per wake-up before the stack runs.
const READ_BATCH: usize = 64;
/// Packets waiting to be written to the TUN: about 1.5 MiB of full
/// packets per sandbox, whatever the MTU. While it is full smoltcp is
/// told the device is busy (its segments stay in the socket buffers);
/// a reply generated while receiving is dropped, as a wire would.
const MAX_TX_QUEUE: usize = (1536 * 1024) / MTU;
/// `poll_egress` passes per step: each sends at most one segment per
/// socket, so one pass per wake-up would cap a flow at one segment per
/// ACK received. Bounded so one busy sandbox yields the thread.
const EGRESS_PASSES: usize = 64;
// The queue holds a bulk flow's whole window (`Limits::bulk_buffer`,
// 1 MiB: 16 full packets), so the MTU cannot silently shrink it below that.
const _: () = assert!(MAX_TX_QUEUE >= 16);

/// The packets between the TUN fd and smoltcp.
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

struct RxToken(Vec<u8>);
struct TxToken<'a>(&'a mut VecDeque<Vec<u8>>);

impl smoltcp::phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        if self.0.len() < MAX_TX_QUEUE {
            self.0.push_back(buf);
        }
        r
    }
}

impl Device for Queues {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _: SmolInstant) -> Option<(RxToken, TxToken<'_>)> {
        let p = self.rx.pop_front()?;
        Some((RxToken(p), TxToken(&mut self.tx)))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<TxToken<'_>> {
        (self.tx.len() < MAX_TX_QUEUE).then_some(TxToken(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ip;
        c.max_transmission_unit = MTU;
        c
    }
}

/// (sandbox address, sandbox port, destination, destination port).
type Key = (Ipv4Addr, u16, Ipv4Addr, u16);

enum Up {
    Data(Vec<u8>),
    Eof,
    Failed,
}

struct Open {
    handle: SocketHandle,
    to_up: Option<mpsc::Sender<Vec<u8>>>,
    from_up: mpsc::Receiver<Up>,
    /// A chunk from upstream not yet all in the socket, and how far.
    out: Option<(Vec<u8>, usize)>,
    up_done: bool,
    closing: bool,
    /// Its reader and writer, and its broker when brokered.
    tasks: Vec<AbortHandle>,
    /// When a byte last moved either way.
    active: std::time::Instant,
    /// `abort()` was called: smoltcp sends the RST on its next poll, so
    /// the socket must live until then.
    reset_pending: bool,
    /// Its entry in the decision log.
    seq: u64,
    /// What it was judged by, to judge it again when the policy changes:
    /// the name dialled, and the address actually connected upstream.
    name: Option<String>,
    peer: Option<IpAddr>,
    /// Bytes of the sandbox's bulk budget its buffers hold (0: small).
    bulk: usize,
}

enum Woke {
    Packets(Vec<Vec<u8>>, Option<io::Error>),
    Event(Event),
    Udp(udp::Event),
    LoopbackDns(Vec<u8>, SocketAddr),
    Other,
}

/// What an allowed flow's bytes go to.
enum Upstream {
    /// The real connection, byte for byte.
    Tcp(TcpStream),
    /// The broker's end of an in-memory pipe, and the broker's task
    /// (it holds the real connection).
    Brokered(
        tokio::io::DuplexStream,
        std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ),
}

enum Event {
    /// The flow, its name, the address connected, the connection.
    Connected(Key, Option<String>, Option<IpAddr>, Upstream),
    /// The name (if any) and why, for the log.
    Refused(Key, Option<String>, String),
}

pub(crate) struct Loop {
    sandbox: String,
    cfg: Arc<Config>,
    /// Read afresh for every SYN and DNS query (a PATCH swaps it).
    policy: PolicyCell,
    tun: AsyncFd<TunFd>,
    iface: Interface,
    dev: Queues,
    sockets: SocketSet<'static>,
    pool: FakePool,
    pending: HashMap<Key, Vec<u8>>,
    open: HashMap<Key, Open>,
    tasks: JoinSet<()>,
    wake: Arc<Notify>,
    events_tx: mpsc::Sender<Event>,
    events: mpsc::Receiver<Event>,
    log: LogBudget,
    /// The responder on the sandbox's `127.0.0.1:53`.
    lo_dns: Option<tokio::net::UdpSocket>,
    meter: Arc<Meter>,
    /// `egress_mb`: payload bytes both ways past which new connections
    /// are refused.
    cap_bytes: Option<u64>,
    /// The rate window: when it began and the byte total then.
    rate_window: (std::time::Instant, u64),
    /// The secrets this sandbox's flows may carry (brokered secrets).
    secrets: Arc<Vec<Secret>>,
    /// UDP flows the policy names.
    udp: udp::Relay,
    /// Upstream answers for this sandbox's names (addresses only).
    dns_cache: Arc<std::sync::Mutex<DnsCache>>,
    /// The policy open flows were last judged by.
    judged: Option<Arc<SandboxPolicy>>,
    /// Bytes of `Limits::bulk_budget` the open flows hold.
    bulk_held: usize,
    /// When the first open flow reaches `--egress-idle-timeout`: the loop
    /// must wake then even if nothing else happens, or a flow whose peer
    /// answers later than the timeout would never be judged idle.
    next_idle: Option<std::time::Instant>,
}

thread_local! {
    /// One packet's read buffer per runtime thread, shared by every
    /// sandbox's loop on it (a read never waits, and its packet is copied
    /// out at once): a 64 KiB buffer per loop would be 6 MiB of hub memory
    /// per 100 idle sandboxes.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One `read(2)` of the TUN; a packet read is appended to `batch`. Returns
/// what `read` returned.
fn read_packet(fd: std::os::fd::RawFd, batch: &mut Vec<Vec<u8>>) -> isize {
    READ_BUF.with_borrow_mut(|buf| {
        buf.resize(MTU + 64, 0);
        // SAFETY: read(2) into a buffer we own, within its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            batch.push(buf[..n as usize].to_vec());
        }
        n
    })
}

/// A datagram on `s`, or never when there is no socket.
async fn recv_dns(
    s: &Option<tokio::net::UdpSocket>,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr)> {
    match s {
        Some(s) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

/// Decision lines a sandbox may put in the hub's log per window: a
/// workload that dials a closed address in a loop must not fill the
/// hub's disk. Past the budget, one line says how many were left out.
pub(crate) struct LogBudget {
    window: std::time::Instant,
    used: u32,
    dropped: u64,
}

impl LogBudget {
    const PER_WINDOW: u32 = 20;
    const WINDOW: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> Self {
        LogBudget {
            window: std::time::Instant::now(),
            used: 0,
            dropped: 0,
        }
    }

    /// Whether one more line may be logged now.
    pub(crate) fn admit(&mut self) -> bool {
        if self.window.elapsed() >= Self::WINDOW {
            if self.dropped > 0 {
                tracing::info!(
                    dropped = self.dropped,
                    "egress: decisions left out of the log"
                );
            }
            *self = LogBudget::new();
        }
        if self.used < Self::PER_WINDOW {
            self.used += 1;
            return true;
        }
        self.dropped += 1;
        false
    }
}

impl Loop {
    pub(crate) fn new(
        sandbox: String,
        cfg: Arc<Config>,
        policy: PolicyCell,
        tun: OwnedFd,
        lo_dns: Option<tokio::net::UdpSocket>,
        metering: crate::Metering,
        secrets: Vec<Secret>,
    ) -> io::Result<Loop> {
        // SAFETY: an OwnedFd is a valid fd that stays open as long as the
        // AsyncFd owns it (a TunFd closes it only when dropped).
        let tun = TunFd::new(tun);
        let tun = unsafe { AsyncFd::register_with_interest(tun, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let mut dev = Queues {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
        };
        let mut config = IfaceConfig::new(HardwareAddress::Ip);
        config.random_seed = rand::random();
        let mut iface = Interface::new(config, &mut dev, SmolInstant::now());
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(
                IpAddress::Ipv4(internal::GATEWAY),
                internal::PREFIX,
            ));
        });
        // Any destination is "ours" (AnyIP) when routed via our own address.
        iface.set_any_ip(true);
        iface
            .routes_mut()
            .add_default_ipv4_route(internal::GATEWAY)
            .map_err(|_| io::Error::other("smoltcp route table full"))?;
        let fake_cap = cfg
            .limits
            .fake_pool
            .clamp(1, (1 << (32 - internal::FAKE_PREFIX)) - 2);
        let (events_tx, events) = mpsc::channel(cfg.limits.max_flows.max(1));
        let wake = Arc::new(Notify::new());
        let dns_cache = Arc::new(std::sync::Mutex::new(DnsCache::default()));
        Ok(Loop {
            sandbox,
            pool: FakePool::new(internal::FAKE_NET, fake_cap),
            cfg,
            policy,
            tun,
            iface,
            dev,
            sockets: SocketSet::new(Vec::new()),
            pending: HashMap::new(),
            open: HashMap::new(),
            tasks: JoinSet::new(),
            udp: udp::Relay::new(wake.clone(), dns_cache.clone()),
            dns_cache,
            judged: None,
            wake,
            events_tx,
            events,
            log: LogBudget::new(),
            lo_dns,
            meter: metering.meter,
            cap_bytes: metering.cap_bytes,
            rate_window: (std::time::Instant::now(), 0),
            secrets: Arc::new(secrets),
            bulk_held: 0,
            next_idle: None,
        })
    }

    pub(crate) async fn run(mut self) {
        let mut dns_buf = vec![0u8; crate::dns::wire::MAX_MESSAGE];
        loop {
            let delay = self
                .iface
                .poll_delay(SmolInstant::now(), &self.sockets)
                .map(|d| Duration::from_micros(d.total_micros()))
                .unwrap_or(Duration::from_secs(5))
                .min(Duration::from_secs(5))
                .min(self.next_idle.map_or(Duration::MAX, |t| {
                    t.saturating_duration_since(std::time::Instant::now())
                }));
            let woke = tokio::select! {
                r = self.tun.readable() => match r {
                    Ok(mut guard) => {
                        let mut batch = Vec::new();
                        let mut failed = None;
                        while batch.len() < READ_BATCH {
                            let fd = guard.get_inner().as_raw_fd();
                            let n = read_packet(fd, &mut batch);
                            if n > 0 {
                                continue;
                            }
                            let e = io::Error::last_os_error();
                            match e.kind() {
                                _ if n == 0 => failed = Some(io::Error::other("end of file")),
                                io::ErrorKind::WouldBlock => guard.clear_ready(),
                                io::ErrorKind::Interrupted => continue,
                                _ => failed = Some(e),
                            }
                            break;
                        }
                        Woke::Packets(batch, failed)
                    }
                    Err(e) => Woke::Packets(Vec::new(), Some(e)),
                },
                Some(ev) = self.events.recv() => Woke::Event(ev),
                ev = self.udp.next() => Woke::Udp(ev),
                r = recv_dns(&self.lo_dns, &mut dns_buf) => match r {
                    Ok((n, from)) => Woke::LoopbackDns(dns_buf[..n].to_vec(), from),
                    Err(_) => Woke::Other,
                },
                _ = self.wake.notified() => Woke::Other,
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => Woke::Other,
                _ = tokio::time::sleep(delay) => Woke::Other,
            };
            match woke {
                Woke::Packets(batch, failed) => {
                    for pkt in batch {
                        self.on_packet(pkt);
                    }
                    if let Some(e) = failed {
                        tracing::warn!(sandbox = %self.sandbox, error = %e, "egress: the TUN is gone; the gateway stops");
                        return;
                    }
                }
                Woke::Event(ev) => self.on_event(ev),
                Woke::Udp(ev) => self.on_udp_event(ev),
                Woke::LoopbackDns(msg, from) => {
                    let answer = dns::respond(
                        &self.cfg.operator,
                        &self.policy.load(),
                        &mut self.pool,
                        &msg,
                    );
                    if let (Some(a), Some(s)) = (answer, &self.lo_dns) {
                        // Non-blocking: a full socket buffer drops the answer.
                        let _ = s.try_send_to(&a, from);
                    }
                }
                Woke::Other => {}
            }
            self.rejudge_if_changed();
            self.step();
        }
    }

    /// Why a new connection is refused under `--egress-rate-mbit`, if it is.
    fn over_rate(&mut self) -> Option<String> {
        let cap = self.cfg.limits.rate_mbit?;
        let total = self.meter.total_bytes();
        let (start, at_start) = self.rate_window;
        let secs = start.elapsed().as_secs_f64().max(0.001);
        let mbit = (total - at_start) as f64 * 8.0 / 1e6 / secs;
        if start.elapsed() >= Duration::from_secs(1) {
            self.rate_window = (std::time::Instant::now(), total);
        }
        (mbit > cap as f64).then(|| {
            format!(
                "--egress-rate-mbit: the sandbox moves {mbit:.1} Mbit/s, above the cap of {cap}"
            )
        })
    }

    /// Polls smoltcp (every received packet), moves bytes, then sends
    /// what the windows allow, writing to the TUN after every pass.
    fn step(&mut self) {
        self.iface
            .poll(SmolInstant::now(), &mut self.dev, &mut self.sockets);
        self.pump();
        for _ in 0..EGRESS_PASSES {
            let sent = self
                .iface
                .poll_egress(SmolInstant::now(), &mut self.dev, &mut self.sockets);
            self.flush();
            if sent == smoltcp::iface::PollResult::None {
                break;
            }
        }
    }

    /// Writes every queued packet to the TUN.
    fn flush(&mut self) {
        let fd = self.tun.get_ref().as_raw_fd();
        while let Some(p) = self.dev.tx.pop_front() {
            // SAFETY: write(2) of a buffer we own. A full TUN queue drops
            // the packet, as a wire would.
            unsafe { libc::write(fd, p.as_ptr().cast(), p.len()) };
        }
    }

    fn on_packet(&mut self, pkt: Vec<u8>) {
        let Ok(ip) = Ipv4Packet::new_checked(&pkt[..]) else {
            return; // IPv6 and junk: the sandbox has no IPv6 route out.
        };
        if ip.more_frags() || ip.frag_offset() != 0 {
            return;
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        match ip.next_header() {
            IpProtocol::Udp => {
                let Ok(udp) = UdpPacket::new_checked(ip.payload()) else {
                    return;
                };
                if dst == internal::GATEWAY && udp.dst_port() == 53 {
                    let answer = dns::respond(
                        &self.cfg.operator,
                        &self.policy.load(),
                        &mut self.pool,
                        udp.payload(),
                    );
                    if let Some(a) = answer {
                        let p = udp::udp_packet(internal::GATEWAY, 53, src, udp.src_port(), &a);
                        if self.dev.tx.len() < MAX_TX_QUEUE {
                            self.dev.tx.push_back(p);
                        }
                    }
                } else {
                    let key = (src, udp.src_port(), dst, udp.dst_port());
                    self.on_udp(key, udp.payload());
                }
            }
            IpProtocol::Tcp => {
                let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else {
                    return;
                };
                let key = (src, tcp.src_port(), dst, tcp.dst_port());
                if tcp.syn() && !tcp.ack() && !self.open.contains_key(&key) {
                    if !self.pending.contains_key(&key) {
                        self.on_syn(key, pkt);
                    }
                    return;
                }
                self.dev.rx.push_back(pkt);
            }
            _ => {} // ICMP and the rest: nothing answers.
        }
    }

    /// Sends the SYN into smoltcp with no socket listening: RST.
    fn refuse(&mut self, syn: Vec<u8>) {
        self.dev.rx.push_front(syn);
    }

    fn on_syn(&mut self, key: Key, syn: Vec<u8>) {
        let (_, _, dst, port) = key;
        let dst_ip = IpAddr::V4(dst);
        let name = if cidr_has(internal::FAKE_NET, internal::FAKE_PREFIX, dst) {
            match self.pool.lookup(dst) {
                Some(n) => Some(n.to_string()),
                None => {
                    tracing::debug!(sandbox = %self.sandbox, %dst, "egress: a fake IP no name holds");
                    self.meter
                        .refused(None, dst_ip, port, "a fake address no name holds");
                    return self.refuse(syn);
                }
            }
        } else {
            None
        };
        let flow = PolicyFlow {
            name: name.as_deref(),
            ip: name.is_none().then_some(dst_ip),
            port,
            proto: Proto::Tcp,
        };
        // The policy as it is now: a PATCH applies from the next SYN.
        let policy = self.policy.load();
        let verdict = match flow.ip {
            Some(ip) => self
                .cfg
                .operator
                .address_open(ip, &[])
                .and_then(|()| policy.lists_allow(&self.cfg.operator, &flow)),
            None => policy.lists_allow(&self.cfg.operator, &flow),
        };
        if let Err(why) = verdict {
            if self.log.admit() {
                tracing::info!(sandbox = %self.sandbox, name = name.as_deref().unwrap_or(""), %dst, port, %why, "egress: denied");
            }
            self.meter
                .refused(name.as_deref(), dst_ip, port, &why.to_string());
            return self.refuse(syn);
        }
        if let Some(cap) = self.cap_bytes {
            let used = self.meter.total_bytes();
            if used >= cap {
                let why = format!(
                    "egress_mb: the sandbox's cap of {} MB is used ({used} payload bytes)",
                    cap / (1024 * 1024)
                );
                if self.log.admit() {
                    tracing::info!(sandbox = %self.sandbox, %why, "egress: refused");
                }
                self.meter.refused(name.as_deref(), dst_ip, port, &why);
                return self.refuse(syn);
            }
        }
        if let Some(why) = self.over_rate() {
            if self.log.admit() {
                tracing::info!(sandbox = %self.sandbox, %why, "egress: refused");
            }
            self.meter.refused(name.as_deref(), dst_ip, port, &why);
            return self.refuse(syn);
        }
        if self.open.len() + self.pending.len() >= self.cfg.limits.max_flows {
            if self.log.admit() {
                tracing::info!(sandbox = %self.sandbox, max = self.cfg.limits.max_flows, "egress: too many flows; refused");
            }
            let why = format!(
                "too many connections open at once (--egress-max-flows {})",
                self.cfg.limits.max_flows
            );
            self.meter.refused(name.as_deref(), dst_ip, port, &why);
            return self.refuse(syn);
        }
        self.pending.insert(key, syn);
        let cfg = self.cfg.clone();
        let events = self.events_tx.clone();
        // Brokered: the flow's name and port are one of a secret's hosts.
        let brokering = match (&cfg.broker, &name) {
            (Some(b), Some(n)) => {
                let s: Vec<Secret> = self
                    .secrets
                    .iter()
                    .filter(|s| s.applies(n, port))
                    .cloned()
                    .collect();
                (!s.is_empty()).then(|| (b.clone(), n.clone(), Arc::new(s)))
            }
            _ => None,
        };
        let sandbox = self.sandbox.clone();
        let dns_cache = self.dns_cache.clone();
        self.tasks.spawn(async move {
            let cache = Some(&*dns_cache);
            let ev = match connect_cached(&cfg, &policy, name.as_deref(), dst_ip, port, cache).await {
                Ok(s) => match brokering {
                    None => {
                        let peer = s.peer_addr().ok().map(|a| a.ip());
                        Event::Connected(key, name, peer, Upstream::Tcp(s))
                    }
                    Some((broker, n, secrets)) => {
                        let peer = s.peer_addr().ok().map(|a| a.ip());
                        let (ours, theirs) = tokio::io::duplex(CHUNK * CHANNEL_CHUNKS);
                        let relay = async move {
                            if let Err(e) = broker.relay(n.clone(), secrets, theirs, s).await {
                                tracing::info!(%sandbox, name = %n, error = %e, "egress: a brokered connection ended");
                            }
                        };
                        Event::Connected(key, name, peer, Upstream::Brokered(ours, Box::pin(relay)))
                    }
                },
                Err(why) => Event::Refused(key, name, why.to_string()),
            };
            let _ = events.send(ev).await;
        });
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Refused(key, name, why) => {
                if self.log.admit() {
                    let (_, _, dst, port) = key;
                    tracing::info!(sandbox = %self.sandbox, name = name.as_deref().unwrap_or(""), %dst, port, %why, "egress: refused");
                }
                let (_, _, dst, port) = key;
                self.meter
                    .refused(name.as_deref(), IpAddr::V4(dst), port, &why);
                if let Some(syn) = self.pending.remove(&key) {
                    self.refuse(syn);
                }
            }
            Event::Connected(key, name, peer, upstream) => {
                let Some(syn) = self.pending.remove(&key) else {
                    return;
                };
                // Bulk buffers while the sandbox's budget allows. Zeroed
                // allocations this large are fresh pages from the kernel:
                // memory is used as data fills them, and returned when the
                // flow ends.
                let limits = &self.cfg.limits;
                let bulk = 2 * limits.bulk_buffer;
                let (size, bulk) = if limits.bulk_buffer > limits.socket_buffer
                    && self.bulk_held + bulk <= limits.bulk_budget
                {
                    (limits.bulk_buffer, bulk)
                } else {
                    (limits.socket_buffer, 0)
                };
                let mut sock = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; size]),
                    tcp::SocketBuffer::new(vec![0; size]),
                );
                sock.set_nagle_enabled(false);
                let (_, _, dst, port) = key;
                let ep = IpListenEndpoint {
                    addr: Some(IpAddress::Ipv4(dst)),
                    port,
                };
                if sock.listen(ep).is_err() {
                    return self.refuse(syn);
                }
                let handle = self.sockets.add(sock);
                // The held SYN first, while this socket is the only one
                // listening there.
                self.dev.rx.push_front(syn);
                self.iface
                    .poll(SmolInstant::now(), &mut self.dev, &mut self.sockets);
                if self.sockets.get::<tcp::Socket>(handle).state() == tcp::State::Listen {
                    // smoltcp did not take the SYN: nothing to carry.
                    self.sockets.remove(handle);
                    return;
                }
                self.bulk_held += bulk;
                let mut tasks = Vec::with_capacity(3);
                type Rd = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
                type Wr = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
                let (mut rd, mut wr): (Rd, Wr) = match upstream {
                    Upstream::Tcp(s) => {
                        let (r, w) = s.into_split();
                        (Box::new(r), Box::new(w))
                    }
                    Upstream::Brokered(pipe, relay) => {
                        tasks.push(self.tasks.spawn(relay));
                        let (r, w) = tokio::io::split(pipe);
                        (Box::new(r), Box::new(w))
                    }
                };
                let seq =
                    self.meter
                        .opened(name.as_deref(), IpAddr::V4(dst), port, !tasks.is_empty());
                let (to_up, mut up_rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
                let (up_tx, from_up) = mpsc::channel::<Up>(CHANNEL_CHUNKS);
                let wake = self.wake.clone();
                let reader = self.tasks.spawn(async move {
                    loop {
                        // A fresh buffer per read, handed over as is (no
                        // copy); `read_buf` fills its spare capacity.
                        let mut buf = Vec::with_capacity(CHUNK);
                        let msg = match rd.read_buf(&mut buf).await {
                            Ok(0) => Up::Eof,
                            Ok(_) => Up::Data(buf),
                            Err(_) => Up::Failed,
                        };
                        let last = !matches!(msg, Up::Data(_));
                        if up_tx.send(msg).await.is_err() {
                            return;
                        }
                        wake.notify_one();
                        if last {
                            return;
                        }
                    }
                });
                let wake = self.wake.clone();
                let writer = self.tasks.spawn(async move {
                    while let Some(chunk) = up_rx.recv().await {
                        if wr.write_all(&chunk).await.is_err() {
                            return;
                        }
                        wake.notify_one();
                    }
                    let _ = wr.shutdown().await;
                });
                self.open.insert(
                    key,
                    Open {
                        handle,
                        to_up: Some(to_up),
                        from_up,
                        out: None,
                        up_done: false,
                        closing: false,
                        tasks: {
                            tasks.extend([reader, writer]);
                            tasks
                        },
                        active: std::time::Instant::now(),
                        reset_pending: false,
                        seq,
                        name,
                        peer,
                        bulk,
                    },
                );
                // Judged when its SYN came; a PATCH may have come since.
                self.judge_tcp(&self.policy.load(), &[key]);
            }
        }
    }

    /// Moves bytes between every open flow's socket and its channels, and
    /// forgets flows whose socket is closed.
    fn pump(&mut self) {
        let idle = self.cfg.limits.idle_timeout;
        let mut done = Vec::new();
        let mut next_idle: Option<std::time::Instant> = None;
        for (key, f) in self.open.iter_mut() {
            let sock = self.sockets.get_mut::<tcp::Socket>(f.handle);
            // Judged before this pass moves anything: bytes that arrive
            // after the deadline do not revive a connection already idle.
            if f.active.elapsed() >= idle && sock.is_open() {
                sock.abort();
                f.reset_pending = true;
            }
            // Sandbox -> upstream, while the channel has room.
            while sock.can_recv() {
                let Some(tx) = &f.to_up else { break };
                match tx.try_reserve() {
                    Ok(permit) => {
                        let data = sock
                            .recv(|b| {
                                let n = b.len().min(CHUNK);
                                (n, b[..n].to_vec())
                            })
                            .unwrap_or_default();
                        if !data.is_empty() {
                            f.active = std::time::Instant::now();
                            self.meter.moved(f.seq, data.len() as u64, 0);
                        }
                        permit.send(data);
                    }
                    Err(mpsc::error::TrySendError::Full(())) => break,
                    Err(mpsc::error::TrySendError::Closed(())) => {
                        sock.abort();
                        f.reset_pending = true;
                        break;
                    }
                }
            }
            // (`may_recv` is false before the handshake ends too: only a
            // state past a received FIN counts.)
            let fin_received = matches!(
                sock.state(),
                tcp::State::CloseWait
                    | tcp::State::LastAck
                    | tcp::State::Closing
                    | tcp::State::TimeWait
                    | tcp::State::Closed
            );
            if fin_received && sock.recv_queue() == 0 {
                // The workload sent FIN: the writer shuts the real socket's
                // write side once the channel drains.
                f.to_up = None;
            }
            // Upstream -> sandbox, while the socket has room.
            loop {
                if let Some((buf, off)) = &mut f.out {
                    if !sock.can_send() {
                        break;
                    }
                    match sock.send_slice(&buf[*off..]) {
                        Ok(n) => {
                            *off += n;
                            if n > 0 {
                                f.active = std::time::Instant::now();
                                self.meter.moved(f.seq, 0, n as u64);
                            }
                        }
                        Err(_) => break,
                    }
                    if *off < buf.len() {
                        break;
                    }
                    f.out = None;
                    continue;
                }
                if f.up_done {
                    break;
                }
                match f.from_up.try_recv() {
                    Ok(Up::Data(v)) => f.out = Some((v, 0)),
                    Ok(Up::Eof) | Err(mpsc::error::TryRecvError::Disconnected) => f.up_done = true,
                    Ok(Up::Failed) => {
                        f.up_done = true;
                        sock.abort();
                        f.reset_pending = true;
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                }
            }
            if sock.is_open() {
                let at = f.active + idle;
                next_idle = Some(next_idle.map_or(at, |n| n.min(at)));
            }
            if f.up_done && f.out.is_none() && !f.closing {
                sock.close();
                f.closing = true;
            }
            if matches!(sock.state(), tcp::State::Closed | tcp::State::TimeWait) {
                if f.reset_pending {
                    // Kept for one more poll, which sends the RST.
                    f.reset_pending = false;
                } else {
                    done.push(*key);
                }
            }
        }
        self.next_idle = next_idle;
        for key in done {
            if let Some(f) = self.open.remove(&key) {
                for t in &f.tasks {
                    t.abort();
                }
                self.sockets.remove(f.handle);
                self.bulk_held -= f.bulk;
            }
        }
    }
}

/// UDP flows and re-judging: kept apart from the TCP path above.
impl Loop {
    /// Resets those of the open TCP flows `keys` that `policy` refuses,
    /// each logged as a decision with the reason.
    fn judge_tcp(&mut self, policy: &SandboxPolicy, keys: &[Key]) {
        for key in keys {
            let Some(f) = self.open.get_mut(key) else {
                continue;
            };
            let (_, _, dst, port) = *key;
            let flow = PolicyFlow {
                name: f.name.as_deref(),
                ip: f.peer.or(f.name.is_none().then_some(IpAddr::V4(dst))),
                port,
                proto: Proto::Tcp,
            };
            let Err(why) = policy.lists_allow(&self.cfg.operator, &flow) else {
                continue;
            };
            let sock = self.sockets.get_mut::<tcp::Socket>(f.handle);
            if !sock.is_open() || f.reset_pending {
                continue;
            }
            sock.abort();
            f.reset_pending = true;
            let why = format!("reset by a change of the sandbox's network: {why}");
            if self.log.admit() {
                tracing::info!(sandbox = %self.sandbox, name = f.name.as_deref().unwrap_or(""), %dst, port, %why, "egress: connection reset");
            }
            self.meter
                .closed(f.name.as_deref(), IpAddr::V4(dst), port, &why, false);
        }
    }

    /// The waker a [`crate::Gateway`] pokes when its policy changes.
    pub(crate) fn waker(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// A datagram from the sandbox that is not DNS to the gateway.
    fn on_udp(&mut self, key: udp::Key, payload: &[u8]) {
        let policy = self.policy.load();
        macro_rules! cx {
            () => {
                udp::Ctx {
                    cfg: &self.cfg,
                    policy: policy.clone(),
                    meter: &self.meter,
                    sandbox: &self.sandbox,
                    tx: &mut self.dev.tx,
                    tx_cap: MAX_TX_QUEUE,
                    mtu: MTU,
                }
            };
        }
        self.udp.sweep(self.cfg.limits.idle_timeout);
        if self.udp.knows(&key) {
            return self.udp.carry(&mut cx!(), key, payload);
        }
        let (_, _, dst, _) = key;
        let name = if cidr_has(internal::FAKE_NET, internal::FAKE_PREFIX, dst) {
            match self.pool.lookup(dst) {
                Some(n) => Some(n.to_string()),
                None => {
                    let log = self.log.admit();
                    let why = "a fake address no name holds";
                    return self.udp.refuse(&mut cx!(), key, None, why, log);
                }
            }
        } else {
            None
        };
        let limit = self.new_flow_refusal();
        let log = self.log.admit();
        match limit {
            Some(why) => self.udp.refuse(&mut cx!(), key, name.as_deref(), &why, log),
            None => self.udp.open(&mut cx!(), key, name, payload, log),
        }
    }

    fn on_udp_event(&mut self, ev: udp::Event) {
        self.udp.sweep(self.cfg.limits.idle_timeout);
        let mut cx = udp::Ctx {
            cfg: &self.cfg,
            policy: self.policy.load(),
            meter: &self.meter,
            sandbox: &self.sandbox,
            tx: &mut self.dev.tx,
            tx_cap: MAX_TX_QUEUE,
            mtu: MTU,
        };
        self.udp.on_event(&mut cx, ev);
    }

    /// `egress_mb` and `--egress-rate-mbit` for a new UDP flow (a SYN
    /// checks the same in [`Loop::on_syn`]).
    fn new_flow_refusal(&mut self) -> Option<String> {
        if let Some(cap) = self.cap_bytes {
            let used = self.meter.total_bytes();
            if used >= cap {
                return Some(format!(
                    "egress_mb: the sandbox's cap of {} MB is used ({used} payload bytes)",
                    cap / (1024 * 1024)
                ));
            }
        }
        self.over_rate()
    }

    /// When the policy changed since open flows were judged (a `PATCH`),
    /// resets every TCP connection and closes every UDP flow it no longer
    /// allows, each logged as a decision with the reason. Judged by the
    /// lists (the operator's ranges do not change while a hub runs), by
    /// name and by the address actually connected, as at connect time.
    fn rejudge_if_changed(&mut self) {
        let policy = self.policy.load();
        if self
            .judged
            .as_ref()
            .is_some_and(|j| Arc::ptr_eq(j, &policy))
        {
            return;
        }
        self.judged = Some(policy.clone());
        let keys: Vec<Key> = self.open.keys().copied().collect();
        self.judge_tcp(&policy, &keys);
        let mut cx = udp::Ctx {
            cfg: &self.cfg,
            policy,
            meter: &self.meter,
            sandbox: &self.sandbox,
            tx: &mut self.dev.tx,
            tx_cap: MAX_TX_QUEUE,
            mtu: MTU,
        };
        self.udp.rejudge(&mut cx);
    }
}

fn cidr_has(net: Ipv4Addr, prefix: u8, ip: Ipv4Addr) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    };
    u32::from(ip) & mask == u32::from(net)
}

/// Resolves (for a name), checks every address again, connects. The TUN
/// loop and the proxy ([`crate::proxy`]) both dial through this one
/// function, so the anti-rebinding check cannot differ between them.
pub(crate) async fn connect(
    cfg: &Config,
    policy: &SandboxPolicy,
    name: Option<&str>,
    literal: IpAddr,
    port: u16,
) -> Result<TcpStream, DialError> {
    connect_cached(cfg, policy, name, literal, port, None).await
}

/// [`connect`] resolving through a sandbox's DNS cache, when given (the
/// checks after resolving are the same: they run on every address dialled).
pub(crate) async fn connect_cached(
    cfg: &Config,
    policy: &SandboxPolicy,
    name: Option<&str>,
    literal: IpAddr,
    port: u16,
    cache: Option<&std::sync::Mutex<DnsCache>>,
) -> Result<TcpStream, DialError> {
    let addrs = match (name, cache) {
        (Some(n), Some(c)) => dns::resolve_cached(cfg.upstream_dns, n, cfg.limits.dns_timeout, c)
            .await
            .map_err(|e| DialError::Failed(e.to_string()))?,
        (Some(n), None) => dns::resolve(cfg.upstream_dns, n, cfg.limits.dns_timeout)
            .await
            .map_err(|e| DialError::Failed(e.to_string()))?,
        (None, _) => vec![literal],
    };
    let host = crate::host_addresses();
    let mut last = String::from("no address");
    // Whether every address was refused by the policy (rebinding to a
    // closed range, a deny CIDR), not by the network.
    let mut all_refused = true;
    for ip in addrs.into_iter().take(4) {
        let flow = PolicyFlow {
            name,
            ip: Some(ip),
            port,
            proto: Proto::Tcp,
        };
        if let Err(why) = policy::decide(&cfg.operator, policy, &flow, &host) {
            last = why.to_string();
            continue;
        }
        match tokio::time::timeout(
            cfg.limits.connect_timeout,
            TcpStream::connect(SocketAddr::new(ip, port)),
        )
        .await
        {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = format!("{ip}:{port}: {e}"),
            Err(_) => last = format!("{ip}:{port}: connect timed out"),
        }
        all_refused = false;
    }
    Err(if all_refused {
        DialError::Refused(last)
    } else {
        DialError::Failed(last)
    })
}

/// Why [`connect`] opened nothing.
#[derive(Debug)]
pub(crate) enum DialError {
    /// The policy refused every address the name resolved to.
    Refused(String),
    /// Resolving or connecting failed.
    Failed(String),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Refused(s) | DialError::Failed(s) => f.write_str(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_answers_are_valid_ipv4() {
        let p = udp::udp_packet(internal::GATEWAY, 53, internal::SANDBOX, 40000, b"hello");
        let ip = Ipv4Packet::new_checked(&p[..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.dst_addr(), internal::SANDBOX);
        let udp = UdpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(udp.dst_port(), 40000);
        assert_eq!(udp.payload(), b"hello");
    }

    #[test]
    fn a_full_tx_queue_tells_smoltcp_the_device_is_busy() {
        // Busy, not a silent drop: smoltcp keeps the segment in the
        // socket's buffer and sends it on a later pass, instead of
        // waiting for a retransmission timeout.
        let mut q = Queues {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
        };
        for _ in 0..MAX_TX_QUEUE {
            let t = q.transmit(SmolInstant::now()).expect("room left");
            smoltcp::phy::TxToken::consume(t, 40, |b| b.fill(1));
        }
        assert_eq!(q.tx.len(), MAX_TX_QUEUE);
        assert!(q.transmit(SmolInstant::now()).is_none());
        q.tx.pop_front();
        assert!(q.transmit(SmolInstant::now()).is_some());
    }

    #[test]
    fn fake_range_membership() {
        assert!(cidr_has(
            internal::FAKE_NET,
            internal::FAKE_PREFIX,
            Ipv4Addr::new(100, 127, 200, 1)
        ));
        assert!(!cidr_has(
            internal::FAKE_NET,
            internal::FAKE_PREFIX,
            internal::GATEWAY
        ));
    }
}
