//! Secret values for brokered secrets: write-only. A value goes in with
//! `PUT`, and no route ever answers it (the list has names and times);
//! only the egress gateway reads it, to put it into requests to the
//! secret's hosts (docs/networking.md).

use axum::http::StatusCode;
use sandhub_api::{
    error::ErrorBody,
    secrets::{PutSecret, SecretInfo, SecretList},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiJson, ApiPath, ApiResult, AppState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_secrets))
        .routes(routes!(put_secret, delete_secret))
}

/// The caller's secrets: names, where each value comes from, when it was
/// set. Never a value.
#[utoipa::path(get, path = "/v1/secrets", tag = "secrets",
    responses((status = 200, body = SecretList)))]
async fn list_secrets(Api(api): Api) -> ApiResult<ApiJson<SecretList>> {
    Ok(ApiJson(api.list_secrets().await?))
}

/// Set (or replace) a secret's value. It is never readable back.
#[utoipa::path(put, path = "/v1/secrets/{name}", tag = "secrets", request_body = PutSecret,
    params(("name" = String, Path, description = "An environment variable's name")),
    responses((status = 200, body = SecretInfo), (status = 400, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "the tenant holds 256 values")))]
async fn put_secret(
    Api(api): Api,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<PutSecret>,
) -> ApiResult<ApiJson<SecretInfo>> {
    Ok(ApiJson(api.put_secret(&name, body.value).await?))
}

/// Delete the caller's value (an operator's `--secrets-file` value stays).
#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets",
    params(("name" = String, Path, description = "The secret's name")),
    responses((status = 204), (status = 400, body = ErrorBody, description = "not a secret's name"),
              (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "the operator's value")))]
async fn delete_secret(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    api.delete_secret(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
