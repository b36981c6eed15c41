//! Warm pools.

use axum::http::StatusCode;
use sandhub_api::{
    error::ErrorBody,
    hub::{Pool, PoolList, PoolSpec},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiJson, ApiPath, ApiResult, AppState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_pools))
        .routes(routes!(put_pool, get_pool, delete_pool))
}

/// The caller's pools with their ready and total counts.
#[utoipa::path(get, path = "/v1/pools", tag = "pools",
    responses((status = 200, body = PoolList)))]
async fn list_pools(Api(api): Api) -> ApiResult<ApiJson<PoolList>> {
    Ok(ApiJson(PoolList {
        pools: api.list_pools().await?,
    }))
}

/// Create or resize a pool; it fills in the background.
#[utoipa::path(put, path = "/v1/pools/{name}", tag = "pools", request_body = PoolSpec,
    params(("name" = String, Path, description = "DNS-1123 label")),
    responses((status = 200, body = Pool), (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "An operator's pool (kubernetes backend)"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "Over the tenant's warm-replica quota")))]
async fn put_pool(
    Api(api): Api,
    ApiPath(name): ApiPath<String>,
    ApiJson(spec): ApiJson<PoolSpec>,
) -> ApiResult<ApiJson<Pool>> {
    Ok(ApiJson(api.put_pool(&name, spec).await?))
}

/// One pool and how many of its sandboxes are ready.
#[utoipa::path(get, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses((status = 200, body = Pool), (status = 404, body = ErrorBody)))]
async fn get_pool(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<ApiJson<Pool>> {
    Ok(ApiJson(api.get_pool(&name).await?))
}

/// Delete a pool and its unclaimed sandboxes.
#[utoipa::path(delete, path = "/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses((status = 204),
        (status = 403, body = ErrorBody, description = "An operator's pool (kubernetes backend)"),
        (status = 404, body = ErrorBody)))]
async fn delete_pool(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    api.delete_pool(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
