//! The two ways the tool set is served: streamable HTTP (mounted by the
//! hub at `/mcp`) and stdio (the `sandhub-mcp` binary, `sandhub mcp`).

use std::sync::Arc;

use rmcp::{
    transport::{
        stdio,
        streamable_http_server::{session::local::LocalSessionManager, StreamableHttpService},
        StreamableHttpServerConfig,
    },
    ServiceExt,
};

pub use crate::binding::McpService;
use crate::{
    provider::SandboxesProvider,
    server::McpOptions,
    shared::{RmcpStore, SharedSessions},
    SandhubMcp,
};

/// Streamable HTTP with default limits and rmcp's default config (which
/// accepts only loopback `Host` headers; see
/// [`streamable_http_service_with`] to serve other names).
pub fn streamable_http_service<P: SandboxesProvider>(provider: P) -> McpService<P> {
    streamable_http_service_with(
        provider,
        McpOptions::default(),
        StreamableHttpServerConfig::default(),
    )
}

/// Streamable HTTP: one [`SandhubMcp`] per MCP session (its
/// `Mcp-Session-Id`), kept in memory by a [`LocalSessionManager`] and
/// bound to the principal that opened it (see
/// [`SandboxesProvider::principal`]). The tool router is built once and
/// shared by every session.
pub fn streamable_http_service_with<P: SandboxesProvider>(
    provider: P,
    options: McpOptions,
    config: StreamableHttpServerConfig,
) -> McpService<P> {
    streamable_http_service_shared(provider, options, config, None)
}

/// As [`streamable_http_service_with`], and with `shared`, sessions any
/// replica can serve: each is recorded there (its principal, the client's
/// `initialize`), and a replica that does not know a session rebuilds it
/// from its record ([`crate::shared`]).
pub fn streamable_http_service_shared<P: SandboxesProvider>(
    provider: P,
    options: McpOptions,
    mut config: StreamableHttpServerConfig,
    shared: Option<Arc<dyn SharedSessions>>,
) -> McpService<P> {
    if let Some(shared) = &shared {
        config.session_store = Some(Arc::new(RmcpStore(shared.clone())));
    }
    let provider = Arc::new(provider);
    let options = Arc::new(options);
    let router = SandhubMcp::<P>::router();
    let sessions = Arc::new(LocalSessionManager::default());
    let factory_provider = provider.clone();
    let inner = StreamableHttpService::new(
        move || {
            Ok(SandhubMcp::with_router(
                factory_provider.clone(),
                options.clone(),
                router.clone(),
            ))
        },
        sessions.clone(),
        config,
    );
    McpService::new(inner, sessions, provider, shared)
}

/// Serves one session on stdin/stdout until the client disconnects.
/// Logs must go to stderr: stdout carries the protocol.
pub async fn serve_stdio<P: SandboxesProvider>(provider: P) -> anyhow::Result<()> {
    serve_stdio_with(provider, McpOptions::default()).await
}

pub async fn serve_stdio_with<P: SandboxesProvider>(
    provider: P,
    options: McpOptions,
) -> anyhow::Result<()> {
    let server = SandhubMcp::with_options(Arc::new(provider), Arc::new(options));
    let running = server
        .serve(stdio())
        .await
        .map_err(|e| anyhow::anyhow!("MCP handshake on stdio failed: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| anyhow::anyhow!("MCP stdio session ended abnormally: {e}"))?;
    Ok(())
}
