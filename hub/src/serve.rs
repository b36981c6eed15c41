//! `sandhub serve`: the hub service, on the local backend or on Kubernetes.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::{
    backend::Backend,
    http::{
        self,
        e2b::{E2b, Tokens},
        gym::Gym,
        hosts::HostRouting,
        proxy::{PortPool, ProxyLimits},
        ApiKeys, AppState,
    },
    kube::{KubeArgs, KubeTenancy},
    local::{self, default_state_dir, LocalArgs},
    policy::Policy,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Namespaced processes on this machine (embedded; nothing to install).
    Local,
    /// SandboxClaims served by sandhub-controller on a cluster.
    Kubernetes,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where sandboxes run.
    #[arg(long, env = "SANDHUB_BACKEND", value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,

    #[command(flatten)]
    pub kube: KubeArgs,

    /// Address to listen on. Anything but loopback requires --api-keys-file.
    #[arg(long, env = "SANDHUB_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// Where the state database, sandbox layers and sockets live
    /// (default: $XDG_DATA_HOME/sandhub, else ~/.local/share/sandhub).
    #[arg(long, env = "SANDHUB_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// `<key> <tenant>` per line; requests then need `Authorization: Bearer <key>`.
    #[arg(long, env = "SANDHUB_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// Tenants (comma-separated) whose keys also see every tenant's usage
    /// against its quotas: `GET /v1/admin/tenants`, the console's Operators view.
    #[arg(long, env = "SANDHUB_ADMIN_TENANTS", value_delimiter = ',')]
    pub admin_tenants: Vec<String>,

    #[command(flatten)]
    pub local: LocalArgs,

    /// Largest file one upload may write through the hub (REST `PUT
    /// .../files/...`, MCP `upload_file`, and the sandbox's own sandboxd);
    /// larger ones get 413 and leave nothing behind. Default 1 GiB.
    #[arg(long, env = "SANDHUB_MAX_UPLOAD_BYTES", default_value_t = sandhub_api::limits::DEFAULT_MAX_UPLOAD_BYTES)]
    pub max_upload_bytes: u64,

    /// Also answer E2B's API (control plane and envd) on this listener, so
    /// the `e2b` SDK works with E2B_API_URL=E2B_SANDBOX_URL=<this hub>.
    #[arg(long, env = "SANDHUB_E2B")]
    pub e2b: bool,

    /// Serve sandbox ports by host name: `{port}-{id}.<DOMAIN>` (a DNS
    /// wildcard, or `*.localhost`, pointing here; `:port` if not 80), for
    /// browser apps; `POST /v1/sandboxes/{id}/port-urls/{port}` mints links.
    #[arg(long, env = "SANDHUB_SANDBOX_DOMAIN")]
    pub sandbox_domain: Option<String>,

    /// The keys E2B access tokens and port links are signed with (a mounted
    /// Secret): one per line, newest first, each at least 32 bytes. Tokens
    /// are signed with the first and accepted under any. Required with
    /// --e2b or --sandbox-domain on the kubernetes backend, so that every
    /// replica opens every other's tokens; the local backend otherwise
    /// keeps a key of its own in its state dir.
    #[arg(long, env = "SANDHUB_SIGNING_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,

    /// How often deadlines, idle timeouts and dead sandboxes are checked.
    #[arg(long, env = "SANDHUB_REAP_INTERVAL", default_value = "1s", value_parser = sandhub_common::parse_duration)]
    pub reap_interval: Duration,

    #[command(flatten)]
    pub ports: PortArgs,

    /// On SIGTERM, how long the hub keeps taking new requests while
    /// `/readyz` fails, so that a Service stops sending it any (Kubernetes
    /// removes a terminating Pod's endpoint a few seconds late). Then it
    /// stops accepting and finishes what is in flight.
    #[arg(long, env = "SANDHUB_DRAIN_DELAY", default_value = "0s", value_parser = sandhub_common::parse_duration)]
    pub drain_delay: Duration,

    /// After the drain delay, how long requests in flight (an exec, a
    /// download) get to finish before the hub exits anyway.
    #[arg(long, env = "SANDHUB_DRAIN_TIMEOUT", default_value = "30s", value_parser = sandhub_common::parse_duration)]
    pub drain_timeout: Duration,

    /// Export traces over OTLP/HTTP (protobuf) to this collector, e.g.
    /// `http://127.0.0.1:4318` (`/v1/traces` is added). Off when unset:
    /// no span is made. The service name is `OTEL_SERVICE_NAME`, else
    /// `sandhub`.
    #[arg(long, env = "SANDHUB_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Bounds on traffic carried to sandbox ports (every proxying route).
#[derive(Debug, Clone, Args)]
pub struct PortArgs {
    /// Most requests to one sandbox's ports in flight at once (an upgraded
    /// connection counts until it closes); past it, 429.
    #[arg(
        long,
        env = "SANDHUB_PORT_MAX_REQUESTS_PER_SANDBOX",
        default_value_t = 256
    )]
    pub port_max_requests_per_sandbox: usize,

    /// Most requests to one tenant's sandbox ports in flight at once.
    #[arg(
        long,
        env = "SANDHUB_PORT_MAX_REQUESTS_PER_TENANT",
        default_value_t = 512
    )]
    pub port_max_requests_per_tenant: usize,

    /// How long a sandbox's server may take to start its answer; then 504.
    #[arg(long, env = "SANDHUB_PORT_RESPONSE_TIMEOUT", default_value = "300s", value_parser = sandhub_common::parse_duration)]
    pub port_response_timeout: Duration,

    /// How long an answer's body may go without a byte before it is cut.
    #[arg(long, env = "SANDHUB_PORT_IDLE_TIMEOUT", default_value = "300s", value_parser = sandhub_common::parse_duration)]
    pub port_idle_timeout: Duration,

    /// The same for WebSockets and other upgrades, and event streams (SSE).
    #[arg(long, env = "SANDHUB_PORT_STREAM_IDLE_TIMEOUT", default_value = "1h", value_parser = sandhub_common::parse_duration)]
    pub port_stream_idle_timeout: Duration,

    /// Serve plain HTTP/1.1 requests to sandbox ports on the fast path
    /// (the one sandhub-router runs), with the same checks as the rest of
    /// the API; `false` sends them through the general server. Local
    /// backend only, and off while traces are exported (`--otlp-endpoint`).
    #[arg(long, env = "SANDHUB_PORT_FAST_PATH", default_value_t = true, action = clap::ArgAction::Set)]
    pub port_fast_path: bool,
}

impl PortArgs {
    /// The limits, with the total sized from the descriptor limit.
    fn limits(&self, nofile: u64) -> ProxyLimits {
        ProxyLimits {
            per_sandbox: self.port_max_requests_per_sandbox.max(1),
            per_tenant: self.port_max_requests_per_tenant.max(1),
            total: ProxyLimits::total_for(nofile),
            response_timeout: self.port_response_timeout,
            idle_timeout: self.port_idle_timeout,
            stream_idle_timeout: self.port_stream_idle_timeout,
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one (systemd starts
/// services at 1024 soft, far below what a hub carrying many sandboxes
/// needs) and returns the limit in force.
fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit = getrlimit(Resource::Nofile),
            Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
        }
    }
    // Unlimited (`None`) is reported as such by no real kernel; a large
    // stand-in keeps the arithmetic simple.
    limit.current.unwrap_or(1 << 20)
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let keys = match &args.api_keys_file {
        Some(path) => Some(Arc::new(ApiKeys::load(path)?)),
        None if !args.listen.ip().is_loopback() => anyhow::bail!(
            "refusing to listen on {} without --api-keys-file: anyone who can reach it could run commands",
            args.listen
        ),
        None => None,
    };
    // Before binding: a SIGTERM once we listen must shut down cleanly.
    let signals = sandhub_common::StopSignals::install().context("SIGTERM/SIGINT handler")?;
    // Bound before anything is set up: a hub that cannot listen (the port
    // is taken) exits with nothing mounted. Streamed answers (MCP's SSE,
    // NDJSON) are written in small pieces; without TCP_NODELAY, Nagle +
    // delayed ACK adds ~40 ms to each.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let nofile = raise_nofile();
    // The local hub, kept to let go of its disk volume at the end, on
    // every way out.
    let mut local_hub = None;
    let served = serve(args, keys, listener, signals, nofile, &mut local_hub).await;
    if let Some(hub) = local_hub {
        hub.shutdown();
    }
    served
}

async fn serve(
    args: ServeArgs,
    keys: Option<Arc<ApiKeys>>,
    listener: tokio::net::TcpListener,
    signals: sandhub_common::StopSignals,
    nofile: u64,
    local_hub: &mut Option<Arc<local::Hub>>,
) -> anyhow::Result<()> {
    // Every backend keeps events and delivers webhooks.
    let events;
    let webhooks: Option<Arc<dyn crate::webhooks::WebhookService>>;
    // Kubernetes: freed at the end, so another replica delivers at once.
    let mut kube_webhooks = None;
    let (hub, gym, where_): (Arc<dyn Backend>, Arc<Gym>, String) = match args.backend {
        BackendKind::Local => {
            let hub =
                local::open(args.state_dir.clone(), &args.local, args.max_upload_bytes).await?;
            *local_hub = Some(hub.clone());
            let hooks = local::Hub::webhooks(&hub).clone();
            hooks.add_own_address(args.listen);
            hooks.load_operator_file().await?;
            events = Some(local::Hub::events(&hub).clone());
            webhooks = Some(hooks);
            hub.spawn_background(args.reap_interval);
            // Gym envs live in the same store as their sandboxes, so a
            // restart keeps both; idle ones are closed on the reaper's beat.
            let gym = Arc::new(Gym::persistent(hub.clone()));
            let backend: Arc<dyn Backend> = Arc::new(hub);
            gym.spawn_sweeper(backend.clone(), args.reap_interval);
            let state_dir = args.state_dir.clone().unwrap_or_else(default_state_dir);
            (
                backend,
                gym,
                format!("local, state in {}", state_dir.display()),
            )
        }
        BackendKind::Kubernetes => {
            // The same tenant quotas as the local backend (pool replicas).
            let kube = KubeTenancy::connect(
                &args.kube,
                Policy::resolve(&args.local.policy, local::runtime::host_memory_kib()),
                match &args.local.egress.secrets_file {
                    Some(p) => crate::secrets_file::OperatorSecrets::load(p)?,
                    None => Default::default(),
                },
                &args.local.events,
            )
            .await?;
            // Derived from the watches, per replica (kube/events.rs).
            events = Some(kube.events());
            // Delivered by the replica holding a Lease (kube/webhooks/).
            let hooks = Arc::new(kube.webhooks(&args.local.webhooks)?);
            hooks.add_own_address(args.listen);
            hooks.load_operator_file().await?;
            hooks.spawn();
            kube_webhooks = Some(hooks.clone());
            webhooks = Some(hooks);
            // Gym envs are ConfigMaps any replica reads; every replica
            // sweeps idle ones (a close that another already made is a no-op).
            let gym = Arc::new(Gym::persistent(Arc::new(kube.env_store())));
            let backend: Arc<dyn Backend> = Arc::new(kube);
            gym.spawn_sweeper(
                backend.clone(),
                args.reap_interval.max(Duration::from_secs(5)),
            );
            (
                backend,
                gym,
                format!("kubernetes, namespace {}", args.kube.namespace),
            )
        }
    };
    let tokens = signing_tokens(&args).await?;
    let e2b = match (&tokens, args.e2b) {
        (Some(t), true) => Some(Arc::new(
            E2b::new(
                t.clone(),
                keys.as_ref()
                    .map_or_else(|| vec![http::OPEN_TENANT.to_string()], |k| k.tenants()),
            )
            .with_domain(args.sandbox_domain.clone()),
        )),
        _ => None,
    };
    let hosts = match (&tokens, &args.sandbox_domain) {
        (Some(t), Some(domain)) => Some(Arc::new(HostRouting::new(domain, t.clone(), args.e2b))),
        _ => None,
    };
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (app, mcp_stop, fast) = http::app(
        AppState {
            hub,
            metrics: Arc::default(),
            gym,
            limits: http::Limits {
                max_upload_bytes: args.max_upload_bytes,
            },
            hosts,
            ports: Arc::new(PortPool::new(args.ports.limits(nofile))),
            draining: draining.clone(),
            events,
            webhooks,
            admin_tenants: args
                .admin_tenants
                .iter()
                .map(|t| t.trim().to_string())
                .collect(),
        },
        keys,
        e2b.clone(),
    );
    // The fast path has no span per request, and speaks to the port
    // directly, not through a router: otherwise every request takes hyper's.
    let fast_path = args.ports.port_fast_path
        && args.backend == BackendKind::Local
        && !sandhub_telemetry::enabled();
    let fast = fast_path.then(|| Arc::new(fast));
    tracing::info!(addr = %args.listen, backend = %where_, nofile, "sandhub serving");
    if e2b.is_some() {
        let url = format!("http://{}", args.listen);
        let key = if args.api_keys_file.is_some() {
            "<a key from the API keys file>"
        } else {
            "sandhub   # any key: this hub has no keys file"
        };
        eprintln!(
            "E2B API on this listener; point the e2b SDK here with:\n  \
             export E2B_API_URL={url} E2B_SANDBOX_URL={url}\n  export E2B_API_KEY={key}"
        );
    }
    let (drain_delay, drain_timeout) = (args.drain_delay, args.drain_timeout);
    let (stopping_tx, stopping) = tokio::sync::oneshot::channel::<()>();
    let server = http::listen::serve(listener, app, fast, async move {
        signals.recv().await;
        draining.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(delay = ?drain_delay, "draining: /readyz fails, still serving");
        tokio::time::sleep(drain_delay).await;
        tracing::info!(timeout = ?drain_timeout, "no new connections; finishing requests in flight");
        let _ = stopping_tx.send(());
        // Open MCP event streams would hold the shutdown forever.
        mcp_stop.cancel();
    });
    tokio::pin!(server);
    tokio::select! {
        served = &mut server => served.context("the listener")?,
        // Past the bound, requests still in flight are cut: a stuck client
        // must not keep a replica from ever stopping.
        _ = async {
            let _ = stopping.await;
            tokio::time::sleep(drain_timeout).await;
        } => tracing::warn!("requests still in flight after --drain-timeout; stopping anyway"),
    }
    if let Some(hooks) = kube_webhooks {
        hooks.release().await;
    }
    // Sandboxes are separate process trees: they keep running, and the
    // next `sandhub serve` re-attaches to them (`run` lets go of the disk).
    tracing::info!("sandhub stopped; sandboxes keep running");
    Ok(())
}

/// The keys the hub signs its own tokens with (E2B access tokens, port
/// links), when a surface that uses them is on: the operator's file, or on
/// the local backend the hub's own key kept with the sandboxes. Replicas on
/// Kubernetes must share one file, and check that they do before serving.
async fn signing_tokens(args: &ServeArgs) -> anyhow::Result<Option<Arc<Tokens>>> {
    if !args.e2b && args.sandbox_domain.is_none() {
        return Ok(None);
    }
    let tokens = match (&args.signing_key_file, args.backend) {
        (Some(path), _) => Tokens::from_file(path).context("--signing-key-file")?,
        (None, BackendKind::Local) => Tokens::load_or_create(
            &args
                .state_dir
                .clone()
                .unwrap_or_else(default_state_dir)
                .join("signing.key"),
        )?,
        (None, BackendKind::Kubernetes) => anyhow::bail!(
            "--e2b and --sandbox-domain on the kubernetes backend need --signing-key-file \
             (SANDHUB_SIGNING_KEY_FILE): every replica must sign with the same key, or a token \
             one replica issues fails on the next"
        ),
    };
    if args.backend == BackendKind::Kubernetes {
        let client = crate::kube::client(args.kube.kubeconfig.as_deref()).await?;
        crate::kube::signing::agree(&client, &args.kube.namespace, &tokens.fingerprints()).await?;
    }
    tracing::info!(fingerprints = ?tokens.fingerprints(), "signing keys loaded");
    Ok(Some(Arc::new(tokens)))
}
