//! The hub's REST API (`/v1/...`), described by `GET /openapi.json`.

mod auth;
mod error;
mod files;
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
pub use error::{ApiError, ApiJson, ApiResult};

use crate::service::{Hub, TenantHub};

/// JSON request bodies (exec, create, templates) are small; a larger one
/// is a mistake and gets 413 before it is read.
pub const MAX_JSON_BODY: usize = 1 << 20;

#[derive(Clone)]
pub struct AppState {
    pub hub: Arc<Hub>,
    pub metrics: Arc<service::Metrics>,
    pub gym: Arc<crate::gym::Gym>,
}

/// The hub as the request's tenant sees it.
pub struct Api(pub TenantHub);

impl FromRequestParts<AppState> for Api {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tenant = parts
            .extensions
            .get::<Tenant>()
            .ok_or_else(|| ApiError::new(Code::Unauthenticated, "no tenant"))?;
        Ok(Api(state.hub.tenant(tenant.0.clone())))
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
/// description (OpenAPI requires one), and every operation behind the
/// bearer key documents its 401.
fn complete_responses(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{
        path::Operation,
        response::{Response, ResponseBuilder},
        ContentBuilder, Ref, RefOr,
    };
    let unauthenticated: RefOr<Response> = ResponseBuilder::new()
        .description("No valid API key (only when the hub has an API keys file)")
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into();
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

/// The whole HTTP app: routes, OpenAPI, auth, limits and metrics.
pub fn app(state: AppState, keys: Option<Arc<ApiKeys>>) -> Router {
    let (router, openapi) = routes();
    let openapi = Arc::new(openapi);
    router
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
        .with_state(state)
}
