//! The operator's disk-quota settings for the local backend, and opening
//! the quota volume they describe (see [`super::runtime::quota`]).

use std::{path::Path, sync::Arc};

use anyhow::Context;
use clap::Args;
use sandhub_api::hub::{MAX_DISK_MB, MIN_DISK_MB};

use super::runtime::{quota, DiskQuotas, VolumeOptions};

/// 10 GiB: room for a checkout, its dependencies and build outputs.
pub const DEFAULT_DISK_MB: u64 = 10240;
/// Four default sandboxes' worth of snapshots per tenant.
pub const DEFAULT_MAX_SNAPSHOT_MB: u64 = 4 * DEFAULT_DISK_MB;
/// 20 GiB of (compressed) image layers per tenant: a few dozen task images.
pub const DEFAULT_MAX_IMAGE_MB: u64 = 20480;

#[derive(Debug, Clone, Args)]
pub struct DiskArgs {
    /// Disk quota in MiB of a sandbox whose template sets no `disk_mb`:
    /// everything it writes (workspace, logs) counts; past it, writes fail
    /// with EDQUOT inside the sandbox.
    #[arg(long, env = "SANDHUB_DEFAULT_DISK_MB", default_value_t = DEFAULT_DISK_MB,
          value_parser = clap::value_parser!(u64).range(MIN_DISK_MB..=MAX_DISK_MB))]
    pub default_disk_mb: u64,

    /// Most MiB of snapshots one tenant may keep (0: no limit). Snapshots
    /// count toward no sandbox's quota; past this, taking one (or forking
    /// without naming one) is RESOURCE_EXHAUSTED until some are deleted.
    #[arg(long, env = "SANDHUB_MAX_SNAPSHOT_MB_PER_TENANT", default_value_t = DEFAULT_MAX_SNAPSHOT_MB)]
    pub max_snapshot_mb_per_tenant: u64,

    /// Most MiB of images one tenant may hold in the image store, counted
    /// as the compressed size of each image's layers plus what they
    /// unpack to (0: no limit). An image several tenants hold counts for
    /// each. Past this, an import or pull is RESOURCE_EXHAUSTED (an unpack
    /// stops there) until some are removed.
    #[arg(long, env = "SANDHUB_MAX_IMAGE_MB_PER_TENANT", default_value_t = DEFAULT_MAX_IMAGE_MB)]
    pub max_image_mb_per_tenant: u64,

    /// Most MiB the whole image store may take on the host's disk:
    /// unpacked layers (once each, however many tenants share them),
    /// blobs, partial downloads and imports in progress. Past this, an
    /// import or pull is RESOURCE_EXHAUSTED. Default: half the size of
    /// the state dir's filesystem. 0: no limit.
    #[arg(long, env = "SANDHUB_MAX_IMAGE_STORE_MB")]
    pub max_image_store_mb: Option<u64>,

    /// Size in MiB of the sparse disk volume the hub makes for sandboxes
    /// on first start, unless the state dir is on btrfs with quotas on
    /// (default: nine tenths of the space free then). Sandboxes together
    /// never take more of the host's disk than this.
    #[arg(long, env = "SANDHUB_DISK_VOLUME_MB")]
    pub disk_volume_mb: Option<u64>,

    /// Where the disk volume is mounted (one directory per state dir).
    #[arg(long, env = "SANDHUB_DISK_VOLUME_DIR", default_value = quota::DEFAULT_RUN_DIR)]
    pub disk_volume_dir: std::path::PathBuf,

    /// Run sandboxes without disk quotas where no quota volume can be had
    /// (rootless, no loop devices, no mkfs.btrfs): a sandbox can then fill
    /// the host's disk.
    #[arg(long, env = "SANDHUB_ALLOW_NO_DISK_QUOTA")]
    pub allow_no_disk_quota: bool,
}

impl Default for DiskArgs {
    fn default() -> Self {
        DiskArgs {
            default_disk_mb: DEFAULT_DISK_MB,
            max_snapshot_mb_per_tenant: DEFAULT_MAX_SNAPSHOT_MB,
            max_image_mb_per_tenant: DEFAULT_MAX_IMAGE_MB,
            max_image_store_mb: None,
            disk_volume_mb: None,
            disk_volume_dir: quota::DEFAULT_RUN_DIR.into(),
            allow_no_disk_quota: false,
        }
    }
}

/// The image store's cap in bytes: `--max-image-store-mb`, else half
/// the size of the state dir's filesystem (the images live there, beside
/// the sandboxes' volume, which has its own bound).
pub fn image_store_cap(state_dir: &Path, args: &DiskArgs) -> u64 {
    if let Some(mb) = args.max_image_store_mb {
        return mb.saturating_mul(1 << 20);
    }
    match rustix::fs::statvfs(state_dir) {
        Ok(st) => st.f_blocks.saturating_mul(st.f_frsize) / 2,
        Err(e) => {
            tracing::warn!(error = %e, "no size for the state dir's filesystem: the image store has no cap");
            0
        }
    }
}

/// The quota volume for `state_dir`, or `None` when there is none and the
/// operator allowed that; otherwise an error that says how to get one.
pub fn open_quotas(state_dir: &Path, args: &DiskArgs) -> anyhow::Result<Option<Arc<DiskQuotas>>> {
    let options = VolumeOptions {
        size_mb: args.disk_volume_mb,
        run_dir: args.disk_volume_dir.clone(),
    };
    let started = std::time::Instant::now();
    match DiskQuotas::detect_or_create(state_dir, &options) {
        Ok(q) => {
            tracing::info!(root = %q.root().display(), elapsed = ?started.elapsed(), "disk quotas on");
            Ok(Some(Arc::new(q)))
        }
        Err(e) if args.allow_no_disk_quota => {
            tracing::warn!(error = %e, "running sandboxes without disk quotas");
            Ok(None)
        }
        Err(e) => Err(e).context(
            "no disk quota volume for sandboxes (needs root, loop devices and mkfs.btrfs \
             from btrfs-progs, or a state dir on btrfs with quotas on); pass \
             --allow-no-disk-quota to run sandboxes without disk limits",
        ),
    }
}
