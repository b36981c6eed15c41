//! The hub's REST API (`/v1/...`), described by `GET /openapi.json`.

mod auth;
mod error;
mod files;
mod json;
mod pools;
mod processes;
mod sandboxes;
mod service;
mod templates;

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
pub use error::{ApiError, ApiResult};
pub use json::{ApiJson, ApiJsonOrDefault};

pub use crate::guard::Limits;

use crate::tenancy::{Tenancy, TenantView};

/// JSON request bodies (exec, create, templates) are small; a larger one
/// is a mistake and gets 413 before it is read.
pub const MAX_JSON_BODY: usize = 1 << 20;

#[derive(Clone)]
pub struct AppState {
    pub hub: Arc<dyn Tenancy>,
    pub metrics: Arc<service::Metrics>,
    pub gym: Arc<crate::gym::Gym>,
    /// What the operator bounds for every tenant; [`app`] puts the checks
    /// in front of `hub`.
    pub limits: Limits,
}

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

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sandhub",
        description = "Isolated sandboxes for AI agents and RL trainers: create, exec, files, lifecycle, templates and pools."
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "sandboxes", description = "Create, list and delete sandboxes"),
        (name = "processes", description = "Run commands in a sandbox"),
        (name = "files", description = "Files in a sandbox's workspace"),
        (name = "lifecycle", description = "Suspend, resume, snapshot, reset, fork"),
        (name = "templates", description = "What a sandbox is"),
        (name = "pools", description = "Warm sandboxes, claimed in milliseconds"),
        (name = "gym", description = "Gym-style environments for RL trainers"),
        (name = "service", description = "Health, readiness, metrics")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
    }
}

/// Every route, and the OpenAPI document built from their annotations.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(sandboxes::routes())
        .merge(processes::routes())
        .merge(files::routes())
        .merge(templates::routes())
        .merge(pools::routes())
        .merge(service::routes())
        .merge(crate::gym::routes())
        .split_for_parts();
    complete_responses(&mut openapi);
    (router, openapi)
}

/// What the route annotations leave implicit: every response gets a
/// description (OpenAPI requires one), every operation behind the bearer
/// key documents its 401, and every operation with a body its 400 (bad or
/// unknown JSON), 413 (over [`MAX_JSON_BODY`]) and 415 (a content type
/// that is not JSON), which the extractors and the body limit answer for
/// every route alike.
fn complete_responses(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{
        path::Operation,
        response::{Response, ResponseBuilder},
        ContentBuilder, Ref, RefOr,
    };
    let error = |description: &str| -> RefOr<Response> {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
            .into()
    };
    let unauthenticated = error("No valid API key (only when the hub has an API keys file)");
    let bad_body = error("The body is not the JSON this operation takes");
    let too_large = error("The body is larger than the hub accepts");
    let not_json = error("The body's content type says it is not JSON");
    for item in openapi.paths.paths.values_mut() {
        let ops: [&mut Option<Operation>; 5] = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.head,
        ];
        for op in ops.into_iter().flatten() {
            // `security(())` marks the open routes; the rest inherit `bearer`.
            if op.security.is_none() {
                op.responses
                    .responses
                    .entry("401".to_string())
                    .or_insert_with(|| unauthenticated.clone());
            }
            if op.request_body.is_some() {
                let responses = &mut op.responses.responses;
                responses
                    .entry("400".to_string())
                    .or_insert_with(|| bad_body.clone());
                responses
                    .entry("413".to_string())
                    .or_insert_with(|| too_large.clone());
                responses
                    .entry("415".to_string())
                    .or_insert_with(|| not_json.clone());
            }
            for (status, response) in op.responses.responses.iter_mut() {
                if let RefOr::T(r) = response {
                    if r.description.is_empty() {
                        r.description = status
                            .parse::<u16>()
                            .ok()
                            .and_then(|s| axum::http::StatusCode::from_u16(s).ok())
                            .and_then(|s| s.canonical_reason())
                            .unwrap_or("Response")
                            .to_string();
                    }
                }
            }
        }
    }
}

/// The whole HTTP app: routes, OpenAPI, MCP at `/mcp`, auth, limits and
/// metrics; plus the token that ends MCP's open streams at shutdown.
pub fn app(
    state: AppState,
    keys: Option<Arc<ApiKeys>>,
) -> (Router, tokio_util::sync::CancellationToken) {
    let (router, openapi) = routes();
    let openapi = Arc::new(openapi);
    // Every front door below (REST, Gym, MCP) acts through this one view.
    let state = AppState {
        hub: crate::guard::Guarded::wrap(state.hub, state.limits),
        ..state
    };
    let (mcp, mcp_stop) = crate::mcp::http_service(state.hub.clone(), keys.is_some());
    let app = router
        .nest_service("/mcp", mcp)
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let doc = openapi.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        .fallback(service::not_found)
        .method_not_allowed_fallback(service::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(middleware::from_fn_with_state(keys, auth::authenticate))
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            service::count_requests,
        ))
        .with_state(state);
    (app, mcp_stop)
}
