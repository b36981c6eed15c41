//! The code interpreter (issue #33): contexts (one Jupyter kernel each,
//! run by the sandbox's sandboxd) and executions streamed as NDJSON.
//!
//! The hub relays sandboxd's answers but trusts nothing of them beyond
//! their bounds: every answer is read with a size limit and parsed into
//! the `api::code` types before anything of it is sent on (a line that is
//! too long or not a `CodeEvent` ends the stream with an error line), a
//! result bundle is cut to the cap again here, relayed error messages are
//! shortened, and a stream is cut at its timeout plus a grace whatever the
//! sandbox says. Another tenant's sandbox is a 404 before anything is
//! forwarded (`sandboxd()` checks the owner), and its contexts with it.

use std::{convert::Infallible, time::Duration};

use axum::{
    body::{Body, Bytes},
    http::{header, HeaderMap, HeaderValue, Method, StatusCode},
    response::{IntoResponse, Response},
};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use sandhub_api::{
    code::{
        canonical_language, check_context_id, check_env, CodeEvent, Context, ContextList,
        CreateContext, ExecuteCode, CONTEXTS_ROUTE, DEFAULT_MAX_RESULT_BYTES,
        DEFAULT_TIMEOUT_SECONDS, EXECUTE_ROUTE, MAX_EVENT_LINE_BYTES, MAX_TIMEOUT_SECONDS,
    },
    error::{Code, ErrorBody},
};
use sandhub_client::sandboxd::SandboxdClient;
use serde::de::DeserializeOwned;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiError, ApiJson, ApiPath, ApiResult, AppState};

/// A context answer or error body is small; a list is at most the cap's
/// worth of them.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Starting a kernel (create, restart, an execution's first) may take this.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Past an execution's timeout, how long sandboxd has to end its stream.
const STREAM_GRACE: Duration = Duration::from_secs(30);
/// A relayed error message is cut to this.
const MAX_MESSAGE: usize = 2048;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_context, list_contexts))
        .routes(routes!(get_context, delete_context))
        .routes(routes!(restart_context))
        .routes(routes!(run_code))
}

fn unavailable(what: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        Code::Unavailable,
        format!("the sandbox's code service: {what}"),
    )
}

fn json_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h
}

/// One request to sandboxd's code routes, its answer read whole (bounded)
/// and decoded as `T`, or its error relayed.
async fn ask<T: DeserializeOwned>(
    client: &SandboxdClient,
    method: Method,
    route: &str,
    body: Bytes,
) -> ApiResult<(StatusCode, Option<T>)> {
    let call = async {
        let response = client
            .forward(
                method,
                route,
                json_headers(),
                http_body_util::Full::new(body),
            )
            .await?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| unavailable(format!("reading its answer: {e}")))?
            .to_bytes();
        Ok::<_, ApiError>((status, body))
    };
    let (status, body) = tokio::time::timeout(START_TIMEOUT, call)
        .await
        .map_err(|_| unavailable("no answer in time"))??;
    if !status.is_success() {
        return Err(relayed_error(status, &body));
    }
    if status == StatusCode::NO_CONTENT {
        return Ok((status, None));
    }
    let value = serde_json::from_slice(&body)
        .map_err(|e| unavailable(format!("an answer that is not the expected JSON: {e}")))?;
    Ok((status, Some(value)))
}

/// sandboxd's error, its message shortened; a sandboxd without the code
/// routes (an older one) answers 404 for the route itself.
fn relayed_error(status: StatusCode, body: &[u8]) -> ApiError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(mut b) => {
            if b.message.starts_with("no route for") {
                return ApiError::new(
                    Code::Unimplemented,
                    "this sandbox's sandboxd has no code interpreter",
                );
            }
            if b.message.len() > MAX_MESSAGE {
                let mut end = MAX_MESSAGE;
                while !b.message.is_char_boundary(end) {
                    end -= 1;
                }
                b.message.truncate(end);
            }
            ApiError::new(b.code, b.message)
        }
        Err(_) => unavailable(format!("it answered {status}")),
    }
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
    let (_, ctx) = ask::<Context>(&client, Method::POST, CONTEXTS_ROUTE, body.into()).await?;
    Ok((StatusCode::CREATED, ApiJson(ctx)).into_response())
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
    let (_, list) = ask::<ContextList>(&client, Method::GET, CONTEXTS_ROUTE, Bytes::new()).await?;
    Ok(ApiJson(list).into_response())
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
    let (_, c) = ask::<Context>(&client, Method::GET, &route, Bytes::new()).await?;
    Ok(ApiJson(c).into_response())
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
    let (_, c) = ask::<Context>(&client, Method::POST, &route, Bytes::new()).await?;
    Ok(ApiJson(c).into_response())
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
    let timeout = req.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(1..=MAX_TIMEOUT_SECONDS).contains(&timeout) {
        return Err(invalid(format!(
            "timeout_seconds: between 1 and {MAX_TIMEOUT_SECONDS}"
        )));
    }
    match &req.context {
        Some(ctx) => check_context_id(ctx).map_err(invalid)?,
        None => {
            canonical_language(req.language.as_deref()).map_err(invalid)?;
        }
    }
    check_env(&req.env).map_err(invalid)?;
    let client = api.sandboxd(&id, "running code").await?;
    let body = serde_json::to_vec(&req).unwrap_or_default();
    let response = tokio::time::timeout(
        START_TIMEOUT,
        client.forward(
            Method::POST,
            EXECUTE_ROUTE,
            json_headers(),
            http_body_util::Full::new(Bytes::from(body)),
        ),
    )
    .await
    .map_err(|_| unavailable("no answer in time"))??;
    let status = response.status();
    if status != StatusCode::OK {
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        return Err(relayed_error(status, &body));
    }
    let frames = response.into_body().into_data_stream();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout) + STREAM_GRACE;
    let lines = relay(frames, deadline).map(|line| Ok::<_, Infallible>(Bytes::from(line)));
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// sandboxd's NDJSON, checked line by line and written anew: each line at
/// most [`MAX_EVENT_LINE_BYTES`], a `CodeEvent`, results bounded; the
/// stream ends after `end`, at the first bad line (with an error line) or
/// at `deadline`.
fn relay<S, E>(frames: S, deadline: tokio::time::Instant) -> impl Stream<Item = Vec<u8>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: std::fmt::Display + Send + 'static,
{
    struct State<S> {
        frames: S,
        buf: Vec<u8>,
        done: bool,
        deadline: tokio::time::Instant,
    }
    let state = State {
        frames,
        buf: Vec::new(),
        done: false,
        deadline,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            if let Some(at) = st.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = st.buf.drain(..=at).collect();
                let line = &line[..at];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let out = match checked(line) {
                    Ok(ev) => {
                        st.done = matches!(ev, CodeEvent::End { .. });
                        encode(&ev)
                    }
                    Err(msg) => {
                        st.done = true;
                        error_line(Code::Internal, &msg)
                    }
                };
                return Some((out, st));
            }
            if st.buf.len() > MAX_EVENT_LINE_BYTES {
                st.done = true;
                let msg = format!("the sandbox sent an event over {MAX_EVENT_LINE_BYTES} bytes");
                return Some((error_line(Code::Internal, &msg), st));
            }
            let next = tokio::time::timeout_at(st.deadline, st.frames.next()).await;
            match next {
                Ok(Some(Ok(chunk))) => st.buf.extend_from_slice(&chunk),
                Ok(Some(Err(e))) => {
                    st.done = true;
                    let msg = format!("the sandbox's stream broke: {e}");
                    return Some((error_line(Code::Unavailable, &msg), st));
                }
                Ok(None) => {
                    st.done = true;
                    let msg = "the sandbox's stream ended before its end event";
                    return Some((error_line(Code::Unavailable, msg), st));
                }
                Err(_) => {
                    st.done = true;
                    let msg = "the execution ran past its timeout and was cut off";
                    return Some((error_line(Code::DeadlineExceeded, msg), st));
                }
            }
        }
    })
}

fn checked(line: &[u8]) -> Result<CodeEvent, String> {
    let mut ev: CodeEvent = serde_json::from_slice(line)
        .map_err(|e| format!("the sandbox sent a line that is not a code event: {e}"))?;
    if let CodeEvent::Result(b) = &mut ev {
        b.bound(DEFAULT_MAX_RESULT_BYTES);
    }
    Ok(ev)
}

fn encode(ev: &CodeEvent) -> Vec<u8> {
    let mut line = serde_json::to_vec(ev).unwrap_or_default();
    line.push(b'\n');
    line
}

fn error_line(code: Code, message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&ErrorBody::new(code, message)).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn relayed(chunks: Vec<&'static [u8]>) -> Vec<String> {
        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c))),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        relay(frames, deadline)
            .map(|l| String::from_utf8(l).unwrap())
            .collect()
            .await
    }

    #[tokio::test]
    async fn good_lines_pass_split_anywhere_and_stop_at_end() {
        let out = relayed(vec![
            b"{\"type\":\"stdout\",\"te",
            b"xt\":\"hi\\n\"}\n\n{\"type\":\"end\",\"execution_count\":1,\"duration\":0.1}\n",
            b"{\"type\":\"stdout\",\"text\":\"after end\"}\n",
        ])
        .await;
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].contains("\"stdout\"") && out[1].contains("\"end\""));
    }

    #[tokio::test]
    async fn a_forged_line_ends_the_stream_with_an_error() {
        let out = relayed(vec![
            b"{\"type\":\"pwned\"}\n{\"type\":\"stdout\",\"text\":\"x\"}\n",
        ])
        .await;
        assert_eq!(out.len(), 1);
        assert!(out[0].contains("INTERNAL"), "{out:?}");
        let cut = relayed(vec![b"{\"type\":\"stdout\",\"text\":\"x\"}\n"]).await;
        assert!(cut[1].contains("UNAVAILABLE"), "{cut:?}");
    }
}
