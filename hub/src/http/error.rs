//! Every hub error leaves as JSON `{code, message}` with the status its
//! code word implies.

use axum::{
    extract::{
        rejection::{PathRejection, QueryRejection},
        Request,
    },
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use sandhub_api::error::Code;
use sandhub_client::Error;

#[derive(Debug)]
pub struct ApiError {
    pub error: Error,
    /// When the code word alone does not say it (413 for an oversized body).
    pub status: Option<StatusCode>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError {
            error,
            status: None,
        }
    }
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error::new(code, message).into()
    }
}

impl ApiError {
    /// The status it is answered with.
    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.error.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        })
    }

    fn log(&self, status: StatusCode) {
        if status.is_server_error() {
            tracing::warn!(code = %self.error.code, message = %self.error.message, "request failed");
        }
    }

    /// The same answer as [`IntoResponse`] gives, with its body in hand
    /// (for the port route's fast path, which writes answers whole).
    pub fn into_whole(self) -> http::Response<bytes::Bytes> {
        let status = self.status();
        self.log(status);
        let body = serde_json::to_vec(&self.error.body()).unwrap_or_default();
        let mut response = http::Response::new(bytes::Bytes::from(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        sandhub_common::hop::close_if_too_large(status, response.headers_mut());
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        self.log(status);
        let mut response = (status, Json(self.error.body())).into_response();
        sandhub_common::hop::close_if_too_large(status, response.headers_mut());
        response
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        let code = if r.status().is_server_error() {
            Code::Internal
        } else {
            Code::InvalidArgument
        };
        ApiError::new(code, r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::new(Code::InvalidArgument, r.body_text())
    }
}

/// `axum::extract::Path` whose rejections (a pid that is not a number)
/// are JSON `{code, message}` too.
#[derive(Debug, Clone, axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `axum::extract::Query` whose rejections are JSON `{code, message}` too.
#[derive(Debug, Clone, axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// The app's fallback: a JSON `NOT_FOUND` for a path no route has.
pub async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        Code::NotFound,
        format!("no route for {}", request.uri().path()),
    )
}

/// A JSON 405 for a method the path's route does not take.
pub async fn method_not_allowed(request: Request) -> ApiError {
    let mut e = ApiError::new(
        Code::InvalidArgument,
        format!(
            "method {} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    );
    e.status = Some(StatusCode::METHOD_NOT_ALLOWED);
    e
}
