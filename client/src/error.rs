//! The client's one error type: an upstream code word and a message,
//! whether the failure came from the hub, a sandboxd, or the transport.

use sandhub_api::error::{Code, ErrorBody};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

impl From<ErrorBody> for Error {
    fn from(b: ErrorBody) -> Self {
        Error::new(b.code, b.message)
    }
}

impl Error {
    /// The error a non-2xx HTTP answer stands for. Every Sandhub surface
    /// sends an [`ErrorBody`]; the status alone decides only when the body
    /// is missing (HEAD) or came from something else on the path (a proxy).
    pub fn from_http(status: u16, body: &[u8]) -> Self {
        if let Ok(b) = serde_json::from_slice::<ErrorBody>(body) {
            return b.into();
        }
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let message = if text.is_empty() {
            format!("HTTP status {status}")
        } else {
            format!("HTTP status {status}: {text}")
        };
        Error::new(code_for_http_status(status), message)
    }
}

/// The inverse of [`Code::http_status`], widened to statuses other
/// software on the path (proxies, load balancers) answers with.
pub fn code_for_http_status(status: u16) -> Code {
    match status {
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 | 410 => Code::NotFound,
        409 => Code::Conflict,
        412 => Code::FailedPrecondition,
        413 => Code::PayloadTooLarge,
        408 | 504 => Code::DeadlineExceeded,
        429 | 507 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        502 | 503 => Code::Unavailable,
        400..=499 => Code::InvalidArgument,
        _ => Code::Internal,
    }
}

/// sandboxd's gRPC services send the same failures as gRPC statuses; this
/// maps them back to the code words its REST side uses (`AlreadyExists` is
/// how sandboxd spells CONFLICT over gRPC).
///
/// A status tonic made up from a local failure (it then carries the
/// failure as its source) is never the server's verdict: tonic turns an
/// io error like ENOENT or EACCES on the socket into NOT_FOUND or
/// PERMISSION_DENIED, which would read as an answer about the file or
/// process asked for. Those all mean the server is out of reach.
impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        use tonic::Code as G;
        if std::error::Error::source(&status).is_some() {
            return Error::unavailable(format!("gRPC connection failed: {}", status.message()));
        }
        let code = match status.code() {
            G::InvalidArgument | G::OutOfRange => Code::InvalidArgument,
            G::NotFound => Code::NotFound,
            G::PermissionDenied => Code::PermissionDenied,
            G::FailedPrecondition => Code::FailedPrecondition,
            G::ResourceExhausted => Code::ResourceExhausted,
            G::Unauthenticated => Code::Unauthenticated,
            G::Unavailable => Code::Unavailable,
            G::DeadlineExceeded => Code::DeadlineExceeded,
            G::AlreadyExists | G::Aborted => Code::Conflict,
            G::Unimplemented => Code::Unimplemented,
            _ => Code::Internal,
        };
        let message = if status.message().is_empty() {
            format!("gRPC status {:?}", status.code())
        } else {
            status.message().to_string()
        };
        Error::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_errors_prefer_the_body() {
        let e = Error::from_http(404, br#"{"code":"PERMISSION_DENIED","message":"no"}"#);
        assert_eq!(e, Error::new(Code::PermissionDenied, "no"));
        let e = Error::from_http(502, b"bad gateway");
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("bad gateway"));
        assert_eq!(Error::from_http(404, b"").code, Code::NotFound);
        assert_eq!(Error::from_http(405, b"").code, Code::InvalidArgument);
        assert_eq!(Error::from_http(500, b"").code, Code::Internal);
    }

    #[test]
    fn grpc_codes_map_to_words() {
        let cases = [
            (tonic::Code::InvalidArgument, Code::InvalidArgument),
            (tonic::Code::NotFound, Code::NotFound),
            (tonic::Code::PermissionDenied, Code::PermissionDenied),
            (tonic::Code::FailedPrecondition, Code::FailedPrecondition),
            (tonic::Code::ResourceExhausted, Code::ResourceExhausted),
            (tonic::Code::Unauthenticated, Code::Unauthenticated),
            (tonic::Code::Unavailable, Code::Unavailable),
            (tonic::Code::DeadlineExceeded, Code::DeadlineExceeded),
            (tonic::Code::AlreadyExists, Code::Conflict),
            (tonic::Code::Unknown, Code::Internal),
        ];
        for (grpc, word) in cases {
            assert_eq!(Error::from(tonic::Status::new(grpc, "m")).code, word);
        }
    }

    #[test]
    fn local_grpc_failures_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "socket: EACCES");
        let status = tonic::Status::from_error(Box::new(io));
        assert_eq!(Error::from(status).code, Code::Unavailable);
    }
}
