//! File transfer throughput: REST upload and download of one large file vs
//! `cp` of the same file, all on one filesystem.
//!
//! Fairness: the source is written once up front, so every copy reads it
//! from the page cache; before each timed transfer the destination is
//! removed and dirty pages are flushed (`sync`, untimed), so every
//! transfer starts from the same state and none pays for another's
//! writeback; and the side that goes first alternates between rounds.

use std::{
    future::Future,
    io::{Read, Write},
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context};

use crate::{
    report::{Report, Row, Target, Unit, Value},
    stats::median,
};

/// Block size of the client's reads and writes: large, as `cp` uses, so the
/// client's own per-chunk cost does not dominate.
const CHUNK: usize = 256 * 1024;
/// Name of the file inside the sandbox root.
const REMOTE_NAME: &str = "bench-transfer.bin";

pub struct Plan<'a> {
    pub rest_url: &'a str,
    /// The sandbox root, as the host sees it.
    pub root: &'a Path,
    /// A directory beside the root, on the same filesystem.
    pub outside: &'a Path,
    pub size: u64,
    pub repeats: u32,
    pub deadline: Instant,
}

/// MB/s of every round, per direction and side.
#[derive(Default)]
pub struct FilesResult {
    size: u64,
    upload_cp: Vec<f64>,
    upload_rest: Vec<f64>,
    download_cp: Vec<f64>,
    download_rest: Vec<f64>,
    stopped_early: bool,
}

pub async fn run(http: &reqwest::Client, plan: &Plan<'_>) -> anyhow::Result<FilesResult> {
    let source = plan.outside.join("source.bin");
    eprintln!("files: writing the {} MiB source file", plan.size >> 20);
    write_source(&source, plan.size)?;
    let remote = plan.root.join(REMOTE_NAME);
    let url = format!("{}/v1/files/{REMOTE_NAME}", plan.rest_url);

    let mut result = FilesResult {
        size: plan.size,
        ..Default::default()
    };
    for round in 0..plan.repeats {
        if Instant::now() >= plan.deadline {
            eprintln!("files: phase deadline reached after {round} rounds");
            result.stopped_early = true;
            break;
        }
        eprintln!("files: round {}/{}", round + 1, plan.repeats);
        // Whoever goes first alternates, so neither side always meets the
        // state the other one left behind.
        let cp_first = round % 2 == 0;
        // Upload: source -> sandbox root. Sandboxd's copy then becomes the
        // source of the download, for both sides.
        let up_cp = plan.outside.join("cp-upload.bin");
        let (cp_t, rest_t) = in_order(
            cp_first,
            timed(&up_cp, plan, cp(&source, &up_cp, plan)),
            timed(&remote, plan, upload(http, &url, &source, plan)),
        )
        .await?;
        result.upload_cp.push(mbps(plan.size, cp_t));
        result.upload_rest.push(mbps(plan.size, rest_t));

        let down_cp = plan.outside.join("cp-download.bin");
        let down_rest = plan.outside.join("rest-download.bin");
        let (cp_t, rest_t) = in_order(
            cp_first,
            timed(&down_cp, plan, cp(&remote, &down_cp, plan)),
            timed(&down_rest, plan, download(http, &url, &down_rest, plan)),
        )
        .await?;
        result.download_cp.push(mbps(plan.size, cp_t));
        result.download_rest.push(mbps(plan.size, rest_t));
    }
    ensure!(
        !result.upload_cp.is_empty() && !result.download_rest.is_empty(),
        "files: no complete round before the deadline"
    );
    Ok(result)
}

/// Runs two lazy futures one after the other, `a` first if `a_first`.
async fn in_order<A, B>(a_first: bool, a: A, b: B) -> anyhow::Result<(Duration, Duration)>
where
    A: Future<Output = anyhow::Result<Duration>>,
    B: Future<Output = anyhow::Result<Duration>>,
{
    if a_first {
        let a = a.await?;
        Ok((a, b.await?))
    } else {
        let b = b.await?;
        Ok((a.await?, b))
    }
}

/// Prepares `dst` (removed, dirty pages flushed), runs the transfer, and
/// checks that `dst` ends up with every byte. The returned time covers the
/// transfer only.
async fn timed(
    dst: &Path,
    plan: &Plan<'_>,
    transfer: impl Future<Output = anyhow::Result<Duration>>,
) -> anyhow::Result<Duration> {
    // `transfer` is lazy: nothing of it has run yet, so this preparation
    // really happens first.
    match std::fs::remove_file(dst) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", dst.display())),
    }
    rustix::fs::sync();
    let elapsed = transfer.await?;
    let len = std::fs::metadata(dst)
        .with_context(|| format!("{} missing after transfer", dst.display()))?
        .len();
    ensure!(
        len == plan.size,
        "{} has {len} bytes, expected {}",
        dst.display(),
        plan.size
    );
    Ok(elapsed)
}

/// The baseline: `cp src dst` as a child process.
async fn cp(src: &Path, dst: &Path, plan: &Plan<'_>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut child = tokio::process::Command::new("cp")
        .arg(src)
        .arg(dst)
        .kill_on_drop(true)
        .spawn()
        .context("spawning cp")?;
    let status = tokio::time::timeout(remaining(plan), child.wait())
        .await
        .context("cp ran past the phase deadline")??;
    let elapsed = started.elapsed();
    ensure!(
        status.success(),
        "cp {} {}: {status}",
        src.display(),
        dst.display()
    );
    Ok(elapsed)
}

/// `PUT /v1/files/...` with the body streamed from `src` in `CHUNK` blocks.
async fn upload(
    http: &reqwest::Client,
    url: &str,
    src: &Path,
    plan: &Plan<'_>,
) -> anyhow::Result<Duration> {
    let mut file = std::fs::File::open(src)?;
    // Plain blocking reads of page-cached data take microseconds; doing
    // them inline keeps the client on one thread instead of hopping through
    // tokio's blocking pool for every chunk, which would bill the client's
    // overhead to sandboxd.
    // `read_to_end` into reserved capacity fills the buffer without zeroing
    // it first: a memset per chunk would be client overhead too.
    let chunks = std::iter::from_fn(move || {
        let mut buf = Vec::with_capacity(CHUNK);
        match (&mut file).take(CHUNK as u64).read_to_end(&mut buf) {
            Ok(0) => None,
            Ok(_) => Some(Ok::<_, std::io::Error>(buf)),
            Err(e) => Some(Err(e)),
        }
    });
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let started = Instant::now();
    let response = http
        .put(url)
        .header(reqwest::header::CONTENT_LENGTH, plan.size)
        .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
        .body(body)
        .timeout(remaining(plan))
        .send()
        .await
        .with_context(|| format!("PUT {url}"))?;
    let elapsed = started.elapsed();
    ensure!(
        response.status().is_success(),
        "PUT {url}: {}",
        response.status()
    );
    Ok(elapsed)
}

/// `GET /v1/files/...` with the body streamed into `dst` as it arrives.
async fn download(
    http: &reqwest::Client,
    url: &str,
    dst: &Path,
    plan: &Plan<'_>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut response = http
        .get(url)
        .timeout(remaining(plan))
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    if !response.status().is_success() {
        bail!("GET {url}: {}", response.status());
    }
    // Blocking writes into the page cache, for the same reason as the
    // reads in `upload`.
    let mut out = std::fs::File::create(dst)?;
    while let Some(chunk) = response.chunk().await? {
        out.write_all(&chunk)?;
    }
    drop(out);
    Ok(started.elapsed())
}

/// Writes `size` bytes of incompressible data: nothing on the path
/// compresses today, but zeros would invite a shortcut some day.
pub(super) fn write_source(path: &Path, size: u64) -> anyhow::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for word in block.chunks_exact_mut(8) {
            // xorshift64: fast, and plenty random for this.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(())
}

fn remaining(plan: &Plan<'_>) -> Duration {
    plan.deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1))
}

fn mbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

impl FilesResult {
    pub fn describe(&self, report: &mut Report, min_ratio: f64) {
        let v = |samples: &[f64]| Value::new(median(samples), Unit::MegabytesPerSecond);
        let target = Some(Target::RatioAtLeast(min_ratio));
        let mib = self.size >> 20;
        let n = self.upload_cp.len();
        report.rows.push(Row::compare(
            format!("upload {mib} MiB, median of {n}"),
            v(&self.upload_cp),
            v(&self.upload_rest),
            target,
        ));
        let n = self.download_rest.len();
        report.rows.push(Row::compare(
            format!("download {mib} MiB, median of {n}"),
            v(&self.download_cp),
            v(&self.download_rest),
            target,
        ));
        let all = |s: &[f64]| {
            s.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        report.detail(
            "transfer rounds (MB/s)",
            format!(
                "upload cp [{}] vs REST PUT [{}]; download cp [{}] vs REST GET [{}]{}",
                all(&self.upload_cp),
                all(&self.upload_rest),
                all(&self.download_cp),
                all(&self.download_rest),
                if self.stopped_early {
                    " (stopped early at the phase deadline)"
                } else {
                    ""
                },
            ),
        );
    }
}
