//! `sandhub serve`: the hub service, on the local backend or on Kubernetes.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use axum::serve::ListenerExt;
use clap::{Args, ValueEnum};

use crate::{
    backend::Backend,
    http::{
        self,
        e2b::{E2b, Tokens},
        gym::Gym,
        hosts::HostRouting,
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

    /// How often deadlines, idle timeouts and dead sandboxes are checked.
    #[arg(long, env = "SANDHUB_REAP_INTERVAL", default_value = "1s", value_parser = sandhub_common::parse_duration)]
    pub reap_interval: Duration,
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
    // The local hub, kept to let go of its disk volume at the end.
    let mut local_hub = None;
    let (hub, gym, where_): (Arc<dyn Backend>, Arc<Gym>, String) = match args.backend {
        BackendKind::Local => {
            let hub =
                local::open(args.state_dir.clone(), &args.local, args.max_upload_bytes).await?;
            hub.spawn_background(args.reap_interval);
            local_hub = Some(hub.clone());
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
        BackendKind::Kubernetes => (
            // The same tenant quotas as the local backend (pool replicas).
            Arc::new(
                KubeTenancy::connect(
                    &args.kube,
                    Policy::resolve(&args.local.policy, local::runtime::host_memory_kib()),
                )
                .await?,
            ),
            // No store on this backend: envs live in this hub's memory.
            Arc::default(),
            format!("kubernetes, namespace {}", args.kube.namespace),
        ),
    };
    // The key the hub signs its tokens with (E2B access tokens, port
    // links): kept with the sandboxes on the local backend, so tokens
    // outlive a restart; on Kubernetes (no state dir) this process's own.
    let tokens = if !args.e2b && args.sandbox_domain.is_none() {
        None
    } else {
        Some(Arc::new(match args.backend {
            BackendKind::Local => Tokens::load_or_create(
                &args
                    .state_dir
                    .clone()
                    .unwrap_or_else(default_state_dir)
                    .join("signing.key"),
            )?,
            BackendKind::Kubernetes => Tokens::random(),
        }))
    };
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
    let (app, mcp_stop) = http::app(
        AppState {
            hub,
            metrics: Arc::default(),
            gym,
            limits: http::Limits {
                max_upload_bytes: args.max_upload_bytes,
            },
            hosts,
            ports: Arc::default(),
        },
        keys,
        e2b.clone(),
    );
    // Streamed answers (MCP's SSE, NDJSON) are written in small pieces;
    // without TCP_NODELAY, Nagle + delayed ACK adds ~40 ms to each.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?
        .tap_io(|stream| {
            let _ = stream.set_nodelay(true);
        });
    tracing::info!(addr = %args.listen, backend = %where_, "sandhub serving");
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
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            // Fails only without a signal driver; then serve until killed.
            if let Err(e) = sandhub_common::terminated().await {
                tracing::error!(error = %e, "no SIGTERM/SIGINT handler: serving until killed");
                std::future::pending::<()>().await;
            }
            // Open MCP event streams would hold the shutdown forever.
            mcp_stop.cancel();
        })
        .await?;
    // Sandboxes are separate process trees: they keep running, and the
    // next `sandhub serve` re-attaches to them.
    if let Some(hub) = local_hub {
        hub.shutdown();
    }
    tracing::info!("sandhub stopped; sandboxes keep running");
    Ok(())
}
