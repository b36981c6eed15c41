//! Templates: what a sandbox is.

use axum::http::StatusCode;
use sandhub_api::{
    error::ErrorBody,
    hub::{NamedTemplate, Template, TemplateList},
};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiJson, ApiPath, ApiResult, AppState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_templates))
        .routes(routes!(put_template, get_template, delete_template))
}

/// Templates of the caller (`default` always exists).
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses((status = 200, body = TemplateList)))]
async fn list_templates(Api(api): Api) -> ApiResult<ApiJson<TemplateList>> {
    Ok(ApiJson(TemplateList {
        templates: api.list_templates().await?,
    }))
}

/// Create or replace a template.
#[utoipa::path(put, path = "/v1/templates/{name}", tag = "templates", request_body = Template,
    params(("name" = String, Path, description = "DNS-1123 label")),
    responses((status = 200, body = NamedTemplate), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "root_fs or seed_dir outside --template-dirs, or network: host without --allow-host-network"),
              (status = 404, body = ErrorBody, description = "image names an image the tenant's store does not hold (pull it first)")))]
async fn put_template(
    Api(api): Api,
    ApiPath(name): ApiPath<String>,
    ApiJson(t): ApiJson<Template>,
) -> ApiResult<ApiJson<NamedTemplate>> {
    Ok(ApiJson(api.put_template(&name, t).await?))
}

/// One template.
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 200, body = NamedTemplate), (status = 404, body = ErrorBody)))]
async fn get_template(
    Api(api): Api,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<ApiJson<NamedTemplate>> {
    Ok(ApiJson(api.get_template(&name).await?))
}

/// Delete a template no pool uses.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_template(Api(api): Api, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    api.delete_template(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
