//! `expose_port`: the URL that reaches a TCP server inside a sandbox
//! through the hub (HTTP, SSE, WebSocket), so the model can hand it on or
//! fetch from it.

use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    errors::ToolError,
    provider::SandboxesProvider,
    server::{Hub, HubUrl, SandhubMcp},
};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExposePortParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// The TCP port the server inside the sandbox listens on (1 to 65535).
    pub port: u32,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ExposePortResult {
    /// Reaches the port through the hub; append the server's path. Send the
    /// hub's API key as `Authorization: Bearer` when it has keys.
    pub url: String,
    pub port: u16,
}

fn port_of(p: u32) -> Result<u16, ToolError> {
    match p {
        1..=65535 => Ok(p as u16),
        _ => Err(ToolError::invalid(format!(
            "port must be between 1 and 65535, not {p}"
        ))),
    }
}

#[tool_router(router = ports_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Return the URL that reaches a TCP port inside a sandbox (a web server, \
        an API, a notebook you started there, e.g. with start_process), through the hub. \
        HTTP, server-sent events and WebSocket work through it. The sandbox's network stays \
        private; nothing is published.",
        annotations(
            title = "Expose port",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn expose_port(
        &self,
        Parameters(p): Parameters<ExposePortParams>,
        hub: Hub,
        HubUrl(base): HubUrl,
    ) -> Result<Json<ExposePortResult>, ToolError> {
        let port = port_of(p.port)?;
        let (_, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let base = base.ok_or_else(|| {
            ToolError::new(
                "the hub's URL is not known to this MCP server, so no port URL can be given",
            )
        })?;
        Ok(Json(ExposePortResult {
            url: format!(
                "{}/v1/sandboxes/{id}/ports/{port}/",
                base.trim_end_matches('/')
            ),
            port,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_range_checked() {
        assert_eq!(port_of(8000).unwrap(), 8000);
        for bad in [0, 65536, u32::MAX] {
            assert!(port_of(bad)
                .unwrap_err()
                .message()
                .contains("INVALID_ARGUMENT"));
        }
    }
}
