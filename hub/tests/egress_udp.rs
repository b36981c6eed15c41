//! The egress gateway's remaining local-backend gaps (issue #27), end to
//! end against a real `sandhub serve` (as root) and the test "internet"
//! of `common::internet`:
//!
//! - UDP to the ports a policy names (`udp:HOST:PORT`), and nothing else;
//! - `AAAA` and IPv6: answered at once, never waited for;
//! - a `PATCH .../network` that narrows the policy resets the open
//!   connections it no longer allows, and only those.

mod common;

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{TcpListener, UdpSocket},
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use sandhub_api::hub::CreateSandbox;
use sandhub_client::{http::HubClient, Sandboxes};
use sandhub_gateway::dns::wire;
use serde_json::json;

use common::{
    error_body,
    internet::{assert_refused, prerequisites, probe, Internet, ONE_INTERNET},
    shell, shell_ok, HubOptions, TestHub,
};

async fn put_template(hub: &TestHub, name: &str, body: serde_json::Value) -> reqwest::Response {
    hub.http()
        .put(format!("{}/v1/templates/{name}", hub.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn create(c: &HubClient, template: &str) -> String {
    c.create(CreateSandbox {
        template: Some(template.into()),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("creating a {template} sandbox: {e}"))
    .id
}

async fn decisions(hub: &TestHub, id: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value = hub
        .http()
        .get(format!("{}/v1/sandboxes/{id}/egress", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["decisions"].as_array().unwrap().clone()
}

/// Payloads a UDP echo server received, by its `addr:port`.
type Seen = Arc<Mutex<HashMap<String, Vec<String>>>>;

/// A UDP echo server inside the test internet on `addr` (bound to that
/// address, so its answers come from it).
fn udp_echo(net: &mut Internet, addr: &'static str, seen: Seen) {
    let stop = net.stop.clone();
    net.spawn_inside(move || {
        let s = UdpSocket::bind(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 2048];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = s.recv_from(&mut b) else {
                continue;
            };
            let text = String::from_utf8_lossy(&b[..n]).into_owned();
            seen.lock()
                .unwrap()
                .entry(addr.to_string())
                .or_default()
                .push(text);
            let _ = s.send_to(&b[..n], from);
        }
    });
}

/// Sends one datagram (`ping TARGET`, or the hex bytes after `=`) to each
/// `HOST:PORT` from inside the sandbox, and one retry after 1.5 s;
/// prints `ECHO`, `NOTHING` or `NONAME` per target.
const UDP_PROBE: &str = r#"
import socket, sys
for target in sys.argv[1:]:
    target, _, hexdata = target.partition("=")
    host, port = target.rsplit(":", 1)
    data = bytes.fromhex(hexdata) if hexdata else ("ping " + target).encode()
    try:
        ip = socket.gethostbyname(host)
    except Exception as e:
        print("NONAME", type(e).__name__)
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.5)
    got = None
    for _ in range(2):
        s.sendto(data, (ip, int(port)))
        try:
            got, _ = s.recvfrom(4096)
            break
        except socket.timeout:
            pass
    if got is None:
        print("NOTHING", ip)
    else:
        print("ECHO" if got == data else "OTHER", ip)
"#;

async fn udp_probe(c: &HubClient, id: &str, targets: &[String]) -> Vec<String> {
    let script = format!(
        "/usr/bin/python3 - {} <<'EOF'\n{UDP_PROBE}\nEOF",
        targets.join(" ")
    );
    let r = shell(c, id, &script).await;
    assert_eq!(r.exit_code, 0, "udp probe failed: {r:?}");
    let lines: Vec<String> = r.stdout.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), targets.len(), "{r:?}");
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_reaches_only_the_ports_the_policy_names() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let mut net = Internet::up();
    let seen: Seen = Default::default();
    for addr in ["198.18.0.2:7000", "198.18.0.2:7001", "198.18.5.2:7000"] {
        udp_echo(&mut net, addr, seen.clone());
    }
    for name in ["echo.udp.test", "bad.udp.test", "other.test"] {
        net.add_name(name, [198, 18, 0, 2]);
    }
    let hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);

    // A `udp:` entry without a port, or with a bad one: 400 naming it.
    for (bad, needle) in [
        (
            json!(["udp:echo.udp.test"]),
            "allow_out[0] \"udp:echo.udp.test\"",
        ),
        (json!(["pypi.test", "udp:198.18.5.2"]), "allow_out[1]"),
        (json!(["udp:x.test:0"]), "1-65535"),
    ] {
        let r = put_template(
            &hub,
            "bad",
            json!({"network": {"mode": "egress", "allow_out": bad}}),
        )
        .await;
        let body = error_body(r, 400, "INVALID_ARGUMENT").await;
        let msg = body["message"].as_str().unwrap();
        assert!(msg.contains(needle) && msg.contains("port"), "{body}");
    }

    let policy = json!({"mode": "egress",
        "allow_out": ["pypi.test", "other.test", "udp:*.udp.test:7000", "udp:198.18.5.2:7000",
                      "udp:rebind.test:7000"],
        "deny_out": ["udp:bad.udp.test:7000"]});
    let r = put_template(&hub, "udp", json!({ "network": policy })).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let id = create(&c, "udp").await;

    // A DNS query for a name the test resolver would answer, sent to that
    // resolver instead of the gateway's.
    let query: String = wire::build_query(7, "marker-udp.test", wire::TYPE_A)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let targets: Vec<String> = [
        "echo.udp.test:7000", // 0 allowed by name (wildcard)
        "198.18.5.2:7000",    // 1 allowed by address
        "echo.udp.test:7001", // 2 another port
        "bad.udp.test:7000",  // 3 denied (the name resolves: the deny has a port)
        "other.test:7000",    // 4 a TCP-only entry
        "198.18.0.2:7000",    // 5 the address behind the names, not named
        "rebind.test:7000",   // 6 resolves to 127.0.0.1: closed
        "198.18.5.2:7001",    // 7 another port of an allowed address
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("198.18.0.2:53={query}")]) // 8 another resolver
    .collect();
    let got = udp_probe(&c, &id, &targets).await;
    let say = |i: usize| format!("{} -> {}\n{}", targets[i], got[i], hub.log_tail());
    assert!(got[0].starts_with("ECHO 100.127.128."), "{}", say(0));
    assert_eq!(got[1], "ECHO 198.18.5.2", "{}", say(1));
    for (i, line) in got.iter().enumerate().skip(2) {
        assert!(line.starts_with("NOTHING"), "{}", say(i));
    }
    // Nothing refused ever left the gateway.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.get("198.18.0.2:7000").cloned().unwrap_or_default(),
        vec!["ping echo.udp.test:7000".to_string()],
        "{seen:?}"
    );
    assert_eq!(
        seen.get("198.18.5.2:7000").cloned().unwrap_or_default(),
        vec!["ping 198.18.5.2:7000".to_string()]
    );
    assert!(!seen.contains_key("198.18.0.2:7001"), "{seen:?}");
    assert_eq!(
        net.asked("marker-udp.test"),
        0,
        "another resolver was reached"
    );
    // A `udp:` entry opens no TCP.
    let tcp = probe(&c, &id, &["http://echo.udp.test/tcp"]).await;
    assert_refused(&tcp[0], "TCP to a udp:-only name");

    // Metered and logged like TCP, marked `udp`.
    let log = decisions(&hub, &id).await;
    let echo = log
        .iter()
        .find(|d| d["name"] == "echo.udp.test" && d["port"] == 7000)
        .unwrap_or_else(|| panic!("{log:#?}"));
    assert_eq!(echo["allowed"], true);
    assert_eq!(echo["udp"], true);
    let n = "ping echo.udp.test:7000".len() as u64;
    assert_eq!(
        (echo["bytes_out"].as_u64(), echo["bytes_in"].as_u64()),
        (Some(n), Some(n))
    );
    for (name, port, why) in [
        ("bad.udp.test", 7000, "denied by the template's deny_out"),
        ("echo.udp.test", 7001, "not in the template's allow_out"),
        ("other.test", 7000, "not in the template's allow_out"),
        ("rebind.test", 7000, "always-closed"),
    ] {
        let d = log
            .iter()
            .find(|d| d["name"] == name && d["port"] == port)
            .unwrap_or_else(|| panic!("{name}:{port} not in {log:#?}"));
        assert_eq!(
            (d["allowed"].clone(), d["udp"].clone()),
            (json!(false), json!(true))
        );
        assert!(d["reason"].as_str().unwrap().contains(why), "{d}");
    }
    for (addr, port) in [
        ("198.18.0.2", 7000),
        ("198.18.0.2", 53),
        ("198.18.5.2", 7001),
    ] {
        assert!(
            log.iter().any(|d| d["address"] == addr
                && d["port"] == port
                && d["allowed"] == false
                && d["udp"] == true),
            "{addr}:{port} not refused in {log:#?}"
        );
    }
    // Each refused flow is logged once, not once per datagram (the probe
    // sent two).
    assert_eq!(
        log.iter().filter(|d| d["name"] == "bad.udp.test").count(),
        1
    );
    let sb: serde_json::Value = hub
        .http()
        .get(format!("{}/v1/sandboxes/{id}", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Both echoes, each way: payload only, no IP or UDP header.
    let both = n + "ping 198.18.5.2:7000".len() as u64;
    assert_eq!(sb["egress"]["bytes_out"].as_u64(), Some(both), "{sb}");
    assert_eq!(sb["egress"]["bytes_in"].as_u64(), Some(both), "{sb}");
    assert_eq!(sb["egress"]["connections_opened"], 2, "{sb}");

    // Two new flows to one name in a row: the second is resolved from the
    // sandbox's DNS cache (the test resolver's TTL of 1 s is kept 5 s).
    let asked = net.asked("echo.udp.test");
    let twice = vec!["echo.udp.test:7000".to_string(); 2];
    let got = udp_probe(&c, &id, &twice).await;
    assert!(got.iter().all(|l| l.starts_with("ECHO")), "{got:?}");
    assert_eq!(
        net.asked("echo.udp.test"),
        asked + 1,
        "one upstream query for two flows"
    );

    // The built-in default (`*`, the operator's allow) opens no UDP.
    let dflt = create(&c, "default").await;
    let got = udp_probe(&c, &dflt, &["198.18.5.2:7000".to_string()]).await;
    assert!(got[0].starts_with("NOTHING"), "{got:?}");
    drop(net);
}

/// A raw DNS query to the gateway's resolver from inside the sandbox:
/// `RCODE ANSWERS MILLISECONDS`.
async fn ask(c: &HubClient, id: &str, name: &str, qtype: u16) -> (u8, usize, u128) {
    let q: String = wire::build_query(9, name, qtype)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let script = format!(
        r#"/usr/bin/python3 - <<'EOF'
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
t = time.monotonic()
s.sendto(bytes.fromhex("{q}"), ("100.127.0.1", 53))
a, _ = s.recvfrom(4096)
print(a[3] & 15, int.from_bytes(a[6:8], "big"), int((time.monotonic() - t) * 1000))
EOF
"#
    );
    let out = shell_ok(c, id, &script).await;
    let v: Vec<u128> = out.split_whitespace().map(|s| s.parse().unwrap()).collect();
    (v[0] as u8, v[1] as usize, v[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aaaa_is_answered_at_once_and_ipv6_fails_closed_at_once() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let r = put_template(
        &hub,
        "web",
        json!({"network": {"mode": "egress", "allow_out": ["pypi.test"]}}),
    )
    .await;
    assert!(r.status().is_success());
    let id = create(&c, "web").await;

    // AAAA of an allowed name: NOERROR with no answer (NODATA); of a
    // refused one: NXDOMAIN. Both at once.
    let (rcode, answers, ms) = ask(&c, &id, "pypi.test", wire::TYPE_AAAA).await;
    assert_eq!((rcode, answers), (wire::NOERROR, 0));
    assert!(ms < 500, "AAAA took {ms} ms");
    let (rcode, answers, _) = ask(&c, &id, "nope.test", wire::TYPE_AAAA).await;
    assert_eq!((rcode, answers), (wire::NXDOMAIN, 0));

    // What resolvers that ask A and AAAA together get: the fake IPv4
    // address only, quickly (no resolver timeout of seconds).
    let script = r#"/usr/bin/python3 - <<'EOF'
import socket, time
t = time.monotonic()
out = getent = None
import subprocess
getent = subprocess.run(["getent", "ahosts", "pypi.test"], capture_output=True, text=True)
g = time.monotonic() - t
t = time.monotonic()
infos = socket.getaddrinfo("pypi.test", 80, socket.AF_UNSPEC, socket.SOCK_STREAM)
p = time.monotonic() - t
print("GETENT", getent.returncode, round(g * 1000), " ".join(sorted(set(l.split()[0] for l in getent.stdout.splitlines()))))
print("PY", round(p * 1000), " ".join(sorted(set(i[4][0] for i in infos))), " ".join(sorted(set(str(i[0]) for i in infos))))
for target in [("2001:db8::1", 80), ("64:ff9b::c612:2", 80)]:
    t = time.monotonic()
    try:
        socket.create_connection(target, timeout=10).close()
        print("V6 connected")
    except OSError as e:
        print("V6", type(e).__name__, e.errno, round((time.monotonic() - t) * 1000))
t = time.monotonic()
try:
    socket.getaddrinfo("pypi.test", 80, socket.AF_INET6)
    print("AF_INET6 answered")
except socket.gaierror as e:
    print("AF_INET6", e.errno, round((time.monotonic() - t) * 1000))
EOF
"#;
    let out = shell_ok(&c, &id, script).await;
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 5, "{out}");
    // GETENT <rc> <ms> <addresses>
    assert_eq!(&lines[0][..2], ["GETENT", "0"], "{out}");
    assert!(lines[0][2].parse::<u64>().unwrap() < 1000, "{out}");
    assert_eq!(lines[0].len(), 4, "one address: {out}");
    assert!(lines[0][3].starts_with("100.127.128."), "{out}");
    // PY <ms> <addresses> <families>
    assert!(lines[1][1].parse::<u64>().unwrap() < 1000, "{out}");
    assert_eq!(lines[1][2], lines[0][3], "{out}");
    assert_eq!(lines[1].len(), 4, "IPv4 only: {out}");
    assert_eq!(lines[1][3], "2", "AF_INET only: {out}");
    for l in &lines[2..4] {
        // No IPv6 route: ENETUNREACH (101) at once, never a timeout.
        assert_eq!(&l[..3], ["V6", "OSError", "101"], "{out}");
        assert!(l[3].parse::<u64>().unwrap() < 500, "{out}");
    }
    assert_eq!(lines[4][0], "AF_INET6", "{out}");
    assert!(lines[4][2].parse::<u64>().unwrap() < 1000, "{out}");
    drop(net);
}

/// A TCP server in the test internet that echoes every line and keeps
/// the connection open until the client closes it.
fn line_echo(net: &mut Internet, port: u16) {
    let stop = net.stop.clone();
    net.spawn_inside(move || {
        let l = TcpListener::bind(("198.18.0.2", port)).unwrap();
        l.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let Ok((mut s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let stop = stop.clone();
            std::thread::spawn(move || {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                let mut b = [0u8; 1024];
                while !stop.load(Ordering::Relaxed) {
                    match s.read(&mut b) {
                        Ok(0) => return,
                        Ok(n) => {
                            if s.write_all(&b[..n]).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => return,
                    }
                }
            });
        }
    });
}

/// Holds one connection to each name on port 9000, writing a line every
/// 50 ms and reading its echo; prints `<name> <state> <unix time>` when a
/// connection ends (and `<name> alive ...` for those alive at the end).
const HOLD: &str = r#"
import socket, sys, time
names = sys.argv[2:]
socks = {}
for n in names:
    socks[n] = socket.create_connection((n, 9000), timeout=5)
open(sys.argv[1] + ".ready", "w").write("ready")
end = time.time() + 8
dead = {}
while time.time() < end and len(dead) < len(names):
    for n, s in socks.items():
        if n in dead:
            continue
        try:
            s.sendall(b"x\n")
            if s.recv(16) == b"":
                dead[n] = ("closed", time.time())
        except OSError as e:
            dead[n] = (type(e).__name__, time.time())
    time.sleep(0.05)
with open(sys.argv[1], "w") as f:
    for n in names:
        state, at = dead.get(n, ("alive", time.time()))
        f.write("%s %s %.3f\n" % (n, state, at))
"#;

/// Starts the holder in the background (`/tmp/<tag>.out`), once its
/// connections are up.
async fn hold(c: &HubClient, id: &str, tag: &str, names: &str) {
    shell_ok(
        c,
        id,
        &format!(
            "setsid nohup /usr/bin/python3 /tmp/hold.py /tmp/{tag}.out {names} \
             >/tmp/{tag}.err 2>&1 </dev/null &"
        ),
    )
    .await;
    let t0 = Instant::now();
    loop {
        let r = shell(c, id, &format!("cat /tmp/{tag}.out.ready 2>/dev/null")).await;
        if r.stdout.contains("ready") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the holder never connected: {}",
            shell(c, id, &format!("cat /tmp/{tag}.err")).await.stdout
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few round trips through each connection first.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// `PATCH .../network`; the Unix time it was sent at.
async fn patch(hub: &TestHub, id: &str, body: serde_json::Value) -> f64 {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let r = hub
        .http()
        .patch(format!("{}/v1/sandboxes/{id}/network", hub.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    at
}

/// The holder's report, once it has ended.
async fn held(c: &HubClient, id: &str, tag: &str) -> String {
    let t0 = Instant::now();
    loop {
        let r = shell(c, id, &format!("cat /tmp/{tag}.out 2>/dev/null")).await;
        if r.stdout.ends_with('\n') && !r.stdout.is_empty() {
            return r.stdout;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the holder never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `name -> (state, unix time)` of a holder's report.
fn rows(out: &str) -> HashMap<&str, (&str, f64)> {
    out.lines()
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            (v[0], (v[1], v[2].parse().unwrap()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowing_patch_resets_the_connections_it_refuses_and_only_those() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let mut net = Internet::up();
    line_echo(&mut net, 9000);
    for name in ["keep.test", "cut.test"] {
        net.add_name(name, [198, 18, 0, 2]);
    }
    let hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let r = put_template(
        &hub,
        "hold",
        json!({"network": {"mode": "egress", "allow_out": ["keep.test", "cut.test"]}}),
    )
    .await;
    assert!(r.status().is_success());
    let id = create(&c, "hold").await;
    shell_ok(&c, &id, &format!("cat > /tmp/hold.py <<'EOF'\n{HOLD}\nEOF")).await;

    hold(&c, &id, "one", "keep.test cut.test").await;
    let patched_at = patch(&hub, &id, json!({"allow_out": ["keep.test"]})).await;
    let out = held(&c, &id, "one").await;
    let got = rows(&out);
    let (state, at) = got["cut.test"];
    assert_eq!(state, "ConnectionResetError", "{out}");
    let after = at - patched_at;
    eprintln!(
        "cut.test reset {:.0} ms after the PATCH was sent",
        after * 1000.0
    );
    assert!(
        (0.0..1.0).contains(&after),
        "reset {after:.3} s after the PATCH: {out}"
    );
    assert_eq!(got["keep.test"].0, "alive", "{out}");
    assert!(got["keep.test"].1 - patched_at > 3.0, "{out}");

    let log = decisions(&hub, &id).await;
    let cut: Vec<_> = log
        .iter()
        .filter(|d| d["allowed"] == false && d["name"] == "cut.test")
        .collect();
    assert_eq!(cut.len(), 1, "{log:#?}");
    assert!(
        cut[0]["reason"]
            .as_str()
            .unwrap()
            .contains("reset by a change of the sandbox's network: not in the sandbox's allow_out"),
        "{}",
        cut[0]
    );
    assert!(!log
        .iter()
        .any(|d| d["allowed"] == false && d["name"] == "keep.test"));
    // The reset is no refused connection: it was opened.
    let sb: serde_json::Value = hub
        .http()
        .get(format!("{}/v1/sandboxes/{id}", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sb["egress"]["connections_refused"], 0, "{sb}");
    let r = shell(
        &c,
        &id,
        "/usr/bin/python3 -c 'import socket; socket.create_connection((\"cut.test\", 9000), timeout=5)' 2>&1 | tail -1",
    )
    .await;
    assert!(
        r.stdout.contains("gaierror"),
        "cut.test no longer resolves: {r:?}"
    );

    // `none`: the connection that was allowed is reset too.
    hold(&c, &id, "two", "keep.test").await;
    let patched_at = patch(&hub, &id, json!({"mode": "none"})).await;
    let out = held(&c, &id, "two").await;
    let (state, at) = rows(&out)["keep.test"];
    assert_eq!(state, "ConnectionResetError", "{out}");
    assert!((0.0..1.0).contains(&(at - patched_at)), "{out}");
    let log = decisions(&hub, &id).await;
    assert!(
        log.iter().any(|d| d["name"] == "keep.test"
            && d["allowed"] == false
            && d["reason"].as_str().unwrap().contains("set to `none`")),
        "{log:#?}"
    );
    drop(net);
}
