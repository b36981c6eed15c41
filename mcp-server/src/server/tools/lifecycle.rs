//! Whole-sandbox operations beyond create and delete: reset and snapshot.

use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::{bounded, sandbox::SandboxParams};
use crate::{
    errors::ToolError,
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

/// Both may copy or drop a whole workspace.
const LIFECYCLE_TIMEOUT: f64 = 600.0;

#[derive(Debug, Serialize, JsonSchema)]
pub struct ResetSandboxResult {
    pub sandbox_claim_name: String,
    /// Pending, Ready, Paused, Suspended, Finished or Expired.
    pub state: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotSandboxResult {
    /// Names the saved copy of the workspace.
    pub snapshot_id: String,
    /// RFC 3339, UTC.
    pub created_at: String,
}

#[tool_router(router = lifecycle_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Reset a sandbox to how it was created: every change to /workspace is \
        dropped and every process is killed. Faster than deleting and creating a new one.",
        annotations(
            title = "Reset sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn reset_sandbox(
        &self,
        Parameters(p): Parameters<SandboxParams>,
        hub: Hub,
    ) -> Result<Json<ResetSandboxResult>, ToolError> {
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let sandbox = bounded("the reset", LIFECYCLE_TIMEOUT, async {
            sb.reset(&id).await.map_err(|e| self.gone_or(&id, e))
        })
        .await?;
        Ok(Json(ResetSandboxResult {
            sandbox_claim_name: sandbox.id,
            state: sandbox.state.as_str().to_string(),
        }))
    }

    #[tool(
        description = "Save a copy of a sandbox's /workspace as it is now and return its \
        snapshot_id. The sandbox keeps running unchanged.",
        annotations(
            title = "Snapshot sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    pub async fn snapshot_sandbox(
        &self,
        Parameters(p): Parameters<SandboxParams>,
        hub: Hub,
    ) -> Result<Json<SnapshotSandboxResult>, ToolError> {
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let snapshot = bounded("the snapshot", LIFECYCLE_TIMEOUT, async {
            sb.snapshot(&id).await.map_err(|e| self.gone_or(&id, e))
        })
        .await?;
        Ok(Json(SnapshotSandboxResult {
            snapshot_id: snapshot.id,
            created_at: snapshot.created_at,
        }))
    }
}
