//! Creating, inspecting, listing and deleting sandboxes, and the
//! `sandboxes://{namespace}` resource.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use rmcp::{
    handler::server::wrapper::Parameters,
    model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate},
    service::RequestContext,
    tool, tool_router, ErrorData, Json, RoleServer,
};
use sandhub_api::{
    error::Code,
    hub::{CreateSandbox, NetworkSpec, Sandbox, SandboxState},
    volumes::VolumeMount,
};
use sandhub_client::Sandboxes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{bounded, lifetime, seconds};
use crate::{
    errors::{during, ToolError, ToolResult},
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
    session::SESSION_LABEL,
};

const DEFAULT_WARMPOOL: &str = "default";
const DEFAULT_READY_TIMEOUT: f64 = 180.0;
const DEFAULT_SHUTDOWN_AFTER: u64 = 300;
/// How often a sandbox that came back `Pending` is looked at again.
const READY_POLL: Duration = Duration::from_millis(200);
const RESOURCE_SCHEME: &str = "sandboxes://";

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateSandboxParams {
    /// Name of a warm pool to take a ready sandbox from, or else of a template to start one
    /// from. Default "default".
    #[serde(default)]
    pub warmpool: Option<String>,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Seconds to wait for the sandbox to become ready. Default 180.
    #[serde(default)]
    pub sandbox_ready_timeout: Option<f64>,
    /// Labels to put on the sandbox, at most 64. Keys: letters, digits and - _ . / (at most
    /// 253 characters; the prefixes agents.x-k8s.io/, kubernetes.io/ and k8s.io/ are
    /// reserved); values: letters, digits and - _ . (at most 63 characters).
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Seconds after which the sandbox is deleted automatically. Default 300.
    #[serde(default)]
    pub shutdown_after_seconds: Option<u64>,
    /// Accepted for compatibility with upstream agent-sandbox (Kubernetes Pod labels); ignored.
    #[serde(default)]
    pub pod_labels: Option<BTreeMap<String, String>>,
    /// Accepted for compatibility with upstream agent-sandbox (Kubernetes Pod annotations);
    /// ignored.
    #[serde(default)]
    pub pod_annotations: Option<BTreeMap<String, String>>,
    /// Narrow the template's outbound network (never widen it): "none" for offline, or {"mode": "egress", "allow_out": [...], "deny_out": [...]} with patterns such as "pypi.org", "*.github.com", "203.0.113.0/24", "api.example.com:443". Default: the template's.
    #[serde(default)]
    #[schemars(schema_with = "network_schema")]
    pub network: Option<NetworkSpec>,
    /// Named volumes to mount (list_volumes shows which exist), at most 16, e.g.
    /// [{"name": "data", "path": "/workspace/data", "read_only": true}]. Paths are absolute;
    /// files written to a volume outlive the sandbox.
    #[serde(default)]
    pub volumes: Option<Vec<VolumeParam>>,
}

/// One volume to mount.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeParam {
    /// The volume's name, from list_volumes.
    pub name: String,
    /// Where it appears in the sandbox, e.g. /workspace/data.
    pub path: String,
    /// Mount it read-only. Default false.
    #[serde(default)]
    pub read_only: bool,
}

/// The schema of `network`: the REST API's words (`NetworkSpec` has its
/// own serde, so its schema is written out here).
fn network_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let list = |what: &str| {
        serde_json::json!({
            "type": "array",
            "maxItems": sandhub_api::network::MAX_NETWORK_ENTRIES,
            "items": {"type": "string", "maxLength": sandhub_api::network::MAX_PATTERN_LEN},
            "description": what,
        })
    };
    schemars::json_schema!({
        "description": "Narrow the template's outbound network (never widen it): \"none\" for offline, or {\"mode\": \"egress\", \"allow_out\": [...], \"deny_out\": [...]} with patterns such as \"pypi.org\", \"*.github.com\", \"203.0.113.0/24\", \"api.example.com:443\". Default: the template's.",
        "oneOf": [
            {"type": "string", "enum": ["none", "egress", "host"]},
            {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "mode": {"type": "string", "enum": ["none", "egress", "host"]},
                    "allow_out": list("Where the sandbox may connect; each entry within the template's"),
                    "deny_out": list("Where it may never connect (deny wins over allow)"),
                },
            },
        ],
    })
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CreateSandboxResult {
    /// The sandbox's id: pass it as sandbox_claim_name to every other tool.
    pub sandbox_claim_name: String,
    /// Pending, Ready, Paused, Suspended, Finished or Expired.
    pub state: String,
}

/// A sandbox named by the id create_sandbox returned.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SandboxParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListSandboxesParams {
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DeleteSandboxResult {
    pub sandbox_claim_name: String,
    pub deleted: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxStatus {
    /// The sandbox id.
    pub sandbox_claim_name: String,
    /// True when commands and file operations can run.
    pub ready: bool,
    /// Pending, Ready, Paused, Suspended, Finished or Expired.
    pub state: String,
    /// The template the sandbox was made from.
    pub template: String,
    /// "warm" (taken from a pool) or "cold" (started for this request).
    pub launch: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// When the sandbox will be deleted automatically (RFC 3339, UTC), if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_at: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl From<Sandbox> for SandboxStatus {
    fn from(s: Sandbox) -> Self {
        SandboxStatus {
            sandbox_claim_name: s.id,
            ready: s.state == SandboxState::Ready,
            state: s.state.as_str().to_string(),
            template: s.template,
            launch: match s.launch {
                sandhub_api::hub::Launch::Warm => "warm",
                sandhub_api::hub::Launch::Cold => "cold",
            }
            .to_string(),
            created_at: s.created_at,
            shutdown_at: s.shutdown_at,
            labels: s.labels,
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxList {
    /// This session's sandboxes.
    pub sandboxes: Vec<SandboxStatus>,
}

#[tool_router(router = sandbox_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Create an isolated Linux sandbox and return its id (sandbox_claim_name), \
        which every other tool takes. Files live under /workspace, which is also the working \
        directory of commands. The sandbox belongs to this session only and is deleted \
        automatically after shutdown_after_seconds (default 300); call delete_sandbox when \
        done.",
        annotations(
            title = "Create sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    pub async fn create_sandbox(
        &self,
        Parameters(p): Parameters<CreateSandboxParams>,
        hub: Hub,
    ) -> Result<Json<CreateSandboxResult>, ToolError> {
        let sb = hub.get()?;
        let ready_timeout = seconds(
            "sandbox_ready_timeout",
            p.sandbox_ready_timeout,
            DEFAULT_READY_TIMEOUT,
        )?;
        let shutdown_after = lifetime(
            "shutdown_after_seconds",
            p.shutdown_after_seconds.unwrap_or(DEFAULT_SHUTDOWN_AFTER),
        )?;
        let mut labels = p.labels.unwrap_or_default();
        if labels.contains_key(SESSION_LABEL) {
            return Err(ToolError::new(format!(
                "the label {SESSION_LABEL} is reserved (it ties the sandbox to this session); \
                 leave it out of labels"
            )));
        }
        // The hub's own rules (sandhub_api::validate), answered here
        // before any round trip, in the same words.
        sandhub_api::validate::labels(&labels).map_err(|e| ToolError::invalid(e.message))?;
        labels.extend(self.session.selector());
        if let Some(n) = &p.network {
            // Bad patterns are named here; a widening is the hub's to
            // refuse (it knows the template).
            sandhub_api::validate::network(n).map_err(|e| ToolError::invalid(e.message))?;
        }
        let volumes: Vec<VolumeMount> = p
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| VolumeMount {
                name: v.name,
                path: v.path,
                read_only: v.read_only,
            })
            .collect();
        sandhub_api::validate::volume_mounts(&volumes)
            .map_err(|e| ToolError::invalid(e.message))?;
        let name = p
            .warmpool
            .filter(|w| !w.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_WARMPOOL.to_string());
        // Upstream's `warmpool` names a pool; here it may also name a
        // template, so that "python" works whether or not it is kept warm.
        let (pool, template) = match sb.get_pool(&name).await {
            Ok(_) => (Some(name.clone()), None),
            Err(e) if e.code == Code::NotFound => (None, Some(name.clone())),
            Err(e) => return Err(ToolError::hub(&format!("looking up pool {name}"), e)),
        };
        let request = CreateSandbox {
            template,
            pool,
            labels,
            shutdown_after_seconds: Some(shutdown_after),
            network: p.network,
            volumes,
            ..CreateSandbox::default()
        };
        let created = bounded("creating the sandbox", ready_timeout, async {
            sb.create(request).await.map_err(|e| {
                if e.code == Code::NotFound {
                    ToolError::new(format!(
                        "no warm pool or template named {name:?}; omit warmpool to use the \
                         default template, or ask the user which templates exist ({})",
                        e.message
                    ))
                } else {
                    ToolError::hub("creating the sandbox", e)
                }
            })
        })
        .await?;
        // Owned from here on, so that even a sandbox that never becomes
        // ready can be inspected and deleted by the model.
        self.session.adopt(&created.id);
        let sandbox = wait_ready(sb.as_ref(), created, ready_timeout).await?;
        Ok(Json(CreateSandboxResult {
            sandbox_claim_name: sandbox.id,
            state: sandbox.state.as_str().to_string(),
        }))
    }

    #[tool(
        description = "Delete a sandbox of this session, with its files and processes.",
        annotations(
            title = "Delete sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn delete_sandbox(
        &self,
        Parameters(p): Parameters<SandboxParams>,
        hub: Hub,
    ) -> Result<Json<DeleteSandboxResult>, ToolError> {
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let id = id.as_str();
        match sb.delete(id).await {
            Ok(()) => {}
            // Already gone (expired): the goal is reached.
            Err(e) if e.code == Code::NotFound => {}
            Err(e) => return Err(ToolError::hub(&format!("deleting sandbox {id}"), e)),
        }
        self.session.forget(id);
        Ok(Json(DeleteSandboxResult {
            sandbox_claim_name: id.to_string(),
            deleted: true,
        }))
    }

    #[tool(
        description = "Show a sandbox's state: whether it is ready, its template, labels, and \
        when it was created and will be deleted.",
        annotations(
            title = "Sandbox status",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn get_sandbox_status(
        &self,
        Parameters(p): Parameters<SandboxParams>,
        hub: Hub,
    ) -> Result<Json<SandboxStatus>, ToolError> {
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let sandbox = sb.get(&id).await.map_err(|e| self.gone_or(&id, e))?;
        Ok(Json(sandbox.into()))
    }

    #[tool(
        description = "List the sandboxes this session created and that still exist.",
        annotations(
            title = "List sandboxes",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn list_sandboxes(
        &self,
        Parameters(_p): Parameters<ListSandboxesParams>,
        hub: Hub,
    ) -> Result<Json<SandboxList>, ToolError> {
        let sb = hub.get()?;
        Ok(Json(self.session_sandboxes(sb.as_ref()).await?))
    }
}

impl<P: SandboxesProvider> SandhubMcp<P> {
    async fn session_sandboxes(&self, sb: &dyn Sandboxes) -> ToolResult<SandboxList> {
        let sandboxes = sb
            .list(&self.session.selector())
            .await
            .map_err(during("listing sandboxes"))?;
        Ok(SandboxList {
            sandboxes: sandboxes.into_iter().map(Into::into).collect(),
        })
    }

    /// A hub error about sandbox `id`, where NOT_FOUND means it expired or
    /// was deleted elsewhere: the session stops claiming it.
    pub(crate) fn gone_or(&self, id: &str, e: sandhub_client::Error) -> ToolError {
        if e.code == Code::NotFound && e.message.contains(id) {
            self.session.forget(id);
            return ToolError::new(format!(
                "sandbox {id} no longer exists (it expired or was deleted); create a new one \
                 with create_sandbox"
            ));
        }
        ToolError::hub(&format!("reaching sandbox {id}"), e)
    }

    /// `sandboxes://{namespace}`: this session's sandboxes as JSON, the
    /// namespace being ignored as everywhere else.
    pub(crate) async fn read_sandboxes_resource(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        if !uri.starts_with(RESOURCE_SCHEME) {
            return Err(ErrorData::resource_not_found(
                format!("unknown resource {uri}; this server has sandboxes://{{namespace}}"),
                None,
            ));
        }
        let listing = async {
            let sb: Arc<dyn Sandboxes> = self.sandboxes_for(context)?;
            self.session_sandboxes(sb.as_ref()).await
        }
        .await
        .map_err(|e| ErrorData::internal_error(e.message().to_string(), None))?;
        let text = serde_json::to_string_pretty(&listing)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(
            text, uri,
        )
        .with_mime_type("application/json")]))
    }
}

/// The sandbox once it is `Ready`, polling a `Pending` one until `timeout`.
async fn wait_ready(sb: &dyn Sandboxes, mut sandbox: Sandbox, timeout: f64) -> ToolResult<Sandbox> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(timeout);
    loop {
        match sandbox.state {
            SandboxState::Ready => return Ok(sandbox),
            SandboxState::Pending => {}
            other => {
                return Err(ToolError::new(format!(
                    "sandbox {} is {} instead of Ready; delete it with delete_sandbox and \
                     create another",
                    sandbox.id,
                    other.as_str()
                )))
            }
        }
        if tokio::time::Instant::now() + READY_POLL > deadline {
            return Err(ToolError::new(format!(
                "sandbox {} is not ready after {timeout}s (still Pending); check it later \
                 with get_sandbox_status, or delete it and retry with a larger \
                 sandbox_ready_timeout",
                sandbox.id
            )));
        }
        tokio::time::sleep(READY_POLL).await;
        sandbox = sb
            .get(&sandbox.id)
            .await
            .map_err(during("waiting for the sandbox"))?;
    }
}

pub(crate) fn resource_template() -> ResourceTemplate {
    ResourceTemplate::new("sandboxes://{namespace}", "sandboxes")
        .with_title("This session's sandboxes")
        .with_description(
            "The sandboxes this MCP session created, as JSON. The namespace is accepted for \
             compatibility with upstream agent-sandbox and ignored.",
        )
        .with_mime_type("application/json")
}

pub(crate) fn default_resource() -> Resource {
    Resource::new("sandboxes://default", "sandboxes")
        .with_title("This session's sandboxes")
        .with_description("The sandboxes this MCP session created, as JSON.")
        .with_mime_type("application/json")
}
