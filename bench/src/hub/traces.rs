//! Phase `traces` (issue #30 §5): what exporting traces costs an exec.
//! A second hub runs beside the suite's own with `--otlp-endpoint` to an
//! OTLP sink on loopback (a thread of this process that reads each POST
//! and answers 200, as a collector does); the suite's hub, without the
//! flag, is the baseline. Rounds of `exec true` alternate between the two
//! (drift hits both alike), and the p50s are compared. Target: on/off at
//! most 1.05.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use reqwest::Method;
use serde_json::json;

use super::{args::Args, server::Hub, us};
use crate::{
    report::{Report, Row, Target},
    stats::summarize,
};

/// Execs per round on each side.
const ROUND: u32 = 25;
const TARGET_RATIO: f64 = 1.05;

/// An OTLP/HTTP sink: counts the bytes and requests it is sent.
struct Sink {
    endpoint: String,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

fn sink() -> anyhow::Result<Sink> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let requests = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let (r, b) = (requests.clone(), bytes.clone());
    std::thread::Builder::new()
        .name("otlp-sink".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let (r, b) = (r.clone(), b.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &r, &b);
                });
            }
        })?;
    Ok(Sink {
        endpoint,
        requests,
        bytes,
    })
}

/// One connection: HTTP/1.1 requests with a Content-Length, each answered 200.
fn serve(
    stream: std::net::TcpStream,
    requests: &AtomicU64,
    bytes: &AtomicU64,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            if !first {
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            first = false;
        }
        let mut body = vec![0; length.min(64 << 20)];
        reader.read_exact(&mut body)?;
        requests.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        out.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        )?;
    }
}

async fn exec_once(hub: &Hub, path: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let v = hub
        .call(Method::POST, path, Some(json!({"command": ["true"]})))
        .await?;
    let took = t.elapsed();
    anyhow::ensure!(v["exit_code"] == 0, "exec of true: {v}");
    Ok(took)
}

pub async fn run(args: &Args, off: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let deadline = args.deadline();
    let sink = sink()?;
    let work = tempfile::Builder::new()
        .prefix("sandhub-bench-traces-")
        .tempdir_in(&args.work_dir)?;
    let log = work.path().join("hub-traced.log");
    let mut on = Hub::start(
        &off.bin,
        &work.path().join("state"),
        &log,
        &["--otlp-endpoint".to_string(), sink.endpoint.clone()],
    )
    .await
    .context("starting the traced hub")?;
    let result = measure(args, off, &mut on, deadline).await;
    on.teardown().await;
    let (mut off_s, mut on_s) = result?;
    anyhow::ensure!(!off_s.is_empty(), "traces: no sample before the deadline");
    let off_sum = summarize(&mut off_s);
    let on_sum = summarize(&mut on_s);
    report.rows.push(Row::compare(
        "exec `true` with trace export on vs off, p50",
        us(off_sum.p50),
        us(on_sum.p50),
        Some(Target::RatioAtMost(TARGET_RATIO)),
    ));
    report.rows.push(Row::compare(
        "exec `true` with trace export on vs off, p99",
        us(off_sum.p99),
        us(on_sum.p99),
        None,
    ));
    report.detail(
        "trace export during the traces phase",
        format!(
            "{} execs each side in rounds of {ROUND}, alternating; the sink got {} \
             OTLP requests, {} bytes",
            on_s.len(),
            sink.requests.load(Ordering::Relaxed),
            sink.bytes.load(Ordering::Relaxed)
        ),
    );
    anyhow::ensure!(
        sink.requests.load(Ordering::Relaxed) > 0,
        "the traced hub exported nothing (see {})",
        log.display()
    );
    Ok(())
}

async fn measure(
    args: &Args,
    off: &mut Hub,
    on: &mut Hub,
    deadline: Instant,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (off_id, _) = off.create().await?;
    let (on_id, _) = on.create().await?;
    let off_path = format!("/v1/sandboxes/{off_id}/exec");
    let on_path = format!("/v1/sandboxes/{on_id}/exec");
    for _ in 0..args.exec_warmup {
        exec_once(off, &off_path).await?;
        exec_once(on, &on_path).await?;
    }
    let (mut off_s, mut on_s) = (Vec::new(), Vec::new());
    let rounds = args.exec_iterations.div_ceil(ROUND);
    for round in 0..rounds {
        if Instant::now() >= deadline {
            eprintln!("traces: phase deadline after {round} rounds");
            break;
        }
        // Which side goes first alternates too.
        let sides: [(&Hub, &str, bool); 2] = if round % 2 == 0 {
            [(off, &off_path, false), (on, &on_path, true)]
        } else {
            [(on, &on_path, true), (off, &off_path, false)]
        };
        for (hub, path, traced) in sides {
            for _ in 0..ROUND {
                let took = exec_once(hub, path).await?;
                if traced {
                    on_s.push(took);
                } else {
                    off_s.push(took);
                }
            }
        }
    }
    off.delete(&off_id).await?;
    on.delete(&on_id).await?;
    Ok((off_s, on_s))
}
