//! `POST /v1/images/prepull`: pull images where the caller's sandboxes will
//! run, before they are needed (on Kubernetes by DaemonSets on the nodes a
//! template's Pods reach; see hub/src/kube/prepull.rs).

use axum::extract::State;
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{PrepullRequest, PrepullResult},
};
use sandhub_client::Error;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiError, ApiJson, ApiResult, AppState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(prepull_images))
}

/// Pull images ahead of the sandboxes that will run them. Answers when
/// every pull has finished or failed (or `timeout_seconds` passed), with
/// each image's outcome; on Kubernetes also each DaemonSet's.
#[utoipa::path(post, path = "/v1/images/prepull", tag = "images", request_body = PrepullRequest,
    responses((status = 200, body = PrepullResult, description = "Every pull's outcome (`ok` is false if any failed)"),
              (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "No such template"),
              (status = 501, body = ErrorBody)))]
async fn prepull_images(
    State(state): State<AppState>,
    Api(view): Api,
    ApiJson(req): ApiJson<PrepullRequest>,
) -> ApiResult<ApiJson<PrepullResult>> {
    let images = state
        .hub
        .images()
        .ok_or_else(|| ApiError::new(Code::Unimplemented, "this backend cannot pre-pull images"))?;
    req.validate().map_err(|e| ApiError::from(Error::from(e)))?;
    Ok(ApiJson(
        images
            .prepull(view.tenant(), req)
            .await
            .map_err(|e| ApiError::from(Error::from(e)))?,
    ))
}
