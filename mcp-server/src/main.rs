//! `sandhub-mcp`: the Sandhub MCP tools against a hub URL.
//!
//! By default an MCP client (Claude Desktop, an agent framework) starts
//! this as a subprocess and speaks MCP on its stdin/stdout. With
//! `--listen`, it serves streamable HTTP at `/mcp` instead, for a hub that
//! is reached over the network but whose clients want MCP nearby. Either
//! way every tool call becomes a request to the hub.

use std::sync::Arc;

use clap::Parser;
use sandhub_client::{http::HubClient, Sandboxes};
use sandhub_mcp::{McpOptions, StreamableHttpServerConfig};

#[derive(Debug, Parser)]
#[command(
    name = "sandhub-mcp",
    version,
    about = "Sandhub's MCP tools over stdio"
)]
struct Args {
    /// The hub's URL.
    #[arg(
        long = "hub",
        value_name = "URL",
        env = "SANDHUB_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    hub: String,

    /// Sent as `Authorization: Bearer` (for hubs started with --api-keys-file).
    #[arg(
        long,
        value_name = "KEY",
        env = "SANDHUB_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,

    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (loopback
    /// addresses only: this endpoint checks no credentials).
    #[arg(long, value_name = "ADDR", env = "SANDHUB_MCP_LISTEN")]
    listen: Option<std::net::SocketAddr>,

    /// Per-stream cap on command output returned to the model, in bytes.
    #[arg(long, env = "SANDHUB_MCP_MAX_OUTPUT_BYTES", default_value_t = McpOptions::default().max_output_bytes)]
    max_output_bytes: usize,

    /// Largest file download_file returns, in bytes.
    #[arg(long, env = "SANDHUB_MCP_MAX_FILE_BYTES", default_value_t = McpOptions::default().max_file_bytes)]
    max_file_bytes: usize,

    /// Export traces over OTLP/HTTP to this collector (`http://host:4318`):
    /// a span per tool call, whose context each hub request carries, so the
    /// hub's spans join the same trace. Off when unset.
    #[arg(long, env = "SANDHUB_MCP_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // stdout is the protocol channel: logs go to stderr only. The guard
    // lives past the runtime: dropping it flushes queued spans.
    let _traces = sandhub_telemetry::init(
        sandhub_common::Logging::new("text").default_level(tracing::Level::WARN),
        args.otlp_endpoint.as_deref(),
        "sandhub-mcp",
    );
    if sandhub_telemetry::enabled() {
        sandhub_client::propagate::set_injector(sandhub_telemetry::inject_current);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let client: Arc<dyn Sandboxes> = Arc::new(HubClient::new(args.hub, args.api_key)?);
    let options = McpOptions {
        max_output_bytes: args.max_output_bytes,
        max_file_bytes: args.max_file_bytes,
        ..McpOptions::default()
    };
    match args.listen {
        None => sandhub_mcp::serve_stdio_with(client, options).await,
        Some(addr) => serve_http(addr, client, options).await,
    }
}

async fn serve_http(
    addr: std::net::SocketAddr,
    client: Arc<dyn Sandboxes>,
    options: McpOptions,
) -> anyhow::Result<()> {
    // Whoever reaches this endpoint acts with our API key, and it checks
    // no credentials of its own: loopback only. (The hub's own /mcp is the
    // networked, authenticated endpoint.)
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "--listen {addr}: serving MCP without authentication is for loopback addresses only; \
         use the hub's /mcp to serve a network"
    );
    let config = StreamableHttpServerConfig::default();
    // Open SSE streams would hold a graceful shutdown forever; cancelling
    // the service's token ends them first.
    let sessions = config.cancellation_token.clone();
    let service = sandhub_mcp::streamable_http_service_with(client, options, config);
    let app = axum::Router::new().nest_service("/mcp", service);
    // Before binding: a SIGTERM once we listen must shut down cleanly.
    let signals = sandhub_common::StopSignals::install()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!("serving MCP at http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            signals.recv().await;
            sessions.cancel();
        })
        .await?;
    Ok(())
}
