//! Files in a sandbox's workspace. Requests are forwarded to the sandbox's
//! sandboxd as they are (method, path, query, range and conditional
//! headers, streamed body), so every sandboxd semantic holds here too:
//! listings, `Range`, `If-Modified-Since`, `mode`, `append`, `type`,
//! `recursive`, multipart uploads, atomic writes, confinement.

use axum::{
    body::Body,
    extract::{Request, State},
    http::{header, HeaderMap, HeaderName},
    response::Response,
    routing::get,
};
use sandhub_api::{error::ErrorBody, sandboxd::DirectoryListing};
use serde::Deserialize;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::http::{
    upload::{self, Upload},
    Api, ApiPath, ApiResult, AppState,
};

/// Request headers sandboxd acts on; everything else (notably the hub's
/// own `Authorization`) stays here.
const FORWARDED_REQUEST: &[HeaderName] = &[
    header::RANGE,
    header::IF_MODIFIED_SINCE,
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
];

/// The file routes need a catch-all segment (`{*path}`), which OpenAPI
/// cannot spell, so they are routed by hand and documented from the same
/// handlers' annotations.
#[derive(OpenApi)]
#[openapi(paths(get_file, head_file, put_file, delete_file))]
struct FilesDoc;

pub fn routes() -> OpenApiRouter<AppState> {
    let methods = || {
        get(get_file)
            .head(head_file)
            .put(put_file)
            .delete(delete_file)
    };
    OpenApiRouter::with_openapi(FilesDoc::openapi())
        .route("/v1/sandboxes/{id}/files", methods())
        .route("/v1/sandboxes/{id}/files/", methods())
        .route("/v1/sandboxes/{id}/files/{*path}", methods())
}

#[derive(Debug, Deserialize)]
struct FilePath {
    id: String,
}

async fn forward(
    api: &dyn crate::backend::TenantView,
    id: &str,
    request: Request,
) -> ApiResult<Response> {
    let client = api.sandboxd(id, "file access").await?;
    let mut target = format!("/v1/files/{}", raw_rest(request.uri().path(), id));
    if let Some(q) = request.uri().query() {
        target.push('?');
        target.push_str(q);
    }
    let mut headers = HeaderMap::new();
    for name in FORWARDED_REQUEST {
        if let Some(v) = request.headers().get(name) {
            headers.insert(name.clone(), v.clone());
        }
    }
    let method = request.method().clone();
    let response = client
        .forward(method, &target, headers, request.into_body())
        .await?;
    Ok(response.map(Body::new))
}

/// The still-encoded part of the request path after `/files/`, so that
/// `a%2Fb` reaches sandboxd exactly as the client sent it.
fn raw_rest<'a>(full: &'a str, id: &str) -> &'a str {
    let prefix_len = "/v1/sandboxes/".len() + id.len() + "/files".len();
    full.get(prefix_len..).unwrap_or("").trim_start_matches('/')
}

/// Read a file (raw bytes; `Range` and `If-Modified-Since` honoured) or list a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path, description = "Path in the workspace"),
           ("type" = Option<String>, Query, description = "`file` or `directory`: 409 if the path is the other kind")),
    responses(
        (status = 200, description = "A file's bytes, or a directory's listing",
         content((String = "application/octet-stream"), (DirectoryListing = "application/json"))),
        (status = 206, description = "Partial content", body = String, content_type = "application/octet-stream"),
        (status = 304, description = "Not modified"),
        (status = 400, body = ErrorBody, description = "Bad query (`type`)"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 416, body = ErrorBody, description = "Range not satisfiable"),
    ))]
async fn get_file(
    Api(api): Api,
    ApiPath(FilePath { id }): ApiPath<FilePath>,
    request: Request,
) -> ApiResult<Response> {
    forward(api.as_ref(), &id, request).await
}

/// Headers of a file or directory, no body.
#[utoipa::path(head, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200), (status = 400), (status = 403), (status = 404), (status = 409),
              (status = 412, description = "The sandbox is not Ready")))]
async fn head_file(
    Api(api): Api,
    ApiPath(FilePath { id }): ApiPath<FilePath>,
    request: Request,
) -> ApiResult<Response> {
    forward(api.as_ref(), &id, request).await
}

/// Write a file atomically (raw or multipart `file` part), creating parents;
/// `append=true` appends instead; `mode` (e.g. 0644) applies to new files.
/// A body over the hub's `--max-upload-bytes` is refused with 413: at once
/// when its `Content-Length` says so, else when it passes the limit (the
/// file is then left as it was).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path),
           ("mode" = Option<String>, Query, description = "^0[0-7]{3}$"),
           ("append" = Option<bool>, Query)),
    request_body(content = String, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
              (status = 413, body = ErrorBody), (status = 507, body = ErrorBody)))]
async fn put_file(
    State(state): State<AppState>,
    Api(api): Api,
    ApiPath(FilePath { id }): ApiPath<FilePath>,
    request: Request,
) -> ApiResult<Response> {
    let limits = state.limits;
    upload::refuse_declared(&limits, request.headers())?;
    // A chunked body is cut off with an error as it passes the limit, so
    // sandboxd sees an aborted upload and discards its temporary file.
    let (parts, body) = request.into_parts();
    let Upload {
        data,
        tripped,
        remainder,
    } = upload::capped(&limits, body);
    let request = Request::from_parts(parts, Body::from_stream(data));
    let result = forward(api.as_ref(), &id, request).await;
    if tripped.is_set() {
        return Err(limits.upload_too_large().into());
    }
    // Refused before the body ended (no space left, say): the client is
    // still sending, and must get this answer, not a reset.
    if !result.as_ref().is_ok_and(|r| r.status().is_success()) {
        remainder
            .drain(limits.max_upload_bytes, crate::guard::DRAIN_TIMEOUT)
            .await;
    }
    result
}

/// Delete a file, or a directory with `recursive=true`.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path), ("recursive" = Option<bool>, Query)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "The sandbox is not Ready")))]
async fn delete_file(
    Api(api): Api,
    ApiPath(FilePath { id }): ApiPath<FilePath>,
    request: Request,
) -> ApiResult<Response> {
    forward(api.as_ref(), &id, request).await
}
