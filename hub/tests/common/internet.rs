//! The tests' own "internet" for `network: egress` (issue #27): a network
//! namespace joined to the host by a veth pair, holding an HTTP server
//! (ports 80 and 8443) and a DNS server, plus helpers to probe it from
//! inside a sandbox. More servers run in it with [`Internet::spawn_inside`].
//!
//! Addresses, all owned by this machine while a test runs:
//!
//! ```text
//! host side of the veth   198.18.0.1/24   (a host address: always closed)
//! the test namespace      198.18.0.2/24   HTTP :80 :8443, DNS :53
//!   on its lo             198.18.5.2      (CIDR entries)
//!                         100.80.0.2      (a private range: closed unless opened)
//!                         169.254.77.2    (link-local: always closed)
//! ```
//!
//! The host routes those three to 198.18.0.2, so the host itself can reach
//! every one of them: when a sandbox cannot, it is the gateway saying no.
//! Nothing is ever sent to an address outside this list or loopback.
//!
//! Needs root, `ip` (iproute2) and `/dev/net/tun`; without them
//! [`prerequisites`] says so and returns false, except under `CI=true`,
//! where it fails.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{TcpListener, UdpSocket},
    os::fd::AsRawFd,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use sandhub_client::http::HubClient;
use sandhub_gateway::dns::wire;

use super::shell;

/// The test "internets" share addresses: one at a time.
pub static ONE_INTERNET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether the machine can run these tests; under CI a missing piece fails.
pub fn prerequisites() -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        missing.push("/dev/net/tun");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        missing.push("the `ip` command (iproute2)");
    }
    if !std::path::Path::new("/usr/bin/python3").exists() {
        missing.push("/usr/bin/python3 (the sandbox's probe)");
    }
    if missing.is_empty() {
        return true;
    }
    assert!(!ci(), "CI=true and missing: {}", missing.join(", "));
    eprintln!("skipping: missing {}", missing.join(", "));
    false
}

pub fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("running ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Bytes of `GET /big` and of the upload test.
pub const BIG: usize = 16 << 20;

/// The byte at `offset` of `GET /big`'s body and of what the upload test
/// sends: the offset mod 251, a prime that divides no segment or buffer
/// size, so a lost, repeated or reordered segment changes what arrives.
pub fn big_byte(offset: usize) -> u8 {
    (offset % 251) as u8
}

/// Names the test DNS server knows, and their addresses.
pub const ZONE: &[(&str, [u8; 4])] = &[
    ("pypi.test", [198, 18, 0, 2]),
    ("api.test", [198, 18, 0, 2]),
    ("git.test", [198, 18, 0, 2]),
    ("a.git.test", [198, 18, 0, 2]),
    ("bad.git.test", [198, 18, 0, 2]),
    ("cidr.test", [198, 18, 5, 2]),
    ("rebind.test", [127, 0, 0, 1]),
    ("hostaddr.test", [198, 18, 0, 1]),
    ("private.test", [100, 80, 0, 2]),
    ("linklocal.test", [169, 254, 77, 2]),
];

/// The lock file behind [`Internet`]'s cross-process lock.
pub const LOCK: &str = "/run/sandhub-test-internet.lock";

/// The test's own network: a namespace, a veth pair, routes, servers.
pub struct Internet {
    pub ns: String,
    pub veth: String,
    pub stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Queries for a name, by name (the DNS server counts them).
    dns_asked: Arc<Mutex<HashMap<String, usize>>>,
    /// HTTP requests by path.
    http_seen: Arc<Mutex<HashMap<String, usize>>>,
    /// An exclusive `flock` on [`LOCK`], held while this is up:
    /// [`ONE_INTERNET`] orders the tests of one process, this orders test
    /// processes (two suites, two worktrees) that would claim the same
    /// addresses.
    _lock: std::fs::File,
    /// Names the DNS server answers beyond [`ZONE`] ([`Internet::add_name`]).
    extra_names: Arc<Mutex<HashMap<String, [u8; 4]>>>,
}

impl Internet {
    pub fn up() -> Internet {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .expect("opening the test internet's lock file");
        // SAFETY: flock on a file this function owns; blocks until free.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let pid = std::process::id() % 100_000;
        let (ns, veth, peer) = (
            format!("sheg{pid}"),
            format!("shegh{pid}"),
            format!("shegn{pid}"),
        );
        // Leftovers of a killed run of this same pid would be in the way.
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &veth]).output();
        ip(&format!("netns add {ns}"));
        let mut net = Internet {
            ns: ns.clone(),
            veth: veth.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            dns_asked: Default::default(),
            http_seen: Default::default(),
            extra_names: Default::default(),
            _lock: lock,
        };
        ip(&format!(
            "link add {veth} type veth peer name {peer} netns {ns}"
        ));
        ip(&format!("addr add 198.18.0.1/24 dev {veth}"));
        ip(&format!("link set {veth} up"));
        ip(&format!("-n {ns} link set lo up"));
        ip(&format!("-n {ns} addr add 198.18.0.2/24 dev {peer}"));
        ip(&format!("-n {ns} link set {peer} up"));
        for a in ["198.18.5.2", "100.80.0.2", "169.254.77.2"] {
            ip(&format!("-n {ns} addr add {a}/32 dev lo"));
            ip(&format!("route add {a}/32 via 198.18.0.2 dev {veth}"));
        }
        ip(&format!("-n {ns} route add default via 198.18.0.1"));
        for port in [80u16, 8443] {
            net.serve_http(port);
        }
        net.serve_dns();
        net
    }

    /// Runs `f` on a thread inside the test namespace.
    pub fn spawn_inside(&mut self, f: impl FnOnce() + Send + 'static) {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.ns)).unwrap();
        self.threads.push(std::thread::spawn(move || {
            // SAFETY: setns on this thread only.
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            f()
        }));
    }

    fn serve_http(&mut self, port: u16) {
        let (stop, seen) = (self.stop.clone(), self.http_seen.clone());
        self.spawn_inside(move || {
            let l = TcpListener::bind(("0.0.0.0", port)).unwrap();
            l.set_nonblocking(true).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                // What came after the head, as sent (the upload checks it).
                let rest = head
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .map_or(Vec::new(), |i| head[i + 4..].to_vec());
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let host = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Host: "))
                    .unwrap_or("")
                    .to_string();
                *seen.lock().unwrap().entry(path.clone()).or_default() += 1;
                if path == "/big" {
                    // 16 MiB down: flow control through the gateway.
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\nConnection: close\r\n\r\n"
                    );
                    let mut chunk = vec![0u8; 64 * 1024];
                    for c in 0..BIG / chunk.len() {
                        for (i, b) in chunk.iter_mut().enumerate() {
                            *b = big_byte(c * 64 * 1024 + i);
                        }
                        if s.write_all(&chunk).is_err() {
                            break;
                        }
                    }
                    continue;
                }
                if path == "/upload" {
                    // Counts the body (up); what came with the head counts too.
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    // The body must be `big_byte`'s pattern, byte for byte.
                    let mut got = 0;
                    let mut wrong = 0usize;
                    let mut check = |bytes: &[u8], got: &mut usize| {
                        for b in bytes {
                            wrong += usize::from(*b != big_byte(*got));
                            *got += 1;
                        }
                    };
                    check(&rest, &mut got);
                    while got < len {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => check(&buf[..n], &mut got),
                        }
                    }
                    let body = if wrong == 0 {
                        format!("hello upload {got}")
                    } else {
                        format!("hello upload {got}, {wrong} bytes wrong")
                    };
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    continue;
                }
                let local = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
                let body = format!("hello {host} at {local}{path}");
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
    }

    fn serve_dns(&mut self) {
        let (stop, asked, extra) = (
            self.stop.clone(),
            self.dns_asked.clone(),
            self.extra_names.clone(),
        );
        self.spawn_inside(move || {
            let s = UdpSocket::bind("0.0.0.0:53").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = s.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(q) = wire::parse_query(&buf[..n]) else {
                    continue;
                };
                *asked.lock().unwrap().entry(q.name.clone()).or_default() += 1;
                let hit = ZONE
                    .iter()
                    .find(|(name, _)| *name == q.name)
                    .map(|(_, a)| *a)
                    .or_else(|| extra.lock().unwrap().get(&q.name).copied());
                let answer = match (hit, q.qtype) {
                    (Some(a), wire::TYPE_A) => wire::answer(&q, wire::NOERROR, &[a.into()], 1),
                    (Some(_), _) => wire::answer(&q, wire::NOERROR, &[], 1),
                    (None, _) if q.name.starts_with("marker") => {
                        wire::answer(&q, wire::NOERROR, &[[198, 18, 0, 2].into()], 1)
                    }
                    (None, _) => wire::answer(&q, wire::NXDOMAIN, &[], 1),
                };
                let _ = s.send_to(&answer, from);
            }
        });
    }

    /// Makes the DNS server answer `name` with `addr` (an address of this
    /// internet: 198.18.0.2, or one on its `lo`).
    pub fn add_name(&self, name: &str, addr: [u8; 4]) {
        self.extra_names
            .lock()
            .unwrap()
            .insert(name.to_ascii_lowercase(), addr);
    }

    pub fn asked(&self, name: &str) -> usize {
        self.dns_asked
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    pub fn seen(&self, path: &str) -> usize {
        self.http_seen
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Fetches each URL from inside the sandbox; one line per URL:
/// `OK <status> <body>` or `ERR <exception class> <message>`. A refused
/// connection is `ConnectionRefusedError`, a hang would be `timeout`. A
/// body over 64 KiB (`/big`, binary) is given as `<N bytes>`.
pub const PROBE: &str = r#"
import socket, sys, urllib.request
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            b = r.read()
            print("OK", r.status, b.decode() if len(b) <= 1 << 16 else f"<{len(b)} bytes>")
    except Exception as e:
        reason = getattr(e, "reason", e)
        print("ERR", type(reason).__name__, reason)
"#;

pub async fn probe(c: &HubClient, id: &str, urls: &[&str]) -> Vec<String> {
    let script = format!(
        "env -u http_proxy -u HTTP_PROXY /usr/bin/python3 - {} <<'EOF'\n{PROBE}\nEOF",
        urls.join(" ")
    );
    let r = shell(c, id, &script).await;
    assert_eq!(r.exit_code, 0, "probe failed: {r:?}");
    let lines: Vec<String> = r.stdout.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), urls.len(), "{r:?}");
    lines
}

pub fn assert_ok(line: &str, what: &str) {
    assert!(line.starts_with("OK 200 hello"), "{what}: {line}");
}

pub fn assert_refused(line: &str, what: &str) {
    assert!(
        line.starts_with("ERR ConnectionRefusedError"),
        "{what}: expected a refusal at once, got {line}"
    );
}

pub fn assert_no_name(line: &str, what: &str) {
    assert!(
        line.starts_with("ERR gaierror") && line.contains("-2"),
        "{what}: expected NXDOMAIN (EAI_NONAME), got {line}"
    );
}
