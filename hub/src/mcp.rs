//! `sandhub mcp`: MCP on stdio, against a hub URL or an embedded local hub,
//! so a desktop client needs one command.

use std::{path::PathBuf, sync::Arc};

use clap::Args;
use sandhub_client::{http::HubClient, Sandboxes};

use crate::http::mcp::TenantSandboxes;

#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// Hub to act on; without one, an embedded local hub runs in-process.
    #[arg(long, env = "SANDHUB_URL")]
    pub hub: Option<String>,

    /// API key for the hub.
    #[arg(long, env = "SANDHUB_API_KEY")]
    pub api_key: Option<String>,

    /// State dir of the embedded hub (as `sandhub serve --state-dir`).
    #[arg(long, env = "SANDHUB_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Export traces (a span per tool call, its context sent to the hub)
    /// over OTLP/HTTP to this collector, as `sandhub serve --otlp-endpoint`.
    #[arg(long, env = "SANDHUB_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// The embedded hub's local backend (as `sandhub serve`).
    #[command(flatten)]
    pub local: crate::local::LocalArgs,

    /// Embedded hub: largest file `upload_file` may write (as `sandhub serve`).
    #[arg(long, env = "SANDHUB_MAX_UPLOAD_BYTES", default_value_t = sandhub_api::limits::DEFAULT_MAX_UPLOAD_BYTES)]
    pub max_upload_bytes: u64,
}

/// `sandhub mcp`: MCP on stdio, so a desktop client needs one command.
pub async fn run(args: McpArgs) -> anyhow::Result<()> {
    match args.hub {
        Some(url) => {
            let client: Arc<dyn Sandboxes> = Arc::new(HubClient::new(url, args.api_key)?);
            sandhub_mcp::serve_stdio(client).await
        }
        None => {
            let hub =
                crate::local::open(args.state_dir, &args.local, args.max_upload_bytes).await?;
            // Deadlines and pools still need minding while this process runs.
            hub.spawn_background(std::time::Duration::from_secs(1));
            let limits = crate::guard::Limits {
                max_upload_bytes: args.max_upload_bytes,
            };
            let served = sandhub_mcp::serve_stdio(TenantSandboxes(crate::guard::Guarded::wrap(
                Arc::new(hub.clone()),
                limits,
            )))
            .await;
            hub.shutdown();
            served
        }
    }
}
