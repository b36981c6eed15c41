//! The Connect protocol as envd speaks it, JSON codec only: unary calls
//! (`application/json` in and out) and server streams
//! (`application/connect+json`: 5-byte envelopes, then an end-of-stream
//! envelope that carries an error, if any).

use std::time::Duration;

use axum::{
    body::{Body, Bytes},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use futures::{Stream, StreamExt};
use sandhub_api::error::Code;
use sandhub_client::Error;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::json;

/// Envelope flag: the frame's payload is compressed (never sent by us;
/// refused when a client sends it, since no encoding was negotiated).
const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the last frame of a stream, with its trailer.
const FLAG_END_STREAM: u8 = 0x02;
/// The largest request message we read: every envd request is a small
/// JSON object (file contents travel over `/files`).
pub const MAX_MESSAGE: usize = 1 << 20;

pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";

/// The Connect error code (`not_found`) and HTTP status for a hub error.
pub fn code_of(code: Code) -> (&'static str, StatusCode) {
    match code {
        Code::InvalidArgument => ("invalid_argument", StatusCode::BAD_REQUEST),
        Code::Unauthenticated => ("unauthenticated", StatusCode::UNAUTHORIZED),
        Code::PermissionDenied => ("permission_denied", StatusCode::FORBIDDEN),
        Code::NotFound => ("not_found", StatusCode::NOT_FOUND),
        Code::Conflict => ("already_exists", StatusCode::CONFLICT),
        Code::FailedPrecondition => ("failed_precondition", StatusCode::BAD_REQUEST),
        Code::ResourceExhausted => ("resource_exhausted", StatusCode::TOO_MANY_REQUESTS),
        Code::PayloadTooLarge => ("resource_exhausted", StatusCode::PAYLOAD_TOO_LARGE),
        Code::Unavailable => ("unavailable", StatusCode::SERVICE_UNAVAILABLE),
        Code::Unimplemented => ("unimplemented", StatusCode::NOT_IMPLEMENTED),
        Code::DeadlineExceeded => ("deadline_exceeded", StatusCode::GATEWAY_TIMEOUT),
        Code::Internal => ("internal", StatusCode::INTERNAL_SERVER_ERROR),
    }
}

fn error_json(e: &Error) -> serde_json::Value {
    json!({"code": code_of(e.code).0, "message": e.message})
}

/// A unary call's error: the Connect JSON body with its HTTP status.
pub fn unary_error(e: &Error) -> Response {
    let (_, status) = code_of(e.code);
    if status.is_server_error() {
        tracing::warn!(code = %e.code, message = %e.message, "envd call failed");
    }
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        error_json(e).to_string(),
    )
        .into_response()
}

/// A unary call's answer.
pub fn unary_ok<T: Serialize>(message: &T) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(message).unwrap_or_else(|_| "{}".into()),
    )
        .into_response()
}

/// The request message of a unary call (plain JSON) or of a server-stream
/// call (one enveloped JSON message).
pub fn request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, Error> {
    let streamed = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(STREAM_CONTENT_TYPE));
    let payload = if streamed { unenvelope(body)? } else { body };
    let payload = if payload.is_empty() { b"{}" } else { payload };
    serde_json::from_slice(payload)
        .map_err(|e| Error::new(Code::InvalidArgument, format!("bad request message: {e}")))
}

fn unenvelope(body: &[u8]) -> Result<&[u8], Error> {
    let bad = |m: &str| Error::new(Code::InvalidArgument, m.to_string());
    if body.len() < 5 {
        return Err(bad("a streamed request needs one enveloped message"));
    }
    if body[0] & FLAG_COMPRESSED != 0 {
        return Err(bad("compressed messages are not supported"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    body.get(5..5 + len)
        .ok_or_else(|| bad("the enveloped message is cut short"))
}

/// One message of a server stream, enveloped.
pub fn envelope<T: Serialize>(message: &T) -> Bytes {
    frame(
        0,
        serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The last frame of a server stream: `{}`, or the error it ended with.
pub fn end_of_stream(error: Option<&Error>) -> Bytes {
    let trailer = match error {
        None => json!({}),
        Some(e) => json!({"error": error_json(e)}),
    };
    frame(FLAG_END_STREAM, trailer.to_string().into_bytes())
}

fn frame(flags: u8, payload: Vec<u8>) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

/// A server stream's answer: always 200; errors travel in the trailer.
pub fn stream_response(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>)),
    )
        .into_response()
}

/// A server-stream call that fails before its first message still answers
/// 200 with the error in the end-of-stream frame (the Connect rule).
pub fn stream_error(e: &Error) -> Response {
    stream_response(futures::stream::iter([end_of_stream(Some(e))]))
}

/// `connect-timeout-ms`: the caller's deadline for the whole call.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// `keepalive-ping-interval` (seconds): how often an idle stream must send
/// something so proxies keep it open.
pub fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_bad_frames_are_refused() {
        let framed = envelope(&json!({"path": "/a"}));
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, STREAM_CONTENT_TYPE.parse().unwrap());
        let v: serde_json::Value = request(&headers, &framed).unwrap();
        assert_eq!(v, json!({"path": "/a"}));
        assert!(request::<serde_json::Value>(&headers, &framed[..4]).is_err());
        assert!(request::<serde_json::Value>(&headers, &framed[..framed.len() - 1]).is_err());
        let mut compressed = framed.to_vec();
        compressed[0] = FLAG_COMPRESSED;
        assert!(request::<serde_json::Value>(&headers, &compressed).is_err());
        let plain: serde_json::Value = request(&HeaderMap::new(), b"").unwrap();
        assert_eq!(plain, json!({}));
    }

    #[test]
    fn end_of_stream_carries_the_error_in_connect_words() {
        let ok = end_of_stream(None);
        assert_eq!(ok[0], FLAG_END_STREAM);
        assert_eq!(&ok[5..], b"{}");
        let e = end_of_stream(Some(&Error::new(Code::NotFound, "gone")));
        let trailer: serde_json::Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(
            trailer,
            json!({"error": {"code": "not_found", "message": "gone"}})
        );
    }
}
