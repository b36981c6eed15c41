//! Named volumes (issue #32 §1): a tenant's disk that outlives its
//! sandboxes. Each tenant sees only its own: another tenant's name is
//! `404 NOT_FOUND`, as a name nobody uses. Local backend only; the
//! Kubernetes backend answers `501 UNIMPLEMENTED`.

use axum::http::StatusCode;
use sandhub_api::{
    error::ErrorBody,
    volumes::{CreateVolume, Volume, VolumeList},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiJson, ApiPath, ApiResult, AppState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_volumes, create_volume))
        .routes(routes!(get_volume, delete_volume))
}

/// The caller's volumes, by name.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn list_volumes(Api(api): Api) -> ApiResult<ApiJson<VolumeList>> {
    Ok(ApiJson(api.list_volumes().await?))
}

/// Make an empty volume of `size_mb` MiB.
#[utoipa::path(post, path = "/v1/volumes", tag = "volumes", request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 400, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "the tenant has a volume of that name"),
              (status = 412, body = ErrorBody, description = "the hub has no disk-quota volume"),
              (status = 429, body = ErrorBody, description = "past --tenant-max-volume-mb"),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn create_volume(
    Api(api): Api,
    ApiJson(body): ApiJson<CreateVolume>,
) -> ApiResult<(StatusCode, ApiJson<Volume>)> {
    Ok((StatusCode::CREATED, ApiJson(api.create_volume(body).await?)))
}

/// One of the caller's volumes.
#[utoipa::path(get, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses((status = 200, body = Volume), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn get_volume(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<ApiJson<Volume>> {
    Ok(ApiJson(api.get_volume(&name).await?))
}

/// Delete a volume and everything in it.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses((status = 204), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn delete_volume(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    api.delete_volume(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
