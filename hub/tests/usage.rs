//! Per-sandbox usage (issue #30 §1) against the real thing: `sandhub
//! serve` through [`TestHub`], sandboxes in real cgroups, the disk quota on
//! a real loop device. Each test reads what the hub's sampler saw of a
//! real workload: CPU at its `cpu` limit, memory at its `memory_mb` with
//! the OOM alert, disk at its `disk_mb` with the disk alert.

mod common;

use std::time::Duration;

use sandhub_api::{
    hub::{CreateSandbox, Sandbox, Template},
    usage::{MetricsQuery, SandboxMetrics},
};
use sandhub_client::{http::HubClient, Sandboxes};
use serde_json::Value;

use common::{eventually, shell as sh, HubOptions, TestHub, ALICE_KEY, BOB_KEY};

/// Upper bound of a wait for the sampler (it reads each second).
const SAMPLED: Duration = Duration::from_secs(20);

async fn sandbox(c: &HubClient, name: &str, template: Template) -> Sandbox {
    c.put_template(name, template).await.unwrap();
    c.create(CreateSandbox {
        template: Some(name.into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn series(c: &HubClient, id: &str) -> SandboxMetrics {
    c.metrics(id, MetricsQuery::default()).await.unwrap()
}

#[tokio::test]
async fn cpu_reads_near_its_cpu_limit() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = sandbox(
        &c,
        "a-fifth-of-a-core",
        Template {
            // Low enough that a busy CI machine still gives it all of it.
            cpu: Some(0.2),
            ..Default::default()
        },
    )
    .await;
    // Two busy loops want two cores; the cgroup gives a fifth of one.
    let burner = {
        let c = c.clone();
        let id = sb.id.clone();
        tokio::spawn(async move {
            sh(
                &c,
                &id,
                "timeout 8 sh -c '(while :; do :; done) & while :; do :; done'; true",
            )
            .await
        })
    };
    let busy = eventually("three busy seconds", SAMPLED, || async {
        let m = series(&c, &sb.id).await;
        let busy: Vec<f64> = m
            .samples
            .iter()
            .map(|s| s.cpu_cores)
            .filter(|&c| c > 0.1)
            .collect();
        (busy.len() >= 3).then_some((m, busy))
    })
    .await;
    let (m, busy) = busy;
    assert_eq!(m.limits.cpu, Some(0.2));
    assert_eq!(m.step_seconds, 1);
    eprintln!("MEASURE cpu samples while burning at a 0.2 limit: {busy:?}");
    let best = busy.iter().copied().fold(0.0, f64::max);
    assert!(
        (0.16..=0.24).contains(&best),
        "a 0.2-core sandbox burning two cores read at most {best} cores: {busy:?}"
    );
    assert!(
        busy.iter().all(|&c| c <= 0.26),
        "a sample above the limit: {busy:?}"
    );
    // The latest sample rides on GET and on the list, with its limits.
    let got = c.get(&sb.id).await.unwrap();
    let usage = got.usage.expect("GET carries the latest sample");
    assert_eq!(usage.limits.cpu, Some(0.2));
    assert!(usage.limits.memory_mb.is_some(), "{usage:?}");
    let listed = c.list(&Default::default()).await.unwrap();
    assert!(listed.iter().any(|s| s.id == sb.id && s.usage.is_some()));
    burner.await.unwrap();
    // Folded to 5 s points: fewer, none wider than the limit.
    let five = c
        .metrics(
            &sb.id,
            MetricsQuery {
                since: None,
                step: Some(5),
            },
        )
        .await
        .unwrap();
    assert_eq!(five.step_seconds, 5);
    // Against the 1 s series of now, not of when the burn was first seen
    // (that one is shorter: sampling went on through the burn).
    let one = series(&c, &sb.id).await;
    assert!(
        five.samples.len() < one.samples.len() || one.samples.len() <= 2,
        "{} points at 5 s, {} at 1 s",
        five.samples.len(),
        one.samples.len()
    );
    assert!(five.samples.iter().all(|s| s.cpu_cores <= 0.26), "{five:?}");
}

#[tokio::test]
async fn memory_reaches_its_limit_and_the_oom_hook_fires() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = sandbox(
        &c,
        "small-memory",
        Template {
            memory_mb: Some(64),
            ..Default::default()
        },
    )
    .await;
    // Seen once before the hog, so its kill is a rise the sampler sees.
    eventually("a first sample", SAMPLED, || async {
        c.get(&sb.id).await.unwrap().usage
    })
    .await;
    let hog = sh(&c, &sb.id, "tail /dev/zero; echo rc=$?").await;
    assert!(hog.stdout.contains("rc=137"), "not OOM-killed: {hog:?}");
    let usage = eventually("the OOM kill in the sample", SAMPLED, || async {
        c.get(&sb.id)
            .await
            .unwrap()
            .usage
            .filter(|u| u.oom_kills >= 1)
    })
    .await;
    assert_eq!(usage.limits.memory_mb, Some(64));
    let limit = 64u64 << 20;
    assert!(
        usage.memory_peak_bytes >= limit * 9 / 10 && usage.memory_peak_bytes <= limit,
        "peak {} of a 64 MiB limit",
        usage.memory_peak_bytes
    );
    let line = eventually("the oom_killed alert in the hub's log", SAMPLED, || async {
        hub.log()
            .lines()
            .find(|l| l.contains("usage alert: oom_killed") && l.contains(&sb.id))
            .map(str::to_string)
    })
    .await;
    assert!(line.contains("new_kills=1"), "{line}");
    // ... and an `oom_killed` event of the sandbox, from the log.
    let event = first_event(&c, &sb.id, "oom_killed").await;
    assert_eq!(event["details"]["new_kills"], 1, "{event}");
}

/// The first event of `kind` for sandbox `id`, replayed from the start of the log.
async fn first_event(c: &HubClient, id: &str, kind: &str) -> Value {
    use futures::StreamExt;
    let filter = sandhub_client::http::EventFilter {
        sandbox: Some(id.to_string()),
        types: vec![kind.to_string()],
        last_event_id: Some(0),
        ..Default::default()
    };
    let mut events = c.events(&filter).await.unwrap();
    tokio::time::timeout(SAMPLED, events.next())
        .await
        .unwrap_or_else(|_| panic!("no {kind} event of {id}"))
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn disk_reaches_its_quota_and_the_disk_hook_fires() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = sandbox(
        &c,
        "small-disk",
        Template {
            disk_mb: Some(64),
            ..Default::default()
        },
    )
    .await;
    let first = eventually("a first sample", SAMPLED, || async {
        c.get(&sb.id).await.unwrap().usage
    })
    .await;
    assert_eq!(first.limits.disk_mb, Some(64), "{first:?}");
    let before = first.latest.disk_bytes.expect("a disk quota is sampled");
    assert!(before < 32 << 20, "{before}");
    // `sync` commits btrfs's transaction: the qgroup counts what was written.
    let r = sh(
        &c,
        &sb.id,
        "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; sync; echo done",
    )
    .await;
    assert!(r.stdout.contains("Disk quota exceeded"), "{r:?}");
    let full = eventually("disk use at the quota", SAMPLED, || async {
        let m = series(&c, &sb.id).await;
        m.samples
            .iter()
            .filter_map(|s| s.disk_bytes)
            .max()
            .filter(|&d| d >= (63 << 20))
    })
    .await;
    assert!(full <= 64 << 20, "{full}");
    eventually("the disk alert in the hub's log", SAMPLED, || async {
        hub.log()
            .lines()
            .any(|l| l.contains("usage alert: disk_quota_exceeded") && l.contains(&sb.id))
            .then_some(())
    })
    .await;
    let event = first_event(&c, &sb.id, "disk_quota_exceeded").await;
    assert!(
        event["details"]["used_bytes"].as_u64().unwrap() > 60 << 20,
        "{event}"
    );
}

#[tokio::test]
async fn metrics_are_the_owners_and_bad_parameters_are_named() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let alice = hub.client(Some(ALICE_KEY));
    let sb = alice.create(CreateSandbox::default()).await.unwrap();
    let http = hub.http();
    let url = |q: &str| format!("{}/v1/sandboxes/{}/metrics{q}", hub.url(), sb.id);
    for (q, field) in [
        ("?step=0", "step"),
        ("?step=3601", "step"),
        ("?step=abc", "step"),
        ("?since=yesterday", "since"),
    ] {
        let r = http
            .get(url(q))
            .bearer_auth(ALICE_KEY)
            .send()
            .await
            .unwrap();
        let body = common::error_body(r, 400, "INVALID_ARGUMENT").await;
        let msg = body["message"].as_str().unwrap();
        assert!(msg.starts_with(&format!("{field}:")), "{q}: {msg}");
    }
    // Another tenant's sandbox does not exist for bob.
    let r = http.get(url("")).bearer_auth(BOB_KEY).send().await.unwrap();
    common::error_body(r, 404, "NOT_FOUND").await;
    let bob = hub.client(Some(BOB_KEY));
    assert!(bob.metrics(&sb.id, MetricsQuery::default()).await.is_err());
    // The owner's series fills, each second, with RFC 3339 times.
    let body: Value = eventually("two samples", SAMPLED, || async {
        let v: Value = http
            .get(url("?since=0&step=1"))
            .bearer_auth(ALICE_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (v["samples"].as_array().map_or(0, Vec::len) >= 2).then_some(v)
    })
    .await;
    let s = &body["samples"][0];
    assert!(s["timestamp"].as_str().unwrap().ends_with('Z'), "{s}");
    assert!(s["memory_bytes"].as_u64().unwrap() > 0, "{s}");
    assert!(s["pids"].as_u64().unwrap() >= 1, "{s}");
    // `since` in the future: nothing yet.
    let later: Value = http
        .get(url("?since=4000000000"))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(later["samples"].as_array().unwrap().len(), 0);
    // Deleted: sampling stops (the cgroup is gone), the sandbox is unknown.
    alice.delete(&sb.id).await.unwrap();
    let r = http
        .get(url(""))
        .bearer_auth(ALICE_KEY)
        .send()
        .await
        .unwrap();
    common::error_body(r, 404, "NOT_FOUND").await;
}
