//! `POST /v1/_sandhub/execute` (`sandhub_api::sandboxd::EXECUTE_ROUTE`):
//! `Execute` over HTTP/1.1, for the hub and the SDK's direct mode. The
//! same protobuf messages as gRPC's, the same [`super::execute`], behind
//! the same token check (`rest::require_token`); only the framing differs,
//! one write each way.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    http::header,
    response::{IntoResponse, Response},
};
use prost::Message;
use sandhub_api::{
    proto::process::v1 as pb,
    sandboxd::{MAX_EXECUTE_REQUEST, PROTOBUF_CONTENT_TYPE},
};

use crate::{error::Error, Daemon};

pub async fn execute(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    let result = async {
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
        super::execute(&daemon, &config).await
    };
    match result.await {
        Ok(done) => (
            [(header::CONTENT_TYPE, PROTOBUF_CONTENT_TYPE)],
            Body::from(done.encode_to_vec()),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}
