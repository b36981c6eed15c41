//! sandboxd against another sandboxd in the same run (`--against-bin`):
//! upstream's Go daemon (kubernetes-sigs/agent-sandbox `packages/sandboxd`,
//! built with `go build`), or an older build of ours. Each daemon gets a
//! root of its own holding the same files, and the calls alternate between
//! them, so drift and background load hit both alike:
//!
//! 1. a small-file download (4 KiB), the round trip, p50 over many;
//! 2. a large download (`--file-size-mib`), MB/s, the median of rounds,
//!    whichever daemon goes first alternating;
//! 3. `Execute` of `true` over gRPC, p50;
//! 4. `Execute` of `true` as Sandhub's clients send it to ours (REST,
//!    `EXECUTE_ROUTE`) against gRPC to theirs, p50.
//!
//! The ratios are ours ÷ theirs, against issue #34's targets: exec at most
//! 0.7×, downloads at least 1.2× the throughput.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context};
use prost::Message;
use sandhub_api::{
    proto::process::v1::{
        process_service_client::ProcessServiceClient, ExecuteRequest, ProcessConfig,
    },
    sandboxd::{EXECUTE_ROUTE, PROTOBUF_CONTENT_TYPE},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tonic::transport::Endpoint;

use super::{daemon::Daemon, exec, files};
use crate::{
    report::{Report, Row, Target, Unit, Value},
    stats::{median, summarize},
};

const SMALL_NAME: &str = "bench-small.bin";
const SMALL_LEN: usize = 4096;
const LARGE_NAME: &str = "bench-large.bin";
/// Rounds of the small download and of exec (each daemon, after warm-up).
const SMALL_ROUNDS: u32 = 2000;
const EXEC_ROUNDS: u32 = 500;
const EXEC_ROUTE_ROUNDS: u32 = 500;
const WARMUP: u32 = 50;
const EXEC_TARGET: f64 = 0.7;
const DOWNLOAD_TARGET: f64 = 1.2;
/// A download this slow means a daemon is stuck, not slow.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Plan<'a> {
    pub ours: &'a Daemon,
    pub ours_root: &'a Path,
    pub theirs: &'a Daemon,
    pub theirs_root: &'a Path,
    /// "upstream" or "baseline": how the rows name the other daemon.
    pub theirs_name: &'a str,
    pub large: u64,
    pub rounds: u32,
    pub deadline: Instant,
}

pub async fn run(plan: &Plan<'_>, report: &mut Report) -> anyhow::Result<()> {
    // The same bytes in both roots: `write_source` starts from one seed.
    for root in [plan.ours_root, plan.theirs_root] {
        files::write_source(&root.join(SMALL_NAME), SMALL_LEN as u64)?;
        files::write_source(&root.join(LARGE_NAME), plan.large)?;
    }
    let sides = [plan.ours, plan.theirs];
    let mut conns = [Conn::open(plan.ours).await?, Conn::open(plan.theirs).await?];
    let who = plan.theirs_name;

    eprintln!("against: {SMALL_ROUNDS} small downloads from each");
    let [ours, theirs] = p50s(SMALL_ROUNDS, plan.deadline, async |side| {
        conns[side].get(SMALL_NAME, SMALL_LEN as u64).await
    })
    .await?;
    report.rows.push(Row::compare(
        format!("download 4 KiB, p50, sandboxd vs {who}"),
        us(theirs),
        us(ours),
        Some(Target::RatioAtMost(1.0)),
    ));

    eprintln!("against: {} large downloads from each", plan.rounds);
    let mut rates = [Vec::new(), Vec::new()];
    for i in 0..plan.rounds {
        for side in in_turn(i) {
            let took = conns[side].get(LARGE_NAME, plan.large).await?;
            rates[side].push(plan.large as f64 / took.as_secs_f64() / 1e6);
        }
        if Instant::now() >= plan.deadline {
            break;
        }
    }
    report.detail(
        format!("large download rounds (MB/s), sandboxd vs {who}"),
        format!("{:.0?} vs {:.0?}", rates[0], rates[1]),
    );
    let [ours, theirs] = rates.map(|r| median(&r));
    report.rows.push(Row::compare(
        format!(
            "download {} MiB, median, sandboxd vs {who}",
            plan.large >> 20
        ),
        Value::new(theirs, Unit::MegabytesPerSecond),
        Value::new(ours, Unit::MegabytesPerSecond),
        Some(Target::RatioAtLeast(DOWNLOAD_TARGET)),
    ));

    eprintln!("against: {EXEC_ROUNDS} execs on each");
    let mut clients = Vec::new();
    for daemon in sides {
        let channel = Endpoint::from_shared(daemon.grpc_url.clone())?
            .connect()
            .await
            .with_context(|| format!("connecting to {}", daemon.grpc_url))?;
        clients.push(ProcessServiceClient::new(channel));
    }
    let [ours, theirs] = p50s(EXEC_ROUNDS, plan.deadline, async |side| {
        exec::remote(&mut clients[side]).await
    })
    .await?;
    report.rows.push(Row::compare(
        format!("exec `true` over gRPC, p50, sandboxd vs {who}"),
        us(theirs),
        us(ours),
        Some(Target::RatioAtMost(EXEC_TARGET)),
    ));

    // What Sandhub's clients send ours (REST) against what theirs takes.
    eprintln!("against: {EXEC_ROUTE_ROUNDS} execs each, ours over REST");
    let [ours, theirs] = p50s(EXEC_ROUTE_ROUNDS, plan.deadline, async |side| match side {
        0 => conns[0].execute_true().await,
        _ => exec::remote(&mut clients[1]).await,
    })
    .await?;
    report.rows.push(Row::compare(
        format!("exec `true`, p50, sandboxd over REST vs {who} over gRPC"),
        us(theirs),
        us(ours),
        Some(Target::RatioAtMost(EXEC_TARGET)),
    ));
    Ok(())
}

/// The p50 of `rounds` calls to each side (0: ours, 1: theirs) after
/// [`WARMUP`] untimed ones, alternating which side goes first; fewer if
/// `deadline` passes.
async fn p50s(
    rounds: u32,
    deadline: Instant,
    mut call: impl AsyncFnMut(usize) -> anyhow::Result<Duration>,
) -> anyhow::Result<[Duration; 2]> {
    let mut samples = [Vec::new(), Vec::new()];
    for i in 0..WARMUP + rounds {
        for side in in_turn(i) {
            let took = call(side).await?;
            if i >= WARMUP {
                samples[side].push(took);
            }
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    ensure!(
        !samples[0].is_empty(),
        "the deadline passed during the warm-up"
    );
    Ok(samples.map(|mut s| summarize(&mut s).p50))
}

/// Both sides (0: ours, 1: theirs), in an order that alternates with `i`.
fn in_turn(i: u32) -> [usize; 2] {
    if i.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// A kept-alive HTTP/1.1 connection that downloads with as little client
/// work as possible (a raw socket, one reused buffer, the body dropped), so
/// the ratio is the daemons', not a client library's.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(daemon: &Daemon) -> anyhow::Result<Self> {
        let addr = daemon.rest_url.trim_start_matches("http://");
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: vec![0; 1 << 20],
        })
    }

    /// One whole download of `name`, which must be `len` bytes.
    async fn get(&mut self, name: &str, len: u64) -> anyhow::Result<Duration> {
        let request = format!("GET /v1/files/{name} HTTP/1.1\r\nHost: sandboxd\r\n\r\n");
        let started = Instant::now();
        tokio::time::timeout(CALL_TIMEOUT, self.exchange(request.as_bytes(), Some(len)))
            .await
            .with_context(|| format!("GET {name} timed out"))??;
        Ok(started.elapsed())
    }

    /// `Execute` of `true` over REST (`EXECUTE_ROUTE`), as Sandhub's
    /// clients send it to a sandboxd that has the route.
    async fn execute_true(&mut self) -> anyhow::Result<Duration> {
        let body = ExecuteRequest {
            config: Some(ProcessConfig {
                command: vec!["true".into()],
                ..Default::default()
            }),
        }
        .encode_to_vec();
        let mut request = format!(
            "POST {EXECUTE_ROUTE} HTTP/1.1\r\nHost: sandboxd\r\n\
             Content-Type: {PROTOBUF_CONTENT_TYPE}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let started = Instant::now();
        tokio::time::timeout(CALL_TIMEOUT, self.exchange(&request, None))
            .await
            .context("Execute over REST timed out")??;
        Ok(started.elapsed())
    }

    /// Sends `request`, reads a 200 answer whole (its body `len` bytes, if
    /// given) and drops the body.
    async fn exchange(&mut self, request: &[u8], len: Option<u64>) -> anyhow::Result<()> {
        self.stream.write_all(request).await?;
        let mut filled = 0;
        let end = loop {
            let n = self.stream.read(&mut self.buf[filled..]).await?;
            ensure!(n > 0, "closed before a whole head");
            filled += n;
            if let Some(i) = self.buf[..filled].windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            ensure!(filled < 64 * 1024, "a head over 64 KiB");
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
        ensure!(head.starts_with("http/1.1 200 "), "answered {head}");
        let announced: u64 = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .context("no content-length")?
            .trim()
            .parse()?;
        let len = len.unwrap_or(announced);
        ensure!(
            announced == len,
            "content-length {announced}, expected {len}"
        );
        let mut got = (filled - end) as u64;
        while got < len {
            let n = self.stream.read(&mut self.buf).await?;
            ensure!(n > 0, "closed {got} bytes into {len}");
            got += n as u64;
        }
        ensure!(
            got == len,
            "{got} bytes, expected {len} (a pipelined surplus?)"
        );
        Ok(())
    }
}

fn us(d: Duration) -> Value {
    Value::new(d.as_secs_f64() * 1e6, Unit::Microseconds)
}
