//! Pull + unpack of a ~200 MB multi-layer image from the loopback test
//! registry (CNCF distribution, `dev/registry/registry.sh`): the hub's
//! `POST /v1/images/pull` against `curl` of the same blobs from the
//! registry's v2 API followed by `tar -xzf` of each layer, interleaved in
//! one run so both see the same machine and the same page cache.
//!
//! The image is `dev/registry/bench_image.py pull` (4 gzip layers of about
//! 50 MB of seeded, partly compressible files; cached in
//! `$SANDHUB_CACHE/registry/bench`). The baseline does what the hub does,
//! in the same shape, minus the checks: the manifest, then the config and
//! the layers with `curl --parallel --parallel-max 3` (the hub fetches 3
//! layers at a time), then one `tar -xzf` per layer, one after the other
//! (the hub unpacks in order too), each into a fresh directory. It checks
//! no digest; the hub hashes every blob and every uncompressed layer.
//! One untimed round of each comes first. Before each hub pull the store
//! is emptied (`DELETE` the image, then `POST /v1/images/prune`), so every
//! pull downloads and unpacks it all.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context};
use reqwest::Method;
use sandhub_api::hub::PullEvent;
use serde::Deserialize;
use serde_json::json;

use super::server::{path_segment, Hub};
use crate::report::Progress;

/// Where the image is pushed, and the tag the hub gives it.
pub const REPO: &str = "bench/pull";
pub const TAG: &str = "1";
/// A pull of 200 MB through a debug hub can take a while; no single call of
/// the other phases may take this long.
const PULL_TIMEOUT: Duration = Duration::from_secs(900);
/// Layers fetched at the same time by the baseline, as the hub does.
const PARALLEL: usize = 3;

/// A test registry started with `registry.sh up DIR`; stopped on drop.
pub struct Registry {
    script: PathBuf,
    dir: PathBuf,
    pub addr: String,
    up: bool,
}

impl Registry {
    pub fn up(repo: &Path, dir: &Path) -> anyhow::Result<Registry> {
        let script = repo.join("dev/registry/registry.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("up")
            .arg(dir)
            .output()
            .context("running dev/registry/registry.sh up")?;
        if !out.status.success() {
            bail!(
                "registry.sh up failed (is the registry built? `bash dev/registry/registry.sh build`): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let addr = stdout
            .lines()
            .find_map(|l| l.strip_prefix("ADDR="))
            .context("registry.sh up printed no ADDR=")?
            .trim()
            .to_string();
        Ok(Registry {
            script,
            dir: dir.to_path_buf(),
            addr,
            up: true,
        })
    }

    /// Pushes the layout's only image as `REPO:TAG`.
    fn push(&self, layout: &Path) -> anyhow::Result<()> {
        let out = Command::new("bash")
            .arg(&self.script)
            .arg("push")
            .arg(&self.dir)
            .arg(layout)
            .arg(format!("{REPO}:{TAG}"))
            .output()
            .context("running dev/registry/registry.sh push")?;
        if !out.status.success() {
            bail!(
                "registry.sh push failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub fn down(&mut self) {
        if !std::mem::take(&mut self.up) {
            return;
        }
        let stopped = Command::new("bash")
            .arg(&self.script)
            .arg("down")
            .arg(&self.dir)
            .output();
        match stopped {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "registry.sh down failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("running registry.sh down: {e}"),
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.down();
    }
}

/// `bench_image.py pull`'s summary (the fields used here).
#[derive(Debug, Deserialize)]
pub struct BenchImage {
    pub layout: PathBuf,
    pub config: String,
    pub layers: Vec<Layer>,
    pub tar_bytes: u64,
}

#[derive(Debug, Deserialize)]
pub struct Layer {
    pub digest: String,
    pub size: u64,
    pub files: u64,
}

/// Builds (or finds cached) the image; its summary and the build time.
pub fn build_image(repo: &Path) -> anyhow::Result<(BenchImage, Duration)> {
    let t = Instant::now();
    let out = Command::new("bash")
        .arg(repo.join("dev/registry/registry.sh"))
        .args(["build-bench-image", "pull"])
        .output()
        .context("running dev/registry/registry.sh build-bench-image pull")?;
    if !out.status.success() {
        bail!(
            "build-bench-image pull failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let image = serde_json::from_slice(&out.stdout)
        .context("build-bench-image pull printed no JSON summary")?;
    Ok((image, t.elapsed()))
}

/// Builds and pushes the image; its summary and the push's wall time.
pub fn prepare(repo: &Path, registry: &Registry) -> anyhow::Result<(BenchImage, Duration)> {
    let (image, _) = build_image(repo)?;
    let t = Instant::now();
    registry.push(&image.layout)?;
    Ok((image, t.elapsed()))
}

/// One timed pull + unpack: the whole, and its two halves.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub total: Duration,
    /// Until every blob is on disk (the hub: the last `layer_done` event).
    pub download: Duration,
    /// From there until the layers are unpacked (the hub: `done`).
    pub unpack: Duration,
}

pub struct Rounds {
    pub hub: Vec<Run>,
    pub curl: Vec<Run>,
    pub stopped_early: bool,
}

/// One untimed round, then `n` timed rounds of (curl + tar, hub), the
/// order alternating between rounds.
pub async fn rounds(
    hub: &Hub,
    registry: &Registry,
    image: &BenchImage,
    scratch: &Path,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<Rounds> {
    let mut r = Rounds {
        hub: Vec::new(),
        curl: Vec::new(),
        stopped_early: false,
    };
    ensure_empty_store(hub).await?;
    // One untimed round first: the registry's blobs into the page cache
    // (the push wrote them, but the first reader should not pay for it).
    let dir = scratch.join("warm-up");
    let warm = curl_tar(registry, image, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    warm?;
    hub_pull(hub, registry, image).await?;
    clear_store(hub).await?;
    let mut progress = Progress::new("pull rounds (curl + tar, hub)", n.into());
    for round in 1..=n {
        if Instant::now() >= deadline {
            eprintln!("pull: phase deadline reached after {} rounds", round - 1);
            r.stopped_early = true;
            break;
        }
        for hub_first in [round % 2 == 0, round % 2 == 1] {
            if hub_first {
                r.hub.push(hub_pull(hub, registry, image).await?);
                clear_store(hub).await?;
            } else {
                let dir = scratch.join(format!("curl-{round}"));
                let run = curl_tar(registry, image, &dir);
                let _ = std::fs::remove_dir_all(&dir);
                r.curl.push(run?);
            }
        }
        progress.update(round.into());
    }
    Ok(r)
}

/// `curl` of the manifest, then of the config and layers (3 at a time),
/// then `tar -xzf` of each layer into its own fresh directory.
fn curl_tar(registry: &Registry, image: &BenchImage, dir: &Path) -> anyhow::Result<Run> {
    let blobs = dir.join("blobs");
    std::fs::create_dir_all(&blobs)?;
    let base = format!("http://{}/v2/{REPO}", registry.addr);
    let start = Instant::now();
    run(Command::new("curl")
        .args(["-sSf", "-o"])
        .arg(dir.join("manifest.json"))
        .args([
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
            &format!("{base}/manifests/{TAG}"),
        ]))?;
    let mut fetch = Command::new("curl");
    fetch.args([
        "-sSf",
        "--parallel",
        "--parallel-max",
        &PARALLEL.to_string(),
    ]);
    for digest in std::iter::once(&image.config).chain(image.layers.iter().map(|l| &l.digest)) {
        fetch
            .arg("-o")
            .arg(blobs.join(digest.replace(':', "-")))
            .arg(format!("{base}/blobs/{digest}"));
    }
    run(&mut fetch)?;
    let download = start.elapsed();
    for (i, layer) in image.layers.iter().enumerate() {
        let file = blobs.join(layer.digest.replace(':', "-"));
        ensure!(
            std::fs::metadata(&file)?.len() == layer.size,
            "curl fetched {} bytes of {}, not {}",
            std::fs::metadata(&file)?.len(),
            layer.digest,
            layer.size
        );
        let into = dir.join(format!("layer-{i}"));
        std::fs::create_dir(&into)?;
        run(Command::new("tar")
            .arg("-xzf")
            .arg(&file)
            .arg("-C")
            .arg(&into))?;
    }
    let total = start.elapsed();
    Ok(Run {
        total,
        download,
        unpack: total - download,
    })
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `POST /v1/images/pull`, reading its NDJSON events until `done`.
async fn hub_pull(hub: &Hub, registry: &Registry, image: &BenchImage) -> anyhow::Result<Run> {
    let body = json!({
        "reference": format!("{}/{REPO}:{TAG}", registry.addr),
        "tag": format!("{REPO}:{TAG}"),
    });
    let start = Instant::now();
    let mut resp = hub
        .http
        .post(format!("{}/v1/images/pull", hub.url))
        .timeout(PULL_TIMEOUT)
        .json(&body)
        .send()
        .await
        .context("POST /v1/images/pull")?;
    let status = resp.status();
    if !status.is_success() {
        bail!(
            "POST /v1/images/pull: {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let (mut buf, mut layers_done, mut download) = (Vec::new(), 0, None);
    while let Some(chunk) = resp.chunk().await.context("reading the pull's events")? {
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let event: PullEvent = serde_json::from_slice(&line)
                .with_context(|| format!("pull event {}", String::from_utf8_lossy(&line)))?;
            match event {
                PullEvent::LayerDone { digest, cached } => {
                    ensure!(!cached, "layer {digest} was already in the store");
                    layers_done += 1;
                    if layers_done == image.layers.len() {
                        download = Some(start.elapsed());
                    }
                }
                PullEvent::Done { image: pulled } => {
                    let total = start.elapsed();
                    ensure!(
                        pulled.layers.len() == image.layers.len(),
                        "the hub pulled {} layers, the image has {}",
                        pulled.layers.len(),
                        image.layers.len()
                    );
                    let download = download.context("`done` before every `layer_done`")?;
                    return Ok(Run {
                        total,
                        download,
                        unpack: total - download,
                    });
                }
                PullEvent::Error { code, message } => {
                    bail!("the pull failed: {code:?}: {message}")
                }
                PullEvent::Resolved { .. } | PullEvent::Layer { .. } => {}
            }
        }
    }
    bail!("the pull's event stream ended without `done`")
}

/// Deletes the pulled image and prunes, then checks the store holds no
/// layer, so the next pull starts cold.
async fn clear_store(hub: &Hub) -> anyhow::Result<()> {
    hub.call(
        Method::DELETE,
        &format!("/v1/images/{}", path_segment(&format!("{REPO}:{TAG}"))),
        None,
    )
    .await?;
    ensure_empty_store(hub).await
}

pub async fn ensure_empty_store(hub: &Hub) -> anyhow::Result<()> {
    hub.call(Method::POST, "/v1/images/prune", None).await?;
    let layers = hub.state_dir.join("images").join("layers");
    let left = std::fs::read_dir(&layers)
        .map(|d| d.count())
        .unwrap_or_default();
    ensure!(
        left == 0,
        "{} still holds {left} layers after a prune: the next pull would not start cold",
        layers.display()
    );
    Ok(())
}

/// Throughput in MB/s (10^6 bytes) of `bytes` in `d`.
pub fn mb_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}
