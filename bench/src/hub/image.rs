//! Cold create of a sandbox whose root is a cached image vs one whose
//! root is the host's (the default template), interleaved in one run so
//! both see the same machine. The image is the test registry's python3
//! image (`dev/registry/registry.sh build-test-image`: three layers from
//! Debian packages), imported once with `sandhub image import`.

use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Value};

use super::{rest::Series, server::Hub};
use crate::report::Progress;

const TAG: &str = "bench/python:1";
const TEMPLATE: &str = "bench-image";

/// Builds (or finds cached) the test image layout; its path.
fn test_image_layout(repo: &Path) -> anyhow::Result<String> {
    let out = Command::new("bash")
        .arg(repo.join("dev/registry/registry.sh"))
        .arg("build-test-image")
        .output()
        .context("running dev/registry/registry.sh build-test-image")?;
    if !out.status.success() {
        bail!(
            "build-test-image failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let summary: Value =
        serde_json::from_slice(&out.stdout).context("build-test-image printed no JSON summary")?;
    summary["layout"]
        .as_str()
        .map(str::to_string)
        .context("build-test-image summary has no layout")
}

/// Imports the image and makes a template of it; the import's wall time.
pub async fn prepare(hub: &Hub, bin: &Path, repo: &Path) -> anyhow::Result<std::time::Duration> {
    let layout = test_image_layout(repo)?;
    let t = Instant::now();
    let out = tokio::process::Command::new(bin)
        .args(["image", "import", &layout, "--hub", &hub.url])
        // The layout also holds the multi-arch index and hostile images.
        .args(["--ref", "sandhub/test:amd64", "--tag", TAG])
        .output()
        .await
        .context("running sandhub image import")?;
    if !out.status.success() {
        bail!(
            "sandhub image import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let took = t.elapsed();
    hub.call(
        Method::PUT,
        &format!("/v1/templates/{TEMPLATE}"),
        Some(json!({"image": TAG})),
    )
    .await?;
    Ok(took)
}

/// `n` cold creates of each kind, alternating: (host root, image root).
pub async fn cold_creates(
    hub: &mut Hub,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<(Series, Series)> {
    let (mut host, mut image) = (Series::new(n), Series::new(n));
    let mut progress = Progress::new("cold create, host root vs image", n.into());
    for done in 1..=n {
        if host.past("cold create (host root)", deadline) {
            break;
        }
        for (template, series) in [(None, &mut host), (Some(TEMPLATE), &mut image)] {
            let body = match template {
                Some(t) => json!({"template": t}),
                None => json!({}),
            };
            let t = Instant::now();
            let v = hub.call(Method::POST, "/v1/sandboxes", Some(body)).await?;
            series.samples.push(t.elapsed());
            let id = super::server::str_field(&v, "id")?;
            hub.track_sandbox(id.clone());
            hub.delete(&id).await?;
        }
        progress.update(done.into());
    }
    Ok((host, image))
}

/// Removes the template and the image.
pub async fn cleanup(hub: &Hub) {
    let _ = hub
        .call(Method::DELETE, &format!("/v1/templates/{TEMPLATE}"), None)
        .await;
    let _ = hub
        .call(
            Method::DELETE,
            &format!("/v1/images/{}", super::server::path_segment(TAG)),
            None,
        )
        .await;
}
