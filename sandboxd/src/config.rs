//! Command-line flags. Names and defaults follow upstream sandboxd; every flag
//! can also come from a `SANDBOXD_*` environment variable.

use std::{path::PathBuf, time::Duration};

use clap::Parser;
use sandhub_api::sandboxd as wire;

#[derive(Debug, Clone, Parser)]
#[command(name = "sandboxd", version, about = "The daemon inside every sandbox")]
pub struct Config {
    /// Address the TCP listeners bind to.
    #[arg(long, env = "SANDBOXD_LISTEN_HOST", default_value = "0.0.0.0")]
    pub listen_host: String,

    /// Port of the REST files API, health, metadata and metrics.
    #[arg(long, env = "SANDBOXD_REST_PORT", default_value_t = wire::DEFAULT_REST_PORT)]
    pub rest_port: u16,

    /// Port of the gRPC process and watcher services.
    #[arg(long, env = "SANDBOXD_GRPC_PORT", default_value_t = wire::DEFAULT_GRPC_PORT)]
    pub grpc_port: u16,

    /// Port of the legacy python-runtime API (`POST /execute`, ...); 0 turns it off.
    #[arg(long, env = "SANDBOXD_LEGACY_PORT", default_value_t = wire::DEFAULT_LEGACY_PORT)]
    pub legacy_port: u16,

    /// Directory every file path and working directory is confined to (created if missing).
    #[arg(long, env = "SANDBOXD_ROOT_DIR", default_value = "/workspace")]
    pub root_dir: PathBuf,

    /// Working directory of processes started without one (default: the
    /// root dir). Unlike a request's `cwd` it may lie outside the root: it
    /// is the operator's setting (an image's WorkingDir), not a caller's.
    /// One that is not a directory when a process starts falls back to the root.
    #[arg(long, env = "SANDBOXD_DEFAULT_CWD")]
    pub default_cwd: Option<PathBuf>,

    /// Run every workload as this user: `user[:group]`, names or numbers,
    /// names from the sandbox's /etc/passwd and /etc/group (an image's
    /// User). The root dir is handed to that user. Default: sandboxd's own.
    #[arg(long, env = "SANDBOXD_USER")]
    pub user: Option<String>,

    /// A JSON argv started in the background when sandboxd starts and
    /// after each workspace reset (an image's Entrypoint and Cmd); its
    /// output goes to /tmp/sandhub-entrypoint.log.
    #[arg(long, env = "SANDBOXD_ENTRYPOINT")]
    pub entrypoint: Option<String>,

    /// Environment variables with this prefix are published by `/v1/metadata`
    /// (secret-looking names never are).
    #[arg(long, env = "SANDBOXD_METADATA_ENV_PREFIX", default_value = wire::DEFAULT_METADATA_ENV_PREFIX)]
    pub metadata_env_prefix: String,

    /// After SIGTERM, how long running processes may finish before their groups are killed.
    #[arg(long, env = "SANDBOXD_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = sandhub_common::parse_duration)]
    pub shutdown_timeout: Duration,

    /// An HTTP connection that sends no request for this long is closed.
    #[arg(long, env = "SANDBOXD_HTTP_IDLE_TIMEOUT", default_value = "60s", value_parser = sandhub_common::parse_duration)]
    pub http_idle_timeout: Duration,

    /// Largest chunk of process output sent in one gRPC message, in bytes.
    #[arg(long, env = "SANDBOXD_STREAM_CHUNK_SIZE", default_value_t = wire::DEFAULT_STREAM_CHUNK_SIZE,
          value_parser = parse_chunk_size)]
    pub stream_chunk_size: usize,

    /// Most concurrent WatchDir streams; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "SANDBOXD_MAX_WATCHES", default_value_t = wire::DEFAULT_MAX_WATCHES)]
    pub max_watches: usize,

    /// Most processes running at once, however they were started (gRPC
    /// Start and Execute, legacy `POST /execute`); one more is refused at
    /// once with RESOURCE_EXHAUSTED. A process counts from its spawn until it
    /// is reaped and its output drained, not until its client reads the end.
    /// The default keeps each sandbox's daemon at roughly a thousand open
    /// pipes (3 per process) and well below one HTTP/2 connection's stream
    /// limit, which is derived from this flag so that this limit, and not a
    /// silent stall, is what a client meets first.
    #[arg(long, env = "SANDBOXD_MAX_PROCESSES", default_value_t = DEFAULT_MAX_PROCESSES,
          value_parser = parse_max_processes)]
    pub max_processes: usize,

    /// The Python that runs code contexts' kernels (`-m ipykernel_launcher`).
    #[arg(long, env = "SANDBOXD_CODE_PYTHON", default_value = "python3")]
    pub code_python: String,

    /// Most code contexts (kernels) at once; one more is refused with
    /// RESOURCE_EXHAUSTED (429).
    #[arg(long, env = "SANDBOXD_MAX_CODE_CONTEXTS", default_value_t = sandhub_api::code::DEFAULT_MAX_CONTEXTS)]
    pub max_code_contexts: usize,

    /// A code result's MIME bundle larger than this is truncated (marked `truncated`).
    #[arg(long, env = "SANDBOXD_CODE_MAX_RESULT_BYTES", default_value_t = sandhub_api::code::DEFAULT_MAX_RESULT_BYTES)]
    pub code_max_result_bytes: usize,

    /// Largest accepted upload body in bytes; 0 means no limit.
    #[arg(long, env = "SANDBOXD_MAX_UPLOAD_BYTES", default_value_t = 0)]
    pub max_upload_bytes: u64,

    /// File holding the bearer token clients must send (surrounding whitespace ignored).
    #[arg(
        long,
        env = "SANDBOXD_AUTH_TOKEN_FILE",
        conflicts_with = "auth_token_sha256"
    )]
    pub auth_token_file: Option<PathBuf>,

    /// Hex SHA-256 of the bearer token clients must send; the token itself never
    /// has to reach this process's arguments or environment.
    #[arg(long, env = "SANDBOXD_AUTH_TOKEN_SHA256")]
    pub auth_token_sha256: Option<String>,

    /// Hex SHA-256 of this sandbox's own token, accepted besides the token
    /// above. sandhub-controller sets it in each Pod it builds: the token
    /// derives from the Pod's Sandbox with a key only the hub and the
    /// controller hold, so it opens this Pod and no other.
    #[arg(long, env = "SANDBOXD_SANDBOX_TOKEN_SHA256")]
    pub sandbox_token_sha256: Option<String>,

    /// Serve REST and gRPC on `rest.sock` and `grpc.sock` in this directory
    /// instead of TCP ports (the hub's local backend uses this).
    #[arg(long, env = "SANDBOXD_UNIX_SOCKET")]
    pub unix_socket: Option<PathBuf>,

    /// Default deadline of a legacy `POST /execute` without `timeout_seconds`.
    #[arg(long, env = "SANDBOX_EXEC_TIMEOUT_SECONDS", default_value = "300",
          value_parser = parse_seconds)]
    pub legacy_exec_timeout: Duration,

    /// A CA certificate (PEM) to trust beside the image's roots: with
    /// `--ca-bundle-out`, the image's system bundle and this are written
    /// there at start (the egress proxy's CA, for brokered secrets).
    #[arg(long, env = "SANDBOXD_EXTRA_CA_FILE", requires = "ca_bundle_out")]
    pub extra_ca_file: Option<PathBuf>,

    /// Where the bundle of `--extra-ca-file` goes.
    #[arg(long, env = "SANDBOXD_CA_BUNDLE_OUT", requires = "extra_ca_file")]
    pub ca_bundle_out: Option<PathBuf>,

    /// When sandboxd starts sampling its own cgroup for `GET
    /// /v1/_sandhub/usage`: `start` (from boot, so the series covers the
    /// sandbox's whole life), `on-demand` (at the first ask), or `auto`:
    /// `start`, except when serving on `--unix-socket` (the hub's local
    /// backend, which reads every sandbox's cgroup from the host itself).
    #[arg(long, env = "SANDBOXD_USAGE_SAMPLING", default_value = "auto",
          value_parser = ["auto", "start", "on-demand"])]
    pub usage_sampling: String,

    /// Log format: `text` or `json`.
    #[arg(long, env = "SANDBOXD_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Export traces (a span per REST request and gRPC call, child of the
    /// caller's `traceparent`) over OTLP/HTTP to this collector, e.g.
    /// `http://otel-collector:4318`. Read once at start; off when unset.
    /// In a Pod it comes from the controller's `--sandbox-otlp-endpoint`.
    #[arg(long, env = "SANDBOXD_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// `--max-processes` when none is given.
pub const DEFAULT_MAX_PROCESSES: usize = 256;

/// The highest `--max-processes`: the HTTP/2 stream limit derived from it
/// must stay a sane `u32`, and no sandbox runs a million processes.
pub const MAX_MAX_PROCESSES: usize = 1 << 20;

fn parse_max_processes(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if !(1..=MAX_MAX_PROCESSES).contains(&n) {
        return Err(format!("{s}: must be between 1 and {MAX_MAX_PROCESSES}"));
    }
    Ok(n)
}

fn parse_chunk_size(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if !(1..=4 << 20).contains(&n) {
        return Err(format!("{s}: must be between 1 and 4194304 bytes"));
    }
    Ok(n)
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s}: must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}
