//! The one error type of sandboxd, mapped once to HTTP and once to gRPC.

use std::io;

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use sandhub_api::error::{Code, ErrorBody};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// Too many of something at once (watches, processes).
    #[error("{0}")]
    ResourceExhausted(String),
    /// A request body over the configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// The disk or quota is full; nothing was changed.
    #[error("{0}")]
    NoSpace(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::NotFound(_) => Code::NotFound,
            Error::Conflict(_) => Code::Conflict,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::ResourceExhausted(_) | Error::TooLarge(_) | Error::NoSpace(_) => {
                Code::ResourceExhausted
            }
            Error::Unavailable(_) => Code::Unavailable,
            Error::Internal(_) => Code::Internal,
        }
    }

    pub fn http_status(&self) -> StatusCode {
        match self {
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            other => StatusCode::from_u16(other.code().http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// Maps an I/O error on `path` (a root-relative display path, never a
    /// host path) to the code a client can act on.
    pub fn io(err: io::Error, path: &str) -> Self {
        let errno = err.raw_os_error().unwrap_or(0);
        match errno {
            libc::ENOENT => Error::NotFound(format!("{path}: no such file or directory")),
            libc::ENOTDIR => Error::NotFound(format!("{path}: a parent is not a directory")),
            // openat2(RESOLVE_BENEATH) answers EXDEV for anything that would
            // leave the root, ELOOP for magic links and loops.
            libc::EXDEV => Error::PermissionDenied(format!("{path}: path escapes the root")),
            libc::ELOOP => {
                Error::PermissionDenied(format!("{path}: symlink loop or escape refused"))
            }
            libc::EACCES | libc::EPERM | libc::EROFS => {
                Error::PermissionDenied(format!("{path}: permission denied"))
            }
            libc::EISDIR => Error::InvalidArgument(format!("{path}: is a directory")),
            libc::ENOTEMPTY => Error::Conflict(format!(
                "{path}: directory not empty; pass recursive=true to delete it"
            )),
            libc::EEXIST => Error::Conflict(format!("{path}: already exists")),
            libc::ENOSPC | libc::EDQUOT => Error::NoSpace(format!(
                "{path}: no space left on device; nothing was changed"
            )),
            libc::ENAMETOOLONG => Error::InvalidArgument(format!("{path}: name too long")),
            libc::EMFILE | libc::ENFILE => {
                Error::ResourceExhausted(format!("{path}: too many open files"))
            }
            _ => Error::Internal(format!("{path}: {err}")),
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code(), self.to_string())
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::io(e.into(), "")
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.http_status();
        let mut response = (status, Json(self.body())).into_response();
        sandhub_common::hop::close_if_too_large(status, response.headers_mut());
        response
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            Error::Unauthenticated(_) => tonic::Status::unauthenticated(msg),
            Error::PermissionDenied(_) => tonic::Status::permission_denied(msg),
            Error::NotFound(_) => tonic::Status::not_found(msg),
            Error::Conflict(_) => tonic::Status::already_exists(msg),
            Error::FailedPrecondition(_) => tonic::Status::failed_precondition(msg),
            Error::ResourceExhausted(_) | Error::TooLarge(_) | Error::NoSpace(_) => {
                tonic::Status::resource_exhausted(msg)
            }
            Error::Unavailable(_) => tonic::Status::unavailable(msg),
            Error::Internal(_) => tonic::Status::internal(msg),
        }
    }
}
