//! Command-line flags. Names and defaults are upstream's (`cmd/agent-sandbox-controller`)
//! wherever they apply; conversion-webhook flags are gone as in upstream v1.0.0. Every flag
//! also reads an environment variable `SANDHUB_CONTROLLER_<FLAG>`.

use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};

/// Per-reconcile create cap (`--sandbox-warm-pool-max-batch-size`), upstream's default.
pub const DEFAULT_MAX_BATCH: usize = 300;

#[derive(Debug, Parser)]
#[command(
    name = "sandhub-controller",
    version,
    about = "Kubernetes controller for the agent-sandbox CRDs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub flags: Flags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the four CRDs as multi-document YAML and exit.
    Crd,
    /// Run the controllers (the default when no subcommand is given).
    Run,
}

/// Go-style durations (`0`, `500ms`, `5m`, `1m30s`; a bare number is seconds).
pub use sandhub_common::parse_duration;

#[derive(Clone, Debug, Args)]
pub struct Flags {
    /// Also run the SandboxClaim and SandboxWarmPool controllers (extensions API group).
    #[arg(long, env = "SANDHUB_CONTROLLER_EXTENSIONS", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub extensions: bool,

    /// Cluster DNS domain used in `status.serviceFQDN` (`<svc>.<ns>.svc.<domain>`).
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,

    /// Address of the Prometheus `/metrics` endpoint; `0` disables it.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_METRICS_BIND_ADDRESS",
        default_value = ":8080"
    )]
    pub metrics_bind_address: String,

    /// Address of `/healthz` and `/readyz`; `0` disables them.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_HEALTH_PROBE_BIND_ADDRESS",
        default_value = ":8081"
    )]
    pub health_probe_bind_address: String,

    /// Run the controllers only while holding the leader Lease, so replicas can stand by.
    #[arg(long, env = "SANDHUB_CONTROLLER_LEADER_ELECT", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,

    /// Namespace of the leader Lease; default: the controller's own namespace.
    #[arg(long, env = "SANDHUB_CONTROLLER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader Lease (coordination.k8s.io/v1).
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_LEADER_ELECTION_ID",
        default_value = "sandhub-controller-leader"
    )]
    pub leader_election_id: String,

    /// How long a Lease holder keeps it without renewing (controller-runtime default 15s).
    #[arg(long, env = "SANDHUB_CONTROLLER_LEADER_ELECTION_LEASE_DURATION", default_value = "15s",
          value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// How often the holder renews, and a standby retries (controller-runtime default 2s).
    #[arg(long, env = "SANDHUB_CONTROLLER_LEADER_ELECTION_RETRY_PERIOD", default_value = "2s",
          value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,

    /// Client-side request rate limit (requests/s); -1 = unlimited (upstream default).
    #[arg(long, env = "SANDHUB_CONTROLLER_KUBE_API_QPS", default_value_t = -1.0, allow_hyphen_values = true)]
    pub kube_api_qps: f64,

    /// Burst allowed above --kube-api-qps (when it is limited).
    #[arg(long, env = "SANDHUB_CONTROLLER_KUBE_API_BURST", default_value_t = 10)]
    pub kube_api_burst: u32,

    /// Kept for upstream compatibility: kube-rs keeps a pool of connections on its own.
    #[arg(long, env = "SANDHUB_CONTROLLER_API_CONNECTIONS", default_value_t = 1)]
    pub api_connections: u32,

    /// Use a second client (own connection pool) for watches, so long-lived watch streams
    /// never queue behind writes during a burst.
    #[arg(long, env = "SANDHUB_CONTROLLER_SEPARATE_WATCH_CONNECTION", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub separate_watch_connection: bool,

    /// Sandboxes reconciled in parallel. A claim burst is bounded by this: each warm adoption
    /// triggers one Sandbox reconcile.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_SANDBOX_CONCURRENT_WORKERS",
        default_value_t = 100
    )]
    pub sandbox_concurrent_workers: u16,

    /// SandboxClaims reconciled in parallel.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_SANDBOX_CLAIM_CONCURRENT_WORKERS",
        default_value_t = 50
    )]
    pub sandbox_claim_concurrent_workers: u16,

    /// SandboxWarmPools reconciled in parallel.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_SANDBOX_WARM_POOL_CONCURRENT_WORKERS",
        default_value_t = 1
    )]
    pub sandbox_warm_pool_concurrent_workers: u16,

    /// SandboxTemplates reconciled in parallel.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_SANDBOX_TEMPLATE_CONCURRENT_WORKERS",
        default_value_t = 1
    )]
    pub sandbox_template_concurrent_workers: u16,

    /// Most Sandboxes one warm-pool reconcile creates (slow-start batches 1, 2, 4, ... up to it).
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_SANDBOX_WARM_POOL_MAX_BATCH_SIZE",
        default_value_t = DEFAULT_MAX_BATCH as u32
    )]
    pub sandbox_warm_pool_max_batch_size: u32,

    /// Wait this long after a pool member is claimed or deleted before replacing it.
    #[arg(long, env = "SANDHUB_CONTROLLER_SANDBOX_WARM_POOL_REPLENISH_DELAY", default_value = "0",
          value_parser = parse_duration)]
    pub sandbox_warm_pool_replenish_delay: Duration,

    /// Token-bucket cap on pool refills (Sandboxes/s per pool); 0 = unlimited.
    #[arg(
        long,
        env = "SANDHUB_CONTROLLER_SANDBOX_WARM_POOL_MAX_REFILL_RATE",
        default_value_t = 0.0
    )]
    pub sandbox_warm_pool_max_refill_rate: f64,

    /// A pool member not Ready after this long is replaced (unless its Pod is Unschedulable).
    #[arg(long, env = "SANDHUB_CONTROLLER_SANDBOX_WARM_POOL_READINESS_GRACE_PERIOD", default_value = "5m",
          value_parser = parse_duration)]
    pub sandbox_warm_pool_readiness_grace_period: Duration,

    /// How often a pool with Unschedulable members is checked again.
    #[arg(long, env = "SANDHUB_CONTROLLER_SANDBOX_WARM_POOL_UNSCHEDULABLE_RECHECK_INTERVAL", default_value = "1m",
          value_parser = parse_duration)]
    pub sandbox_warm_pool_unschedulable_recheck_interval: Duration,

    /// Mark warm Pods `cluster-autoscaler.kubernetes.io/safe-to-evict: "true"`.
    #[arg(long, env = "SANDHUB_CONTROLLER_ENABLE_WARM_POOL_EVICTION", default_value_t = true,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_warm_pool_eviction: bool,

    /// Watch only Pods and Services that carry the sandbox-name-hash label.
    #[arg(long, env = "SANDHUB_CONTROLLER_CACHE_LABEL_SELECTORS", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub cache_label_selectors: bool,

    /// Do not emit Events for claims.
    #[arg(long, env = "SANDHUB_CONTROLLER_DISABLE_CLAIM_EVENTS", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub disable_claim_events: bool,

    /// Do not stamp `controller-first-observed-at` and trace-context annotations on claims.
    #[arg(long, env = "SANDHUB_CONTROLLER_DISABLE_CLAIM_OBSERVABILITY_ANNOTATIONS", default_value_t = false,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub disable_claim_observability_annotations: bool,

    /// Coalesce Pod metadata patches for this long (capped at 1s); 0 = write at once.
    #[arg(long, env = "SANDHUB_CONTROLLER_SANDBOX_WRITE_BEHIND_WINDOW", default_value = "0",
          value_parser = parse_duration)]
    pub sandbox_write_behind_window: Duration,

    /// Restrict every controller to one namespace (default: all namespaces).
    #[arg(long, env = "SANDHUB_CONTROLLER_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// Namespace of the controller itself (the `agent-sandbox-config` ConfigMap and, by
    /// default, the leader Lease). Default: the service account's namespace, else
    /// `agent-sandbox-system`.
    #[arg(long, env = "POD_NAMESPACE")]
    pub controller_namespace: Option<String>,

    /// Kubeconfig file; default: in-cluster config, then $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "SANDHUB_CONTROLLER_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Log format: `text` or `json`.
    #[arg(long, env = "SANDHUB_CONTROLLER_LOG_FORMAT", default_value = "text")]
    pub log_format: String,

    /// Export the controller's traces (a span per reconcile) over OTLP/HTTP
    /// to this collector, e.g. `http://otel-collector.observability:4318`.
    /// Off when unset.
    #[arg(long, env = "SANDHUB_CONTROLLER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Tell every sandbox Pod's sandboxd to export its spans here
    /// (`SANDBOXD_OTLP_ENDPOINT` in each container, replacing any value a
    /// template or claim set). Off when unset: a SandboxTemplate may still
    /// set the variable itself.
    #[arg(long, env = "SANDHUB_CONTROLLER_SANDBOX_OTLP_ENDPOINT")]
    pub sandbox_otlp_endpoint: Option<String>,

    /// File with the key (32+ bytes) that derives each Sandbox's own sandboxd token; the
    /// hub gets the same file (`sandhub serve --sandboxd-token-key-file`). Every Pod is then
    /// given only the SHA-256 of its own token (`SANDBOXD_SANDBOX_TOKEN_SHA256`), so a
    /// workload cannot open another sandbox's sandboxd. Unset: Pods get no token of their own.
    #[arg(long, env = "SANDHUB_CONTROLLER_SANDBOXD_TOKEN_KEY_FILE")]
    pub sandboxd_token_key_file: Option<std::path::PathBuf>,
}

impl Flags {
    /// The window actually used: upstream caps it at one second.
    pub fn write_behind_window(&self) -> Duration {
        self.sandbox_write_behind_window.min(Duration::from_secs(1))
    }
}
