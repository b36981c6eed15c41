//! [`SandhubMcp`]: the MCP server handler of one session.

use std::{borrow::Cow, panic::AssertUnwindSafe, sync::Arc};

use futures::FutureExt;
use rmcp::{
    handler::server::{common::FromContextPart, router::tool::ToolRouter, tool::ToolCallContext},
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        InitializeResult, JsonObject, ListResourceTemplatesResult, ListResourcesResult,
        ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
        ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
    },
    service::RequestContext,
    ErrorData, RoleServer, ServerHandler,
};
use sandhub_api::error::Code;
use sandhub_client::Sandboxes;
use serde_json::Value;
use tracing::Instrument;

use crate::{
    errors::ToolError,
    process::ProcessTable,
    provider::SandboxesProvider,
    session::{Session, SESSION_LABEL},
};

// The tool implementations are `impl SandhubMcp` blocks (rmcp's routers), so
// they live under the server they extend: a child, not a sibling that would
// import its parent back.
mod tools;

/// Limits that keep one session from flooding the model or the server.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// Per stream, for `execute_command` and each `read_process_output`.
    pub max_output_bytes: usize,
    /// Unread output kept per stream of a background process.
    pub process_buffer_bytes: usize,
    /// Largest file `download_file` returns.
    pub max_file_bytes: usize,
    /// Background processes one session tracks at once.
    pub max_processes: usize,
}

impl Default for McpOptions {
    fn default() -> Self {
        McpOptions {
            max_output_bytes: 64 * 1024,
            process_buffer_bytes: 1024 * 1024,
            max_file_bytes: 8 * 1024 * 1024,
            max_processes: 32,
        }
    }
}

/// What the client passes to the model about this server as a whole.
const INSTRUCTIONS: &str = concat!(
    "Sandhub gives you isolated Linux sandboxes. Call create_sandbox first; its ",
    "sandbox_claim_name names the sandbox in every other tool. Files live under /workspace ",
    "(the working directory of commands); file tools take paths relative to it. Use ",
    "execute_command for short commands, and start_process with read_process_output for ",
    "long-running ones (servers, test suites). Sandboxes are private to this session and ",
    "expire after shutdown_after_seconds; call delete_sandbox when done.",
);

/// The Sandhub MCP server of one session: its tools, its resource, and the
/// sandboxes and processes it owns. One instance serves one stdio
/// connection, or one streamable-HTTP session (the service makes one per
/// session).
pub struct SandhubMcp<P> {
    pub(crate) provider: Arc<P>,
    pub(crate) options: Arc<McpOptions>,
    pub(crate) session: Session,
    tool_router: ToolRouter<Self>,
}

impl<P: SandboxesProvider> SandhubMcp<P> {
    /// A session over `provider`'s sandboxes, with default limits.
    pub fn new(provider: P) -> Self {
        Self::with_options(Arc::new(provider), Arc::new(McpOptions::default()))
    }

    /// A session sharing `provider` and `options` with other sessions.
    pub fn with_options(provider: Arc<P>, options: Arc<McpOptions>) -> Self {
        Self::with_router(provider, options, Self::router())
    }

    pub(crate) fn with_router(
        provider: Arc<P>,
        options: Arc<McpOptions>,
        tool_router: ToolRouter<Self>,
    ) -> Self {
        let processes = ProcessTable::new(options.max_processes, options.process_buffer_bytes);
        SandhubMcp {
            provider,
            options,
            session: Session::new(processes),
            tool_router,
        }
    }

    /// Every tool, from each module's router.
    pub(crate) fn router() -> ToolRouter<Self> {
        let mut router = Self::sandbox_router()
            + Self::exec_router()
            + Self::code_router()
            + Self::files_router()
            + Self::process_router()
            + Self::lifecycle_router()
            + Self::ports_router()
            + Self::metrics_router()
            + Self::volumes_router();
        for route in router.map.values_mut() {
            unwrap_descriptions(Arc::make_mut(&mut route.attr.input_schema));
            if let Some(output) = route.attr.output_schema.as_mut() {
                unwrap_descriptions(Arc::make_mut(output));
            }
        }
        router
    }

    /// This session's id (the value of its sandboxes' session label).
    pub fn session_id(&self) -> &str {
        self.session.id()
    }

    /// Over HTTP, the session's id comes from its `Mcp-Session-Id`, so every
    /// replica serving it derives the same one (see `session.rs`).
    fn bind_session(&self, context: &RequestContext<RoleServer>) {
        if let Some(id) = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
        {
            self.session.bind_http(id);
        }
    }

    /// The tools this server lists, sorted by name.
    pub fn tools(&self) -> Vec<Tool> {
        self.tool_router.list_all()
    }

    pub(crate) fn sandboxes_for(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Arc<dyn Sandboxes>, ToolError> {
        let parts = context.extensions.get::<http::request::Parts>();
        self.provider
            .sandboxes(parts)
            .map_err(|e| ToolError::hub("reaching the hub", e))
    }

    /// The sandbox `id` names, if this session owns it: it created it (the
    /// fast path, no round trip), or it carries this session's label (a
    /// creation whose answer was lost to a timeout).
    pub(crate) async fn owned(
        &self,
        hub: Hub,
        id: &str,
    ) -> Result<(Arc<dyn Sandboxes>, String), ToolError> {
        let id = id.trim();
        if id.is_empty() {
            return Err(ToolError::new(
                "sandbox_claim_name is empty; pass the id that create_sandbox returned",
            ));
        }
        let sb = hub.get()?;
        if self.session.owns(id) {
            return Ok((sb, id.to_string()));
        }
        match sb.get(id).await {
            Ok(s) if s.labels.get(SESSION_LABEL).map(String::as_str) == Some(self.session.id()) => {
                self.session.adopt(id);
                Ok((sb, id.to_string()))
            }
            Ok(_) => Err(ToolError::sandbox_not_found(id)),
            Err(e) if matches!(e.code, Code::NotFound | Code::InvalidArgument) => {
                Err(ToolError::sandbox_not_found(id))
            }
            Err(e) => Err(ToolError::hub(&format!("looking up sandbox {id}"), e)),
        }
    }

    /// A tool error for arguments that did not deserialize, naming the
    /// tool's required fields so the model can fix the call in one go.
    fn argument_error(&self, tool: &str, detail: &str) -> CallToolResult {
        let required = self
            .tool_router
            .get(tool)
            .and_then(|t| t.input_schema.get("required").cloned())
            .and_then(|r| serde_json::from_value::<Vec<String>>(r).ok())
            .filter(|r| !r.is_empty())
            .map(|r| format!(" Required arguments: {}.", r.join(", ")))
            .unwrap_or_default();
        CallToolResult::error(vec![ContentBlock::text(format!(
            "invalid arguments for {tool}: {detail} ({}).{required} Check the tool's input \
             schema and call it again.",
            Code::InvalidArgument
        ))])
    }
}

/// The [`Sandboxes`] a call acts on, resolved from the request that
/// carried it. Resolution failure is kept, not raised: an extractor error
/// would be a protocol error, and the model would never see why.
pub(crate) struct Hub(Result<Arc<dyn Sandboxes>, ToolError>);

impl Hub {
    pub fn get(self) -> Result<Arc<dyn Sandboxes>, ToolError> {
        self.0
    }
}

impl<P: SandboxesProvider> FromContextPart<ToolCallContext<'_, SandhubMcp<P>>> for Hub {
    fn from_context_part(
        context: &mut ToolCallContext<'_, SandhubMcp<P>>,
    ) -> Result<Self, ErrorData> {
        Ok(Hub(context.service.sandboxes_for(&context.request_context)))
    }
}

/// The hub's URL as seen by the client of this call (for port URLs);
/// `None` when it cannot be known.
pub(crate) struct HubUrl(pub Option<String>);

impl<P: SandboxesProvider> FromContextPart<ToolCallContext<'_, SandhubMcp<P>>> for HubUrl {
    fn from_context_part(
        context: &mut ToolCallContext<'_, SandhubMcp<P>>,
    ) -> Result<Self, ErrorData> {
        let parts = context
            .request_context
            .extensions
            .get::<http::request::Parts>();
        Ok(HubUrl(context.service.provider.hub_url(parts)))
    }
}

/// rmcp's prefix for arguments that did not deserialize (it already turns
/// them into tool errors; we only make the message actionable).
const ARGUMENT_ERROR_PREFIX: &str = "failed to deserialize parameters: ";

impl<P: SandboxesProvider> ServerHandler for SandhubMcp<P> {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .build();
        let mut info = InitializeResult::new(capabilities).with_instructions(INSTRUCTIONS);
        info.server_info = Implementation::new("sandhub", env!("CARGO_PKG_VERSION"))
            .with_title("Sandhub sandboxes");
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        info
    }

    /// Only the revisions with an `initialize` handshake. Sandbox ownership
    /// is per session, and 2026-07-28 removed sessions: a client that
    /// probes with `server/discover` falls back to the handshake, and gets
    /// a session (an `Mcp-Session-Id` over HTTP, the connection on stdio).
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let span = tool_span(&name, &context);
        self.call_tool_inner(name, request, context)
            .instrument(span)
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![
            tools::sandbox::default_resource(),
        ]))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            tools::sandbox::resource_template(),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.bind_session(&context);
        self.read_sandboxes_resource(&request.uri, &context)
            .await
            .map(Into::into)
    }
}

/// Parameter descriptions come from doc comments, wrapped at the source's
/// line width; a model reads them better as plain sentences.
fn unwrap_descriptions(schema: &mut JsonObject) {
    for (key, value) in schema.iter_mut() {
        match value {
            Value::String(s) if key == "description" && s.contains('\n') => {
                *s = s.replace('\n', " ");
            }
            Value::Object(o) => unwrap_descriptions(o),
            Value::Array(items) => {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    unwrap_descriptions(item);
                }
            }
            _ => {}
        }
    }
}

/// The first argument whose JSON type its schema does not allow, described
/// for the model. Only plain `type` constraints are checked; everything
/// else is left to deserialization.
fn mistyped(schema: &JsonObject, arguments: Option<&JsonObject>) -> Option<String> {
    let properties = schema.get("properties")?.as_object()?;
    arguments?.iter().find_map(|(name, value)| {
        let allowed: Vec<&str> = match properties.get(name)?.get("type")? {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return None,
        };
        let fits = allowed.iter().any(|t| match *t {
            "string" => value.is_string(),
            "number" => value.is_number(),
            "integer" => value.is_i64() || value.is_u64(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "null" => value.is_null(),
            _ => true,
        });
        (!fits).then(|| {
            let wanted: Vec<&str> = allowed.into_iter().filter(|t| *t != "null").collect();
            format!(
                "{name} must be {}, not {}",
                wanted.join(" or "),
                json_type(value)
            )
        })
    })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The span of one tool call, named `tools/call <tool>` (the tool's name
/// only: its arguments are the caller's command text, paths and env, and
/// never go into a span). Its parent: over HTTP, the hub's request span
/// (in the request's extensions, since tool calls run on the session's
/// task) or the `traceparent` the client sent; on stdio a new trace.
fn tool_span(name: &str, context: &RequestContext<RoleServer>) -> tracing::Span {
    if !sandhub_telemetry::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: "sandhub::trace",
        "tool",
        otel.name = format!("tools/call {name}"),
        mcp.tool = name,
    );
    let parent = context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| {
            parts
                .extensions
                .get::<sandhub_telemetry::Parent>()
                .cloned()
                .or_else(|| sandhub_telemetry::Parent::from_headers(&parts.headers))
        });
    if let Some(parent) = parent {
        parent.adopt(&span);
    }
    span
}

impl<P: SandboxesProvider> SandhubMcp<P> {
    async fn call_tool_inner(
        &self,
        name: String,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.bind_session(&context);
        // serde names a mistyped field's expected type but not the field;
        // checking the JSON types first lets the message name it.
        if let Some(tool) = self.tool_router.get(&name) {
            if let Some(detail) = mistyped(&tool.input_schema, request.arguments.as_ref()) {
                return Ok(self.argument_error(&name, &detail).into());
            }
        }
        let call = ToolCallContext::new(self, request, context);
        // A bug in one tool must cost one failed call, not the session.
        let result = match AssertUnwindSafe(self.tool_router.call(call))
            .catch_unwind()
            .await
        {
            Ok(result) => result?,
            Err(_) => {
                tracing::error!(tool = %name, "tool panicked");
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "{name} failed with an internal error; retry once, and report it if it \
                     persists"
                ))])
                .into());
            }
        };
        Ok(match result {
            CallToolResponse::Complete(r) if r.is_error == Some(true) => {
                let detail = r
                    .content
                    .first()
                    .and_then(|c| c.as_text())
                    .and_then(|t| t.text.strip_prefix(ARGUMENT_ERROR_PREFIX))
                    .map(str::to_string);
                match detail {
                    Some(detail) => self.argument_error(&name, &detail).into(),
                    None => r.into(),
                }
            }
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn mistyped_arguments_are_named() {
        let schema = obj(serde_json::json!({
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": ["number", "null"]},
                "max_entries": {"type": ["integer", "null"]},
                "signal": {"anyOf": [{"$ref": "#/$defs/KillSignal"}, {"type": "null"}]}
            }
        }));
        let check = |args: Value| mistyped(&schema, Some(&obj(args)));
        assert_eq!(
            check(serde_json::json!({"command": "ls", "timeout": 5})),
            None
        );
        assert_eq!(
            check(serde_json::json!({"timeout": null, "extra": 1})),
            None
        );
        assert_eq!(check(serde_json::json!({"signal": "HUP"})), None);
        assert_eq!(
            check(serde_json::json!({"timeout": "soon"})).unwrap(),
            "timeout must be number, not a string"
        );
        assert_eq!(
            check(serde_json::json!({"max_entries": 1.5})).unwrap(),
            "max_entries must be integer, not a number"
        );
        assert_eq!(
            check(serde_json::json!({"command": ["ls"]})).unwrap(),
            "command must be string, not an array"
        );
        assert_eq!(mistyped(&schema, None), None);
    }
}
