//! The hub's HTTP app. This module owns what every front door shares: the
//! [`AppState`], auth ([`Tenant`], [`ApiKeys`]), the JSON extractors and
//! error answers, and [`app`], which merges the routers of its children.
//! Every front door acts through one guarded [`Backend`] view, so they work
//! unchanged on either backend.
//!
//! # Layout
//!
//! ```text
//! mod.rs       AppState, app(): the routers merged, the guard in front of the backend
//! auth.rs      API keys (SHA-256 digests) and the request's Tenant
//! error.rs     ApiError: every error as JSON {code, message}; 413 says Connection: close
//! json.rs      ApiJson: the one JSON body extractor (objects only, content types)
//! openapi.rs   the OpenAPI document's frame (title, tags, shared answers)
//! rest/        the REST API (/v1/...): sandboxes, processes (and their list, kept
//!              terminal shells), entrypoint logs, files, ports, templates, pools, images,
//!              prepull, health (probes, /metrics), admin (operators)
//! gym/         Gym-style environments (/gym/v1/...): envs, step matching, the registry
//!              (kept across restarts through backend::EnvStore)
//! mcp.rs       the sandhub-mcp tool set, mounted at /mcp
//! e2b/         the E2B-compatible API (--e2b): the control plane, and envd (process
//!              and filesystem over Connect-RPC, /files, signed file URLs), and volumes
//!              (/volumes, and /volumecontent authorized by a volume token)
//! hosts.rs     ports by host name (--sandbox-domain): {port}-{id}.D, link cookies
//! proxy/       carrying requests to sandbox ports, for every door:
//!   mod.rs       forwarding, upgrades, the headers the sandbox sees
//!   answer.rs    what a sandbox's answer may carry back (CSP sandbox, cookies)
//!   limits.rs    in-flight caps per sandbox, tenant and hub; head and idle timeouts
//! fast/        the port route's HTTP/1.1 fast path (sandhub-http1's server): plain
//!              requests to a port without hyper's server or axum, same checks
//! listen.rs    the listener: each connection to the fast path, then hyper and the app
//! browser.rs   refusing what only a sandbox's page could send (Origin, port cookies)
//! plain.rs     middleware without from_fn's per-request clone (auth, metrics, route tag)
//! console/     the web console at `/` (embedded files, CSP), the terminal's tickets
//! signing.rs   tokens the hub signs for itself (envd access, browser links)
//! trace.rs     the server span of every request (traceparent in), when traces export
//! upload.rs    a request body as an upload: the declared length refused past the cap,
//!              the stream cut off at it and drainable (files, volumes, images)
//! volume_store.rs  where a volume's files are, for rest/ and e2b/: the hub's own
//!              directory, or a Kubernetes volume's helper Pod
//! ```
//!
//! The children use this module's state and extractors; what two of them
//! share (the sandbox-host marker) lives here, so no two import each other
//! in a circle: `proxy` owns the link cookie's name, `hosts` uses it.

mod auth;
mod browser;
mod console;
pub mod e2b;
mod error;
pub mod fast;
pub mod gym;
pub mod hosts;
mod json;
pub mod listen;
pub mod mcp;
mod openapi;
mod plain;
pub mod proxy;
pub mod rest;
pub mod signing;
mod trace;
pub mod upload;
pub mod volume_store;

use std::sync::Arc;

use axum::{
    extract::{DefaultBodyLimit, FromRequestParts},
    http::request::Parts,
    middleware, Router,
};
use sandhub_api::error::Code;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use auth::{ApiKeys, Tenant, OPEN_TENANT};
pub use error::{ApiError, ApiPath, ApiQuery, ApiResult};
pub use json::{ApiJson, ApiJsonOrDefault};

pub use crate::guard::Limits;

use crate::backend::{Backend, TenantView};
use plain::PlainLayer;

/// JSON request bodies (exec, create, templates) are small; a larger one
/// is a mistake and gets 413 before it is read.
pub const MAX_JSON_BODY: usize = 1 << 20;

#[derive(Clone)]
pub struct AppState {
    pub hub: Arc<dyn Backend>,
    pub metrics: Arc<rest::health::Metrics>,
    pub gym: Arc<gym::Gym>,
    /// What the operator bounds for every tenant; [`app`] puts the checks
    /// in front of `hub`.
    pub limits: Limits,
    /// `--sandbox-domain`: ports by host name, and the URLs that open them.
    pub hosts: Option<Arc<hosts::HostRouting>>,
    /// Keep-alive connections to sandbox ports, for every door that proxies.
    pub ports: Arc<proxy::PortPool>,
    /// Set once the hub is stopping: `/readyz` fails, so load balancers
    /// send new requests to other replicas while this one finishes its own.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// The lifecycle event log (`GET /v1/events`), where the backend keeps one.
    pub events: Option<Arc<crate::events::EventLog>>,
    /// The tenants' webhooks (`/v1/webhooks`), where the backend has them.
    pub webhooks: Option<Arc<dyn crate::webhooks::WebhookService>>,
    /// `--admin-tenants`: whose keys also see every tenant's usage
    /// against its quotas (`GET /v1/admin/tenants`).
    pub admin_tenants: Arc<[String]>,
}

/// Marks a request that came to a sandbox's own host (`{port}-{id}.D`):
/// what it gets back is shown on that host's origin, not the hub's. Set
/// by `hosts`, read by `e2b`; kept here so neither imports the other.
#[derive(Debug, Clone, Copy)]
pub struct ViaSandboxHost;

/// The hub as the request's tenant sees it.
pub struct Api(pub Arc<dyn TenantView>);

impl FromRequestParts<AppState> for Api {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tenant = parts
            .extensions
            .get::<Tenant>()
            .ok_or_else(|| ApiError::new(Code::Unauthenticated, "no tenant"))?;
        Ok(Api(state.hub.tenant(&tenant.0)))
    }
}

/// Every route, and the OpenAPI document built from their annotations.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(rest::routes())
        .merge(gym::routes())
        .merge(console::api_routes())
        .split_for_parts();
    openapi::complete_responses(&mut openapi);
    (router, openapi)
}

/// The whole HTTP app: routes, OpenAPI, MCP at `/mcp`, auth, limits and
/// metrics; the token that ends MCP's open streams at shutdown; and what
/// the port route's fast path needs, over the same guarded backend.
pub fn app(
    state: AppState,
    keys: Option<Arc<ApiKeys>>,
    e2b: Option<Arc<e2b::E2b>>,
) -> (Router, tokio_util::sync::CancellationToken, fast::Ports) {
    let (mut router, openapi) = routes();
    if let Some(e2b) = &e2b {
        router = router
            .merge(e2b::control_routes())
            .layer(axum::Extension(e2b.clone()));
    }
    let openapi = Arc::new(openapi);
    // Every front door below (REST, Gym, MCP) acts through this one view.
    let state = AppState {
        hub: crate::guard::Guarded::wrap_measured(
            state.hub,
            state.limits,
            state.metrics.operations.clone(),
        ),
        ..state
    };
    let (mcp, mcp_stop) = mcp::http_service(state.hub.clone(), keys.is_some());
    let fast = fast::Ports::new(&state, keys.clone());
    let auth = auth::Auth {
        keys: keys.clone(),
        tickets: Arc::new(console::PtyTickets::default()),
    };
    let app = router
        .merge(console::file_routes())
        .layer(axum::Extension(auth.tickets.clone()))
        .layer(axum::Extension(Arc::new(rest::shells::Shells::default())))
        .layer(axum::Extension(Arc::new(
            rest::process_list::ProcessTable::default(),
        )))
        .nest_service("/mcp", mcp)
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = openapi.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        // Which route template served a request, for its metrics label.
        .route_layer(PlainLayer(rest::health::TagRoute))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(PlainLayer(auth));
    // envd traffic names its sandbox in a header and carries that
    // sandbox's token, not an API key: it turns off before auth.
    let app = match e2b {
        Some(e2b) => app.layer(middleware::from_fn_with_state(
            e2b::Diversion::new(state.clone(), e2b),
            e2b::divert,
        )),
        None => app,
    };
    // What only a sandbox's page could send never reaches a hub route.
    let app = app.layer(browser::GuardLayer);
    // Outermost: a request for `{port}-{id}.<domain>` is that port's (or,
    // on 49983, envd's, through the diversion above).
    let app = match state.hosts.clone() {
        Some(hosts) => app.layer(middleware::from_fn_with_state(
            (state.clone(), keys, hosts),
            hosts::route,
        )),
        None => app,
    };
    let app = app.layer(PlainLayer(rest::health::CountRequests(
        state.metrics.clone(),
    )));
    // Outermost: the span covers auth, routing and metrics too. Only with
    // an exporter: the layer costs a clone of the app per request.
    let app = if sandhub_telemetry::enabled() {
        app.layer(middleware::from_fn(trace::trace_request))
    } else {
        app
    };
    let app = app.with_state(state);
    (app, mcp_stop, fast)
}
