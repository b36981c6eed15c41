//! The REST phases: warm claim, cold create, reset, and exec through the
//! hub next to exec straight to the same sandbox's sandboxd.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context};
use reqwest::Method;
use sandhub_api::hub::{Command, ExecRequest};
use sandhub_client::sandboxd::SandboxdClient;
use serde_json::json;

use super::server::Hub;
use crate::report::Progress;

/// Named like the template, so a plain `POST /v1/sandboxes {}` claims from
/// it (a pool of the template's name is tried first).
pub const POOL: &str = "default";

/// Samples of one timed series, and whether the deadline cut it short.
pub struct Series {
    pub samples: Vec<Duration>,
    pub stopped_early: bool,
}

impl Series {
    pub(super) fn new(n: u32) -> Self {
        Series {
            samples: Vec::with_capacity(n as usize),
            stopped_early: false,
        }
    }

    /// True (and noted) when the phase must stop.
    pub(super) fn past(&mut self, phase: &str, deadline: Instant) -> bool {
        if Instant::now() >= deadline {
            eprintln!(
                "{phase}: phase deadline reached after {} samples",
                self.samples.len()
            );
            self.stopped_early = true;
        }
        self.stopped_early
    }
}

/// Polls the pool until `ready >= want` or the deadline.
pub(super) async fn wait_ready(hub: &Hub, want: u64, deadline: Instant) -> anyhow::Result<bool> {
    loop {
        let (ready, _) = hub.pool(POOL).await?;
        if ready >= want {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Warm claims: a pool of `replicas`, then `n` times (wait for a ready
/// replica, untimed) create (timed) → delete. Returns the series and how
/// the creates were launched (the API's `launch` field), counted.
pub async fn warm_claims(
    hub: &mut Hub,
    replicas: u32,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<(Series, BTreeMap<String, u32>, Duration)> {
    hub.put_pool(POOL, replicas).await?;
    let fill_start = Instant::now();
    ensure!(
        wait_ready(hub, replicas.into(), deadline).await?,
        "warm: pool never reached ready={replicas}"
    );
    let fill = fill_start.elapsed();
    eprintln!("warm: pool ready={replicas} after {fill:?}");
    let (s, launches) = claims(hub, "warm claim", 1, n, deadline).await?;
    Ok((s, launches, fill))
}

/// Warm claims on a settled pool: before each (untimed), the pool is full
/// again and the last claim's sandbox deleted, so the claim does not share
/// the CPU with the refill the last one started. This is the claim path
/// alone, as a sporadic caller meets it; [`warm_claims`] is a steady stream.
pub async fn settled_claims(
    hub: &mut Hub,
    replicas: u32,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<Series> {
    hub.put_pool(POOL, replicas).await?;
    let (s, _) = claims(hub, "settled warm claim", replicas, n, deadline).await?;
    Ok(s)
}

/// `n` times: wait (untimed) for `ready` members, create (timed), delete;
/// then the pool goes.
async fn claims(
    hub: &mut Hub,
    what: &'static str,
    ready: u32,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<(Series, BTreeMap<String, u32>)> {
    let mut s = Series::new(n);
    let mut launches = BTreeMap::new();
    let mut progress = Progress::new(what, n.into());
    for done in 1..=n {
        if s.past(what, deadline) || !wait_ready(hub, ready.into(), deadline).await? {
            s.stopped_early = true;
            break;
        }
        let t = Instant::now();
        let (id, launch) = hub.create().await?;
        s.samples.push(t.elapsed());
        *launches.entry(launch).or_default() += 1;
        hub.delete(&id).await?;
        progress.update(done.into());
    }
    hub.delete_pool(POOL).await?;
    Ok((s, launches))
}

/// Untimed creates before a cold series.
const COLD_WARMUP: u32 = 2;

/// Cold creates with no pool: each timed until the 201, then deleted.
pub async fn cold_creates(
    hub: &mut Hub,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<(Series, Series)> {
    let mut s = Series::new(n);
    let mut floor = Series::new(n);
    // Untimed first: a fresh state dir's one-time work (the egress
    // sandboxes' /etc, ~0.3 s of links the hub starts at boot; the first
    // spare) is not a cold create's cost, and in a run of 40 it was the
    // p99.
    for _ in 0..COLD_WARMUP {
        let (id, _) = hub.create().await?;
        hub.delete(&id).await?;
    }
    let mut progress = Progress::new("cold create", n.into());
    for done in 1..=n {
        if s.past("cold create", deadline) {
            break;
        }
        // The floor alternates with the create, so load drift hits both.
        floor.samples.push(unshare_floor().await?);
        let t = Instant::now();
        let (id, _) = hub.create().await?;
        s.samples.push(t.elapsed());
        hub.delete(&id).await?;
        progress.update(done.into());
    }
    Ok((s, floor))
}

/// Makes `n` suspended sandboxes (rows in the store, no process), left to
/// the hub's teardown.
pub async fn suspended(hub: &mut Hub, n: u32, deadline: Instant) -> anyhow::Result<()> {
    let mut progress = Progress::new("suspended sandboxes", n.into());
    for done in 1..=n {
        ensure!(
            Instant::now() < deadline,
            "the phase's deadline passed after {done} suspended sandboxes"
        );
        let (id, _) = hub.create().await?;
        hub.call(Method::POST, &format!("/v1/sandboxes/{id}/suspend"), None)
            .await?;
        progress.update(done.into());
    }
    Ok(())
}

/// The floor a cold create is judged against (issue #34 §4): util-linux
/// `unshare` of every namespace a sandbox gets (user with root mapped,
/// mount, UTS, IPC, network, PID with a fork, cgroup) running `true`.
async fn unshare_floor() -> anyhow::Result<std::time::Duration> {
    let t = Instant::now();
    let status = tokio::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--pid",
            "--fork",
            "--cgroup",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .status()
        .await
        .context("running unshare (util-linux) for the cold-create floor")?;
    let took = t.elapsed();
    anyhow::ensure!(status.success(), "unshare of every namespace: {status}");
    Ok(took)
}

/// Resets of one sandbox, each after an untimed `touch x`, so every reset
/// has a changed workspace to undo.
pub async fn resets(hub: &mut Hub, n: u32, deadline: Instant) -> anyhow::Result<Series> {
    let (id, _) = hub.create().await?;
    let mut s = Series::new(n);
    let mut progress = Progress::new("reset", n.into());
    for done in 1..=n {
        if s.past("reset", deadline) {
            break;
        }
        hub.call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": ["touch", "x"]})),
        )
        .await?;
        let t = Instant::now();
        hub.call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/reset"),
            Some(json!({})),
        )
        .await?;
        s.samples.push(t.elapsed());
        progress.update(done.into());
    }
    hub.delete(&id).await?;
    Ok(s)
}

/// `true` through the hub and straight to the sandbox's sandboxd over its
/// Unix sockets, alternating per iteration so drift hits both alike.
/// Returns (hub, direct).
pub async fn exec(
    hub: &mut Hub,
    n: u32,
    warmup: u32,
    deadline: Instant,
) -> anyhow::Result<(Series, Series)> {
    let (id, _) = hub.create().await?;
    let direct = SandboxdClient::unix(&hub.socket_dir(&id));
    let path = format!("/v1/sandboxes/{id}/exec");
    let body = json!({"command": ["true"]});
    let request = ExecRequest {
        command: Command::Argv(vec!["true".into()]),
        env: BTreeMap::new(),
        cwd: String::new(),
        timeout_seconds: None,
        stdin: String::new(),
        container: None,
    };
    let straight = || async {
        let t = Instant::now();
        let r = tokio::time::timeout(super::server::CALL_TIMEOUT, direct.exec(request.clone()))
            .await
            .context("direct exec timed out")?
            .context("direct exec")?;
        let took = t.elapsed();
        ensure!(
            r.exit_code == 0,
            "direct exec of true exited {}",
            r.exit_code
        );
        anyhow::Ok(took)
    };
    eprintln!("exec: warming up ({warmup} each side)");
    for _ in 0..warmup {
        via_hub(hub, &path, &body).await?;
        straight().await?;
    }
    let mut h = Series::new(n);
    let mut d = Series::new(n);
    let mut progress = Progress::new("exec", n.into());
    for done in 1..=n {
        if h.past("exec", deadline) {
            break;
        }
        h.samples.push(via_hub(hub, &path, &body).await?);
        d.samples.push(straight().await?);
        progress.update(done.into());
    }
    hub.delete(&id).await?;
    Ok((h, d))
}

/// One `POST /v1/sandboxes/{id}/exec` of `true`, timed.
async fn via_hub(hub: &Hub, path: &str, body: &serde_json::Value) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let v = hub.call(Method::POST, path, Some(body.clone())).await?;
    let took = t.elapsed();
    ensure!(v["exit_code"] == 0, "hub exec of true: {v}");
    Ok(took)
}
