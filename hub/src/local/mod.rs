//! The local backend: sandboxes as namespaced process trees on this
//! machine, with the hub's own model of them in SQLite. Its sibling is
//! `kube/`; both implement the seam in `crate::backend`.
//!
//! # Layout
//!
//! ```text
//! mod.rs             LocalArgs and RegistryArgs (the operator's flags) and open():
//!                    the constructor `sandhub serve` and `sandhub mcp` start a
//!                    local hub with
//! hub.rs             Hub: the model (admission, cold start, templates, clients)
//! tenant.rs          TenantHub: one tenant's Sandboxes (changes of several steps run
//!                    as tasks of their own, finished when the caller hangs up);
//!                    Backend for Arc<Hub>
//! lifecycle.rs       locks, recovery after a restart, the reaper
//! entrypoints.rs     `entrypoint_exited`: Ready sandboxes' entrypoint records, asked
//!                    every 2 s, each exit told once
//! pools.rs           warm pools: the refiller
//! gauges.rs          the pool and tenant gauges of /metrics (Hub::gauges)
//! ports.rs           a sandbox's TCP ports, reached inside its network namespace
//! ready.rs           ReadyCache: which sandboxes were Ready, per store generation (the
//!                    port proxy's check per request, without a lookup)
//! plan.rs            the pure decisions lifecycle and pools apply (unit-tested)
//! store/             the SQLite store (sandboxes, templates, pools, snapshots, gym envs,
//!                    tenants' secret values)
//! runtime_adapter.rs LocalBackend: rows to runtime calls (launch, stop, snapshot, ...)
//! sampler.rs         every sandbox's usage (cgroup, disk quota, gateway bytes) each
//!                    second into its ring (`crate::usage`); the OOM/disk alert hook
//! disk.rs            disk-quota flags and opening the quota volume
//! egress.rs          `network: egress`: the operator's flags (the built-in `default`
//!                    template's network among them), attaching a gateway (crate
//!                    `sandhub-gateway`) to each such sandbox
//! secrets.rs         brokered secrets: values (--secrets-file, the store),
//!                    placeholders, what each sandbox's gateway is handed
//! tenant_secrets.rs  /v1/secrets and the create-time check (Hub methods)
//! volumes.rs         named volumes (Hub methods): rows and subvolumes, snapshots and
//!                    clones, what a launch mounts (volume_binds), the in-use check,
//!                    the start-up reconciliation
//! network.rs         PATCH .../network: a running sandbox's narrowing replaced
//! image/             the image store: import, layers, ls/rm/prune (see its docs)
//! runtime/           the namespace runtime itself (see its docs)
//! ```

pub mod disk;
pub mod egress;
mod entrypoints;
mod gauges;
mod hub;
pub mod image;
mod lifecycle;
mod network;
pub mod plan;
mod pools;
mod ports;
mod ready;
pub mod runtime;
mod runtime_adapter;
pub mod sampler;
mod secrets;
pub mod store;
mod tenant;
mod tenant_secrets;
mod volumes;

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use clap::Args;

pub use disk::DiskArgs;
pub use hub::Hub;
pub use runtime_adapter::{LaunchRequest, LocalBackend};
pub use store::Store;
pub use tenant::TenantHub;

use crate::policy::{Policy, PolicyArgs};
use image::registry_auth::DockerConfig;

/// The embedded local backend's settings (`sandhub serve`, `sandhub mcp`).
#[derive(Debug, Clone, Default, Args)]
pub struct LocalArgs {
    /// Run sandboxes without cpu/memory/pids limits where no cgroup can be
    /// delegated (rootless without systemd delegation).
    #[arg(long, env = "SANDHUB_ALLOW_NO_CGROUP_LIMITS")]
    pub allow_no_cgroup_limits: bool,

    /// Host directories templates may use as `root_fs` or `seed_dir`
    /// (comma-separated); none by default, so a tenant can never name `/`.
    #[arg(long, env = "SANDHUB_TEMPLATE_DIRS", value_delimiter = ',')]
    pub template_dirs: Vec<PathBuf>,

    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub disk: DiskArgs,

    #[command(flatten)]
    pub registry: RegistryArgs,

    #[command(flatten)]
    pub egress: egress::EgressArgs,

    #[command(flatten)]
    pub events: crate::events::EventArgs,

    #[command(flatten)]
    pub webhooks: crate::webhooks::WebhookArgs,
}

/// Default of `--max-image-bytes`.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 16 << 30;

/// The registry flags of `sandhub serve` (local backend).
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// A Docker-style `config.json` with registry credentials (`auths`:
    /// `auth` as base64 of `user:password`, or `username` and `password`);
    /// read at each pull, so it may change while the hub runs.
    #[arg(long, env = "SANDHUB_REGISTRY_CONFIG")]
    pub registry_config: Option<PathBuf>,

    /// A registry (`HOST:PORT`, as in image references) reached over plain
    /// HTTP instead of HTTPS; repeat it, or comma-separate the env var.
    /// For test registries: loopback is not implied.
    #[arg(
        long = "insecure-registry",
        env = "SANDHUB_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,

    /// Largest image (its config and layer blobs, compressed) a pull
    /// stores; each blob is also held to the size its manifest states, so
    /// a registry cannot fill the disk. Default 16 GiB.
    #[arg(long, env = "SANDHUB_MAX_IMAGE_BYTES", default_value_t = DEFAULT_MAX_IMAGE_BYTES)]
    pub max_image_bytes: u64,
}

impl Default for RegistryArgs {
    fn default() -> Self {
        RegistryArgs {
            registry_config: None,
            insecure_registries: Vec::new(),
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }
}

impl RegistryArgs {
    /// Checks the flags at start: a config file given must parse.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.registry_config {
            let bytes = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("--registry-config {}: {e}", path.display()))?;
            DockerConfig::parse(&bytes).map_err(|e| {
                anyhow::anyhow!("--registry-config {}: {}", path.display(), e.message)
            })?;
        }
        for r in &self.insecure_registries {
            if r.is_empty() || r.contains('/') {
                anyhow::bail!("--insecure-registry {r:?}: expected HOST[:PORT]");
            }
        }
        Ok(())
    }
}

pub fn default_state_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("sandhub");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".local/share/sandhub")
}

/// The hub on the local backend, re-attached to the sandboxes it had.
/// Background work (pools, reaping) is the caller's to start.
pub async fn open(
    state_dir: Option<PathBuf>,
    local: &LocalArgs,
    max_upload_bytes: u64,
) -> anyhow::Result<Arc<Hub>> {
    let policy = Policy::resolve(&local.policy, runtime::host_memory_kib());
    policy.validate()?;
    Policy::validate_args(&local.policy)?;
    let template_dirs = local
        .template_dirs
        .iter()
        .map(|d| {
            d.canonicalize()
                .with_context(|| format!("--template-dirs {}", d.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let state_dir = state_dir.unwrap_or_else(default_state_dir);
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating state dir {}", state_dir.display()))?;
    let store = Store::open(&state_dir.join("sandhub.db"))
        .map_err(|e| anyhow::anyhow!("opening the state store: {e}"))?;
    // Webhooks first: their outbox is written in each event's transaction.
    let (webhooks, outbox) =
        crate::webhooks::Webhooks::open(&state_dir.join("sandhub.db"), &local.webhooks)
            .context("opening the webhook store")?;
    let events =
        crate::events::EventLog::sqlite(&state_dir.join("sandhub.db"), &local.events, Some(outbox))
            .map_err(|e| anyhow::anyhow!("opening the event log: {e}"))?;
    let backend = LocalBackend::new(
        &state_dir,
        local.allow_no_cgroup_limits,
        max_upload_bytes,
        &local.disk,
        &local.egress,
    )
    .context("starting the local backend")?;
    local.registry.check()?;
    backend.images.configure_pulls(local.registry.clone());
    tracing::info!(?policy, "sandbox limits and tenant quotas");
    let hub = Hub::new(store, backend, template_dirs, policy, events, webhooks);
    hub.set_max_snapshot_bytes(
        local
            .disk
            .max_snapshot_mb_per_tenant
            .saturating_mul(1 << 20),
    );
    hub.recover()
        .await
        .map_err(|e| anyhow::anyhow!("re-attaching to sandboxes: {e}"))?;
    hub.reconcile_volumes()
        .map_err(|e| anyhow::anyhow!("named volumes: {e}"))?;
    Ok(hub)
}
