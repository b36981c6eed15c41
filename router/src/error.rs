//! The router's own failures, mapped once to an HTTP answer
//! (`{"detail": "..."}`, upstream's shape) or a gRPC trailers-only answer.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::{body::ProxyBody, routing::RouteError};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    BadRequest(&'static str),
    #[error("{0}")]
    MethodNotAllowed(&'static str),
    #[error("Request body too large.")]
    BodyTooLarge,
    #[error("Could not connect to the backend sandbox: {0}")]
    Dial(String),
    #[error("Timed out waiting for the backend sandbox: {0}")]
    Timeout(String),
    #[error("Error talking to the backend sandbox: {0}")]
    Upstream(String),
    #[error("{0}")]
    Internal(String),
}

/// gRPC status codes the router itself produces.
pub mod grpc_code {
    pub const CANCELLED: u8 = 1;
    pub const INVALID_ARGUMENT: u8 = 3;
    pub const DEADLINE_EXCEEDED: u8 = 4;
    pub const PERMISSION_DENIED: u8 = 7;
    pub const INTERNAL: u8 = 13;
    pub const UNAVAILABLE: u8 = 14;
    pub const UNAUTHENTICATED: u8 = 16;
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Route(_) | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Dial(_) | Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Upstream's mapping: 400, 401, 403, 502 by status; timeouts are deadlines;
    /// everything else INTERNAL.
    pub fn grpc_code(&self) -> u8 {
        match self {
            Self::Timeout(_) => grpc_code::DEADLINE_EXCEEDED,
            _ => match self.status() {
                StatusCode::BAD_REQUEST => grpc_code::INVALID_ARGUMENT,
                StatusCode::UNAUTHORIZED => grpc_code::UNAUTHENTICATED,
                StatusCode::FORBIDDEN => grpc_code::PERMISSION_DENIED,
                StatusCode::BAD_GATEWAY => grpc_code::UNAVAILABLE,
                _ => grpc_code::INTERNAL,
            },
        }
    }

    pub fn to_http(&self) -> Response<ProxyBody> {
        json_response(
            self.status(),
            &serde_json::json!({ "detail": self.to_string() }),
        )
    }

    pub fn to_grpc(&self) -> Response<ProxyBody> {
        grpc_trailers_only(self.grpc_code(), &self.to_string())
    }
}

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A gRPC answer with no messages: HTTP 200 and the status in the one
/// HEADERS frame (which then ends the stream).
pub fn grpc_trailers_only(code: u8, message: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::empty());
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(v) = HeaderValue::from_str(&encode_grpc_message(message)) {
        h.insert("grpc-message", v);
    }
    resp
}

/// grpc-message is percent-encoded: everything outside printable ASCII, and '%'.
pub fn encode_grpc_message(msg: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    percent_encoding::utf8_percent_encode(msg, SET).to_string()
}
