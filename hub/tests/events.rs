//! Lifecycle events and webhooks against a real `sandhub serve` (local
//! backend, real sandboxes, real SQLite): each event produced by a real
//! action, `GET /v1/events` (filters, tenants, resume after `kill -9`,
//! slow consumers, caps) and signed webhooks (a receiver that verifies
//! signatures with its own Stripe-style verifier, outages, `kill -9`, and
//! the outbound address rules).

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{eventually, HubOptions, TestHub, ALICE_KEY, BOB_KEY, WAIT};
use futures::StreamExt;
use serde_json::{json, Value};

// ------------------------------------------------------------------ helpers

/// One Server-Sent Events frame.
#[derive(Debug, Clone)]
struct Frame {
    id: Option<u64>,
    event: Option<String>,
    data: String,
}

/// A `GET /v1/events` stream, read frame by frame.
struct Sse {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl Sse {
    async fn open(hub: &TestHub, key: &str, query: &str, last_id: Option<u64>) -> Sse {
        let mut req = reqwest::Client::new()
            .get(format!("{}/v1/events?{query}", hub.url()))
            .bearer_auth(key);
        if let Some(id) = last_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        Sse {
            body: resp.bytes_stream().boxed(),
            buf: String::new(),
        }
    }

    /// The next frame with data (comments are heartbeats); None at the end
    /// of the stream or after `wait`.
    async fn next(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut f = Frame {
                    id: None,
                    event: None,
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        f.id = v.trim().parse().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        f.event = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        f.data.push_str(v.trim_start());
                    }
                }
                if !f.data.is_empty() {
                    return Some(f);
                }
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .ok()??
                .ok()?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next event's JSON; panics on anything else.
    async fn event(&mut self) -> Value {
        let f = self.next(WAIT).await.expect("an event before the timeout");
        assert_eq!(f.event, None, "not an event: {f:?}");
        let v: Value = serde_json::from_str(&f.data).unwrap();
        assert_eq!(Some(v["id"].as_u64().unwrap()), f.id, "{f:?}");
        v
    }

    /// Events until one of `kind` (for `sandbox`, when given) arrives;
    /// all of them, that one last.
    async fn until(&mut self, kind: &str, sandbox: Option<&str>) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let e = self.event().await;
            let hit =
                e["type"] == kind && sandbox.is_none_or(|s| e["sandbox_id"].as_str() == Some(s));
            seen.push(e);
            if hit {
                return seen;
            }
        }
    }
}

async fn call(hub: &TestHub, key: &str, method: &str, path: &str, body: Option<Value>) -> Value {
    let url = format!("{}{path}", hub.url());
    let req = match method {
        "POST" => hub.http().post(url),
        "PUT" => hub.http().put(url),
        "DELETE" => hub.http().delete(url),
        _ => hub.http().get(url),
    }
    .bearer_auth(key);
    let req = match body {
        Some(b) => req.json(&b),
        None => req,
    };
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{method} {path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

async fn create(hub: &TestHub, key: &str, body: Value) -> String {
    call(hub, key, "POST", "/v1/sandboxes", Some(body)).await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

/// Every event of `key`'s tenant the log holds (a fresh stream from 0).
async fn whole_log(hub: &TestHub, key: &str, at_least: usize) -> Vec<Value> {
    let mut s = Sse::open(hub, key, "", Some(0)).await;
    let mut all = Vec::new();
    while all.len() < at_least {
        all.push(s.event().await);
    }
    // Anything more arrives at once: it is all in the log already.
    while let Some(f) = s.next(Duration::from_millis(500)).await {
        all.push(serde_json::from_str(&f.data).unwrap());
    }
    all
}

// ------------------------------------------------------------------ events

/// `entrypoint_exited`: each exit of a sandbox's entrypoint is told once,
/// with its exit code in the GET's words; a reset starts it again and its
/// next exit is told again; a sandbox without one tells nothing.
#[tokio::test]
async fn an_entrypoints_exit_is_told_once_per_run() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let k = ALICE_KEY;
    let ep = json!({"entrypoint": ["/bin/sh", "-c", "sleep 1; exit 3"]});
    call(&hub, k, "PUT", "/v1/templates/ends", Some(ep)).await;
    call(&hub, k, "PUT", "/v1/templates/plain", Some(json!({}))).await;
    let mut s = Sse::open(&hub, k, "type=entrypoint_exited,reset", None).await;
    let plain = create(&hub, k, json!({"template": "plain"})).await;
    let id = create(
        &hub,
        k,
        json!({"template": "ends", "labels": {"team": "a"}}),
    )
    .await;

    let first = s.until("entrypoint_exited", Some(&id)).await;
    assert_eq!(first.len(), 1, "{first:?}");
    let e = &first[0];
    assert_eq!(e["labels"]["team"], "a");
    assert_eq!(e["details"]["exit_code"], 3, "{e}");
    assert_eq!(e["details"]["state"], "Error", "{e}");
    assert!(e["details"]["finished_at"].is_string(), "{e}");

    // Asked again and again (every 2 s): not told twice.
    assert!(
        s.next(Duration::from_secs(5)).await.is_none(),
        "a second event for one exit"
    );
    // Nor after a pause: the same run goes on once thawed (a pause is not
    // a new start, as a resume after a suspend is).
    call(&hub, k, "POST", &format!("/v1/sandboxes/{id}/pause"), None).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    call(&hub, k, "POST", &format!("/v1/sandboxes/{id}/resume"), None).await;
    assert!(
        s.next(Duration::from_secs(5)).await.is_none(),
        "the exit told again after a pause"
    );

    // A reset starts the entrypoint again: its next exit is a new one.
    call(&hub, k, "POST", &format!("/v1/sandboxes/{id}/reset"), None).await;
    let again = s.until("entrypoint_exited", Some(&id)).await;
    assert_eq!(types(&again), ["reset", "entrypoint_exited"]);
    assert_ne!(
        again[1]["details"]["started_at"],
        e["details"]["started_at"]
    );
    assert!(again[1]["id"].as_u64() > e["id"].as_u64());

    // The sandbox without an entrypoint told nothing.
    let log = whole_log(&hub, k, 3).await;
    assert!(
        log.iter()
            .all(|e| e["type"] != "entrypoint_exited" || e["sandbox_id"] == id.as_str()),
        "{log:?}"
    );
    assert!(log.iter().any(|e| e["sandbox_id"] == plain.as_str()));
}

/// Each local action emits its event, with the sandbox's labels and the
/// reasons the issue names; one stream follows them live.
#[tokio::test]
async fn every_action_emits_its_event() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let k = ALICE_KEY;
    let mut s = Sse::open(&hub, k, "", None).await;

    call(&hub, k, "PUT", "/v1/templates/tpl", Some(json!({}))).await;
    let e = s.event().await;
    assert_eq!(
        (e["type"].as_str(), e["details"]["template"].as_str()),
        (Some("template_changed"), Some("tpl"))
    );

    let id = create(&hub, k, json!({"template": "tpl", "labels": {"team": "a"}})).await;
    let seen = s.until("ready", Some(&id)).await;
    assert_eq!(types(&seen), ["created", "ready"]);
    assert!(
        seen.iter()
            .all(|e| e["labels"]["team"] == "a" && e["tenant"] == "alice"),
        "{seen:?}"
    );

    let snap = call(
        &hub,
        k,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        None,
    )
    .await;
    let e = s.event().await;
    assert_eq!(e["type"], "snapshotted");
    assert_eq!(e["details"]["snapshot_id"], snap["id"]);

    let fork = call(
        &hub,
        k,
        "POST",
        &format!("/v1/sandboxes/{id}/fork"),
        Some(json!({"snapshot": snap["id"]})),
    )
    .await;
    let fork_id = fork["id"].as_str().unwrap().to_string();
    let seen = s.until("forked", Some(&id)).await;
    assert_eq!(types(&seen), ["created", "ready", "forked"]);
    assert_eq!(seen[0]["sandbox_id"].as_str(), Some(fork_id.as_str()));
    assert_eq!(
        seen[2]["details"]["fork_id"].as_str(),
        Some(fork_id.as_str())
    );

    for (op, kind) in [
        ("reset", "reset"),
        ("suspend", "suspended"),
        ("resume", "resumed"),
        ("pause", "paused"),
        ("resume", "resumed"),
    ] {
        call(&hub, k, "POST", &format!("/v1/sandboxes/{id}/{op}"), None).await;
        let e = s.event().await;
        assert_eq!(
            (e["type"].as_str(), e["sandbox_id"].as_str()),
            (Some(kind), Some(id.as_str()))
        );
    }

    call(&hub, k, "DELETE", &format!("/v1/sandboxes/{fork_id}"), None).await;
    let e = s.event().await;
    assert_eq!(
        (e["type"].as_str(), e["details"]["reason"].as_str()),
        (Some("deleted"), Some("by_caller"))
    );

    // The reaper's verdicts, with their reasons.
    let doomed = create(&hub, k, json!({"shutdown_after_seconds": 1})).await;
    let idle = create(&hub, k, json!({"idle_timeout_seconds": 1})).await;
    let mut reasons = BTreeMap::new();
    while reasons.len() < 2 {
        let e = s.event().await;
        if e["type"] == "deleted" {
            reasons.insert(
                e["sandbox_id"].as_str().unwrap().to_string(),
                e["details"]["reason"].clone(),
            );
        }
    }
    assert_eq!(reasons[&doomed], "deadline");
    assert_eq!(reasons[&idle], "idle_timeout");

    // Pools: a warm claim; a pool that cannot start says why and starves.
    call(
        &hub,
        k,
        "PUT",
        "/v1/pools/warm",
        Some(json!({"template": "tpl", "replicas": 1})),
    )
    .await;
    eventually("the warm pool to fill", WAIT, || async {
        let p = call(&hub, k, "GET", "/v1/pools/warm", None).await;
        (p["ready"] == 1).then_some(())
    })
    .await;
    let claimed = create(&hub, k, json!({"pool": "warm", "labels": {"via": "pool"}})).await;
    let seen = s.until("claimed", Some(&claimed)).await;
    let e = seen.last().unwrap();
    assert_eq!(
        (e["pool"].as_str(), e["labels"]["via"].as_str()),
        (Some("warm"), Some("pool"))
    );
    assert!(
        !types(&seen).contains(&"created".to_string()),
        "a warm member is not announced: {seen:?}"
    );

    call(
        &hub,
        k,
        "PUT",
        "/v1/templates/broken",
        Some(json!({"user": "no-such-user"})),
    )
    .await;
    call(
        &hub,
        k,
        "PUT",
        "/v1/pools/broken",
        Some(json!({"template": "broken", "replicas": 1})),
    )
    .await;
    let seen = s.until("pool_start_failed", None).await;
    let e = seen.last().unwrap();
    assert_eq!(e["pool"], "broken");
    assert!(
        e["details"]["last_error"]
            .as_str()
            .unwrap()
            .contains("no-such-user"),
        "{e}"
    );
    let r = hub
        .http()
        .post(format!("{}/v1/sandboxes", hub.url()))
        .bearer_auth(k)
        .json(&json!({"pool": "broken"}))
        .send()
        .await
        .unwrap();
    assert!(!r.status().is_success());
    let seen = s.until("deleted", None).await;
    let t = types(&seen);
    assert!(
        t.contains(&"pool_starved".to_string()) && t.contains(&"created".to_string()),
        "{t:?}"
    );
    assert_eq!(seen.last().unwrap()["details"]["reason"], "start_failed");

    // A pool's template changed.
    call(
        &hub,
        k,
        "PUT",
        "/v1/pools/warm",
        Some(json!({"template": "default", "replicas": 0})),
    )
    .await;
    let seen = s.until("template_changed", None).await;
    let e = seen.last().unwrap();
    assert_eq!(
        (e["pool"].as_str(), e["details"]["previous"].as_str()),
        (Some("warm"), Some("tpl"))
    );

    // Ids only grow.
    let all = whole_log(&hub, k, 20).await;
    let ids: Vec<u64> = all.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

/// Resuming with `Last-Event-ID` after a `kill -9` of the hub misses
/// nothing and repeats nothing; filters apply to the replay too.
#[tokio::test]
async fn a_stream_resumes_across_kill9_without_gaps_or_repeats() {
    let mut hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let k = ALICE_KEY;
    let mut s = Sse::open(&hub, k, "", Some(0)).await;
    for i in 0..5 {
        call(
            &hub,
            k,
            "PUT",
            &format!("/v1/templates/t{i}"),
            Some(json!({})),
        )
        .await;
    }
    // The stream sends only what is stored, so all five outlive the kill;
    // the client acknowledged three of them. (An action's event is stored
    // just after the action answers: the kill must come after the stream
    // showed them, or the test would race the writer's commit.)
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(s.event().await);
    }
    let mut got: Vec<Value> = seen.drain(..3).collect();
    let acked = got.last().unwrap()["id"].as_u64().unwrap();
    drop(s);
    hub.kill9();
    hub.restart().await;
    let id = create(&hub, k, json!({"labels": {"x": "1"}})).await;
    call(&hub, k, "PUT", "/v1/templates/after", Some(json!({}))).await;
    let mut s = Sse::open(&hub, k, "", Some(acked)).await;
    for _ in 0..(2 + 2 + 1) {
        got.push(s.event().await);
    }
    assert!(
        s.next(Duration::from_millis(700)).await.is_none(),
        "nothing more"
    );
    let ids: Vec<u64> = got.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "no repeat, in order: {ids:?}"
    );
    let all = whole_log(&hub, k, got.len()).await;
    assert_eq!(all, got, "nothing missed");
    assert_eq!(types(&got[5..7]), ["created", "ready"]);

    // Filters: by sandbox, by type, by labels (replayed from the log).
    let mut f = Sse::open(&hub, k, &format!("sandbox={id}&type=ready"), Some(0)).await;
    let e = f.event().await;
    assert_eq!(
        (e["type"].as_str(), e["sandbox_id"].as_str()),
        (Some("ready"), Some(id.as_str()))
    );
    assert!(f.next(Duration::from_millis(500)).await.is_none());
    let mut f = Sse::open(&hub, k, "labels=x%3D1", Some(0)).await;
    assert_eq!(
        types(&[f.event().await, f.event().await]),
        ["created", "ready"]
    );
    let mut f = Sse::open(&hub, k, "labels=x%3D2", Some(0)).await;
    assert!(f.next(Duration::from_millis(500)).await.is_none());
}

/// Another tenant's events are never seen, not even by naming its sandbox.
#[tokio::test]
async fn tenants_never_see_each_others_events() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let mut alice = Sse::open(&hub, ALICE_KEY, "", Some(0)).await;
    let bobs = create(&hub, BOB_KEY, json!({})).await;
    let mut snooping = Sse::open(&hub, ALICE_KEY, &format!("sandbox={bobs}"), Some(0)).await;
    let mut bob = Sse::open(&hub, BOB_KEY, "", Some(0)).await;
    assert_eq!(
        types(&[bob.event().await, bob.event().await]),
        ["created", "ready"]
    );
    call(
        &hub,
        ALICE_KEY,
        "PUT",
        "/v1/templates/mine",
        Some(json!({})),
    )
    .await;
    let e = alice.event().await;
    assert_eq!(
        (e["type"].as_str(), e["tenant"].as_str()),
        (Some("template_changed"), Some("alice"))
    );
    assert!(alice.next(Duration::from_millis(700)).await.is_none());
    assert!(snooping.next(Duration::from_millis(300)).await.is_none());
    assert!(
        bob.next(Duration::from_millis(300)).await.is_none(),
        "alice's event reached bob"
    );
}

/// Unknown types, filters and ids are 400 naming the field; the tenant's
/// stream count is capped.
#[tokio::test]
async fn bad_filters_are_refused_by_name_and_streams_are_capped() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--event-max-streams-per-tenant", "2"],
        ..Default::default()
    })
    .await;
    let get = |q: &'static str, last: Option<&'static str>| {
        let mut r = hub
            .http()
            .get(format!("{}/v1/events?{q}", hub.url()))
            .bearer_auth(ALICE_KEY);
        if let Some(l) = last {
            r = r.header("Last-Event-ID", l);
        }
        r.send()
    };
    for (q, last, field) in [
        ("type=created,exploded", None, "type"),
        ("labels=novalue", None, "labels"),
        ("colour=red", None, "colour"),
        ("", Some("yesterday"), "Last-Event-ID"),
        ("last_event_id=-1", None, "last_event_id"),
    ] {
        let body = common::error_body(get(q, last).await.unwrap(), 400, "INVALID_ARGUMENT").await;
        assert!(
            body["message"].as_str().unwrap().contains(field),
            "{q}: {body}"
        );
    }
    let _a = Sse::open(&hub, ALICE_KEY, "", None).await;
    let _b = Sse::open(&hub, ALICE_KEY, "", None).await;
    common::error_body(get("", None).await.unwrap(), 429, "RESOURCE_EXHAUSTED").await;
    // Another tenant has its own count.
    let _c = Sse::open(&hub, BOB_KEY, "", None).await;
    drop(_a);
    eventually("a closed stream's slot to free", WAIT, || async {
        get("", None).await.ok().filter(|r| r.status() == 200)
    })
    .await;
}

/// A consumer that does not read is sent a final `error` event and cut
/// off once it falls `--event-buffer` behind; the hub's memory stays put.
#[tokio::test]
async fn a_slow_consumer_is_cut_off_with_a_final_event_and_bounded_memory() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--event-buffer", "16"],
        ..Default::default()
    })
    .await;
    let rss = || {
        let pid = hub.pid().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket
        .connect(format!("127.0.0.1:{}", hub.port).parse().unwrap())
        .await
        .unwrap();
    conn.write_all(
        format!("GET /v1/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {ALICE_KEY}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss();
    // Far more than the socket buffers hold (names make each event ~300
    // bytes): the stream stops being written, the ring moves on without it.
    const N: usize = 6000;
    let pad = "p".repeat(50);
    futures::stream::iter(0..N)
        .for_each_concurrent(16, |i| {
            let (hub, pad) = (&hub, &pad);
            async move {
                let path = format!("/v1/templates/{pad}-{}", i % 50);
                call(hub, ALICE_KEY, "PUT", &path, Some(json!({}))).await;
            }
        })
        .await;
    let after = rss();
    let mut got = Vec::new();
    let read = tokio::time::timeout(WAIT, conn.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the stream was never ended");
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("event: error"),
        "no final event: ...{}",
        &text[text.len().saturating_sub(500)..]
    );
    assert!(
        text.contains("RESOURCE_EXHAUSTED") && text.contains("Last-Event-ID"),
        "{}",
        &text[text.len().saturating_sub(500)..]
    );
    let sent = text.matches("id: ").count();
    assert!(
        sent < N,
        "the consumer was sent everything ({sent}), not cut off"
    );
    eprintln!("slow consumer: hub RSS {before} kB -> {after} kB while {N} events passed it; {sent} were sent");
    assert!(
        after < before + 16 * 1024,
        "the hub grew from {before} kB to {after} kB"
    );
}

// ------------------------------------------------------------------ webhooks

/// A Stripe-style verifier, written here independently of the hub: parse
/// `t=` and `v1=` from the header, HMAC-SHA256 `"{t}.{body}"`, compare in
/// constant time, and refuse stale timestamps.
fn verify(body: &[u8], header: &str, secret: &str, tolerance_s: u64) -> bool {
    use hmac::{Mac, SimpleHmac};
    let mut t = None;
    let mut sigs = Vec::new();
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = v.parse::<u64>().ok(),
            Some(("v1", v)) => sigs.push(v.to_string()),
            _ => {}
        }
    }
    let Some(t) = t else { return false };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if now.abs_diff(t) > tolerance_s {
        return false;
    }
    let mut mac = SimpleHmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let want = mac.finalize().into_bytes();
    sigs.iter().any(|s| {
        hex::decode(s).is_ok_and(|got| {
            use subtle::ConstantTimeEq;
            got.len() == want.len() && bool::from(got.ct_eq(&want))
        })
    })
}

#[derive(Default)]
struct Received {
    /// Event ids, each time one arrived (repeats kept).
    ids: Vec<u64>,
    bad: Vec<String>,
}

/// A webhook receiver on loopback: verifies each POST, records its id.
async fn receiver(
    port: u16,
    secret: &'static str,
    got: Arc<Mutex<Received>>,
) -> tokio::task::JoinHandle<()> {
    use axum::{body::Bytes, http::HeaderMap, routing::post};
    let app = axum::Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: Bytes| {
            let got = got.clone();
            async move {
                let sig = headers
                    .get("sandhub-signature")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let id = headers
                    .get("sandhub-event-id")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let mut g = got.lock().unwrap();
                let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if !verify(&body, sig, secret, 300)
                    || event["id"].as_u64().map(|i| i.to_string()).as_deref() != Some(id)
                {
                    g.bad
                        .push(format!("{sig} {id} {}", String::from_utf8_lossy(&body)));
                    return axum::http::StatusCode::BAD_REQUEST;
                }
                g.ids.push(event["id"].as_u64().unwrap());
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    })
}

const SECRET: &str = "whsec_0123456789abcdef";

/// Signed deliveries a standard verifier accepts; a receiver that is down
/// for a while, and a hub `kill -9`ed meanwhile, still get every event.
#[tokio::test]
async fn webhooks_are_signed_retried_and_survive_kill9() {
    let mut hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &[
            "--webhook-allow-loopback",
            "--webhook-backoff",
            "100ms",
            "--webhook-max-backoff",
            "400ms",
            "--webhook-timeout",
            "2s",
        ],
        ..Default::default()
    })
    .await;
    let port = common::free_port();
    let got = Arc::new(Mutex::new(Received::default()));
    let server = receiver(port, SECRET, got.clone()).await;
    let url = format!("http://127.0.0.1:{port}/hook");
    let info = call(&hub, ALICE_KEY, "PUT", "/v1/webhooks/main",
        Some(json!({"url": url, "events": ["template_changed", "created", "deleted"], "secret": SECRET}))).await;
    assert_eq!(info["url"], url.as_str());
    assert!(
        info.get("secret").is_none() && !info.to_string().contains(SECRET),
        "{info}"
    );
    let listed = call(&hub, ALICE_KEY, "GET", "/v1/webhooks", None).await;
    assert!(!listed.to_string().contains(SECRET), "{listed}");
    assert_eq!(
        call(&hub, BOB_KEY, "GET", "/v1/webhooks", None).await["webhooks"],
        json!([])
    );
    let r = hub
        .http()
        .get(format!("{}/v1/webhooks/main", hub.url()))
        .bearer_auth(BOB_KEY)
        .send()
        .await
        .unwrap();
    common::error_body(r, 404, "NOT_FOUND").await;

    call(&hub, ALICE_KEY, "PUT", "/v1/templates/a", Some(json!({}))).await;
    let id = create(&hub, ALICE_KEY, json!({})).await; // created (ready is not subscribed)
    call(&hub, BOB_KEY, "PUT", "/v1/templates/bobs", Some(json!({}))).await; // not alice's
    eventually("two deliveries", WAIT, || async {
        (got.lock().unwrap().ids.len() >= 2).then_some(())
    })
    .await;

    // The receiver goes down; events pile up and fail; the hub is killed.
    server.abort();
    let _ = server.await;
    call(
        &hub,
        ALICE_KEY,
        "DELETE",
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    call(&hub, ALICE_KEY, "PUT", "/v1/templates/b", Some(json!({}))).await;
    eventually("failed attempts to be recorded", WAIT, || async {
        let d = call(&hub, ALICE_KEY, "GET", "/v1/webhooks/main/deliveries", None).await;
        d["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["error"].is_string() && a["attempt"].as_u64() >= Some(2))
            .then_some(())
    })
    .await;
    hub.kill9();
    hub.restart().await;
    call(&hub, ALICE_KEY, "PUT", "/v1/templates/c", Some(json!({}))).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _server = receiver(port, SECRET, got.clone()).await;

    // Every event alice's webhook takes, from the log itself.
    let log = whole_log(&hub, ALICE_KEY, 6).await;
    let want: BTreeSet<u64> = log
        .iter()
        .filter(|e| {
            ["template_changed", "created", "deleted"].contains(&e["type"].as_str().unwrap())
        })
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert_eq!(want.len(), 5, "{log:?}");
    eventually("every event delivered after the outage", WAIT, || async {
        let ids: BTreeSet<u64> = got.lock().unwrap().ids.iter().copied().collect();
        (ids == want).then_some(())
    })
    .await;
    let bad = got.lock().unwrap().bad.clone();
    assert!(bad.is_empty(), "signatures that failed: {bad:?}");
    let d = call(&hub, ALICE_KEY, "GET", "/v1/webhooks/main/deliveries", None).await;
    assert!(
        d["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["status"] == 204),
        "{d}"
    );

    // Deleting it stops deliveries and forgets its attempts.
    call(&hub, ALICE_KEY, "DELETE", "/v1/webhooks/main", None).await;
    let r = hub
        .http()
        .get(format!("{}/v1/webhooks/main/deliveries", hub.url()))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    common::error_body(r, 404, "NOT_FOUND").await;
}

/// Webhook URLs obey the egress closed ranges: by default no loopback (a
/// literal or a name resolving to it), no metadata address, no private
/// range; with loopback opened, still never the hub's own port. Bad fields
/// are 400 naming them, and the count per tenant is capped.
#[tokio::test]
async fn webhook_urls_are_checked_and_fields_refused_by_name() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--webhook-max-per-tenant", "1"],
        ..Default::default()
    })
    .await;
    let put = |body: Value| {
        hub.http()
            .put(format!("{}/v1/webhooks/w", hub.url()))
            .bearer_auth(ALICE_KEY)
            .json(&body)
            .send()
    };
    let own = format!("http://127.0.0.1:{}/v1/sandboxes", hub.port);
    for url in [
        "http://127.0.0.1:9/hook".to_string(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://localhost:9/hook".to_string(),
        "http://10.0.0.1/hook".to_string(),
        "http://[::1]:9/".to_string(),
        own,
    ] {
        let r = put(json!({"url": url, "secret": SECRET})).await.unwrap();
        let body = common::error_body(r, 403, "PERMISSION_DENIED").await;
        assert!(
            body["message"].as_str().unwrap().contains("url"),
            "{url}: {body}"
        );
    }
    for (body, field, code) in [
        (
            json!({"url": "ftp://example.com/", "secret": SECRET}),
            "url",
            400,
        ),
        (
            json!({"url": "http://example.com/", "secret": "short"}),
            "secret",
            400,
        ),
        (
            json!({"url": "http://example.com/", "secret": SECRET, "events": ["exploded"]}),
            "events",
            400,
        ),
        (
            json!({"url": "http://example.com/", "secret": SECRET, "colour": "red"}),
            "colour",
            400,
        ),
    ] {
        let r = put(body.clone()).await.unwrap();
        let b = common::error_body(r, code, "INVALID_ARGUMENT").await;
        assert!(
            b["message"].as_str().unwrap().contains(field),
            "{body}: {b}"
        );
    }
    // A public address (a literal: no lookup leaves the machine) is taken;
    // the second webhook is past the cap.
    call(
        &hub,
        ALICE_KEY,
        "PUT",
        "/v1/webhooks/w",
        Some(json!({"url": "http://192.0.2.1/", "secret": SECRET})),
    )
    .await;
    let r = hub
        .http()
        .put(format!("{}/v1/webhooks/w2", hub.url()))
        .bearer_auth(ALICE_KEY)
        .json(&json!({"url": "http://192.0.2.1/", "secret": SECRET}))
        .send()
        .await
        .unwrap();
    common::error_body(r, 429, "RESOURCE_EXHAUSTED").await;
}

/// With loopback opened by the operator, the hub's own listener is still
/// refused, at registration and at delivery.
#[tokio::test]
async fn the_hubs_own_port_is_refused_even_with_loopback_open() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        extra_args: &["--webhook-allow-loopback"],
        ..Default::default()
    })
    .await;
    for host in ["127.0.0.1", "localhost"] {
        let r = hub.http().put(format!("{}/v1/webhooks/self", hub.url())).bearer_auth(ALICE_KEY)
            .json(&json!({"url": format!("http://{host}:{}/v1/sandboxes", hub.port), "secret": SECRET}))
            .send().await.unwrap();
        let body = common::error_body(r, 403, "PERMISSION_DENIED").await;
        assert!(
            body["message"].as_str().unwrap().contains("own listener"),
            "{body}"
        );
    }
}

/// `sandhub events` prints what the log keeps; `-f` follows new events.
#[tokio::test]
async fn the_cli_prints_and_follows_events() {
    use std::io::BufRead;
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    call(&hub, ALICE_KEY, "PUT", "/v1/templates/one", Some(json!({}))).await;
    let out = std::process::Command::new(common::EXE)
        .args([
            "events",
            "--hub",
            &hub.url(),
            "--api-key",
            ALICE_KEY,
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(types(&lines), ["template_changed"]);
    let mut follow = std::process::Command::new(common::EXE)
        .args([
            "events",
            "-f",
            "--type",
            "template_changed",
            "--hub",
            &hub.url(),
            "--api-key",
            ALICE_KEY,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    call(&hub, ALICE_KEY, "PUT", "/v1/templates/two", Some(json!({}))).await;
    let line = rx.recv_timeout(WAIT).expect("a followed event");
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(
        line.contains("template_changed") && line.contains("\"two\""),
        "{line}"
    );
}
