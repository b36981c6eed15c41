//! The Sandhub MCP tool set: sandboxes, commands, files and processes for
//! LLM agents, generic over [`sandhub_client::Sandboxes`], so the same
//! tools run inside the hub (per tenant, streamable HTTP at `/mcp`) and in
//! a stdio process against a hub URL.
//!
//! Tool names, parameters and results follow upstream agent-sandbox's MCP
//! server, so prompts written for it work unchanged; the tools upstream
//! lacks (processes, reset, snapshot, watch) follow the same style.
//!
//! Integration is a provider and one call per transport:
//!
//! ```text
//! // The hub: each request's tenant, which its auth middleware put there.
//! struct TenantSandboxes(Arc<Hub>);
//! impl sandhub_mcp::SandboxesProvider for TenantSandboxes {
//!     fn sandboxes(&self, parts: Option<&http::request::Parts>)
//!         -> Result<Arc<dyn Sandboxes>, sandhub_client::Error> {
//!         let tenant = parts.and_then(|p| p.extensions.get::<Tenant>())
//!             .map_or(OPEN_TENANT.to_string(), |t| t.0.clone());
//!         Ok(Arc::new(self.0.tenant(tenant)))
//!     }
//! }
//! router.nest_service("/mcp", sandhub_mcp::streamable_http_service(TenantSandboxes(hub)));
//!
//! // stdio against a hub URL (`sandhub mcp --hub URL`).
//! let client: Arc<dyn Sandboxes> = Arc::new(HubClient::new(url, api_key)?);
//! sandhub_mcp::serve_stdio(client).await?;
//! ```

mod binding;
mod errors;
mod output;
mod paths;
mod process;
mod provider;
mod server;
mod session;
mod shared;
mod transport;

pub use provider::SandboxesProvider;
pub use server::{McpOptions, SandhubMcp};
pub use session::SESSION_LABEL;
pub use shared::{SharedSession, SharedSessions};
pub use transport::{
    serve_stdio, serve_stdio_with, streamable_http_service, streamable_http_service_shared,
    streamable_http_service_with, McpService,
};

/// rmcp's HTTP server config, re-exported so the hub can set allowed
/// hosts or a shutdown token without depending on rmcp itself.
pub use rmcp::transport::StreamableHttpServerConfig;
