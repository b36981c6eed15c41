//! The gateway in proxy form against real servers on loopback: an HTTP
//! server, a TLS server with a test CA (the broker's upstream trust), and
//! a resolver that gives each test name its address. The proxy runs as
//! `sandhub egress-proxy` runs it, with a [`Directory`] closure standing
//! in for the Kubernetes API.
//!
//! Loopback is closed to every sandbox; these tests open it with the
//! test-only [`OperatorPolicy::open_loopback_for_tests`] where a flow must
//! reach a server, and one test runs without it to show that a name
//! resolving to loopback (rebinding) is refused after resolution. The
//! other closed and private ranges are never dialled: their refusals come
//! before any connect.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use sandhub_api::network::Pattern;
use sandhub_gateway::{
    broker::{Broker, Secret},
    dns::wire,
    proxy::{Proxy, ProxyLimits, ProxySandbox},
    Config, Limits, Meter, OperatorPolicy, SandboxPolicy,
};

const CRED: &str = "c0ffee-credential";
const VALUE: &str = "sk-the-real-value-42";
const PLACEHOLDER: &str = "sandhub-secret-abc123";

/// Answers `A` for each name in `names`, NXDOMAIN for the rest.
fn resolver(names: &[(&str, Ipv4Addr)]) -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    let names: HashMap<String, Ipv4Addr> = names.iter().map(|(n, a)| (n.to_string(), *a)).collect();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            if let Ok(q) = wire::parse_query(&buf[..n]) {
                let a = match names.get(&q.name) {
                    Some(ip) => wire::answer(&q, wire::NOERROR, &[*ip], 1),
                    None => wire::answer(&q, wire::NXDOMAIN, &[], 1),
                };
                let _ = s.send_to(&a, from);
            }
        }
    });
    addr
}

/// Reads one request head, answers 200 with `X-Echo: <Authorization>`
/// and the head as its body, closes.
fn answer(s: &mut (impl Read + Write)) {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let auth = text
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
                .map(|(_, v)| v.trim())
        })
        .unwrap_or("")
        .to_string();
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nX-Echo: {auth}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = s.flush();
}

/// An HTTP server on loopback; every request it saw, by head.
fn http_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let mut peek = [0u8; 4096];
            let n = s.peek(&mut peek).unwrap_or(0);
            log.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&peek[..n]).into_owned());
            answer(&mut s);
        }
    });
    (port, seen)
}

/// The test CA (PEM) and a TLS server for `api.test` on loopback that
/// echoes the `Authorization` it received.
fn tls_server() -> (String, u16) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "sandhub proxy test CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.test".into()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let cfg = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
        )
        .unwrap(),
    );
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, s);
            answer(&mut tls);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    (ca_cert.pem(), port)
}

fn pats(list: &[&str]) -> Vec<Pattern> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

struct Setup {
    op: OperatorPolicy,
    dns: SocketAddr,
    policy: SandboxPolicy,
    limits: Limits,
    proxy_limits: ProxyLimits,
    broker: Option<Arc<Broker>>,
    secrets: Vec<Secret>,
}

impl Setup {
    fn new(dns: SocketAddr, allow: &[&str], deny: &[&str]) -> Setup {
        Setup {
            op: OperatorPolicy::new(vec![], vec![], false, &[]).open_loopback_for_tests(),
            dns,
            policy: SandboxPolicy {
                template_allow: pats(allow),
                template_deny: pats(deny),
                ..Default::default()
            },
            limits: Limits::default(),
            proxy_limits: ProxyLimits::default(),
            broker: None,
            secrets: Vec::new(),
        }
    }

    /// Starts the proxy for sandbox `sb-1` on its own runtime thread.
    fn start(self) -> (SocketAddr, Arc<Meter>) {
        let meter = Arc::new(Meter::default());
        let cfg = Arc::new(Config {
            upstream_dns: self.dns,
            operator: self.op,
            limits: self.limits,
            broker: self.broker,
        });
        let entry = ProxySandbox {
            credential: CRED.into(),
            policy: Arc::new(self.policy),
            secrets: Arc::new(self.secrets),
            meter: meter.clone(),
            cap_bytes: None,
        };
        let dir = move |id: &str| (id == "sb-1").then(|| entry.clone());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let limits = self.proxy_limits;
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(l).unwrap();
                let _ = Proxy::new(cfg, Arc::new(dir), limits).serve(l).await;
            });
        });
        (addr, meter)
    }
}

fn basic(user: &str, pass: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
}

fn dial(proxy: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s
}

/// Reads until the end of a head; the head as text.
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends CONNECT with `auth` (`None`: no header); the answer's head.
fn connect(s: &mut TcpStream, target: &str, auth: Option<&str>) -> String {
    let auth = auth
        .map(|a| format!("Proxy-Authorization: Basic {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"
    )
    .unwrap();
    read_head(s)
}

fn read_all(s: &mut impl Read) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn connect_and_absolute_form_follow_the_policy_and_the_meter_counts() {
    let (port, seen) = http_server();
    let dns = resolver(&[
        ("pypi.test", Ipv4Addr::LOCALHOST),
        ("bad.pypi.test", Ipv4Addr::LOCALHOST),
        ("other.test", Ipv4Addr::LOCALHOST),
    ]);
    let (proxy, meter) = Setup::new(dns, &["*.pypi.test", "pypi.test"], &["bad.pypi.test"]).start();
    let cred = basic("sb-1", CRED);

    // CONNECT to an allowed name: a tunnel to the real server.
    let mut s = dial(proxy);
    let head = connect(&mut s, &format!("pypi.test:{port}"), Some(&cred));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let req = "GET /simple/ HTTP/1.1\r\nHost: pypi.test\r\n\r\n";
    s.write_all(req.as_bytes()).unwrap();
    let body = read_all(&mut s);
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("GET /simple/"), "{body}");

    // Deny over allow, and a name in no allow entry: 403 with the reason,
    // and the server never hears of them.
    for (target, why) in [
        ("bad.pypi.test", "denied by the template's deny_out"),
        ("other.test", "not in the template's allow_out"),
    ] {
        let mut s = dial(proxy);
        let head = connect(&mut s, &format!("{target}:{port}"), Some(&cred));
        assert!(head.starts_with("HTTP/1.1 403"), "{target}: {head}");
        assert!(read_all(&mut s).contains(why), "{target}");
    }

    // Absolute form: forwarded in origin form, the proxy's credential
    // stripped, judged by the URL's host.
    let mut s = dial(proxy);
    write!(
        s,
        "GET http://pypi.test:{port}/simple/x/?q=1 HTTP/1.1\r\nHost: pypi.test:{port}\r\nProxy-Authorization: Basic {cred}\r\nProxy-Connection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let body = read_all(&mut s);
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert!(
        last.starts_with("GET /simple/x/?q=1 HTTP/1.1\r\n"),
        "{last}"
    );
    assert!(!last.to_ascii_lowercase().contains("proxy-"), "{last}");
    assert!(last.contains("Connection: close"), "{last}");
    let mut s = dial(proxy);
    write!(
        s,
        "GET http://other.test:{port}/ HTTP/1.1\r\nProxy-Authorization: Basic {cred}\r\n\r\n"
    )
    .unwrap();
    assert!(read_all(&mut s).starts_with("HTTP/1.1 403"));
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "refused requests never arrive"
    );

    // The meter: two flows carried, two CONNECTs and one GET refused;
    // bytes out are exactly what the client sent through the tunnels.
    let t = meter.totals();
    assert_eq!((t.connections_opened, t.connections_refused), (2, 3));
    let log = meter.decisions();
    assert_eq!(log.len(), 5);
    assert_eq!(log[0].name.as_deref(), Some("pypi.test"));
    assert!(log[0].allowed);
    assert_eq!(log[0].bytes_out, req.len() as u64);
    assert!(!log[1].allowed && log[1].reason.contains("deny_out"));
    assert!(t.bytes_in > 0);
}

#[test]
fn missing_or_wrong_credentials_get_407_and_a_socks_auth_failure() {
    let (port, seen) = http_server();
    let dns = resolver(&[("pypi.test", Ipv4Addr::LOCALHOST)]);
    let (proxy, meter) = Setup::new(dns, &["pypi.test"], &[]).start();
    let target = format!("pypi.test:{port}");
    for auth in [
        None,
        Some(basic("sb-1", "wrong")),
        Some(basic("sb-2", CRED)),
        Some(basic("sb-1", &format!("{CRED}x"))),
        Some("!!!".to_string()),
    ] {
        let mut s = dial(proxy);
        let head = connect(&mut s, &target, auth.as_deref());
        assert!(head.starts_with("HTTP/1.1 407"), "{auth:?}: {head}");
        assert!(head.contains("Proxy-Authenticate: Basic"), "{head}");
    }
    // SOCKS5: no user/pass method offered, then a wrong password.
    let mut s = dial(proxy);
    s.write_all(&[5, 1, 0]).unwrap();
    let mut r = [0u8; 2];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r, [5, 0xFF]);
    let mut s = dial(proxy);
    s.write_all(&[5, 1, 2]).unwrap();
    s.read_exact(&mut r).unwrap();
    assert_eq!(r, [5, 2]);
    let mut sub = vec![1, 4];
    sub.extend_from_slice(b"sb-1");
    sub.push(5);
    sub.extend_from_slice(b"wrong");
    s.write_all(&sub).unwrap();
    s.read_exact(&mut r).unwrap();
    assert_eq!(r, [1, 1]);
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(meter.totals().connections_opened, 0);
}

/// SOCKS5 greeting, auth and a CONNECT to `name:port`; the reply code.
fn socks_connect(s: &mut TcpStream, user: &str, pass: &str, name: &str, port: u16) -> u8 {
    s.write_all(&[5, 1, 2]).unwrap();
    let mut r = [0u8; 2];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r, [5, 2]);
    let mut sub = vec![1, user.len() as u8];
    sub.extend_from_slice(user.as_bytes());
    sub.push(pass.len() as u8);
    sub.extend_from_slice(pass.as_bytes());
    s.write_all(&sub).unwrap();
    s.read_exact(&mut r).unwrap();
    assert_eq!(r, [1, 0]);
    let mut req = vec![5, 1, 0, 3, name.len() as u8];
    req.extend_from_slice(name.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(rep[0], 5);
    rep[1]
}

#[test]
fn socks5_carries_allowed_names_and_refuses_denied_ones_with_0x02() {
    let (port, _) = http_server();
    let dns = resolver(&[
        ("pypi.test", Ipv4Addr::LOCALHOST),
        ("bad.test", Ipv4Addr::LOCALHOST),
    ]);
    let (proxy, meter) = Setup::new(dns, &["*.test", "pypi.test"], &["bad.test"]).start();
    let mut s = dial(proxy);
    assert_eq!(socks_connect(&mut s, "sb-1", CRED, "pypi.test", port), 0);
    s.write_all(b"GET /via-socks HTTP/1.1\r\nHost: pypi.test\r\n\r\n")
        .unwrap();
    assert!(read_all(&mut s).contains("GET /via-socks"));
    let mut s = dial(proxy);
    assert_eq!(socks_connect(&mut s, "sb-1", CRED, "bad.test", port), 2);
    // A name no resolver knows: unreachable (0x04).
    let mut s = dial(proxy);
    assert_eq!(socks_connect(&mut s, "sb-1", CRED, "nowhere.test", port), 4);
    let t = meter.totals();
    assert_eq!((t.connections_opened, t.connections_refused), (1, 2));
}

#[test]
fn closed_and_private_ranges_are_refused_after_resolution_whatever_the_lists() {
    // No loopback knob here: the operator policy every binary uses.
    let (port, seen) = http_server();
    let dns = resolver(&[
        ("rebind.test", Ipv4Addr::LOCALHOST),
        ("meta.test", Ipv4Addr::new(169, 254, 169, 254)),
        ("db.test", Ipv4Addr::new(10, 0, 0, 7)),
    ]);
    let mut setup = Setup::new(dns, &["*", "0.0.0.0/0"], &[]);
    setup.op = OperatorPolicy::new(vec![], vec![], false, &[]);
    let (proxy, meter) = setup.start();
    let cred = basic("sb-1", CRED);
    for (target, why) in [
        (format!("rebind.test:{port}"), "always-closed"),
        (format!("meta.test:{port}"), "always-closed"),
        (format!("db.test:{port}"), "private"),
        (format!("127.0.0.1:{port}"), "always-closed"),
        ("169.254.169.254:80".to_string(), "always-closed"),
        ("[::1]:80".to_string(), "always-closed"),
        ("10.0.0.7:80".to_string(), "private"),
    ] {
        let mut s = dial(proxy);
        let head = connect(&mut s, &target, Some(&cred));
        assert!(head.starts_with("HTTP/1.1 403"), "{target}: {head}");
        assert!(read_all(&mut s).contains(why), "{target}");
    }
    let mut s = dial(proxy);
    assert_eq!(socks_connect(&mut s, "sb-1", CRED, "rebind.test", port), 2);
    assert!(seen.lock().unwrap().is_empty(), "nothing reached loopback");
    assert_eq!(meter.totals().connections_refused, 8);
    assert_eq!(meter.totals().connections_opened, 0);
}

#[test]
fn a_brokered_secret_reaches_its_host_through_connect_and_never_the_client() {
    let (test_ca, tls_port) = tls_server();
    let (http_port, seen) = http_server();
    let dns = resolver(&[
        ("api.test", Ipv4Addr::LOCALHOST),
        ("other.test", Ipv4Addr::LOCALHOST),
    ]);
    let dir = std::env::temp_dir().join(format!("sandhub-proxy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let roots = dir.join("test-ca.pem");
    std::fs::write(&roots, &test_ca).unwrap();
    let broker = Arc::new(Broker::new(&dir.join("ca"), Some(&roots)).unwrap());
    let mut setup = Setup::new(dns, &["api.test", "other.test"], &[]);
    setup.broker = Some(broker.clone());
    setup.secrets = vec![Secret {
        name: "OPENAI_API_KEY".into(),
        placeholder: PLACEHOLDER.into(),
        value: VALUE.into(),
        hosts: pats(&[&format!("api.test:{tls_port}")]),
        header: http::header::AUTHORIZATION,
        format: "Bearer {value}".into(),
    }];
    let (proxy, meter) = setup.start();
    let cred = basic("sb-1", CRED);

    // TLS through the tunnel, trusting only the hub's CA (as the Pod does).
    let mut s = dial(proxy);
    let head = connect(&mut s, &format!("api.test:{tls_port}"), Some(&cred));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(broker.ca_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cc = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let conn = rustls::ClientConnection::new(Arc::new(cc), "api.test".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, s);
    write!(
        tls,
        "GET /v1/models HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let answer = read_all(&mut tls);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The server got the value (its echo proves it); the client never
    // sees it: the broker masks it in what it relays back.
    assert!(
        answer.to_ascii_lowercase().contains("x-echo: bearer "),
        "{answer}"
    );
    assert!(
        !answer.contains(PLACEHOLDER),
        "the server got more than the placeholder: {answer}"
    );
    assert!(!answer.contains(VALUE), "{answer}");
    let log = meter.decisions();
    assert!(log[0].allowed && log[0].brokered);

    // The placeholder sent to a host without the secret (plain HTTP via
    // the proxy) arrives as the placeholder.
    let mut s = dial(proxy);
    write!(
        s,
        "GET http://other.test:{http_port}/ HTTP/1.1\r\nAuthorization: Bearer {PLACEHOLDER}\r\nProxy-Authorization: Basic {cred}\r\n\r\n"
    )
    .unwrap();
    let body = read_all(&mut s);
    assert!(
        body.contains(&format!("X-Echo: Bearer {PLACEHOLDER}")),
        "{body}"
    );
    assert!(!seen.lock().unwrap().concat().contains(VALUE));
    // The secret's own host and port in plain HTTP (absolute form) is
    // carried as it is, never brokered: the TLS server gets bytes it
    // cannot read, and no value.
    let mut s = dial(proxy);
    s.write_all(
        format!(
            "GET http://api.test:{tls_port}/ HTTP/1.1\r\nAuthorization: Bearer {PLACEHOLDER}\r\nProxy-Authorization: Basic {cred}\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    // (Our end closed: the TLS server then stops waiting for the rest of
    // the "record" those bytes announce.)
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let answer = read_all(&mut s);
    assert!(!answer.contains(VALUE), "{answer}");
    let last = meter.decisions().pop().unwrap();
    assert_eq!(last.name.as_deref(), Some("api.test"));
    assert!(last.allowed && !last.brokered, "{last:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bounds_flows_per_sandbox_oversized_heads_and_slow_handshakes() {
    let (port, _) = http_server();
    let dns = resolver(&[("pypi.test", Ipv4Addr::LOCALHOST)]);
    let mut setup = Setup::new(dns, &["pypi.test"], &[]);
    setup.limits.max_flows = 1;
    setup.proxy_limits.handshake_timeout = Duration::from_millis(300);
    let (proxy, _) = setup.start();
    let cred = basic("sb-1", CRED);
    let target = format!("pypi.test:{port}");

    // One flow open: a second is refused; once it ends, a third is carried.
    let mut first = dial(proxy);
    assert!(connect(&mut first, &target, Some(&cred)).starts_with("HTTP/1.1 200"));
    let mut s = dial(proxy);
    let head = connect(&mut s, &target, Some(&cred));
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(read_all(&mut s).contains("too many connections"));
    first
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_all(&mut first);
    drop(first);
    let mut ok = false;
    for _ in 0..50 {
        let mut s = dial(proxy);
        if connect(&mut s, &target, Some(&cred)).starts_with("HTTP/1.1 200") {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ok, "the slot came back");

    // A head past 16 KiB: 400, never a growing buffer.
    let mut s = dial(proxy);
    let big = format!(
        "CONNECT {target} HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let _ = s.write_all(big.as_bytes());
    // (The kernel may turn the close into a reset, unread bytes pending:
    // then the 400 is lost, but the connection ends all the same.)
    let h = read_head(&mut s);
    assert!(h.is_empty() || h.starts_with("HTTP/1.1 400"), "{h}");

    // A bare CR inside a header line: 400, never forwarded.
    let mut s = dial(proxy);
    // (One write: `write!` would send the pieces one by one, and the proxy
    // closes as soon as it has read the bad line.)
    s.write_all(
        format!(
            "GET http://pypi.test:{port}/ HTTP/1.1\r\nProxy-Authorization: Basic {cred}\r\nX-A: a\rInjected: b\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    assert!(read_head(&mut s).starts_with("HTTP/1.1 400"));

    // A client that says nothing is closed after the handshake timeout.
    let mut s = dial(proxy);
    let t = std::time::Instant::now();
    assert_eq!(read_all(&mut s), "");
    assert!(t.elapsed() < Duration::from_secs(5));
    // Half a head, then silence: the same.
    let mut s = dial(proxy);
    s.write_all(b"CONNECT pypi.test:1 HTTP/1.1\r\n").unwrap();
    assert!(read_all(&mut s).starts_with("HTTP/1.1 400"));
}
