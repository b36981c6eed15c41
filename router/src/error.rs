//! The router's own failures, mapped once to an HTTP answer
//! (`{"detail": "..."}`, upstream's shape) or a gRPC trailers-only answer.

use http::{Response, StatusCode};

use crate::{
    grpc_status::code as grpc_code,
    response::{grpc_trailers_only, json_response, ProxyBody},
    routing::RouteError,
};

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
        // No `Connection: close` on a 413 here, unlike the hub and
        // sandboxd: the fast path reads a small refused body past and
        // keeps the connection, and both paths must answer alike.
        json_response(
            self.status(),
            &serde_json::json!({ "detail": self.to_string() }),
        )
    }

    pub fn to_grpc(&self) -> Response<ProxyBody> {
        grpc_trailers_only(self.grpc_code(), &self.to_string())
    }
}
