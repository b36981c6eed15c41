//! `GET /v1/sandboxes/{id}/entrypoint/log`: the newest bytes of a sandbox's
//! entrypoint output (`/tmp/sandhub-entrypoint.log` inside it, outside the
//! workspace the files routes reach). sandboxd reads it back through the
//! handle it wrote it with, so whatever the sandbox puts at that path
//! since, the answer is the entrypoint's own output.

use std::time::Duration;

use axum::{
    body::Bytes,
    http::{header, HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
};
use http_body_util::BodyExt;
use sandboxd::entrypoint::{ENTRYPOINT_LOG_ROUTE, LOG_TAIL_DEFAULT, LOG_TAIL_MAX};
use sandhub_api::error::{Code, ErrorBody};
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiError, ApiPath, ApiQuery, ApiResult, AppState};

/// A sandboxd that does not answer in this long leaves the caller a 503.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(entrypoint_log))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LogQuery {
    /// How many of the newest bytes (default 65536, at most 1048576).
    tail: Option<u64>,
}

/// The newest bytes of the sandbox's entrypoint output, as text (invalid
/// UTF-8 replaced).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/entrypoint/log", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), LogQuery),
    responses(
        (status = 200, body = String, content_type = "text/plain"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "No such sandbox, or it has no entrypoint log"),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 503, body = ErrorBody, description = "Its sandboxd did not answer"),
    ))]
async fn entrypoint_log(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> ApiResult<Response> {
    let tail = q.tail.unwrap_or(LOG_TAIL_DEFAULT);
    if tail > LOG_TAIL_MAX {
        return Err(ApiError::new(
            Code::InvalidArgument,
            format!("tail: at most {LOG_TAIL_MAX} bytes"),
        ));
    }
    let client = api.sandboxd(&id, "reading the entrypoint's log").await?;
    let unavailable = |what: String| ApiError::new(Code::Unavailable, what);
    let ask = async {
        let response = client
            .forward(
                Method::GET,
                &format!("{ENTRYPOINT_LOG_ROUTE}?tail={tail}"),
                HeaderMap::new(),
                http_body_util::Empty::<Bytes>::new(),
            )
            .await?;
        let status = response.status();
        // The sandbox answers from inside: never more than asked for.
        let body = http_body_util::Limited::new(response.into_body(), tail as usize + 1024)
            .collect()
            .await
            .map_err(|e| unavailable(format!("reading the entrypoint's log: {e}")))?
            .to_bytes();
        Ok::<_, ApiError>((status, body))
    };
    let (status, body) = tokio::time::timeout(ASK_TIMEOUT, ask)
        .await
        .map_err(|_| unavailable("the sandbox did not answer in time".into()))??;
    match status {
        StatusCode::OK => {}
        StatusCode::NOT_FOUND => {
            return Err(ApiError::new(
                Code::NotFound,
                format!("sandbox {id} has no entrypoint log"),
            ))
        }
        s => {
            return Err(unavailable(format!(
                "the sandbox answered {s} for its entrypoint log"
            )))
        }
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        String::from_utf8_lossy(&body).into_owned(),
    )
        .into_response())
}
