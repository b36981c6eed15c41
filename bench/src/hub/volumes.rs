//! Phase `volumes` (issue #32 §1): what named volumes cost.
//!
//! - **Clone**: a volume holding 1 GiB in 1,000 files (written by a
//!   sandbox that mounts it) is snapshotted once, then cloned
//!   (`POST /v1/volumes {from_snapshot}`) `--volume-rounds` times, against
//!   `cp -a --reflink=always` of the same directory on the same btrfs
//!   (the quota volume), alternating which goes first. Clean-up is
//!   untimed.
//! - **Files**: 256 MiB uploaded and downloaded through the volume files
//!   API (no sandbox) against the sandbox files API (through the hub to a
//!   running sandbox's sandboxd), alternating.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context;
use reqwest::Method;
use serde_json::json;

use super::{args::Args, rest::Series, server::Hub, summary, us};
use crate::report::{Report, Row};

const FILES: u32 = 1000;
const FILE_MB: u32 = 1;
const IO_MB: usize = 256;

pub(super) async fn run(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    clone(args, hub, report).await?;
    files(args, hub, report).await
}

async fn volume(hub: &Hub, name: &str, size_mb: u64) -> anyhow::Result<()> {
    hub.call(
        Method::POST,
        "/v1/volumes",
        Some(json!({"name": name, "size_mb": size_mb})),
    )
    .await?;
    Ok(())
}

async fn delete_volume(hub: &Hub, name: &str) -> anyhow::Result<()> {
    hub.call(Method::DELETE, &format!("/v1/volumes/{name}"), None)
        .await?;
    Ok(())
}

/// The quota volume's root: where the sandbox's own state dir lives.
fn quota_root(hub: &Hub, sandbox: &str) -> anyhow::Result<PathBuf> {
    let sock = hub.socket_dir(sandbox);
    sock.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .filter(|r| r.join("volumes").is_dir())
        .context("this hub keeps no volumes on a quota volume")
}

async fn clone(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let size = u64::from(FILES * FILE_MB) * 2;
    volume(hub, "bench-src", size).await?;
    let (id, _) = hub
        .create_with(json!({"volumes": [{"name": "bench-src", "path": "/mnt/v"}]}))
        .await?;
    let fill = format!(
        "i=0; while [ $i -lt {FILES} ]; do head -c {} /dev/urandom > /mnt/v/f$i; i=$((i+1)); done; sync",
        FILE_MB << 20
    );
    hub.call(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": fill, "timeout_seconds": 600})),
    )
    .await?;
    let root = quota_root(hub, &id)?;
    hub.delete(&id).await?;
    let src = std::fs::read_dir(root.join("volumes"))?
        .flatten()
        .map(|t| t.path().join("bench-src"))
        .find(|p| p.is_dir())
        .context("the volume's directory on the quota volume")?;
    hub.call(
        Method::POST,
        "/v1/volumes/bench-src/snapshots",
        Some(json!({"name": "s"})),
    )
    .await?;

    let (mut api, mut cp) = (
        Series::new(args.volume_rounds),
        Series::new(args.volume_rounds),
    );
    for i in 0..args.volume_rounds {
        if api.past("volume clone", args.deadline()) {
            break;
        }
        for api_first in [i % 2 == 0, i % 2 != 0] {
            if api_first {
                let name = format!("bench-clone-{i}");
                let t = Instant::now();
                hub.call(
                    Method::POST,
                    "/v1/volumes",
                    Some(json!({"name": name, "size_mb": size, "from_snapshot": "bench-src@s"})),
                )
                .await?;
                api.samples.push(t.elapsed());
                delete_volume(hub, &name).await?;
            } else {
                let dest = root.join(format!("bench-cp-{i}"));
                cp.samples.push(reflink_copy(&src, &dest)?);
                std::fs::remove_dir_all(&dest)?;
            }
        }
    }
    hub.call(Method::DELETE, "/v1/volumes/bench-src/snapshots/s", None)
        .await?;
    delete_volume(hub, "bench-src").await?;
    let api = summary(report, "volume clone (1 GiB in 1,000 files)", api)?;
    let cp = summary(report, "cp -a --reflink=always of the same files", cp)?;
    report.rows.push(Row::compare(
        "volume clone of 1 GiB in 1,000 files vs cp -a --reflink, p50",
        us(cp.p50),
        us(api.p50),
        None,
    ));
    Ok(())
}

fn reflink_copy(src: &Path, dest: &Path) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let out = std::process::Command::new("cp")
        .args(["-a", "--reflink=always"])
        .arg(src)
        .arg(dest)
        .output()
        .context("running cp")?;
    let took = t.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "cp --reflink: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

async fn files(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    // Room for an upload beside the file it replaces.
    volume(hub, "bench-io", (IO_MB * 4) as u64).await?;
    let (id, _) = hub.create().await?;
    let data = bytes::Bytes::from(
        (0..IO_MB << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect::<Vec<u8>>(),
    );
    let volume_path = "/v1/volumes/bench-io/files/big".to_string();
    let sandbox_path = format!("/v1/sandboxes/{id}/files/big");
    let n = args.volume_rounds;
    let (mut vol_up, mut sb_up, mut vol_down, mut sb_down) = (
        Series::new(n),
        Series::new(n),
        Series::new(n),
        Series::new(n),
    );
    for i in 0..n {
        if vol_up.past("volume files", args.deadline()) {
            break;
        }
        let order = if i % 2 == 0 {
            [(&volume_path, true), (&sandbox_path, false)]
        } else {
            [(&sandbox_path, false), (&volume_path, true)]
        };
        for (path, is_volume) in order {
            let up = put(hub, path, data.clone()).await?;
            let down = get(hub, path, data.len()).await?;
            if is_volume {
                vol_up.samples.push(up);
                vol_down.samples.push(down);
            } else {
                sb_up.samples.push(up);
                sb_down.samples.push(down);
            }
        }
    }
    hub.delete(&id).await?;
    delete_volume(hub, "bench-io").await?;
    let vol_up = summary(report, "volume files API upload (256 MiB)", vol_up)?;
    let sb_up = summary(report, "sandbox files API upload (256 MiB)", sb_up)?;
    let vol_down = summary(report, "volume files API download (256 MiB)", vol_down)?;
    let sb_down = summary(report, "sandbox files API download (256 MiB)", sb_down)?;
    report.rows.push(Row::compare(
        "upload 256 MiB: volume files API vs sandbox files API, p50",
        us(sb_up.p50),
        us(vol_up.p50),
        None,
    ));
    report.rows.push(Row::compare(
        "download 256 MiB: volume files API vs sandbox files API, p50",
        us(sb_down.p50),
        us(vol_down.p50),
        None,
    ));
    Ok(())
}

async fn put(hub: &Hub, path: &str, body: bytes::Bytes) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let r = hub
        .http
        .put(format!("{}{path}", hub.url))
        .body(body)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "PUT {path}: {}", r.status());
    r.bytes().await?;
    Ok(t.elapsed())
}

async fn get(hub: &Hub, path: &str, want: usize) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let r = hub.http.get(format!("{}{path}", hub.url)).send().await?;
    anyhow::ensure!(r.status().is_success(), "GET {path}: {}", r.status());
    let mut got = 0;
    let mut stream = r.bytes_stream();
    use futures::StreamExt;
    while let Some(chunk) = stream.next().await {
        got += chunk?.len();
    }
    anyhow::ensure!(got == want, "GET {path}: {got} bytes, not {want}");
    Ok(t.elapsed())
}
