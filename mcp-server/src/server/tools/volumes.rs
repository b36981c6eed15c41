//! `list_volumes`: the named volumes an agent may mount with
//! `create_sandbox`'s `volumes`. Agents see and mount the volumes they
//! are given; making, deleting or filling them is the hub's REST API
//! (a person or a program decides what data an agent gets).

use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    errors::ToolError,
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListVolumesParams {
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeInfo {
    /// Pass it as a volume's `name` to create_sandbox.
    pub name: String,
    /// Most MiB its files may take.
    pub size_mb: u64,
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListVolumesResult {
    pub volumes: Vec<VolumeInfo>,
}

#[tool_router(router = volumes_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "List the named volumes you may mount: disks whose files outlive any \
        sandbox (a dataset, a package cache, your earlier work). Mount one with create_sandbox's \
        `volumes`, e.g. [{\"name\": \"data\", \"path\": \"/workspace/data\", \"read_only\": true}].",
        annotations(
            title = "List volumes",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn list_volumes(
        &self,
        Parameters(_): Parameters<ListVolumesParams>,
        hub: Hub,
    ) -> Result<Json<ListVolumesResult>, ToolError> {
        let sb = hub.get()?;
        let volumes = sb
            .volumes()
            .await
            .map_err(|e| ToolError::hub("listing volumes", e))?;
        Ok(Json(ListVolumesResult {
            volumes: volumes
                .into_iter()
                .map(|v| VolumeInfo {
                    name: v.name,
                    size_mb: v.size_mb,
                    labels: v.labels,
                })
                .collect(),
        }))
    }
}
