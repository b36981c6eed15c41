//! Named volumes (issue #32 §1): a tenant's disk that outlives its
//! sandboxes. Each tenant sees only its own: another tenant's name is
//! `404 NOT_FOUND`, as a name nobody uses. Local backend only; the
//! Kubernetes backend answers `501 UNIMPLEMENTED`.

use axum::http::StatusCode;
use sandhub_api::{
    error::ErrorBody,
    volumes::{
        CreateVolume, CreateVolumeSnapshot, Volume, VolumeList, VolumeSnapshot, VolumeSnapshotList,
    },
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiJson, ApiPath, ApiResult, AppState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_volumes, create_volume))
        .routes(routes!(get_volume, delete_volume))
        .routes(routes!(list_volume_snapshots, create_volume_snapshot))
        .routes(routes!(delete_volume_snapshot))
}

/// The caller's volumes, by name.
#[utoipa::path(get, path = "/v1/volumes", tag = "volumes",
    responses((status = 200, body = VolumeList),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn list_volumes(Api(api): Api) -> ApiResult<ApiJson<VolumeList>> {
    Ok(ApiJson(api.list_volumes().await?))
}

/// Make an empty volume of `size_mb` MiB, or with `from_snapshot` a
/// writable copy of one of the caller's volume snapshots.
#[utoipa::path(post, path = "/v1/volumes", tag = "volumes", request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody, description = "no such snapshot (`from_snapshot`)"),
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

/// Delete a volume and everything in it; refused (409) while it has
/// snapshots.
#[utoipa::path(delete, path = "/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses((status = 204), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "the volume has snapshots"),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn delete_volume(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    api.delete_volume(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A volume's snapshots, by name.
#[utoipa::path(get, path = "/v1/volumes/{name}/snapshots", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses((status = 200, body = VolumeSnapshotList), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn list_volume_snapshots(
    Api(api): Api,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<ApiJson<VolumeSnapshotList>> {
    Ok(ApiJson(api.list_volume_snapshots(&name).await?))
}

/// Take a read-only snapshot of a volume, at once whatever its size (it
/// shares the volume's blocks until either changes). At most 64 per
/// volume.
#[utoipa::path(post, path = "/v1/volumes/{name}/snapshots", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = CreateVolumeSnapshot,
    responses((status = 201, body = VolumeSnapshot), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody, description = "the volume has a snapshot of that name"),
              (status = 412, body = ErrorBody, description = "the hub has no disk-quota volume"),
              (status = 429, body = ErrorBody, description = "the volume has 64 snapshots"),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn create_volume_snapshot(
    Api(api): Api,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<CreateVolumeSnapshot>,
) -> ApiResult<(StatusCode, ApiJson<VolumeSnapshot>)> {
    Ok((
        StatusCode::CREATED,
        ApiJson(api.create_volume_snapshot(&name, body).await?),
    ))
}

/// Delete a volume snapshot (volumes cloned from it keep their files).
#[utoipa::path(delete, path = "/v1/volumes/{name}/snapshots/{snapshot}", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name"),
           ("snapshot" = String, Path, description = "The snapshot's name")),
    responses((status = 204), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn delete_volume_snapshot(
    Api(api): Api,
    ApiPath((name, snapshot)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    api.delete_volume_snapshot(&name, &snapshot).await?;
    Ok(StatusCode::NO_CONTENT)
}
