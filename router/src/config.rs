//! Flags (upstream sandbox-router's names and defaults), each also read from
//! an environment variable, plus an optional YAML `--config` file.
//! Precedence: command-line flags, then the file, then env, then defaults.

use std::{ffi::OsString, path::PathBuf, time::Duration};

use anyhow::{bail, Context};
use clap::{
    parser::ValueSource, ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum MtlsMode {
    #[default]
    Off,
    Optional,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum AuthzMode {
    #[default]
    AllowAll,
    Tokenreview,
    ScopedToken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum SameSite {
    #[default]
    Lax,
    Strict,
    None,
}

impl SameSite {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lax => "Lax",
            Self::Strict => "Strict",
            Self::None => "None",
        }
    }
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "sandhub-router",
    version,
    about = "Reverse proxy into sandbox Pods: X-Sandbox-* header or path routing, HTTP/1.1, WebSocket and other upgrades, h2c gRPC"
)]
pub struct Args {
    /// HTTP listener (HTTP/1.1 and h2c). Go form: ":8080" is every interface.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_HTTP_BIND_ADDRESS",
        default_value = ":8080"
    )]
    pub http_bind_address: String,
    /// TLS listener (HTTP/1.1 and HTTP/2 by ALPN); empty: none.
    #[arg(long, env = "SANDBOX_ROUTER_HTTPS_BIND_ADDRESS", default_value = "")]
    pub https_bind_address: String,
    /// Prometheus /metrics listener; empty or "0": none.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_METRICS_BIND_ADDRESS",
        default_value = ":9090"
    )]
    pub metrics_bind_address: String,
    /// /healthz and /readyz listener; empty or "0": none.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_HEALTH_PROBE_BIND_ADDRESS",
        default_value = ":8081"
    )]
    pub health_probe_bind_address: String,
    /// PEM certificate chain for the TLS listener (re-read when it changes).
    #[arg(long, env = "SANDBOX_ROUTER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key for the TLS listener (re-read when it changes).
    #[arg(long, env = "SANDBOX_ROUTER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA bundle that client certificates must chain to (mTLS).
    #[arg(long, env = "SANDBOX_ROUTER_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Client certificates on the TLS listener: off, optional (verified when sent) or required.
    #[arg(long, env = "SANDBOX_ROUTER_MTLS_MODE", value_enum, default_value_t = MtlsMode::Off)]
    pub mtls_mode: MtlsMode,
    /// Cluster DNS suffix for `<id>.<ns>.svc.<domain>` upstreams.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Budget for an HTTP request until the response head (not applied after a 101, nor to gRPC).
    /// A bare number means seconds.
    #[arg(long, env = "PROXY_TIMEOUT_SECONDS", default_value = "180s", value_parser = parse_duration)]
    pub proxy_timeout: Duration,
    /// Cap on an RPC's duration; 0s: no cap (the client's grpc-timeout still applies).
    #[arg(long, env = "SANDBOX_ROUTER_GRPC_PROXY_TIMEOUT", default_value = "0s", value_parser = parse_duration)]
    pub grpc_proxy_timeout: Duration,
    /// Dial retries after a failed dial (other failures are never retried).
    #[arg(long, env = "SANDBOX_ROUTER_UPSTREAM_MAX_RETRIES", default_value_t = 3)]
    pub upstream_max_retries: u32,
    /// First retry delay; doubles per retry.
    #[arg(long, env = "SANDBOX_ROUTER_UPSTREAM_RETRY_INITIAL_DELAY", default_value = "200ms", value_parser = parse_duration)]
    pub upstream_retry_initial_delay: Duration,
    /// Largest retry delay.
    #[arg(long, env = "SANDBOX_ROUTER_UPSTREAM_RETRY_MAX_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub upstream_retry_max_delay: Duration,
    /// Timeout of one dial attempt.
    #[arg(long, env = "SANDBOX_ROUTER_UPSTREAM_DIAL_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub upstream_dial_timeout: Duration,
    /// Largest request body forwarded (413 beyond); 0: unlimited.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_MAX_REQUEST_BODY_BYTES",
        default_value_t = 0
    )]
    pub max_request_body_bytes: u64,
    /// Accept loopback X-Sandbox-Pod-IP values (tests only: it lets clients reach the router's host).
    #[arg(long, env = "SANDBOX_ROUTER_ALLOW_LOOPBACK_POD_IP", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_loopback_pod_ip: bool,
    /// Watch sandbox Pods and route by the cache before falling back to DNS.
    #[arg(long, env = "SANDBOX_ROUTER_CACHE_ENABLED", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub cache_enabled: bool,
    /// Limit the Pod cache to one namespace; empty: all namespaces.
    #[arg(long, env = "SANDBOX_ROUTER_CACHE_NAMESPACE", default_value = "")]
    pub cache_namespace: String,
    /// kubeconfig for the Pod cache and TokenReview; default: in-cluster, then $KUBECONFIG.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Accepted for compatibility; this build exports no traces.
    #[arg(long, env = "SANDBOX_ROUTER_ENABLE_TRACING", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_tracing: bool,
    /// Accepted for compatibility; metrics are Prometheus only.
    #[arg(long, env = "SANDBOX_ROUTER_ENABLE_OTEL_METRICS", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_otel_metrics: bool,
    /// One log line per request.
    #[arg(long, env = "SANDBOX_ROUTER_ACCESS_LOG", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub access_log: bool,
    /// YAML file of flag values (keys are flag names, e.g. `proxy-timeout: 30s`).
    #[arg(long, env = "SANDBOX_ROUTER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Time open connections get to finish after SIGTERM.
    #[arg(long, env = "SANDBOX_ROUTER_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// allow-all, tokenreview (Bearer token checked by the API server) or scoped-token (HMAC tokens per sandbox).
    #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_MODE", value_enum, default_value_t = AuthzMode::AllowAll)]
    pub authz_mode: AuthzMode,
    /// How long a TokenReview answer is reused.
    #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_TOKENREVIEW_TTL", default_value = "30s", value_parser = parse_duration)]
    pub authz_tokenreview_ttl: Duration,
    /// How many TokenReview answers are kept (LRU).
    #[arg(
        long,
        env = "SANDBOX_ROUTER_AUTHZ_TOKENREVIEW_CACHE_SIZE",
        default_value_t = 2048
    )]
    pub authz_tokenreview_cache_size: usize,
    /// In tokenreview mode, reject requests without a Bearer token (otherwise they pass).
    #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_TOKENREVIEW_REQUIRE_TOKEN", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub authz_tokenreview_require_token: bool,
    /// Audiences sent in TokenReviews (comma-separated).
    #[arg(
        long,
        env = "SANDBOX_ROUTER_AUTHZ_TOKENREVIEW_AUDIENCES",
        value_delimiter = ','
    )]
    pub authz_tokenreview_audiences: Vec<String>,
    /// HMAC-SHA256 secret (at least 32 bytes; trailing whitespace ignored) for scoped tokens.
    #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_SCOPED_TOKEN_SECRET_FILE")]
    pub authz_scoped_token_secret_file: Option<PathBuf>,
    /// Route `<prefix>/<namespace>/<id>/<port>/...` URLs (prefix stripped); empty: off.
    #[arg(long, env = "SANDBOX_ROUTER_PATH_ROUTING_PREFIX", default_value = "")]
    pub path_routing_prefix: String,
    /// Origins (scheme://host[:port]) allowed on path-routed requests besides the router's own.
    #[arg(
        long,
        env = "SANDBOX_ROUTER_AUTHZ_COOKIE_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub authz_cookie_allowed_origins: Vec<String>,
    /// SameSite attribute of the session cookie.
    #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_COOKIE_SAMESITE", value_enum, default_value_t = SameSite::Lax)]
    pub authz_cookie_samesite: SameSite,
    /// Believe X-Forwarded-Proto (set it only behind a proxy that overwrites it).
    #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_TRUST_FORWARDED_PROTO", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub authz_trust_forwarded_proto: bool,
    /// Proxy worker threads, each with its own event loop, listening socket
    /// (SO_REUSEPORT) and upstream connection pool, like nginx's worker
    /// processes; 0: one per CPU.
    #[arg(long, env = "SANDBOX_ROUTER_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// Serve HTTP/1.1 requests (plain or TLS) routed by X-Sandbox-* headers to a
    /// known Pod address on the router's own HTTP/1.1 path instead of hyper's
    /// server (anything else still goes to hyper, on the same connection).
    #[arg(long, env = "SANDBOX_ROUTER_HTTP1_FAST_PATH", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub http1_fast_path: bool,
    /// Log format: text or json.
    #[arg(long, env = "SANDBOX_ROUTER_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Export traces over OTLP/HTTP to this collector (`http://host:4318`): a
    /// span per proxied request, child of the caller's `traceparent`, whose
    /// own context goes on to sandboxd. Off when unset. While on, every
    /// request takes the hyper path (the HTTP/1.1 fast path makes no spans).
    #[arg(long, env = "SANDBOX_ROUTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Print a scoped token for one sandbox (for --authz-mode=scoped-token).
    MintToken {
        #[arg(long, env = "SANDBOX_ROUTER_AUTHZ_SCOPED_TOKEN_SECRET_FILE")]
        secret_file: PathBuf,
        #[arg(long, default_value = "default")]
        namespace: String,
        #[arg(long)]
        name: String,
        /// Lifetime, e.g. 1h.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        ttl: Duration,
    },
}

// Go-style durations (a bare number is seconds) and listen addresses (`:8080`,
// host names resolved, `0` disables): the parsers every Sandhub binary uses.
pub use sandhub_common::{parse_bind, parse_duration};

/// Parses the process arguments, folding in the `--config` file.
pub fn load() -> anyhow::Result<Args> {
    load_from(std::env::args_os().collect())
}

pub fn load_from(argv: Vec<OsString>) -> anyhow::Result<Args> {
    let cmd = Args::command();
    let matches = cmd
        .clone()
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| e.exit());
    let Some(path) = matches.get_one::<PathBuf>("config").cloned() else {
        return Ok(Args::from_arg_matches(&matches)?);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading --config {}", path.display()))?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text)
        .with_context(|| format!("parsing --config {}", path.display()))?;
    let map = match doc {
        serde_yaml::Value::Mapping(m) => m,
        serde_yaml::Value::Null => Default::default(),
        _ => bail!(
            "--config {}: expected a mapping of flag names to values",
            path.display()
        ),
    };
    let mut from_file = Vec::new();
    for (key, value) in map {
        let key = key
            .as_str()
            .with_context(|| format!("--config {}: keys must be strings", path.display()))?
            .to_owned();
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .with_context(|| format!("--config {}: unknown key {key:?}", path.display()))?;
        if key == "config" {
            bail!(
                "--config {}: a config file cannot name another",
                path.display()
            );
        }
        // A flag given on the command line wins over the file.
        if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        from_file.push(OsString::from(format!(
            "--{key}={}",
            yaml_scalar(&key, &value)?
        )));
    }
    // Inserted before any subcommand, so they parse as top-level flags.
    let mut merged = vec![argv
        .first()
        .cloned()
        .unwrap_or_else(|| "sandhub-router".into())];
    merged.extend(from_file);
    merged.extend(argv.into_iter().skip(1));
    let matches = cmd
        .try_get_matches_from(merged)
        .unwrap_or_else(|e| e.exit());
    Ok(Args::from_arg_matches(&matches)?)
}

fn yaml_scalar(key: &str, v: &serde_yaml::Value) -> anyhow::Result<String> {
    use serde_yaml::Value;
    Ok(match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        Value::Sequence(items) => items
            .iter()
            .map(|i| yaml_scalar(key, i))
            .collect::<anyhow::Result<Vec<_>>>()?
            .join(","),
        _ => bail!("config key {key:?}: expected a scalar or a list"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_file_and_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("router.yaml");
        std::fs::write(
            &file,
            "proxy-timeout: 30s\nupstream-max-retries: 7\naccess-log: false\nauthz-cookie-allowed-origins: [https://a.example, https://b.example]\n",
        )
        .unwrap();
        let args = load_from(
            [
                "sandhub-router",
                "--config",
                file.to_str().unwrap(),
                "--upstream-max-retries",
                "1",
            ]
            .map(OsString::from)
            .to_vec(),
        )
        .unwrap();
        assert_eq!(args.proxy_timeout, Duration::from_secs(30));
        assert_eq!(args.upstream_max_retries, 1);
        assert!(!args.access_log);
        assert_eq!(
            args.authz_cookie_allowed_origins,
            ["https://a.example", "https://b.example"]
        );
        assert_eq!(args.cluster_domain, "cluster.local");
    }
}
