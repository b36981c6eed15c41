//! Size: one scenario on one hub and one test internet, whose steps build
//! on each other (values set, sandboxes made, a restart), plus the host-side
//! readers (memory, files) it needs.
//!
//! Brokered secrets end to end (issue #27 part 3, local backend): a real
//! `sandhub serve` (as root), real sandboxes, and the test "internet" of
//! `common::internet` with an HTTPS API server at `api.test` whose
//! certificate comes from a test CA the hub is told to trust
//! (`--egress-ca-file`). The server records the headers it receives and
//! echoes the `Authorization` header back (in its body and in `X-Echo`),
//! as a careless or hostile API would.
//!
//! What the sandbox may see is read from the host as root: every process's
//! environment and memory (`/proc/PID/environ`, `/proc/PID/mem` through
//! `/proc/PID/maps`: the "core dump" check), its files (the state dir, and
//! `/tmp`, `/root`, `/dev/shm`, `/etc`, `/workspace` through
//! `/proc/PID/root`), and what the gateway relayed back. The value is in
//! none of them.

mod common;

use std::{
    collections::HashMap,
    io::{Read, Seek, SeekFrom, Write},
    net::TcpListener,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use sandhub_api::hub::CreateSandbox;
use sandhub_client::{http::HubClient, Sandboxes};
use serde_json::{json, Value};

use common::{
    error_body,
    internet::{ip, prerequisites, Internet, ONE_INTERNET},
    shell, shell_ok, HubOptions, TestHub, ALICE_KEY, BOB_KEY,
};

/// Alice's value (tenant API) and Bob's (the operator's file): long and
/// distinctive, so a match anywhere is no accident.
const ALICE_VALUE: &str = "sk-alice-7Qm2Vx9Lr4Tz8Kp1Wn6Hc3Yd5Bf0Gj";
const BOB_VALUE: &str = "bob-op-value-Zr8Mq3Lx6Tn1Vp4Kc9Wd2Hy7";

/// One request the test API server received.
#[derive(Debug, Clone)]
struct Seen {
    host: String,
    tls: bool,
    headers: HashMap<String, String>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Reads one request head, records it, answers with the echo.
fn answer(s: &mut (impl Read + Write), tls: bool, log: &Log) {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let headers: HashMap<String, String> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let host = headers.get("host").cloned().unwrap_or_default();
    let auth = headers.get("authorization").cloned().unwrap_or_default();
    let key = headers.get("x-api-key").cloned().unwrap_or_default();
    log.lock().unwrap().push(Seen { host, tls, headers });
    let body = format!("auth={auth};key={key}");
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nX-Echo: {auth}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.flush();
}

/// The test CA (PEM) and a server config for `api.test`, `api2.test` and
/// `other.test` signed by it.
fn test_pki() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "sandhub test internet CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![
        "api.test".into(),
        "api2.test".into(),
        "other.test".into(),
    ])
    .unwrap()
    .signed_by(&leaf_key, &issuer)
    .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
    )
    .unwrap();
    (ca_cert.pem(), Arc::new(cfg))
}

/// Serves `addr` inside the test namespace until `stop`: TLS with `tls`,
/// plain HTTP without.
fn serve(
    net: &mut Internet,
    addr: &'static str,
    tls: Option<Arc<rustls::ServerConfig>>,
    log: Log,
    stop: Arc<AtomicBool>,
) {
    net.spawn_inside(move || {
        let l = TcpListener::bind(addr).unwrap();
        l.set_nonblocking(true).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let Ok((s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            match &tls {
                Some(cfg) => {
                    let Ok(conn) = rustls::ServerConnection::new(cfg.clone()) else {
                        continue;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, s);
                    answer(&mut tls, true, &log);
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
                None => {
                    let mut s = s;
                    answer(&mut s, false, &log);
                }
            }
        }
    });
}

/// Every request the sandbox's client makes; prints one JSON object, then
/// stays alive (its memory is read from the host).
const CLIENT: &str = r#"
import json, os, ssl, sys, time, urllib.request
key = os.environ["OPENAI_API_KEY"]
foreign = sys.argv[1]
def get(url, headers, ctx=None):
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            return {"status": r.status, "body": r.read().decode(), "echo": r.headers.get("X-Echo", "")}
    except Exception as e:
        return {"error": type(e).__name__ + ": " + str(getattr(e, "reason", e))}
auth = {"Authorization": "Bearer " + key}
out = {
    "api": get("https://api.test/echo", auth),
    "foreign": get("https://api.test/echo", {"Authorization": "Bearer " + foreign}),
    "xkey": get("https://api.test/echo", {"X-Api-Key": key}),
    "other_hub_trust": get("https://other.test/echo", auth),
    "other": get("https://other.test/echo", auth, ssl.create_default_context(cafile="/tmp/test-ca.pem")),
    "plain": get("http://api2.test:8080/echo", auth),
    "no_tls_upstream": get("https://api.test:8443/echo", auth),
}
with open("/tmp/out.json", "w") as f:
    json.dump(out, f)
time.sleep(600)
"#;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether `needle` is anywhere in the readable memory of `pid`.
fn in_memory(pid: i32, needle: &[u8]) -> bool {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return false;
    };
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(mut at), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        // In 1 MiB windows that overlap by the needle's length.
        while at < end {
            let len = (end - at).min(1 << 20) as usize;
            let mut buf = vec![0u8; len];
            if mem.seek(SeekFrom::Start(at)).is_err() {
                break;
            }
            let Ok(n) = mem.read(&mut buf) else { break };
            if n == 0 {
                break;
            }
            if contains(&buf[..n], needle) {
                return true;
            }
            if at + n as u64 >= end || n <= needle.len() {
                break;
            }
            at += (n - needle.len() + 1) as u64;
        }
    }
    false
}

/// Files under `dir` (not following links) that hold `needle`; and how
/// many files were read.
fn files_with(dir: &Path, needle: &[u8], found: &mut Vec<String>, read: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let p = e.path();
        if ft.is_dir() {
            files_with(&p, needle, found, read);
        } else if ft.is_file() {
            if e.metadata().is_ok_and(|m| m.len() > 64 << 20) {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&p) {
                *read += 1;
                if contains(&bytes, needle) {
                    found.push(p.display().to_string());
                }
            }
        }
    }
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

async fn put_template(hub: &TestHub, key: &str, name: &str, body: Value) -> reqwest::Response {
    hub.http()
        .put(format!("{}/v1/templates/{name}", hub.url()))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn secret(name: &str, header: &str, format: &str) -> Value {
    // api.test:8443 is the internet's plain-HTTP server: brokering TLS
    // there fails upstream, and the sandbox hears why (502).
    json!({"name": name, "hosts": ["api.test", "api2.test", "api.test:8443"],
           "header": header, "format": format})
}

fn policy() -> Value {
    json!({"mode": "egress", "allow_out": ["api.test", "api2.test", "other.test"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokered_secrets_reach_only_their_header_and_never_the_sandbox() {
    if !prerequisites() {
        return;
    }
    let _one = ONE_INTERNET.lock().await;
    let mut net = Internet::up();
    // `api2.test`: the secret's second host, on its own address, where
    // this test records plain HTTP too (on 8080: the internet's own
    // server holds port 80 on every address, and records no headers).
    ip(&format!("-n {} addr add 198.18.5.3/32 dev lo", net.ns));
    ip(&format!(
        "route add 198.18.5.3/32 via 198.18.0.2 dev {}",
        net.veth
    ));
    net.add_name("api2.test", [198, 18, 5, 3]);
    net.add_name("other.test", [198, 18, 0, 2]);
    let (ca_pem, tls) = test_pki();
    let log: Log = Default::default();
    // The internet's own stop flag: its drop joins these threads too.
    let stop = net.stop.clone();
    serve(
        &mut net,
        "0.0.0.0:443",
        Some(tls),
        log.clone(),
        stop.clone(),
    );
    serve(&mut net, "198.18.5.3:8080", None, log.clone(), stop.clone());

    let files = tempfile::tempdir().unwrap();
    let ca_file = files.path().join("test-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let secrets_file = files.path().join("secrets.json");
    std::fs::write(
        &secrets_file,
        json!({"bob": {"BOB_KEY": BOB_VALUE}}).to_string(),
    )
    .unwrap();
    std::fs::set_permissions(
        &secrets_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let args: Vec<&'static str> = vec![
        "--egress-dns",
        "198.18.0.2",
        "--egress-ca-file",
        Box::leak(ca_file.display().to_string().into_boxed_str()),
        "--secrets-file",
        Box::leak(secrets_file.display().to_string().into_boxed_str()),
    ];
    let mut hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: Box::leak(args.into_boxed_slice()),
        ..Default::default()
    })
    .await;
    let (alice, bob) = (hub.client(Some(ALICE_KEY)), hub.client(Some(BOB_KEY)));
    let http = hub.http();
    let url = hub.url();

    // --- the API: bad entries are 400 naming the entry ---
    for (bad, needle) in [
        (secret("1KEY", "Authorization", "{value}"), "secrets[0]"),
        (secret("K", "Host", "{value}"), "secrets[0] \"K\".header"),
        (
            secret("K", "Authorization", "Bearer"),
            "secrets[0] \"K\".format",
        ),
        (
            json!({"name": "K", "hosts": ["10.0.0.0/8"], "header": "X-Key"}),
            "secrets[0] \"K\".hosts[0]",
        ),
    ] {
        let r = put_template(
            &hub,
            ALICE_KEY,
            "bad",
            json!({"network": policy(), "secrets": [bad]}),
        )
        .await;
        let body = error_body(r, 400, "INVALID_ARGUMENT").await;
        assert!(body["message"].as_str().unwrap().contains(needle), "{body}");
    }
    // Secrets without egress: refused.
    let r = put_template(
        &hub,
        ALICE_KEY,
        "bad",
        json!({"secrets": [secret("K", "X-Key", "{value}")]}),
    )
    .await;
    error_body(r, 400, "INVALID_ARGUMENT").await;

    let tpl = json!({"network": policy(),
                     "secrets": [secret("OPENAI_API_KEY", "Authorization", "Bearer {value}")]});
    let r = put_template(&hub, ALICE_KEY, "agent", tpl.clone()).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // No value yet: FAILED_PRECONDITION naming the secret.
    let e = alice
        .create(CreateSandbox {
            template: Some("agent".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::FailedPrecondition, "{e}");
    assert!(e.message.contains("OPENAI_API_KEY"), "{e}");

    // --- write-only values ---
    let put = |key: &'static str, name: &str, body: Value| {
        http.put(format!("{url}/v1/secrets/{name}"))
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    for (name, body) in [
        ("1BAD", json!({"value": "x"})),
        ("OK", json!({"value": "two\nlines"})),
        ("OK", json!({"value": "x".repeat(8193)})),
        ("OK", json!({"value": ""})),
        ("OK", json!({"value": "short"})),
    ] {
        error_body(
            put(ALICE_KEY, name, body).await.unwrap(),
            400,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    let r = put(ALICE_KEY, "OPENAI_API_KEY", json!({"value": ALICE_VALUE}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("OPENAI_API_KEY") && !text.contains(ALICE_VALUE),
        "{text}"
    );
    let list = |key: &'static str| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http
                .get(format!("{url}/v1/secrets"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let alices = list(ALICE_KEY).await;
    assert!(
        alices.contains("\"OPENAI_API_KEY\"") && alices.contains("\"tenant\""),
        "{alices}"
    );
    assert!(
        !alices.contains(ALICE_VALUE) && !alices.contains("BOB_KEY"),
        "{alices}"
    );
    let bobs = list(BOB_KEY).await;
    assert!(
        bobs.contains("\"BOB_KEY\"") && bobs.contains("\"operator\""),
        "{bobs}"
    );
    assert!(
        !bobs.contains(BOB_VALUE) && !bobs.contains("OPENAI_API_KEY"),
        "{bobs}"
    );
    // No route reads a value back.
    let r = http
        .get(format!("{url}/v1/secrets/OPENAI_API_KEY"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(!r.text().await.unwrap().contains(ALICE_VALUE));

    // --- alice's sandboxes ---
    let a = create(&alice, "agent").await;
    let b = create(&alice, "agent").await;
    let env_a = shell_ok(
        &alice,
        &a,
        "echo $OPENAI_API_KEY; echo $SSL_CERT_FILE; echo $NODE_EXTRA_CA_CERTS",
    )
    .await;
    let lines: Vec<&str> = env_a.lines().collect();
    let (ph_a, bundle) = (lines[0].to_string(), lines[1]);
    assert!(ph_a.starts_with("sandhub-secret-"), "{env_a}");
    assert_eq!(bundle, "/etc/sandhub/ca-bundle.pem");
    assert_eq!(lines[2], "/etc/sandhub/ca.pem");
    let ph_b = shell_ok(&alice, &b, "echo $OPENAI_API_KEY")
        .await
        .trim()
        .to_string();
    assert!(ph_b.starts_with("sandhub-secret-") && ph_b != ph_a);
    // The bundle is read-only inside.
    let r = shell(&alice, &a, "echo x >> /etc/sandhub/ca-bundle.pem").await;
    assert_ne!(r.exit_code, 0, "{r:?}");

    // The client, left running so its memory can be read.
    let script = format!(
        "cat > /tmp/test-ca.pem <<'EOF'\n{ca_pem}EOF\ncat > /tmp/client.py <<'EOF'\n{CLIENT}\nEOF\n\
         env -u http_proxy -u HTTP_PROXY -u https_proxy -u HTTPS_PROXY \
         setsid /usr/bin/python3 /tmp/client.py {ph_b} >/tmp/client.log 2>&1 </dev/null &"
    );
    shell_ok(&alice, &a, &script).await;
    let out = common::eventually("the client's answers", Duration::from_secs(90), || async {
        let r = shell(&alice, &a, "cat /tmp/out.json 2>/dev/null").await;
        serde_json::from_str::<Value>(&r.stdout).ok()
    })
    .await;
    let seen: Vec<Seen> = log.lock().unwrap().clone();
    let by = |host: &str, tls: bool| -> Vec<&Seen> {
        seen.iter()
            .filter(|s| s.host == host && s.tls == tls)
            .collect()
    };

    // The value reached api.test in the named header, formatted.
    let api = by("api.test", true);
    let auths: Vec<&str> = api
        .iter()
        .filter_map(|s| s.headers.get("authorization").map(String::as_str))
        .collect();
    assert!(
        auths.contains(&format!("Bearer {ALICE_VALUE}").as_str()),
        "{seen:?}"
    );
    // Another sandbox's placeholder is not replaced.
    assert!(
        auths.contains(&format!("Bearer {ph_b}").as_str()),
        "{seen:?}"
    );
    // The placeholder in another header is not replaced either.
    assert!(
        api.iter()
            .any(|s| s.headers.get("x-api-key") == Some(&ph_a)),
        "{seen:?}"
    );
    // The answer came back, the echoed value masked (same length).
    let masked = format!("Bearer {}", "*".repeat(ALICE_VALUE.len()));
    assert_eq!(out["api"]["status"], 200, "{out}");
    assert_eq!(out["api"]["body"], format!("auth={masked};key="), "{out}");
    assert_eq!(out["api"]["echo"], masked, "{out}");
    assert_eq!(
        out["foreign"]["body"],
        format!("auth=Bearer {ph_b};key="),
        "{out}"
    );
    // other.test has no secret: its TLS is the server's own (the hub's CA
    // is not used: verifying with the sandbox's bundle fails, with the
    // test CA it works), and the placeholder arrives as it is.
    let err = out["other_hub_trust"]["error"].as_str().unwrap_or_default();
    assert!(err.contains("CERTIFICATE_VERIFY_FAILED"), "{out}");
    assert_eq!(out["other"]["status"], 200, "{out}");
    let other = by("other.test", true);
    assert!(
        other
            .iter()
            .any(|s| s.headers.get("authorization") == Some(&format!("Bearer {ph_a}"))),
        "{seen:?}"
    );
    // A secret's host without TLS gets the placeholder.
    assert_eq!(out["plain"]["status"], 200, "{out}");
    let plain = by("api2.test:8080", false);
    assert_eq!(plain.len(), 1, "{seen:?}");
    assert_eq!(plain[0].headers["authorization"], format!("Bearer {ph_a}"));
    // A secret's host whose upstream fails TLS: a 502 that says why.
    let e = out["no_tls_upstream"]["error"].as_str().unwrap_or_default();
    assert!(e.contains("Bad Gateway"), "{out}");
    // Nothing but api.test's TLS requests ever carried the value.
    for s in &seen {
        if s.headers.values().any(|v| v.contains(ALICE_VALUE)) {
            assert!(s.host == "api.test" && s.tls, "{s:?}");
        }
    }

    // The decision log marks the brokered flows.
    let decisions: Value = http
        .get(format!("{url}/v1/sandboxes/{a}/egress"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ds = decisions["decisions"].as_array().unwrap();
    let brokered = |name: &str| {
        ds.iter()
            .filter(|d| d["name"] == name && d["allowed"] == true)
            .map(|d| d["brokered"] == true)
            .collect::<Vec<_>>()
    };
    assert!(
        !brokered("api.test").is_empty() && brokered("api.test").iter().all(|b| *b),
        "{decisions}"
    );
    assert!(
        !brokered("other.test").is_empty() && brokered("other.test").iter().all(|b| !b),
        "{decisions}"
    );
    assert!(brokered("api2.test").iter().all(|b| !b), "{decisions}");
    assert!(ds.iter().all(|d| d["bytes_in"].as_u64().is_some()));

    // --- the value is nowhere in the sandbox ---
    let value = ALICE_VALUE.as_bytes();
    // Its processes: the mounts name its id, and they are in their own
    // network namespace (the hub is not).
    let own_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let pids: Vec<i32> = common::host_pids_with_mount(&a)
        .into_iter()
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/net")).is_ok_and(|ns| ns != own_ns))
        .collect();
    assert!(pids.len() >= 2, "the sandbox's processes: {pids:?}");
    let mut placeholder_in_env = false;
    let mut placeholder_in_memory = false;
    for &pid in &pids {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !contains(&env, value),
            "the value is in /proc/{pid}/environ"
        );
        placeholder_in_env |= contains(&env, ph_a.as_bytes());
        assert!(
            !in_memory(pid, value),
            "the value is in the memory of {pid}"
        );
        placeholder_in_memory |= in_memory(pid, ph_a.as_bytes());
    }
    // Positive controls: the same reads find the placeholder.
    assert!(placeholder_in_env && placeholder_in_memory);
    let (mut found, mut read) = (Vec::new(), 0);
    files_with(&hub.sandboxes_dir().join(&a), value, &mut found, &mut read);
    let root = format!("/proc/{}/root", pids.iter().max().unwrap());
    for d in ["tmp", "root", "dev/shm", "etc", "workspace"] {
        files_with(&Path::new(&root).join(d), value, &mut found, &mut read);
    }
    assert!(found.is_empty(), "the value is in {found:?}");
    let (mut with_placeholder, mut n) = (Vec::new(), 0);
    files_with(
        &Path::new(&root).join("tmp"),
        ph_a.as_bytes(),
        &mut with_placeholder,
        &mut n,
    );
    assert!(
        with_placeholder
            .iter()
            .any(|p| p.ends_with("/tmp/out.json")),
        "{with_placeholder:?} ({read} files read)"
    );
    assert!(
        !hub.log().contains(ALICE_VALUE),
        "the value is in the hub's log"
    );

    // --- per tenant ---
    // Bob's template names alice's secret: bob has no value for it.
    let r = put_template(&hub, BOB_KEY, "agent", tpl.clone()).await;
    assert_eq!(r.status(), 200);
    let e = bob
        .create(CreateSandbox {
            template: Some("agent".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::FailedPrecondition, "{e}");
    // Bob's own (the operator's file) reaches the server in its header.
    let r = put_template(
        &hub,
        BOB_KEY,
        "keyed",
        json!({"network": policy(), "secrets": [secret("BOB_KEY", "X-Api-Key", "{value}")]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let c = create(&bob, "keyed").await;
    let r = shell_ok(
        &bob,
        &c,
        "env -u https_proxy -u HTTPS_PROXY /usr/bin/python3 -c \"import os, urllib.request as u; \
         print(u.urlopen(u.Request('https://api.test/echo', headers={'X-Api-Key': os.environ['BOB_KEY']}), timeout=20).read().decode())\"",
    )
    .await;
    assert_eq!(
        r.trim(),
        format!("auth=;key={}", "*".repeat(BOB_VALUE.len()))
    );
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.headers.get("x-api-key").map(String::as_str) == Some(BOB_VALUE)));
    // Bob cannot delete alice's value, nor the operator's.
    let del = |key: &'static str, name: &str| {
        http.delete(format!("{url}/v1/secrets/{name}"))
            .bearer_auth(key)
            .send()
    };
    error_body(
        del(BOB_KEY, "OPENAI_API_KEY").await.unwrap(),
        404,
        "NOT_FOUND",
    )
    .await;
    error_body(
        del(BOB_KEY, "BOB_KEY").await.unwrap(),
        412,
        "FAILED_PRECONDITION",
    )
    .await;
    assert!(list(ALICE_KEY).await.contains("OPENAI_API_KEY"));
    // Alice deletes hers: gone from the list, and new sandboxes refused.
    assert_eq!(
        del(ALICE_KEY, "OPENAI_API_KEY").await.unwrap().status(),
        204
    );
    assert!(!list(ALICE_KEY).await.contains("OPENAI_API_KEY"));
    let e = alice
        .create(CreateSandbox {
            template: Some("agent".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::FailedPrecondition, "{e}");

    // --- a create request adds secrets to its template's ---
    let req_secret = |name: &str| -> sandhub_api::secrets::SecretRef {
        serde_json::from_value(secret(name, "X-Api-Key", "{value}")).unwrap()
    };
    let r = put_template(&hub, ALICE_KEY, "online", json!({"network": policy()})).await;
    assert_eq!(r.status(), 200);
    // (The built-in `default` is online now: an offline template of its own.)
    let r = put_template(&hub, ALICE_KEY, "offline", json!({"network": "none"})).await;
    assert_eq!(r.status(), 200);
    let created = |template: &str, name: &str| {
        alice.create(CreateSandbox {
            template: Some(template.into()),
            secrets: vec![req_secret(name)],
            ..Default::default()
        })
    };
    // Not a secret the template names already; not without egress; not
    // without a value.
    let e = created("agent", "OPENAI_API_KEY").await.unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument, "{e}");
    let e = created("offline", "EXTRA_KEY").await.unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument, "{e}");
    let e = created("online", "EXTRA_KEY").await.unwrap_err();
    assert_eq!(e.code, sandhub_api::error::Code::FailedPrecondition, "{e}");
    assert!(e.message.contains("EXTRA_KEY"), "{e}");
    const EXTRA_VALUE: &str = "extra-value-Jw5Qn2Ks8Pt";
    let r = put(ALICE_KEY, "EXTRA_KEY", json!({"value": EXTRA_VALUE}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let d = created("online", "EXTRA_KEY").await.unwrap().id;
    let got = shell_ok(
        &alice,
        &d,
        "echo $EXTRA_KEY; env -u https_proxy -u HTTPS_PROXY /usr/bin/python3 -c \"import os, urllib.request as u; \
         print(u.urlopen(u.Request('https://api.test/echo', headers={'X-Api-Key': os.environ['EXTRA_KEY']}), timeout=20).read().decode())\"",
    )
    .await;
    let lines: Vec<&str> = got.lines().collect();
    assert!(lines[0].starts_with("sandhub-secret-"), "{got}");
    assert_eq!(
        lines[1],
        format!("auth=;key={}", "*".repeat(EXTRA_VALUE.len()))
    );
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.headers.get("x-api-key").map(String::as_str) == Some(EXTRA_VALUE)));
    let _ = alice.delete(&d).await;

    // --- a hub killed with -9 gives the sandbox its gateway back, with
    // the same placeholder and the value as the store has it then ---
    const NEW_VALUE: &str = "sk-alice-rotated-4Hq8Zt1Mv6Xc3Lp9Rb2N";
    let r = put(ALICE_KEY, "OPENAI_API_KEY", json!({"value": NEW_VALUE}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    hub.kill9();
    hub.restart().await;
    let (alice, bob) = (hub.client(Some(ALICE_KEY)), hub.client(Some(BOB_KEY)));
    let after = common::eventually("the brokered call after a restart", Duration::from_secs(60), || async {
        let r = shell(
            &alice,
            &a,
            "echo $OPENAI_API_KEY; env -u https_proxy -u HTTPS_PROXY /usr/bin/python3 -c \"import os, urllib.request as u; \
             print(u.urlopen(u.Request('https://api.test/echo', headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']}), timeout=20).read().decode())\"",
        )
        .await;
        (r.exit_code == 0).then_some(r.stdout)
    })
    .await;
    let lines: Vec<&str> = after.lines().collect();
    assert_eq!(lines[0], ph_a, "the placeholder is kept");
    assert_eq!(
        lines[1],
        format!("auth=Bearer {};key=", "*".repeat(NEW_VALUE.len()))
    );
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|s| s.headers.get("authorization") == Some(&format!("Bearer {NEW_VALUE}"))));
    assert!(!hub.log().contains(NEW_VALUE) && !hub.log().contains(ALICE_VALUE));

    for (c, id) in [(&alice, &a), (&alice, &b), (&bob, &c)] {
        let _ = c.delete(id).await;
    }
    drop(hub);
    drop(net);
}
