//! The one error body every Sandhub HTTP surface returns, and its code words.
//!
//! The code words are the upstream sandboxd ones (which are also gRPC status
//! names), so a client can switch on them whichever surface it called.

use serde::{Deserialize, Serialize};

/// `{"code": "...", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub code: Code,
    pub message: String,
}

/// Upstream code words. Serialized as the SCREAMING_SNAKE_CASE names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Code {
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    Conflict,
    FailedPrecondition,
    ResourceExhausted,
    PayloadTooLarge,
    Unavailable,
    Unimplemented,
    DeadlineExceeded,
    Internal,
}

impl Code {
    /// The HTTP status this code is sent with.
    pub fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::Conflict => 409,
            Code::FailedPrecondition => 412,
            Code::PayloadTooLarge => 413,
            Code::ResourceExhausted => 429,
            Code::Internal => 500,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
        }
    }

    /// The wire word, e.g. `NOT_FOUND`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::NotFound => "NOT_FOUND",
            Code::Conflict => "CONFLICT",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::Internal => "INTERNAL",
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ErrorBody {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}
