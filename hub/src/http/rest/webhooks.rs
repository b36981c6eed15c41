//! `/v1/webhooks`: the caller's signed webhooks (see `crate::webhooks`).
//! The secret goes in with `PUT` and no route ever answers it.

use std::sync::Arc;

use axum::{extract::State, http::StatusCode, Extension};
use sandhub_api::error::{Code, ErrorBody};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    http::{ApiError, ApiJson, ApiPath, ApiResult, AppState, Tenant},
    webhooks::{DeliveryList, PutWebhook, WebhookInfo, WebhookList, WebhookService},
};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_webhooks))
        .routes(routes!(put_webhook, get_webhook, delete_webhook))
        .routes(routes!(list_deliveries))
}

fn hooks(state: &AppState) -> ApiResult<Arc<dyn WebhookService>> {
    state.webhooks.clone().ok_or_else(|| {
        ApiError::new(
            Code::Unimplemented,
            "webhooks are not available on this backend",
        )
    })
}

/// The caller's webhooks (never their secrets).
#[utoipa::path(get, path = "/v1/webhooks", tag = "events",
    responses((status = 200, body = WebhookList), (status = 501, body = ErrorBody)))]
async fn list_webhooks(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
) -> ApiResult<ApiJson<WebhookList>> {
    Ok(ApiJson(hooks(&state)?.list(&tenant).await?))
}

/// Register (or replace) a webhook: the caller's events, POSTed to `url`
/// signed with `secret` (`Sandhub-Signature: t=..,v1=..`).
#[utoipa::path(put, path = "/v1/webhooks/{name}", tag = "events", request_body = PutWebhook,
    params(("name" = String, Path, description = "The webhook's name")),
    responses((status = 200, body = WebhookInfo),
              (status = 400, body = ErrorBody, description = "a bad url, event type, secret or field"),
              (status = 403, body = ErrorBody, description = "the url reaches a closed address"),
              (status = 429, body = ErrorBody, description = "the tenant has the most webhooks allowed")))]
async fn put_webhook(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<PutWebhook>,
) -> ApiResult<ApiJson<WebhookInfo>> {
    Ok(ApiJson(hooks(&state)?.put(&tenant, &name, body).await?))
}

/// One webhook (never its secret).
#[utoipa::path(get, path = "/v1/webhooks/{name}", tag = "events",
    params(("name" = String, Path, description = "The webhook's name")),
    responses((status = 200, body = WebhookInfo), (status = 404, body = ErrorBody)))]
async fn get_webhook(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<ApiJson<WebhookInfo>> {
    Ok(ApiJson(hooks(&state)?.get(&tenant, &name).await?))
}

/// Delete a webhook, with what it was still owed.
#[utoipa::path(delete, path = "/v1/webhooks/{name}", tag = "events",
    params(("name" = String, Path, description = "The webhook's name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_webhook(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    hooks(&state)?.delete(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A webhook's last delivery attempts, newest first, with the receiver's
/// status codes.
#[utoipa::path(get, path = "/v1/webhooks/{name}/deliveries", tag = "events",
    params(("name" = String, Path, description = "The webhook's name")),
    responses((status = 200, body = DeliveryList), (status = 404, body = ErrorBody)))]
async fn list_deliveries(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<ApiJson<DeliveryList>> {
    Ok(ApiJson(hooks(&state)?.deliveries(&tenant, &name).await?))
}
