//! MCP over HTTP: the `sandhub-mcp` tool set mounted at `/mcp`, each call
//! acting as its request's tenant. (`sandhub mcp` on stdio is `crate::mcp`.)

use std::sync::Arc;

use sandhub_client::{Error, Sandboxes};
use tokio_util::sync::CancellationToken;

use super::{Tenant, OPEN_TENANT};
use crate::backend::Backend;

/// Each MCP call acts as the tenant its HTTP request authenticated as.
pub struct TenantSandboxes(pub Arc<dyn Backend>);

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

    /// The hub as the MCP client reached it: its Host (and the scheme a
    /// TLS-terminating proxy says it used).
    fn hub_url(&self, parts: Option<&http::request::Parts>) -> Option<String> {
        let h = &parts?.headers;
        let host = h.get(http::header::HOST)?.to_str().ok()?;
        let proto = h
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .filter(|p| matches!(*p, "http" | "https"))
            .unwrap_or("http");
        Some(format!("{proto}://{host}"))
    }
}

/// The streamable HTTP service for `/mcp`, and the token that ends its
/// open streams at shutdown.
pub fn http_service(
    hub: Arc<dyn Backend>,
    authenticated: bool,
) -> (sandhub_mcp::McpService<TenantSandboxes>, CancellationToken) {
    let mut config = sandhub_mcp::StreamableHttpServerConfig::default();
    // rmcp accepts only loopback Host headers by default (DNS rebinding);
    // with API keys every request is authenticated anyway.
    if authenticated {
        config = config.disable_allowed_hosts();
    }
    let stop = config.cancellation_token.clone();
    let shared = hub.shared_mcp_sessions();
    let service = sandhub_mcp::streamable_http_service_shared(
        TenantSandboxes(hub),
        sandhub_mcp::McpOptions::default(),
        config,
        shared,
    );
    (service, stop)
}
