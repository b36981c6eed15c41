//! Phase `events` (issue #30 §2): what the event stream costs the hub.
//!
//! - **Idle consumers.** `--event-consumers` connections each open
//!   `GET /v1/events` and never read past its headers. The hub's RSS before
//!   they connect is the baseline; after, the measurement (and the cost per
//!   consumer in the details). The hub runs with a per-tenant stream cap
//!   that admits them all.
//! - **Create p50 under a live stream.** Warm claims paced at 100/s, in
//!   alternating rounds: with no consumer (the baseline), then with
//!   [`LIVE_CONSUMERS`] consumers reading every event. Target: the stream
//!   adds at most 5% to the p50.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinSet,
};

use super::{args::Args, procs, rest, server::Hub};
use crate::{
    report::{Report, Row, Target, Unit, Value},
    stats::summarize,
};

/// Consumers reading the stream in the measured rounds.
const LIVE_CONSUMERS: usize = 8;
/// Claims per round, one every 10 ms (100/s).
const ROUND_CLAIMS: u32 = 20;
const PACE: Duration = Duration::from_millis(10);
/// Rounds per side, alternating.
const ROUNDS: usize = 15;
/// The pool the rounds claim from (refilled between rounds).
const POOL_REPLICAS: u32 = 24;
/// Create p50 with live consumers vs without.
const MAX_CREATE_RATIO: f64 = 1.05;

/// The hub flags this phase needs: a stream cap that admits every idle
/// consumer.
pub fn hub_flags(args: &Args) -> Vec<String> {
    vec![
        "--event-max-streams-per-tenant".into(),
        (args.event_consumers as usize + LIVE_CONSUMERS + 16).to_string(),
    ]
}

pub async fn run(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    idle_consumers(args, hub, report).await?;
    create_under_stream(args, hub, report).await
}

/// Opens one stream and reads its response head; the socket then sits.
async fn open_idle(addr: &str) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET /v1/events HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut head = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut head))
        .await
        .context("no response head in 30 s")??;
    let head = String::from_utf8_lossy(&head[..n]);
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the stream was refused: {}",
        head.lines().next().unwrap_or("")
    );
    Ok(s)
}

async fn idle_consumers(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let want = args.event_consumers as usize;
    let addr = hub.url.trim_start_matches("http://").to_string();
    let before = procs::rss_kib(hub.pid());
    let started = Instant::now();
    let mut held = Vec::with_capacity(want);
    // A few hundred connects at a time: the listener's backlog is finite.
    for chunk in (0..want).collect::<Vec<_>>().chunks(256) {
        let mut set = JoinSet::new();
        for _ in chunk {
            let addr = addr.clone();
            set.spawn(async move { open_idle(&addr).await });
        }
        while let Some(r) = set.join_next().await {
            held.push(r??);
        }
    }
    eprintln!(
        "events: {} idle consumers in {:?}",
        held.len(),
        started.elapsed()
    );
    // Let the hub settle (its per-stream tasks have run once each).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = procs::rss_kib(hub.pid());
    let mib = |kib: u64| Value::new(kib as f64 / 1024.0, Unit::Mebibytes);
    report.rows.push(Row::compare(
        format!("hub RSS with {} idle event consumers", held.len()),
        mib(before),
        mib(after),
        None,
    ));
    report.detail(
        "idle event consumer cost",
        format!(
            "{:.1} KiB each ({} KiB -> {} KiB RSS for {})",
            after.saturating_sub(before) as f64 / held.len().max(1) as f64,
            before,
            after,
            held.len()
        ),
    );
    drop(held);
    // The hub notices the closed sockets on its next keep-alive write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// `n` consumers draining the stream until dropped, on a thread and
/// runtime of their own: a consumer is another program, and sharing the
/// timing client's one thread would charge their reads to the creates
/// being timed (each event reaches them about when its create answers).
struct LiveConsumers {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LiveConsumers {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn live_consumers(hub: &Hub, n: usize) -> LiveConsumers {
    let url = format!("{}/v1/events", hub.url);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let mut set = JoinSet::new();
            for _ in 0..n {
                let url = url.clone();
                // The hub's client times calls out; a stream lasts the round.
                let http = reqwest::Client::new();
                set.spawn(async move {
                    let Ok(r) = http.get(url).send().await else {
                        return;
                    };
                    let mut body = r.bytes_stream();
                    while let Some(Ok(_)) = body.next().await {}
                });
            }
            let _ = stopped.await;
            set.abort_all();
        });
    });
    LiveConsumers {
        stop: Some(stop),
        thread: Some(thread),
    }
}

async fn create_under_stream(
    args: &Args,
    hub: &mut Hub,
    report: &mut Report,
) -> anyhow::Result<()> {
    let deadline = args.deadline();
    hub.put_pool(rest::POOL, POOL_REPLICAS).await?;
    let (mut quiet, mut live) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS * 2 {
        anyhow::ensure!(
            rest::wait_ready(hub, ROUND_CLAIMS.into(), deadline).await?,
            "events: the pool never refilled before the phase deadline"
        );
        let streaming = round % 2 == 1;
        let consumers = streaming.then(|| live_consumers(hub, LIVE_CONSUMERS));
        if streaming {
            // Connected and past their replay before the round starts.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let mut ids = Vec::new();
        let mut next = Instant::now();
        for _ in 0..ROUND_CLAIMS {
            tokio::time::sleep_until(next.into()).await;
            next += PACE;
            let t = Instant::now();
            let (id, _) = hub.create().await?;
            let took = t.elapsed();
            (if streaming { &mut live } else { &mut quiet }).push(took);
            ids.push(id);
        }
        for id in &ids {
            hub.delete(id).await?;
        }
        drop(consumers);
    }
    hub.delete_pool(rest::POOL).await?;
    let (q, l) = (summarize(&mut quiet), summarize(&mut live));
    let us = |d: Duration| Value::new(d.as_secs_f64() * 1e6, Unit::Microseconds);
    report.rows.push(Row::compare(
        format!("warm create at 100/s with {LIVE_CONSUMERS} event consumers vs none, p50"),
        us(q.p50),
        us(l.p50),
        Some(Target::RatioAtMost(MAX_CREATE_RATIO)),
    ));
    report.detail(
        "warm create at 100/s",
        format!(
            "{} rounds of {ROUND_CLAIMS} each side, alternating; no consumer: p50 {:?}, p99 {:?}; \
             {LIVE_CONSUMERS} consumers: p50 {:?}, p99 {:?}",
            ROUNDS, q.p50, q.p99, l.p50, l.p99
        ),
    );
    Ok(())
}
