//! The hub's side of the code interpreter (issue #33): asking a sandbox's
//! sandboxd about its contexts and relaying an execution's events, for the
//! REST routes (`http/rest/code.rs`) and for `Sandboxes::run_code` (MCP's
//! `run_code`, through `guard.rs`). A leaf: both stand on it.
//!
//! The hub trusts nothing of what it relays beyond its bounds: every
//! answer is read with a size limit and parsed into the `api::code` types
//! before anything of it goes on (a line that is too long or not a
//! `CodeEvent` ends the stream with an error), a result bundle is cut to
//! the cap again here, relayed error messages are shortened, and a stream
//! is cut at its timeout plus a grace whatever the sandbox does.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use sandhub_api::{
    code::{
        canonical_language, check_context_id, check_env, CodeEvent, ExecuteCode,
        DEFAULT_MAX_RESULT_BYTES, DEFAULT_TIMEOUT_SECONDS, EXECUTE_ROUTE, MAX_EVENT_LINE_BYTES,
        MAX_TIMEOUT_SECONDS,
    },
    error::{Code, ErrorBody},
};
use sandhub_client::{sandboxd::SandboxdClient, CodeEvents, Error, Result};
use serde::de::DeserializeOwned;

/// A context answer or error body is small; a list is at most the cap's
/// worth of them.
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Starting a kernel (create, restart, an execution's first) may take this.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Past an execution's timeout, how long sandboxd has to end its stream.
const STREAM_GRACE: Duration = Duration::from_secs(30);
/// A relayed error message is cut to this.
const MAX_MESSAGE: usize = 2048;

fn unavailable(what: impl std::fmt::Display) -> Error {
    Error::unavailable(format!("the sandbox's code service: {what}"))
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
/// and decoded as `T` (None for a 204), or its error relayed.
pub async fn ask<T: DeserializeOwned>(
    client: &SandboxdClient,
    method: Method,
    route: &str,
    body: Bytes,
) -> Result<Option<T>> {
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
        Ok::<_, Error>((status, body))
    };
    let (status, body) = tokio::time::timeout(START_TIMEOUT, call)
        .await
        .map_err(|_| unavailable("no answer in time"))??;
    if !status.is_success() {
        return Err(relayed_error(status, &body));
    }
    if status == StatusCode::NO_CONTENT {
        return Ok(None);
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| unavailable(format!("an answer that is not the expected JSON: {e}")))
}

/// sandboxd's error, its message shortened; a sandboxd without the code
/// routes (an older one) answers 404 for the route itself.
fn relayed_error(status: StatusCode, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(mut b) => {
            if b.message.starts_with("no route for") {
                return Error::new(
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
            Error::new(b.code, b.message)
        }
        Err(_) => unavailable(format!("it answered {status}")),
    }
}

/// What the hub refuses before anything reaches the sandbox.
pub fn check(req: &ExecuteCode) -> Result<()> {
    let invalid = |m: String| Error::new(Code::InvalidArgument, m);
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
    check_env(&req.env).map_err(invalid)
}

/// Starts an execution (the request already [`check`]ed) and returns its
/// events as relayed: checked, bounded, ended by `end` or an error.
pub async fn execute(client: &SandboxdClient, req: &ExecuteCode) -> Result<CodeEvents> {
    let timeout = req.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    let body = serde_json::to_vec(req).unwrap_or_default();
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
    Ok(Box::pin(relay(frames, deadline)))
}

/// sandboxd's NDJSON, checked line by line: each line at most
/// [`MAX_EVENT_LINE_BYTES`], a `CodeEvent`, results bounded; the stream
/// ends after `end`, at the first bad line (an error) or at `deadline`.
pub fn relay<S, E>(
    frames: S,
    deadline: tokio::time::Instant,
) -> impl Stream<Item = Result<CodeEvent>> + Send
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin + 'static,
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
                let item = checked(line);
                st.done = is_last(&item);
                return Some((item, st));
            }
            if st.buf.len() > MAX_EVENT_LINE_BYTES {
                st.done = true;
                let msg = format!("the sandbox sent an event over {MAX_EVENT_LINE_BYTES} bytes");
                return Some((Err(Error::internal(msg)), st));
            }
            let next = tokio::time::timeout_at(st.deadline, st.frames.next()).await;
            let err = match next {
                Ok(Some(Ok(chunk))) => {
                    st.buf.extend_from_slice(&chunk);
                    continue;
                }
                Ok(Some(Err(e))) => unavailable(format!("its stream broke: {e}")),
                Ok(None) => unavailable("its stream ended before the end event"),
                Err(_) => Error::new(
                    Code::DeadlineExceeded,
                    "the execution ran past its timeout and was cut off",
                ),
            };
            st.done = true;
            return Some((Err(err), st));
        }
    })
}

fn is_last(item: &Result<CodeEvent>) -> bool {
    matches!(item, Ok(CodeEvent::End { .. }) | Err(_))
}

fn checked(line: &[u8]) -> Result<CodeEvent> {
    let mut ev: CodeEvent = serde_json::from_slice(line).map_err(|e| {
        Error::internal(format!(
            "the sandbox sent a line that is not a code event: {e}"
        ))
    })?;
    if let CodeEvent::Result(b) = &mut ev {
        b.bound(DEFAULT_MAX_RESULT_BYTES);
    }
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn relayed(chunks: Vec<&'static [u8]>) -> Vec<Result<CodeEvent>> {
        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c))),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        relay(frames, deadline).collect().await
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
        assert!(matches!(out[0], Ok(CodeEvent::Stdout { .. })));
        assert!(matches!(out[1], Ok(CodeEvent::End { .. })));
    }

    #[tokio::test]
    async fn a_forged_line_ends_the_stream_with_an_error() {
        let out = relayed(vec![
            b"{\"type\":\"pwned\"}\n{\"type\":\"stdout\",\"text\":\"x\"}\n",
        ])
        .await;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ref().unwrap_err().code, Code::Internal);
        let cut = relayed(vec![b"{\"type\":\"stdout\",\"text\":\"x\"}\n"]).await;
        assert_eq!(cut[1].as_ref().unwrap_err().code, Code::Unavailable);
    }
}
