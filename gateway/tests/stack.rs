//! The gateway's loop without root: a `SOCK_SEQPACKET` socket pair stands
//! in for the TUN device (one packet per read and write, as a TUN gives),
//! the test writes the sandbox's IPv4 packets into one end and reads the
//! gateway's answers from it. The upstream resolver is a UDP socket of the
//! test on loopback. Every address it hands out is closed (loopback), so
//! these tests cover the refusing paths; `hub/tests/egress.rs` covers the
//! connecting ones against real servers.

use std::{
    net::{Ipv4Addr, UdpSocket},
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::net::UnixDatagram,
    },
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use sandhub_api::network::Pattern;
use sandhub_gateway::{
    dns::wire,
    policy::internal::{GATEWAY, SANDBOX},
    Config, Limits, OperatorPolicy, SandboxPolicy,
};
use smoltcp::{
    phy::ChecksumCapabilities,
    wire::{
        IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
        UdpPacket,
    },
};

/// The test's end of the "TUN" and the gateway's.
fn tun_pair() -> (UnixDatagram, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fds we own at once.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: both fds are fresh and ours.
    let (mine, theirs) = unsafe {
        (
            UnixDatagram::from_raw_fd(fds[0]),
            OwnedFd::from_raw_fd(fds[1]),
        )
    };
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fds[1], libc::F_GETFL);
        libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    mine.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (mine, theirs)
}

/// A resolver on loopback that answers every name with 127.0.0.1 and
/// counts the questions.
fn upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            if let Ok(q) = wire::parse_query(&buf[..n]) {
                count.fetch_add(1, Ordering::SeqCst);
                let a = wire::answer(&q, wire::NOERROR, &[Ipv4Addr::LOCALHOST], 1);
                let _ = s.send_to(&a, from);
            }
        }
    });
    (addr, asked)
}

fn udp(dst: Ipv4Addr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let total = 28 + payload.len();
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&SANDBOX.octets());
    p.extend_from_slice(&dst.octets());
    let mut ip = Ipv4Packet::new_unchecked(&mut p[..]);
    ip.fill_checksum();
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

fn syn(dst: Ipv4Addr, dport: u16, sport: u16) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: sport,
        dst_port: dport,
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(1000),
        ack_number: None,
        window_len: 65535,
        window_scale: None,
        max_seg_size: Some(1400),
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let ip = Ipv4Repr {
        src_addr: SANDBOX,
        dst_addr: dst,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let mut buf = vec![0u8; ip.buffer_len() + tcp.buffer_len()];
    let caps = ChecksumCapabilities::default();
    let mut p = Ipv4Packet::new_unchecked(&mut buf[..]);
    ip.emit(&mut p, &caps);
    let mut t = TcpPacket::new_unchecked(p.payload_mut());
    tcp.emit(
        &mut t,
        &IpAddress::Ipv4(SANDBOX),
        &IpAddress::Ipv4(dst),
        &caps,
    );
    buf
}

/// The next packet the gateway writes, if one comes within `wait`.
fn next(tun: &UnixDatagram, wait: Duration) -> Option<Vec<u8>> {
    tun.set_read_timeout(Some(wait)).unwrap();
    let mut buf = vec![0u8; 2048];
    let n = tun.recv(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

fn dns_answer(p: &[u8]) -> (u8, Vec<std::net::IpAddr>) {
    let ip = Ipv4Packet::new_checked(p).unwrap();
    assert!(ip.verify_checksum());
    assert_eq!(ip.src_addr(), GATEWAY);
    assert_eq!(ip.dst_addr(), SANDBOX);
    let u = UdpPacket::new_checked(ip.payload()).unwrap();
    assert_eq!(u.src_port(), 53);
    wire::parse_response(u.payload(), 7).unwrap()
}

/// Asserts `p` is a reset of the SYN (`syn` above) to `dst:dport`.
fn assert_reset(p: &[u8], dst: Ipv4Addr, dport: u16) {
    let ip = Ipv4Packet::new_checked(p).unwrap();
    assert_eq!(ip.src_addr(), dst);
    let t = TcpPacket::new_checked(ip.payload()).unwrap();
    assert_eq!(t.src_port(), dport);
    assert!(t.rst(), "not a reset: {t:?}");
    assert_eq!(t.ack_number(), TcpSeqNumber(1001));
}

#[tokio::test]
async fn the_loop_answers_dns_and_resets_what_the_policy_or_the_closed_ranges_refuse() {
    let (tun, gw_end) = tun_pair();
    let (upstream_dns, asked) = upstream();
    let cfg = Arc::new(Config {
        upstream_dns,
        operator: OperatorPolicy::new(vec![], vec![], false, &[]),
        limits: Limits::default(),
        broker: None,
    });
    let policy = SandboxPolicy {
        template_allow: vec!["pypi.test".parse::<Pattern>().unwrap()],
        ..Default::default()
    };
    let gw = sandhub_gateway::start(gw_end, None, cfg, policy, "sb-test".into()).unwrap();
    let wait = Duration::from_secs(10);
    let ask = |name: &str| {
        tun.send(&udp(GATEWAY, 53, &wire::build_query(7, name, wire::TYPE_A)))
            .unwrap();
        let tun = tun.try_clone().unwrap();
        async move {
            tokio::task::spawn_blocking(move || next(&tun, wait))
                .await
                .unwrap()
        }
    };

    // An allowed name: a fake IP; a refused one: NXDOMAIN, never asked upstream.
    let (rcode, addrs) = dns_answer(&ask("pypi.test").await.expect("an answer"));
    assert_eq!(rcode, wire::NOERROR);
    let fake = match addrs.as_slice() {
        [std::net::IpAddr::V4(a)] => *a,
        other => panic!("{other:?}"),
    };
    assert_eq!(fake.octets()[..2], [100, 127]);
    let (rcode, addrs) = dns_answer(&ask("other.test").await.expect("an answer"));
    assert_eq!((rcode, addrs.len()), (wire::NXDOMAIN, 0));

    let read = |tun: &UnixDatagram| {
        let tun = tun.try_clone().unwrap();
        tokio::task::spawn_blocking(move || next(&tun, wait))
    };
    // A literal address the policy does not name: reset at once.
    let dst = Ipv4Addr::new(203, 0, 113, 9);
    tun.send(&syn(dst, 80, 40001)).unwrap();
    assert_reset(&read(&tun).await.unwrap().expect("a reset"), dst, 80);
    // The allowed name resolves (upstream) to loopback: reset after the
    // resolution, nothing connected (rebinding).
    tun.send(&syn(fake, 80, 40002)).unwrap();
    assert_reset(&read(&tun).await.unwrap().expect("a reset"), fake, 80);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "only pypi.test was asked, once"
    );
    // A fake IP nobody was given: reset.
    let unknown = Ipv4Addr::new(100, 127, 200, 200);
    tun.send(&syn(unknown, 443, 40003)).unwrap();
    assert_reset(&read(&tun).await.unwrap().expect("a reset"), unknown, 443);
    // The gateway's own address is no destination (no DNS over TCP).
    tun.send(&syn(GATEWAY, 53, 40004)).unwrap();
    assert_reset(&read(&tun).await.unwrap().expect("a reset"), GATEWAY, 53);

    // UDP to another resolver and ICMP: nothing comes back, nothing leaves.
    tun.send(&udp(
        Ipv4Addr::new(198, 51, 100, 1),
        53,
        &wire::build_query(7, "pypi.test", wire::TYPE_A),
    ))
    .unwrap();
    let mut ping = udp(GATEWAY, 0, &[8, 0, 0, 0, 0, 0, 0, 0]);
    ping[9] = 1; // ICMP
    tun.send(&ping).unwrap();
    let quiet = {
        let tun = tun.try_clone().unwrap();
        tokio::task::spawn_blocking(move || next(&tun, Duration::from_millis(500)))
            .await
            .unwrap()
    };
    assert_eq!(quiet, None);
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // Every refused connection (and the UDP flow) is counted and logged
    // with its reason; nothing was opened, no byte moved.
    let t = gw.meter().totals();
    assert_eq!(
        (
            t.connections_opened,
            t.connections_refused,
            t.bytes_out,
            t.bytes_in
        ),
        (0, 5, 0, 0)
    );
    let log = gw.meter().decisions();
    let seen: Vec<_> = log
        .iter()
        .map(|d| (d.name.as_deref(), d.address.to_string(), d.port, d.allowed))
        .collect();
    assert_eq!(
        seen,
        vec![
            (None, "203.0.113.9".to_string(), 80, false),
            (Some("pypi.test"), fake.to_string(), 80, false),
            (None, unknown.to_string(), 443, false),
            (None, GATEWAY.to_string(), 53, false),
            (None, "198.51.100.1".to_string(), 53, false),
        ]
    );
    assert!(log.iter().all(|d| !d.reason.is_empty()), "{log:?}");
    assert_eq!(
        log.iter().map(|d| d.udp).collect::<Vec<_>>(),
        [false, false, false, false, true]
    );
    assert!(log[1].reason.contains("127.0.0.1"), "{:?}", log[1].reason);
}
