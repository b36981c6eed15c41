//! The code interpreter (issue #33): contexts (one Jupyter kernel each,
//! run by the sandbox's sandboxd) and executions streamed as NDJSON.
//!
//! What comes back is checked and bounded by `crate::code` (see there).
//! Another tenant's sandbox is a 404 before anything is forwarded
//! (`sandboxd()` checks the owner), and its contexts with it.

use std::convert::Infallible;

use axum::{
    body::{Body, Bytes},
    http::{header, Method, StatusCode},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use sandhub_api::{
    code::{
        canonical_language, check_context_id, check_env, CodeEvent, Context, ContextList,
        CreateContext, ExecuteCode, CONTEXTS_ROUTE,
    },
    error::{Code, ErrorBody},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    code::ask,
    http::{Api, ApiError, ApiJson, ApiPath, ApiResult, AppState},
};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_context, list_contexts))
        .routes(routes!(get_context, delete_context))
        .routes(routes!(restart_context))
        .routes(routes!(run_code))
}

/// A body where one was due (sandboxd answered 204 where it should not).
fn answer<T>(value: Option<T>) -> ApiResult<T> {
    value.ok_or_else(|| {
        ApiError::new(
            Code::Unavailable,
            "the sandbox's code service answered without a body",
        )
    })
}

fn context_route(ctx: &str, tail: &str) -> ApiResult<String> {
    check_context_id(ctx).map_err(|m| ApiError::new(Code::InvalidArgument, m))?;
    Ok(format!("{CONTEXTS_ROUTE}/{ctx}{tail}"))
}

fn invalid(m: String) -> ApiError {
    ApiError::new(Code::InvalidArgument, m)
}

/// Start a context: a kernel of `language` (`python`) whose variables,
/// imports and working directory persist between executions.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts", tag = "code", request_body = CreateContext,
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 201, body = Context),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready, or its kernel did not start"),
        (status = 429, body = ErrorBody, description = "The sandbox has as many contexts as it may"),
        (status = 501, body = ErrorBody, description = "The sandbox's sandboxd has no code interpreter"),
    ))]
async fn create_context(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<CreateContext>,
) -> ApiResult<Response> {
    canonical_language(req.language.as_deref()).map_err(invalid)?;
    check_env(&req.env).map_err(invalid)?;
    let client = api.sandboxd(&id, "starting a code context").await?;
    let body = serde_json::to_vec(&req).unwrap_or_default();
    let ctx = ask::<Context>(&client, Method::POST, CONTEXTS_ROUTE, body.into()).await?;
    Ok((StatusCode::CREATED, ApiJson(answer(ctx)?)).into_response())
}

/// A sandbox's contexts.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/code/contexts", tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = ContextList),
        (status = 404, body = ErrorBody, description = "No such sandbox"),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 501, body = ErrorBody, description = "The sandbox's sandboxd has no code interpreter"),
    ))]
async fn list_contexts(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<Response> {
    let client = api.sandboxd(&id, "listing code contexts").await?;
    let list = ask::<ContextList>(&client, Method::GET, CONTEXTS_ROUTE, Bytes::new()).await?;
    Ok(ApiJson(answer(list)?).into_response())
}

/// One context.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path)),
    responses((status = 200, body = Context),
        (status = 400, body = ErrorBody, description = "A bad context id"),
        (status = 404, body = ErrorBody, description = "No such sandbox or context"),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 501, body = ErrorBody, description = "The sandbox's sandboxd has no code interpreter"),
    ))]
async fn get_context(
    Api(api): Api,
    ApiPath((id, ctx)): ApiPath<(String, String)>,
) -> ApiResult<Response> {
    let route = context_route(&ctx, "")?;
    let client = api.sandboxd(&id, "reading a code context").await?;
    let c = ask::<Context>(&client, Method::GET, &route, Bytes::new()).await?;
    Ok(ApiJson(answer(c)?).into_response())
}

/// Delete a context: its kernel is killed, its variables gone.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/code/contexts/{context}", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path)),
    responses((status = 204, description = "Deleted"),
        (status = 400, body = ErrorBody, description = "A bad context id"),
        (status = 404, body = ErrorBody, description = "No such sandbox or context"),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 501, body = ErrorBody, description = "The sandbox's sandboxd has no code interpreter"),
    ))]
async fn delete_context(
    Api(api): Api,
    ApiPath((id, ctx)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let route = context_route(&ctx, "")?;
    let client = api.sandboxd(&id, "deleting a code context").await?;
    ask::<serde_json::Value>(&client, Method::DELETE, &route, Bytes::new()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restart a context's kernel (after it died, or to forget its state).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code/contexts/{context}/restart", tag = "code",
    params(("id" = String, Path, description = "Sandbox id"), ("context" = String, Path)),
    responses((status = 200, body = Context),
        (status = 400, body = ErrorBody, description = "A bad context id"),
        (status = 404, body = ErrorBody, description = "No such sandbox or context"),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready, or the kernel did not start"),
        (status = 501, body = ErrorBody, description = "The sandbox's sandboxd has no code interpreter"),
    ))]
async fn restart_context(
    Api(api): Api,
    ApiPath((id, ctx)): ApiPath<(String, String)>,
) -> ApiResult<Response> {
    let route = context_route(&ctx, "/restart")?;
    let client = api.sandboxd(&id, "restarting a code context").await?;
    let c = ask::<Context>(&client, Method::POST, &route, Bytes::new()).await?;
    Ok(ApiJson(answer(c)?).into_response())
}

/// Run code in a context (or the language's default context, made on
/// first use) and stream its events as NDJSON: `stdout`, `stderr`,
/// `result` (a MIME bundle), `error`, and `end` last. A timeout interrupts
/// the cell (an `error` named `TimeoutError`) and keeps the context; a
/// kernel that died is an `error` named `KernelDied`.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", tag = "code", request_body = ExecuteCode,
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, content_type = "application/x-ndjson", body = CodeEvent,
         description = "One event per line; `end` last (or an ErrorBody line if the stream broke)"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "No such sandbox or context"),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready, or the kernel did not start"),
        (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "The default context would pass the cap"),
        (status = 501, body = ErrorBody, description = "The sandbox's sandboxd has no code interpreter"),
    ))]
async fn run_code(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ExecuteCode>,
) -> ApiResult<Response> {
    crate::code::check(&req)?;
    let client = api.sandboxd(&id, "running code").await?;
    let events = crate::code::execute(&client, &req).await?;
    let lines = events.map(|item| Ok::<_, Infallible>(line(item)));
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

fn line(item: sandhub_client::Result<CodeEvent>) -> Bytes {
    let mut line = match item {
        Ok(ev) => serde_json::to_vec(&ev),
        // A broken stream ends with an error line the client can read.
        Err(e) => serde_json::to_vec(&e.body()),
    }
    .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
