//! UDP flows the policy names (`udp:HOST:PORT`): one sandbox's relay.
//!
//! UDP has no handshake to hold, so a flow (sandbox address and port,
//! destination and port) is judged on its first datagram, by the same
//! decision as a TCP SYN with [`Proto::Udp`]: only `udp:` allow entries
//! open it, plain and `udp:` deny entries close it, the closed and
//! private ranges stay closed. Refused datagrams are dropped (UDP has no
//! refusal the workload would read; an ICMP error would be a second
//! protocol to answer), and the refusal is logged once per flow per
//! [`REFUSED_MEMORY`].
//!
//! An allowed flow gets its own host-side socket, `connect`ed to the one
//! address the name resolved to and passed the policy again (closed
//! ranges, deny CIDRs: DNS rebinding stops here, as for TCP), so the
//! kernel drops datagrams from anyone else. Until it is connected, up to
//! [`PENDING_DATAGRAMS`] datagrams wait; more are dropped.
//!
//! Bounds: at most `max_flows` UDP flows per sandbox (beside as many TCP
//! connections), idle ones forgotten after [`UDP_IDLE`] (or the
//! operator's `--egress-idle-timeout`, when shorter); [`EVENTS`] datagrams
//! from upstream waiting for the loop, more dropped; datagrams over
//! [`MAX_DATAGRAM`] bytes (a jumbo frame's payload, far above what DNS,
//! QUIC or STUN send) dropped, so each flow's reader holds one buffer of
//! [`MAX_DATAGRAM`] + 1 bytes (about 2.3 MiB for 256 flows) whatever the
//! TUN's MTU.

use std::{
    collections::{HashMap, VecDeque},
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    net::UdpSocket,
    sync::{mpsc, Notify},
    task::{AbortHandle, JoinSet},
};

use crate::{
    dns::{self, cache::DnsCache},
    meter::Meter,
    policy::{self, Flow as PolicyFlow, Proto, SandboxPolicy},
    Config,
};

/// An idle flow's socket is closed after this long (conntrack's UDP
/// "stream" timeout is 120 s; a minute is ample for request/answer use
/// and gives slots back sooner).
pub(crate) const UDP_IDLE: Duration = Duration::from_secs(60);
/// Datagrams held per flow while its name resolves and its socket opens.
const PENDING_DATAGRAMS: usize = 8;
/// Upstream datagrams (all flows) queued for the loop; more are dropped.
const EVENTS: usize = 256;
/// How long a refused flow stays refused without another log entry.
const REFUSED_MEMORY: Duration = Duration::from_secs(10);
/// Largest datagram payload relayed either way: a 9000-byte jumbo frame's
/// (IPv4 and UDP headers are 28 bytes), well within the TUN's MTU; larger
/// ones are dropped. Not the TUN's 65535: that would make each flow's
/// buffer 64 KiB.
const MAX_DATAGRAM: usize = 9000 - 28;
const _: () = assert!(MAX_DATAGRAM + 28 <= crate::tun::MTU);

/// (sandbox address, sandbox port, destination, destination port).
pub(crate) type Key = (Ipv4Addr, u16, Ipv4Addr, u16);

enum State {
    /// Resolving and opening; datagrams wait.
    Pending(VecDeque<Vec<u8>>),
    Open {
        sock: Arc<UdpSocket>,
        /// Its decision-log entry.
        seq: u64,
        reader: AbortHandle,
    },
}

struct UdpFlow {
    name: Option<String>,
    /// The address the host socket is connected to (known once open).
    peer: Option<IpAddr>,
    state: State,
    active: Instant,
}

pub(crate) enum Event {
    Opened(Key, Arc<UdpSocket>, IpAddr),
    Refused(Key, String),
    Datagram(Key, Vec<u8>),
}

/// What the relay needs from its loop for one call.
pub(crate) struct Ctx<'a> {
    pub cfg: &'a Arc<Config>,
    pub policy: Arc<SandboxPolicy>,
    pub meter: &'a Meter,
    pub sandbox: &'a str,
    /// Packets for the TUN.
    pub tx: &'a mut VecDeque<Vec<u8>>,
    pub tx_cap: usize,
    /// The MTU of the TUN: an answer that does not fit is dropped.
    pub mtu: usize,
}

pub(crate) struct Relay {
    flows: HashMap<Key, UdpFlow>,
    /// Flows refused lately, so a workload that repeats a refused
    /// datagram fills neither the log nor the CPU.
    refused: HashMap<Key, Instant>,
    tasks: JoinSet<()>,
    events_tx: mpsc::Sender<Event>,
    events: mpsc::Receiver<Event>,
    wake: Arc<Notify>,
    last_sweep: Instant,
    /// The sandbox's upstream answers (shared with its TCP flows).
    dns_cache: Arc<Mutex<DnsCache>>,
}

impl Relay {
    pub(crate) fn new(wake: Arc<Notify>, dns_cache: Arc<Mutex<DnsCache>>) -> Relay {
        let (events_tx, events) = mpsc::channel(EVENTS);
        Relay {
            flows: HashMap::new(),
            refused: HashMap::new(),
            tasks: JoinSet::new(),
            events_tx,
            events,
            wake,
            last_sweep: Instant::now(),
            dns_cache,
        }
    }

    /// The next event of a flow's task (never ends: the relay holds a
    /// sender). Finished tasks are reaped here too.
    pub(crate) async fn next(&mut self) -> Event {
        loop {
            tokio::select! {
                Some(ev) = self.events.recv() => return ev,
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        }
    }

    /// Whether `key` has a flow (open or opening) or was refused lately:
    /// then its datagram needs no new decision.
    pub(crate) fn knows(&self, key: &Key) -> bool {
        self.flows.contains_key(key)
            || self
                .refused
                .get(key)
                .is_some_and(|t| t.elapsed() < REFUSED_MEMORY)
    }

    /// A datagram from the sandbox on a flow already known.
    pub(crate) fn carry(&mut self, cx: &mut Ctx<'_>, key: Key, payload: &[u8]) {
        if payload.len() > MAX_DATAGRAM {
            return; // over the bound both ways: what is held stays small
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return; // refused lately: dropped
        };
        f.active = Instant::now();
        match &mut f.state {
            State::Pending(q) => {
                if q.len() < PENDING_DATAGRAMS {
                    q.push_back(payload.to_vec());
                }
            }
            State::Open { sock, seq, .. } => {
                // Non-blocking: a full socket buffer drops it, as a wire would.
                if sock.try_send(payload).is_ok() {
                    cx.meter.moved(*seq, payload.len() as u64, 0);
                }
            }
        }
    }

    /// Records a refusal of a new flow (by the loop's limits or policy).
    pub(crate) fn refuse(
        &mut self,
        cx: &mut Ctx<'_>,
        key: Key,
        name: Option<&str>,
        why: &str,
        log: bool,
    ) {
        if self.refused.len() >= cx.cfg.limits.max_flows.max(1) {
            self.refused.retain(|_, t| t.elapsed() < REFUSED_MEMORY);
        }
        if self.refused.len() < cx.cfg.limits.max_flows.max(1) {
            self.refused.insert(key, Instant::now());
        }
        let (_, _, dst, port) = key;
        if log {
            tracing::info!(sandbox = %cx.sandbox, name = name.unwrap_or(""), %dst, port, %why, "egress: UDP refused");
        }
        cx.meter.refused_udp(name, IpAddr::V4(dst), port, why);
    }

    /// A new flow the loop's limits let through: judged by the policy now,
    /// then resolved, checked again and opened by a task.
    pub(crate) fn open(
        &mut self,
        cx: &mut Ctx<'_>,
        key: Key,
        name: Option<String>,
        first: &[u8],
        log: bool,
    ) {
        if first.len() > MAX_DATAGRAM {
            return; // over the bound: no flow is held for it
        }
        let (_, _, dst, port) = key;
        let flow = PolicyFlow {
            name: name.as_deref(),
            ip: name.is_none().then_some(IpAddr::V4(dst)),
            port,
            proto: Proto::Udp,
        };
        let verdict = match flow.ip {
            Some(ip) => cx
                .cfg
                .operator
                .address_open(ip, &[])
                .and_then(|()| cx.policy.lists_allow(&cx.cfg.operator, &flow)),
            None => cx.policy.lists_allow(&cx.cfg.operator, &flow),
        };
        if let Err(why) = verdict {
            return self.refuse(cx, key, name.as_deref(), &why.to_string(), log);
        }
        if self.flows.len() >= cx.cfg.limits.max_flows {
            let why = format!(
                "too many UDP flows open at once (--egress-max-flows {})",
                cx.cfg.limits.max_flows
            );
            return self.refuse(cx, key, name.as_deref(), &why, log);
        }
        let (cfg, policy, events, wake, cache) = (
            cx.cfg.clone(),
            cx.policy.clone(),
            self.events_tx.clone(),
            self.wake.clone(),
            self.dns_cache.clone(),
        );
        let task_name = name.clone();
        self.tasks.spawn(async move {
            let dialled = dial(
                &cfg,
                &policy,
                &cache,
                task_name.as_deref(),
                IpAddr::V4(dst),
                port,
            );
            let ev = match dialled.await {
                Ok((sock, peer)) => Event::Opened(key, Arc::new(sock), peer),
                Err(why) => Event::Refused(key, why),
            };
            let _ = events.send(ev).await;
            wake.notify_one();
        });
        self.flows.insert(
            key,
            UdpFlow {
                name,
                peer: None,
                state: State::Pending(VecDeque::from([first.to_vec()])),
                active: Instant::now(),
            },
        );
    }

    pub(crate) fn on_event(&mut self, cx: &mut Ctx<'_>, ev: Event) {
        match ev {
            Event::Refused(key, why) => {
                if let Some(f) = self.flows.remove(&key) {
                    self.refuse(cx, key, f.name.as_deref(), &why, true);
                }
            }
            Event::Opened(key, sock, peer) => {
                let Some(f) = self.flows.get_mut(&key) else {
                    return;
                };
                let (_, _, dst, port) = key;
                let seq = cx
                    .meter
                    .opened_udp(f.name.as_deref(), IpAddr::V4(dst), port);
                let (events, wake, rd) = (self.events_tx.clone(), self.wake.clone(), sock.clone());
                let reader = self.tasks.spawn(async move {
                    // One byte more than fits: a longer datagram is seen
                    // truncated, and dropped rather than passed on cut.
                    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
                    loop {
                        match rd.recv(&mut buf).await {
                            Ok(n) if n > MAX_DATAGRAM => {}
                            Ok(n) => {
                                // Full: dropped, as a congested link would.
                                if events
                                    .try_send(Event::Datagram(key, buf[..n].to_vec()))
                                    .is_ok()
                                {
                                    wake.notify_one();
                                }
                            }
                            // An ICMP "port unreachable" from the peer.
                            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                            Err(_) => return,
                        }
                    }
                });
                let waiting = match std::mem::replace(
                    &mut f.state,
                    State::Open {
                        sock: sock.clone(),
                        seq,
                        reader,
                    },
                ) {
                    State::Pending(q) => q,
                    State::Open { .. } => VecDeque::new(),
                };
                f.peer = Some(peer);
                for d in waiting {
                    if sock.try_send(&d).is_ok() {
                        cx.meter.moved(seq, d.len() as u64, 0);
                    }
                }
                // Judged when it began; a PATCH may have come since.
                self.judge(cx, &[key]);
            }
            Event::Datagram(key, payload) => {
                let Some(f) = self.flows.get_mut(&key) else {
                    return;
                };
                let State::Open { seq, .. } = &f.state else {
                    return;
                };
                let (src, sport, dst, dport) = key;
                if payload.len() + 28 > cx.mtu || cx.tx.len() >= cx.tx_cap {
                    return;
                }
                f.active = Instant::now();
                cx.meter.moved(*seq, 0, payload.len() as u64);
                cx.tx
                    .push_back(udp_packet(dst, dport, src, sport, &payload));
            }
        }
    }

    /// Closes flows the sandbox's policy no longer allows (a `PATCH`),
    /// judged by name and by the address actually connected.
    /// Refusals remembered under the old policy are forgotten: a flow it
    /// refused may be one the new policy opens.
    pub(crate) fn rejudge(&mut self, cx: &mut Ctx<'_>) {
        self.refused.clear();
        let keys: Vec<Key> = self.flows.keys().copied().collect();
        self.judge(cx, &keys);
    }

    /// Closes those of `keys` the policy in `cx` refuses.
    fn judge(&mut self, cx: &mut Ctx<'_>, keys: &[Key]) {
        let mut cut = Vec::new();
        for key in keys {
            let Some(f) = self.flows.get(key) else {
                continue;
            };
            let (_, _, dst, port) = *key;
            let flow = PolicyFlow {
                name: f.name.as_deref(),
                ip: f.peer.or(f.name.is_none().then_some(IpAddr::V4(dst))),
                port,
                proto: Proto::Udp,
            };
            if let Err(why) = cx.policy.lists_allow(&cx.cfg.operator, &flow) {
                cut.push((*key, why.to_string()));
            }
        }
        for (key, why) in cut {
            if let Some(f) = self.flows.remove(&key) {
                if let State::Open { reader, .. } = &f.state {
                    reader.abort();
                }
                let (_, _, dst, port) = key;
                let why = format!("closed by a change of the sandbox's network: {why}");
                tracing::info!(sandbox = %cx.sandbox, name = f.name.as_deref().unwrap_or(""), %dst, port, %why, "egress: UDP flow closed");
                cx.meter
                    .closed_udp(f.name.as_deref(), IpAddr::V4(dst), port, &why);
            }
        }
    }

    /// Forgets idle flows and old refusals (at most once a second).
    pub(crate) fn sweep(&mut self, idle: Duration) {
        if self.last_sweep.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last_sweep = Instant::now();
        let idle = idle.min(UDP_IDLE);
        self.flows.retain(|_, f| {
            let keep = f.active.elapsed() < idle;
            if !keep {
                if let State::Open { reader, .. } = &f.state {
                    reader.abort();
                }
            }
            keep
        });
        self.refused.retain(|_, t| t.elapsed() < REFUSED_MEMORY);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.flows.len()
    }
}

/// Resolves (for a name), checks every address again, opens a socket
/// connected to the first that passes.
async fn dial(
    cfg: &Config,
    policy: &SandboxPolicy,
    cache: &Mutex<DnsCache>,
    name: Option<&str>,
    literal: IpAddr,
    port: u16,
) -> Result<(UdpSocket, IpAddr), String> {
    let addrs = match name {
        Some(n) => dns::resolve_cached(cfg.upstream_dns, n, cfg.limits.dns_timeout, cache)
            .await
            .map_err(|e| e.to_string())?,
        None => vec![literal],
    };
    let host = crate::host_addresses();
    let mut last = String::from("no address");
    for ip in addrs.into_iter().take(4) {
        let flow = PolicyFlow {
            name,
            ip: Some(ip),
            port,
            proto: Proto::Udp,
        };
        if let Err(why) = policy::decide(&cfg.operator, policy, &flow, &host) {
            last = why.to_string();
            continue;
        }
        let bind: SocketAddr = if ip.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let opened = async {
            let s = UdpSocket::bind(bind).await?;
            s.connect(SocketAddr::new(ip, port)).await?;
            io::Result::Ok(s)
        };
        match opened.await {
            Ok(s) => return Ok((s, ip)),
            Err(e) => last = format!("{ip}:{port}: {e}"),
        }
    }
    Err(last)
}

/// An IPv4/UDP packet (UDP checksum 0: none, which IPv4 allows): relayed
/// answers here, and the DNS responder's answers in `stack.rs`.
pub(crate) fn udp_packet(
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]); // id, DF, TTL, UDP, checksum
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let sum = ipv4_checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{policy::OperatorPolicy, Limits};

    fn cfg(dns: SocketAddr, max_flows: usize) -> Config {
        Config {
            upstream_dns: dns,
            operator: OperatorPolicy::new(vec![], vec![], true, &[]).open_loopback_for_tests(),
            limits: Limits {
                max_flows,
                ..Limits::default()
            },
            broker: None,
        }
    }

    fn policy(allow: &[&str]) -> Arc<SandboxPolicy> {
        Arc::new(SandboxPolicy {
            template_allow: allow.iter().map(|s| s.parse().unwrap()).collect(),
            ..Default::default()
        })
    }

    /// A real echo server on loopback, a relay, and datagrams both ways:
    /// the allowed port echoes, another port and a full table do not.
    #[tokio::test]
    async fn allowed_flows_echo_and_others_are_dropped_and_bounded() {
        let echo = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut b = vec![0u8; 65_536];
            while let Ok((n, from)) = echo.recv_from(&mut b) {
                let _ = echo.send_to(&b[..n], from);
            }
        });
        let cfg = Arc::new(cfg("127.0.0.1:9".parse().unwrap(), 2));
        let meter = Meter::default();
        let mut tx = VecDeque::new();
        let wake = Arc::new(Notify::new());
        let mut relay = Relay::new(wake, Default::default());
        let allow = format!("udp:127.0.0.1:{port}");
        let pol = policy(&[&allow]);
        let sb = Ipv4Addr::new(100, 127, 0, 2);
        let lo = Ipv4Addr::LOCALHOST;
        macro_rules! cx {
            () => {
                Ctx {
                    cfg: &cfg,
                    policy: pol.clone(),
                    meter: &meter,
                    sandbox: "t",
                    tx: &mut tx,
                    tx_cap: 16,
                    mtu: 1500,
                }
            };
        }
        let ok = (sb, 4000, lo, port);
        relay.open(&mut cx!(), ok, None, b"ping", false);
        // Another port: refused at once, remembered, never a flow.
        let other = (sb, 4001, lo, port.wrapping_add(1).max(1));
        relay.open(&mut cx!(), other, None, b"x", false);
        assert!(relay.knows(&other));
        assert_eq!(relay.len(), 1);
        // Opened, the waiting datagram goes out, and its echo comes back.
        for _ in 0..2 {
            let ev = tokio::time::timeout(Duration::from_secs(5), relay.next())
                .await
                .expect("an event");
            relay.on_event(&mut cx!(), ev);
        }
        let pkt = tx.pop_front().expect("the echo as a packet");
        let ip = smoltcp::wire::Ipv4Packet::new_checked(&pkt[..]).unwrap();
        assert_eq!((ip.src_addr(), ip.dst_addr()), (lo, sb));
        let udp = smoltcp::wire::UdpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!((udp.src_port(), udp.dst_port()), (port, 4000));
        assert_eq!(udp.payload(), b"ping");
        let t = meter.totals();
        assert_eq!((t.bytes_out, t.bytes_in, t.connections_opened), (4, 4, 1));
        // An answer too large for one packet to the sandbox is dropped,
        // not passed on cut.
        relay.carry(&mut cx!(), ok, &vec![7u8; MAX_DATAGRAM + 100]);
        let quiet = tokio::time::timeout(Duration::from_millis(300), relay.next()).await;
        assert!(quiet.is_err(), "an oversized datagram came through");
        assert_eq!(t.connections_refused, 1);
        // The table is bounded: a second allowed flow fits, a third not.
        relay.open(&mut cx!(), (sb, 4002, lo, port), None, b"a", false);
        relay.open(&mut cx!(), (sb, 4003, lo, port), None, b"b", false);
        assert_eq!(relay.len(), 2);
        assert!(meter
            .decisions()
            .last()
            .unwrap()
            .reason
            .contains("too many UDP flows"));
        // A narrowed policy closes the open flow.
        let narrowed = policy(&["udp:127.0.0.1:1"]);
        relay.rejudge(&mut Ctx {
            policy: narrowed,
            ..cx!()
        });
        assert_eq!(relay.len(), 0);
        let last = meter.decisions().pop().unwrap();
        assert!(last.reason.contains("closed by a change"), "{last:?}");
        // And forgets refusals made under the old one.
        assert!(!relay.knows(&other));
        // Idle flows give their slot back.
        relay.open(&mut cx!(), (sb, 4004, lo, port), None, b"c", false);
        assert_eq!(relay.len(), 1);
        relay.sweep(Duration::from_secs(3600));
        assert_eq!(
            relay.len(),
            1,
            "at most one sweep a second, and it is not idle"
        );
        relay.last_sweep -= Duration::from_secs(2);
        relay.sweep(Duration::ZERO);
        assert_eq!(relay.len(), 0);
    }
}
