//! The OpenAPI document's frame: its title, tags and bearer scheme, and
//! what the route annotations leave implicit (descriptions, and the 400,
//! 401, 413 and 415 every route shares).

use utoipa::OpenApi;

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
        (name = "code", description = "Stateful code contexts (Jupyter kernels) with rich results"),
        (name = "files", description = "Files in a sandbox's workspace"),
        (name = "lifecycle", description = "Suspend, resume, snapshot, reset, fork"),
        (name = "templates", description = "What a sandbox is"),
        (name = "secrets", description = "Values the egress gateway puts into requests; write-only"),
        (name = "volumes", description = "Named volumes: a tenant's disk that outlives sandboxes (local backend)"),
        (name = "pools", description = "Warm sandboxes, claimed in milliseconds"),
        (name = "events", description = "Lifecycle events: a resumable stream, and signed webhooks"),
        (name = "ports", description = "TCP servers inside a sandbox, proxied (HTTP, SSE, WebSocket)"),
        (name = "images", description = "The local image store: import, list, remove, prune; pre-pull on either backend"),
        (name = "gym", description = "Gym-style environments for RL trainers"),
        (name = "service", description = "Health, readiness, metrics")
    )
)]
pub struct ApiDoc;

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

/// What the route annotations leave implicit: every response gets a
/// description (OpenAPI requires one), every operation behind the bearer
/// key documents its 401, and every operation with a body its 400 (bad or
/// unknown JSON), 413 (over [`super::MAX_JSON_BODY`]) and 415 (a content type
/// that is not JSON), which the extractors and the body limit answer for
/// every route alike.
pub fn complete_responses(openapi: &mut utoipa::openapi::OpenApi) {
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
        let ops: [&mut Option<Operation>; 6] = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.patch,
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
