//! Disk use of images that share a layer: ten images with one base layer
//! in common (`dev/registry/bench_image.py shared`: a ~30 MB gzip base and
//! a small top layer of each image's own) are imported with `sandhub image
//! import`; then the bytes under `<state-dir>/images/layers` (what `du -sb`
//! counts: apparent sizes, a hard-linked inode once) are set against the
//! bytes of one image's unpacked layers. One shared copy of the base makes
//! the ratio about 1; a copy per image would make it about 10.

use std::{
    collections::HashSet,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context};
use reqwest::Method;
use serde::Deserialize;

use super::server::{path_segment, Hub};
use crate::report::Progress;

#[derive(Debug, Deserialize)]
struct Shared {
    base: LayerSummary,
    images: Vec<SharedImage>,
}

#[derive(Debug, Deserialize)]
struct SharedImage {
    #[serde(rename = "ref")]
    reference: String,
    layout: PathBuf,
    layers: Vec<LayerSummary>,
}

#[derive(Debug, Deserialize)]
struct LayerSummary {
    diff_id: String,
    size: u64,
}

/// What the phase measured, in bytes.
pub struct Outcome {
    pub images: usize,
    /// Growth of `images/layers` over the imports.
    pub layers_bytes: u64,
    /// One image's unpacked layers (base + its top).
    pub one_image_bytes: u64,
    /// The base layer unpacked.
    pub base_bytes: u64,
    /// Its gzip blob.
    pub base_gzip_bytes: u64,
    /// Growth of `images/blobs` over the imports.
    pub blobs_bytes: u64,
    /// Disk blocks (`du -s`, not `-b`) of the layers' growth.
    pub layers_allocated: u64,
    /// Wall time of each import.
    pub imports: Vec<Duration>,
}

/// Apparent bytes and allocated bytes of everything under `path` (itself
/// included), each inode once; (0, 0) when it does not exist.
pub fn du(path: &Path) -> anyhow::Result<(u64, u64)> {
    let mut seen = HashSet::new();
    let mut total = (0, 0);
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && p.as_path() == path => {
                return Ok((0, 0))
            }
            Err(e) => return Err(e).with_context(|| format!("stat {}", p.display())),
        };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total.0 += meta.len();
        total.1 += meta.blocks() * 512;
        if meta.is_dir() {
            for entry in
                std::fs::read_dir(&p).with_context(|| format!("listing {}", p.display()))?
            {
                stack.push(entry?.path());
            }
        }
    }
    Ok(total)
}

pub async fn measure(hub: &Hub, bin: &Path, repo: &Path) -> anyhow::Result<Outcome> {
    let out = Command::new("bash")
        .arg(repo.join("dev/registry/registry.sh"))
        .args(["build-bench-image", "shared"])
        .output()
        .context("running dev/registry/registry.sh build-bench-image shared")?;
    if !out.status.success() {
        bail!(
            "build-bench-image shared failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shared: Shared = serde_json::from_slice(&out.stdout)
        .context("build-bench-image shared printed no JSON summary")?;
    ensure!(!shared.images.is_empty(), "no shared images were built");

    // Start from a store holding no unused layer.
    hub.call(Method::POST, "/v1/images/prune", None).await?;
    let images_dir = hub.state_dir.join("images");
    let (layers_before, alloc_before) = du(&images_dir.join("layers"))?;
    let (blobs_before, _) = du(&images_dir.join("blobs"))?;

    let result = import_all(hub, bin, &shared).await;
    let measured = match result {
        Ok(imports) => {
            let (layers_after, alloc_after) = du(&images_dir.join("layers"))?;
            let (blobs_after, _) = du(&images_dir.join("blobs"))?;
            let layer = |diff_id: &str| -> anyhow::Result<u64> {
                let hex = diff_id.strip_prefix("sha256:").unwrap_or(diff_id);
                let dir = images_dir.join("layers").join(hex);
                ensure!(dir.is_dir(), "no unpacked layer at {}", dir.display());
                Ok(du(&dir)?.0)
            };
            let first = &shared.images[0];
            let mut one_image_bytes = 0;
            for l in &first.layers {
                one_image_bytes += layer(&l.diff_id)?;
            }
            Ok(Outcome {
                images: shared.images.len(),
                layers_bytes: layers_after.saturating_sub(layers_before),
                one_image_bytes,
                base_bytes: layer(&shared.base.diff_id)?,
                base_gzip_bytes: shared.base.size,
                blobs_bytes: blobs_after.saturating_sub(blobs_before),
                layers_allocated: alloc_after.saturating_sub(alloc_before),
                imports,
            })
        }
        Err(e) => Err(e),
    };
    cleanup(hub, &shared).await;
    measured
}

async fn import_all(hub: &Hub, bin: &Path, shared: &Shared) -> anyhow::Result<Vec<Duration>> {
    let mut imports = Vec::new();
    let mut progress = Progress::new("disk: importing images", shared.images.len() as u64);
    for (i, image) in shared.images.iter().enumerate() {
        let t = Instant::now();
        let out = tokio::process::Command::new(bin)
            .args(["image", "import"])
            .arg(&image.layout)
            .args(["--tag", &image.reference, "--hub", &hub.url])
            .output()
            .await
            .context("running sandhub image import")?;
        if !out.status.success() {
            bail!(
                "sandhub image import {}: {}",
                image.layout.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        imports.push(t.elapsed());
        progress.update(i as u64 + 1);
    }
    let list = hub.call(Method::GET, "/v1/images", None).await?;
    let tags: HashSet<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["tags"].as_array().into_iter().flatten())
        .filter_map(|t| t.as_str())
        .collect();
    for image in &shared.images {
        ensure!(
            tags.contains(image.reference.as_str()),
            "{} is not in GET /v1/images after its import (tags: {tags:?})",
            image.reference
        );
    }
    Ok(imports)
}

async fn cleanup(hub: &Hub, shared: &Shared) {
    for image in &shared.images {
        let path = format!("/v1/images/{}", path_segment(&image.reference));
        if let Err(e) = hub.call(Method::DELETE, &path, None).await {
            if !e.to_string().contains("404") {
                eprintln!("disk: removing {}: {e:#}", image.reference);
            }
        }
    }
    if let Err(e) = hub.call(Method::POST, "/v1/images/prune", None).await {
        eprintln!("disk: prune: {e:#}");
    }
}
