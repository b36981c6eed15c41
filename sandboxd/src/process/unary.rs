//! `POST /v1/_sandhub/execute` (`sandhub_api::sandboxd::EXECUTE_ROUTE`):
//! `Execute` over HTTP/1.1, for the hub and the SDK's direct mode, with
//! an optional timeout (`?timeout_ms=`). The same protobuf messages as
//! gRPC's, the same [`super::execute`], behind
//! the same token check (`rest::require_token`); only the framing differs,
//! one write each way.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Request, State},
    http::header,
    response::{IntoResponse, Response},
};
use prost::Message;
use sandhub_api::{
    proto::process::v1 as pb,
    sandboxd::{EXECUTE_TIMED_OUT_HEADER, MAX_EXECUTE_REQUEST, PROTOBUF_CONTENT_TYPE},
};

use crate::{error::Error, Daemon};

pub async fn execute(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    let result = async {
        let timeout = timeout_of(request.uri().query())?;
        let body = axum::body::to_bytes(request.into_body(), MAX_EXECUTE_REQUEST)
            .await
            .map_err(|e| {
                let e = e.into_inner();
                if e.is::<http_body_util::LengthLimitError>() {
                    Error::TooLarge(format!(
                        "the request must be at most {MAX_EXECUTE_REQUEST} bytes"
                    ))
                } else {
                    Error::InvalidArgument(format!("reading the request body: {e}"))
                }
            })?;
        let request = pb::ExecuteRequest::decode(body).map_err(|e| {
            Error::InvalidArgument(format!("the body is not a process.v1.ExecuteRequest: {e}"))
        })?;
        let config = request.config.unwrap_or_default();
        super::execute(&daemon, &config, timeout).await
    };
    match result.await {
        Ok(done) => {
            let timed_out = if done.timed_out { "true" } else { "false" };
            (
                [
                    (header::CONTENT_TYPE, PROTOBUF_CONTENT_TYPE),
                    (
                        header::HeaderName::from_static(EXECUTE_TIMED_OUT_HEADER),
                        timed_out,
                    ),
                ],
                Body::from(done.into_response().encode_to_vec()),
            )
                .into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `?timeout_ms=N`, within the hub's bounds for a timeout.
fn timeout_of(query: Option<&str>) -> Result<Option<Duration>, Error> {
    let Some((_, value)) =
        crate::files::form_pairs(query.unwrap_or("")).find(|(key, _)| key == "timeout_ms")
    else {
        return Ok(None);
    };
    let millis: u64 = value.parse().map_err(|_| {
        Error::InvalidArgument(format!("timeout_ms must be a whole number, not `{value}`"))
    })?;
    sandhub_api::limits::timeout("timeout_ms", millis as f64 / 1000.0)
        .map(Some)
        .map_err(|e| Error::InvalidArgument(e.message))
}
