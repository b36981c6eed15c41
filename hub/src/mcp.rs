//! MCP on the hub: the `sandhub-mcp` tool set mounted at `/mcp` (per
//! tenant), and `sandhub mcp` on stdio, against a hub URL or an embedded one.

use std::{path::PathBuf, sync::Arc};

use clap::Args;
use sandhub_client::{http::HubClient, Error, Sandboxes};
use tokio_util::sync::CancellationToken;

use crate::{
    rest::{Tenant, OPEN_TENANT},
    tenancy::Tenancy,
};

/// Each MCP call acts as the tenant its HTTP request authenticated as.
pub struct TenantSandboxes(pub Arc<dyn Tenancy>);

fn tenant_of(parts: Option<&http::request::Parts>) -> &str {
    parts
        .and_then(|p| p.extensions.get::<Tenant>())
        .map_or(OPEN_TENANT, |t| t.0.as_str())
}

impl sandhub_mcp::SandboxesProvider for TenantSandboxes {
    fn sandboxes(&self, parts: Option<&http::request::Parts>) -> Result<Arc<dyn Sandboxes>, Error> {
        Ok(self.0.tenant(tenant_of(parts)))
    }

    /// An MCP session (its sandboxes, its processes' output) belongs to
    /// the tenant whose key opened it; another tenant's key with its
    /// `Mcp-Session-Id` finds no session.
    fn principal(&self, parts: &http::request::Parts) -> Option<String> {
        Some(tenant_of(Some(parts)).to_string())
    }
}

/// The streamable HTTP service for `/mcp`, and the token that ends its
/// open streams at shutdown.
pub fn http_service(
    hub: Arc<dyn Tenancy>,
    authenticated: bool,
) -> (sandhub_mcp::McpService<TenantSandboxes>, CancellationToken) {
    let mut config = sandhub_mcp::StreamableHttpServerConfig::default();
    // rmcp accepts only loopback Host headers by default (DNS rebinding);
    // with API keys every request is authenticated anyway.
    if authenticated {
        config = config.disable_allowed_hosts();
    }
    let stop = config.cancellation_token.clone();
    let service = sandhub_mcp::streamable_http_service_with(
        TenantSandboxes(hub),
        sandhub_mcp::McpOptions::default(),
        config,
    );
    (service, stop)
}

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

    /// The embedded hub's local backend (as `sandhub serve`).
    #[command(flatten)]
    pub local: crate::serve::LocalArgs,

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
                crate::serve::embedded_hub(args.state_dir, &args.local, args.max_upload_bytes)
                    .await?;
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
