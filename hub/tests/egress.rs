//! `network: egress` end to end (issue #27, local backend): a real
//! `sandhub serve` (as root), real sandboxes, and the small "internet" of
//! `common::internet` (its addresses are listed there).

mod common;

use std::{
    io::{Read, Write},
    net::TcpListener,
};

use sandhub_api::hub::CreateSandbox;
use sandhub_client::{http::HubClient, Sandboxes};
use serde_json::json;

use common::{
    error_body,
    internet::{
        assert_no_name, assert_ok, assert_refused, prerequisites, probe, Internet, BIG,
        ONE_INTERNET,
    },
    shell, HubOptions, TestHub,
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

const WEB_POLICY: &str = r#"{"mode": "egress",
  "allow_out": ["pypi.test", "*.git.test", "198.18.5.0/24", "api.test:8443",
                "rebind.test", "hostaddr.test", "private.test", "linklocal.test",
                "198.18.0.1", "169.254.77.2", "100.80.0.2"],
  "deny_out": ["bad.git.test", "198.18.5.2:8443"]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_sandboxes_reach_only_what_their_policy_and_the_closed_ranges_allow() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    // A host address the hub could listen on (198.18.0.1 is the host's).
    let host_listener = TcpListener::bind("198.18.0.1:0").unwrap();
    let host_port = host_listener.local_addr().unwrap().port();
    let mut hub = TestHub::start(HubOptions {
        extra_args: &["--egress-dns", "198.18.0.2"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);

    // Bad patterns are 400 naming the entry.
    for (bad, needle) in [
        (json!(["a.*.test"]), "allow_out[0] \"a.*.test\""),
        (json!(["ok.test", "x.test:70000"]), "allow_out[1]"),
        (json!(["10.0.0.1/8"]), "host bits"),
    ] {
        let r = put_template(
            &hub,
            "bad",
            json!({"network": {"mode": "egress", "allow_out": bad}}),
        )
        .await;
        let body = error_body(r, 400, "INVALID_ARGUMENT").await;
        assert!(body["message"].as_str().unwrap().contains(needle), "{body}");
    }
    let many: Vec<String> = (0..257).map(|i| format!("h{i}.test")).collect();
    let r = put_template(
        &hub,
        "bad",
        json!({"network": {"mode": "egress", "allow_out": many}}),
    )
    .await;
    error_body(r, 400, "INVALID_ARGUMENT").await;

    let policy: serde_json::Value = serde_json::from_str(WEB_POLICY).unwrap();
    let r = put_template(&hub, "web", json!({ "network": policy })).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let got: serde_json::Value = hub
        .http()
        .get(format!("{}/v1/templates/web", hub.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["network"], policy, "the policy reads back as written");
    let id = create(&c, "web").await;

    let hub_port = hub.port;
    let urls = [
        "http://pypi.test/allowed".to_string(),
        "http://a.git.test/wildcard".into(),
        "http://git.test/not-below".into(),
        "http://bad.git.test/deny-wins".into(),
        "http://nope.test/unknown".into(),
        "http://198.18.5.2/cidr".into(),
        "http://198.18.0.2/literal-outside".into(),
        "http://api.test:8443/port".into(),
        "http://api.test/wrong-port".into(),
        "http://198.18.5.2:8443/deny-cidr-port".into(),
        format!("http://rebind.test:{hub_port}/healthz"),
        format!("http://hostaddr.test:{host_port}/host"),
        format!("http://198.18.0.1:{host_port}/host-literal"),
        "http://linklocal.test/linklocal".into(),
        "http://169.254.77.2/linklocal-literal".into(),
        "http://private.test/private".into(),
        "http://100.80.0.2/private-literal".into(),
    ];
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let got = probe(&c, &id, &refs).await;
    let log = |i: usize| format!("{} -> {}\n{}", urls[i], got[i], hub.log_tail());
    assert_ok(&got[0], &log(0));
    assert!(
        got[0].contains("hello pypi.test at 198.18.0.2:80/allowed"),
        "{}",
        log(0)
    );
    assert_ok(&got[1], &log(1));
    assert_no_name(&got[2], &log(2));
    assert_no_name(&got[3], &log(3));
    assert_no_name(&got[4], &log(4));
    assert_ok(&got[5], &log(5));
    assert_refused(&got[6], &log(6));
    assert_ok(&got[7], &log(7));
    assert_refused(&got[8], &log(8));
    assert_refused(&got[9], &log(9));
    // The hub's own port on loopback, through an allowed name that
    // resolves there (DNS rebinding), and a host address, by name and
    // literally: refused although the policy names them.
    for (i, line) in got.iter().enumerate().skip(10) {
        assert_refused(line, &log(i));
    }
    assert_eq!(net.seen("/literal-outside"), 0);
    assert_eq!(net.seen("/wrong-port"), 0);
    assert_eq!(net.seen("/deny-cidr-port"), 0);
    assert_eq!(net.seen("/linklocal") + net.seen("/linklocal-literal"), 0);
    assert_eq!(net.seen("/private") + net.seen("/private-literal"), 0);
    host_listener.set_nonblocking(true).unwrap();
    assert!(
        host_listener.accept().is_err(),
        "the host listener was reached"
    );
    // Denied names were never asked upstream: the decision is local.
    assert_eq!(
        net.asked("bad.git.test") + net.asked("nope.test") + net.asked("git.test"),
        0
    );
    // The host itself reaches every test address (the refusals are the
    // gateway's): the positive control.
    for a in ["198.18.5.2", "100.80.0.2", "169.254.77.2"] {
        let mut s = std::net::TcpStream::connect((a, 80)).unwrap_or_else(|e| panic!("{a}: {e}"));
        write!(s, "GET /control HTTP/1.0\r\nHost: control\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        assert!(body.contains("hello control"), "{a}: {body}");
    }

    // The same responder on the sandbox's own 127.0.0.1:53, for images
    // whose /etc/resolv.conf names no server.
    let lo_dns = r#"/usr/bin/python3 - <<'EOF'
import socket
def ask(name):
    q = bytes.fromhex("beef01000001000000000000")
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\x00\x00\x01\x00\x01"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.sendto(q, ("127.0.0.1", 53))
    a = s.recv(512)
    print(name, a[3] & 15, int.from_bytes(a[6:8], "big"))
ask("pypi.test")
ask("nope.test")
EOF
"#;
    let r = shell(&c, &id, lo_dns).await;
    assert_eq!(r.stdout, "pypi.test 0 1\nnope.test 3 0\n", "{r:?}");

    // Bulk both ways: the window closes and opens, nothing is lost.
    let bulk = format!(
        r#"/usr/bin/python3 - <<'EOF'
import urllib.request
# Byte for byte: the test internet's pattern, the offset mod 251.
pattern = bytes(range(251)) * ((1 << 17) // 251 + 2)
def expected(at, n):
    return pattern[at % 251:at % 251 + n]
with urllib.request.urlopen("http://pypi.test/big", timeout=60) as r:
    n = wrong = 0
    while True:
        b = r.read(1 << 16)
        if not b:
            break
        wrong += b != expected(n, len(b))
        n += len(b)
print("down", n, "wrong reads", wrong)
body = b"".join(expected(at, 1 << 16) for at in range(0, {BIG}, 1 << 16))
req = urllib.request.Request("http://pypi.test/upload", data=body, method="POST")
with urllib.request.urlopen(req, timeout=60) as r:
    print(r.read().decode())
EOF
"#
    );
    let r = shell(&c, &id, &bulk).await;
    assert_eq!(
        r.stdout,
        format!("down {BIG} wrong reads 0\nhello upload {BIG}\n"),
        "{r:?}\n{}",
        hub.log_tail()
    );

    // Root inside: routes flushed and re-added by hand, an address of the
    // test net claimed, DNS and HTTP sent to the test hosts directly.
    // Whatever of it the kernel lets root do, nothing gets out.
    let escape = r#"
ip route flush table main 2>&1
ip addr add 198.18.0.77/24 dev egress0 2>&1
ip route add 198.18.0.0/24 dev egress0 2>&1
ip route add default dev egress0 2>&1
/usr/bin/python3 - <<'EOF'
import socket
q = bytes.fromhex("abcd01000001000000000000") + b"\x0bmarker-root\x04test\x00\x00\x01\x00\x01"
for dst in ["198.18.0.2", "198.18.0.1", "100.127.0.1"]:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        s.sendto(q, (dst, 53))
        print("udp", dst, "answered", len(s.recv(512)))
    except Exception as e:
        print("udp", dst, type(e).__name__)
for dst in ["198.18.0.2", "198.18.0.1"]:
    try:
        c = socket.create_connection((dst, 80), timeout=10)
        c.sendall(b"GET /root-escape HTTP/1.0\r\n\r\n")
        print("tcp", dst, c.recv(100))
    except Exception as e:
        print("tcp", dst, type(e).__name__)
EOF
"#;
    let r = shell(&c, &id, escape).await;
    assert_eq!(net.asked("marker-root.test"), 0, "{r:?}");
    assert_eq!(net.seen("/root-escape"), 0, "{r:?}");
    // Only the gateway's own responder answers (NXDOMAIN: not allowed).
    assert!(!r.stdout.contains("udp 198.18.0.2 answered"), "{r:?}");
    assert!(!r.stdout.contains("udp 198.18.0.1 answered"), "{r:?}");
    assert!(!r.stdout.contains("tcp 198.18.0.2 b"), "{r:?}");

    // A create request narrows its template's policy, never widens it.
    let narrowed = c
        .create(CreateSandbox {
            template: Some("web".into()),
            network: Some(
                serde_json::from_value(json!({"mode": "egress", "allow_out": ["pypi.test"]}))
                    .unwrap(),
            ),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let got = probe(
        &c,
        &narrowed,
        &[
            "http://pypi.test/narrowed",
            "http://a.git.test/narrowed-out",
        ],
    )
    .await;
    assert_ok(&got[0], "narrowed: pypi.test");
    assert_no_name(&got[1], "narrowed: a.git.test");
    let r = hub
        .http()
        .post(format!("{}/v1/sandboxes", hub.url()))
        .json(&json!({"template": "web", "network": {"mode": "egress", "allow_out": ["other.example"]}}))
        .send()
        .await
        .unwrap();
    let body = error_body(r, 400, "INVALID_ARGUMENT").await;
    assert!(
        body["message"].as_str().unwrap().contains("never widen"),
        "{body}"
    );

    // kill -9 of the hub: the sandboxes' TUN devices go with it (they are
    // offline, not open); the restarted hub gives each its gateway back,
    // with the same policy.
    let devices = |hub: &TestHub| -> Vec<String> {
        let mine = std::fs::read_link("/proc/self/ns/net").unwrap();
        common::host_pids_with_mount(&hub.token())
            .into_iter()
            .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/net")).is_ok_and(|ns| ns != mine))
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/net/dev")).ok())
            .collect()
    };
    let before = devices(&hub);
    assert!(
        !before.is_empty() && before.iter().all(|d| d.contains("egress0:")),
        "{before:?}"
    );
    hub.kill9();
    let after = devices(&hub);
    assert!(!after.is_empty(), "the sandboxes outlive their hub");
    assert!(
        after.iter().all(|d| !d.contains("egress0:")),
        "a sandbox kept its way out without a hub: {after:?}"
    );
    hub.restart().await;
    let c = hub.client(None);
    let got = probe(
        &c,
        &id,
        &[
            "http://pypi.test/after-restart",
            "http://nope.test/after-restart",
        ],
    )
    .await;
    assert_ok(&got[0], &format!("after restart: {}", hub.log_tail()));
    assert_no_name(&got[1], "after restart");
    let got = probe(&c, &narrowed, &["http://a.git.test/narrowed-after-restart"]).await;
    assert_no_name(
        &got[0],
        "the narrowed sandbox keeps its narrowing after a restart",
    );
    drop(hub);
    drop(net);
}

/// `sandhub_egress_gateways`, summed over tenants: the gateways running.
async fn gateways(hub: &TestHub) -> u64 {
    let text = hub.metrics().await;
    text.lines()
        .filter(|l| l.starts_with("sandhub_egress_gateways{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The gateway attaches while the sandbox boots, so a launch can fail
/// after it attached (here sandboxd refuses the template's unknown user,
/// once the namespaces exist; the hub logs each attach). The create then
/// fails with the reason, and the gateway is stopped with the sandbox:
/// `sandhub_egress_gateways` counts only the sandbox that is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_failing_after_the_gateway_attached_leaves_no_gateway() {
    if !prerequisites() {
        return;
    }
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    for (name, extra) in [
        ("online", json!({})),
        ("broken", json!({"user": "no-such-user"})),
    ] {
        let mut body = json!({"network": {"mode": "egress", "allow_out": ["pypi.test"]}});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = put_template(&hub, name, body).await;
        assert!(r.status().is_success(), "{name}: {}", r.status());
    }
    assert_eq!(gateways(&hub).await, 0);
    let online = create(&c, "online").await;
    assert_eq!(
        gateways(&hub).await,
        1,
        "one egress sandbox up, one gateway"
    );
    // Each launch races its attach; the attach nearly always wins (it
    // needs the namespaces, the failure comes after PID 1 built the root).
    // Three failed launches at least, and more (up to ten) until one of
    // them attached, so that a loaded machine cannot skip the path.
    let mut attached = 0;
    for tries in 1..=10 {
        if tries > 3 && attached > 0 {
            break;
        }
        let r = hub
            .http()
            .post(format!("{}/v1/sandboxes", hub.url()))
            .json(&json!({"template": "broken"}))
            .send()
            .await
            .unwrap();
        let body = error_body(r, 412, "FAILED_PRECONDITION").await;
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("no-such-user"), "{body}");
        let id = message.split_whitespace().nth(1).unwrap();
        attached += usize::from(
            hub.log()
                .contains(&format!("egress gateway attached id={id}")),
        );
        assert_eq!(gateways(&hub).await, 1, "a failed launch left its gateway");
    }
    assert!(
        attached > 0,
        "no failed launch had its gateway attached: {}",
        hub.log_tail()
    );
    c.delete(&online).await.unwrap();
    assert_eq!(
        gateways(&hub).await,
        0,
        "the deleted sandbox's gateway is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_ranges_open_only_where_the_operator_opens_them() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let hub = TestHub::start(HubOptions {
        extra_args: &[
            "--egress-dns",
            "198.18.0.2",
            "--egress-allow-private",
            "100.80.0.0/16",
            "--egress-deny",
            "*.git.test",
            "--egress-idle-timeout",
            "2s",
        ],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let r = put_template(&hub, "open", json!({"network": "egress"})).await;
    assert!(r.status().is_success());
    let id = create(&c, "open").await;
    let got = probe(
        &c,
        &id,
        &[
            "http://private.test/opened",
            "http://100.80.0.2/opened-literal",
            "http://linklocal.test/still-closed",
            "http://pypi.test/default-allows",
            "http://a.git.test/operator-denied",
        ],
    )
    .await;
    assert_ok(&got[0], &got[0]);
    assert_ok(&got[1], &got[1]);
    assert_refused(&got[2], &got[2]);
    assert_ok(&got[3], &got[3]);
    assert_no_name(&got[4], &got[4]);
    assert_eq!(net.seen("/opened") + net.seen("/opened-literal"), 2);

    // A connection that moves nothing for --egress-idle-timeout is reset
    // when the timeout ends, not at the gateway's next unrelated wake: the
    // test internet answers a silent client after 5 s, and that answer
    // must find the flow already reset.
    let idle = r#"/usr/bin/python3 - <<'EOF'
import socket, time
c = socket.create_connection(("pypi.test", 80), timeout=30)
t = time.monotonic()
try:
    print("recv", len(c.recv(100)))
except Exception as e:
    print(type(e).__name__, round(time.monotonic() - t, 1))
EOF
"#;
    let r = shell(&c, &id, idle).await;
    let (what, after) = r.stdout.trim().split_once(' ').unwrap_or(("", ""));
    assert_eq!(what, "ConnectionResetError", "{r:?}");
    let after: f64 = after.parse().unwrap_or(f64::NAN);
    assert!(
        (1.9..3.2).contains(&after),
        "reset {after} s after connecting, not ~2 s: {r:?}"
    );
    drop(hub);
    drop(net);
}

/// Sends exactly N bytes on a raw connection and reads to EOF; prints
/// `sent received`. The counters must say the same (payload bytes).
const METERED: &str = r#"/usr/bin/python3 - <<'EOF'
import socket
body = b"y" * 300000
req = b"POST /upload HTTP/1.1\r\nHost: pypi.test\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
c = socket.create_connection(("pypi.test", 80), timeout=30)
c.sendall(req)
got = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    got += len(b)
print(len(req), got)
try:
    socket.create_connection(("198.18.5.2", 8443), timeout=10)
    print("connected")
except ConnectionRefusedError:
    print("refused")
EOF
"#;

/// In a new sandbox of alice's `template`: downloads `/big` (16 MiB), then
/// asks for `after`, which must be refused at once. Returns the last
/// decision of the sandbox's log (the refusal, with its reason).
async fn big_then_refused(
    hub: &TestHub,
    alice: &HubClient,
    template: &str,
    after: &str,
) -> serde_json::Value {
    let id = create(alice, template).await;
    let after_url = format!("http://pypi.test{after}");
    let got = probe(alice, &id, &["http://pypi.test/big", &after_url]).await;
    assert!(
        got[0].starts_with("OK 200"),
        "{}",
        &got[0][..got[0].len().min(80)]
    );
    assert_refused(&got[1], &got[1]);
    let log: serde_json::Value = hub
        .http()
        .get(format!("{}/v1/sandboxes/{id}/egress", hub.url()))
        .bearer_auth(common::ALICE_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let last = log["decisions"].as_array().unwrap().last().cloned();
    last.unwrap_or_else(|| panic!("no decisions: {log}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_counts_payload_bytes_and_logs_each_decision_per_tenant() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let net = Internet::up();
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--egress-dns", "198.18.0.2", "--egress-rate-mbit", "1"],
        ..Default::default()
    })
    .await;
    let (alice, bob) = (
        hub.client(Some(common::ALICE_KEY)),
        hub.client(Some(common::BOB_KEY)),
    );
    let r = hub
        .http()
        .put(format!("{}/v1/templates/metered", hub.url()))
        .bearer_auth(common::ALICE_KEY)
        .json(
            &json!({"network": {"mode": "egress", "allow_out": ["pypi.test:80"],
                                  "deny_out": ["198.18.5.2:8443"]}}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let id = create(&alice, "metered").await;
    let r = shell(&alice, &id, METERED).await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{r:?}");
    assert_eq!(lines[1], "refused");
    let (sent, received) = lines[0].split_once(' ').unwrap();
    let (sent, received): (u64, u64) = (sent.parse().unwrap(), received.parse().unwrap());
    assert!(sent > 300_000 && received > 0, "{r:?}");
    assert_eq!(net.seen("/upload"), 1);

    // GET /v1/sandboxes/{id}: the counters are the payload bytes the
    // workload wrote and read, exactly.
    let get = |key: &'static str, path: String| {
        let (http, url) = (hub.http(), hub.url());
        async move {
            http.get(format!("{url}{path}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
        }
    };
    let sb: serde_json::Value = get(common::ALICE_KEY, format!("/v1/sandboxes/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        sb["egress"],
        json!({"bytes_out": sent, "bytes_in": received,
               "connections_opened": 1, "connections_refused": 1}),
        "{sb}"
    );

    // The log: the allowed connection with its bytes, the refused one with why.
    let log: serde_json::Value = get(common::ALICE_KEY, format!("/v1/sandboxes/{id}/egress"))
        .await
        .json()
        .await
        .unwrap();
    let d = log["decisions"].as_array().unwrap();
    assert_eq!(d.len(), 2, "{log}");
    assert_eq!(d[0]["name"], "pypi.test");
    assert_eq!(d[0]["port"], 80);
    assert_eq!(d[0]["allowed"], true);
    assert_eq!(
        (d[0]["bytes_out"].as_u64(), d[0]["bytes_in"].as_u64()),
        (Some(sent), Some(received))
    );
    assert!(
        d[0]["address"].as_str().unwrap().starts_with("100.127."),
        "{log}"
    );
    assert!(d[0]["at"].as_str().unwrap().ends_with('Z'), "{log}");
    assert_eq!(d[1]["address"], "198.18.5.2");
    assert_eq!(d[1]["port"], 8443);
    assert_eq!(d[1]["allowed"], false);
    assert!(!d[1]["reason"].as_str().unwrap().is_empty(), "{log}");

    // /metrics: the same totals, one series per tenant (no sandbox label).
    let m = hub.metrics().await;
    for line in [
        format!("sandhub_egress_sent_bytes_total{{tenant=\"alice\"}} {sent}"),
        format!("sandhub_egress_received_bytes_total{{tenant=\"alice\"}} {received}"),
        "sandhub_egress_connections_opened_total{tenant=\"alice\"} 1".to_string(),
        "sandhub_egress_connections_refused_total{tenant=\"alice\"} 1".to_string(),
    ] {
        assert!(m.lines().any(|l| l == line), "{line} not in:\n{m}");
    }

    // egress_mb: validated; past the cap new connections are refused (the
    // open one that crossed it finishes), with the reason in the log.
    let put = |name: &'static str, body: serde_json::Value| {
        let (http, url) = (hub.http(), hub.url());
        async move {
            http.put(format!("{url}/v1/templates/{name}"))
                .bearer_auth(common::ALICE_KEY)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let r = put("capped", json!({"network": "egress", "egress_mb": 0})).await;
    let body = error_body(r, 400, "INVALID_ARGUMENT").await;
    assert!(
        body["message"].as_str().unwrap().contains("egress_mb"),
        "{body}"
    );
    let r = put("capped", json!({"network": "egress", "egress_mb": 1})).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let last = big_then_refused(&hub, &alice, "capped", "/after-cap").await;
    assert_eq!(net.seen("/after-cap"), 0);
    assert_eq!(last["allowed"], false, "{last}");
    assert!(
        last["reason"].as_str().unwrap().contains("egress_mb"),
        "{last}"
    );

    // --egress-rate-mbit 1: right after a 16 MiB download the rate is far
    // above 1 Mbit/s, so the next connection is refused, with why.
    let last = big_then_refused(&hub, &alice, "metered", "/too-fast").await;
    assert!(
        last["reason"]
            .as_str()
            .unwrap()
            .contains("--egress-rate-mbit"),
        "{last}"
    );

    // Another tenant's sandbox is NOT_FOUND, like every route.
    error_body(
        get(common::BOB_KEY, format!("/v1/sandboxes/{id}/egress")).await,
        404,
        "NOT_FOUND",
    )
    .await;
    // A sandbox without a gateway: an empty log, no `egress` object.
    let r = hub
        .http()
        .put(format!("{}/v1/templates/offline", hub.url()))
        .bearer_auth(common::BOB_KEY)
        .json(&json!({"network": "none"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let plain = create(&bob, "offline").await;
    let log: serde_json::Value = get(common::BOB_KEY, format!("/v1/sandboxes/{plain}/egress"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(log, json!({"decisions": []}));
    let sb: serde_json::Value = get(common::BOB_KEY, format!("/v1/sandboxes/{plain}"))
        .await
        .json()
        .await
        .unwrap();
    assert!(sb.get("egress").is_none(), "{sb}");
    drop(hub);
    drop(net);
}
