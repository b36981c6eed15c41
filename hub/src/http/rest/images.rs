//! Images in the local backend's store: import, pull (streamed NDJSON
//! progress), prepull, list, remove, prune. Layers are shared by content,
//! but each tenant sees, names and removes only the images it imported or
//! pulled itself; on Kubernetes these
//! routes answer `UNIMPLEMENTED` (the nodes hold images).

use axum::{
    body::Body,
    extract::{Request, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{Image, ImageList, PruneResult, PullEvent, PullRequest},
};
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use sandhub_client::Error;

use crate::{
    backend::ImageService,
    http::{Api, ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState},
};

fn api(e: ErrorBody) -> ApiError {
    Error::from(e).into()
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_images))
        .routes(routes!(import_image))
        .routes(routes!(pull_image))
        .routes(routes!(prune_images))
        .routes(routes!(delete_image))
}

fn images(state: &AppState) -> Result<std::sync::Arc<dyn ImageService>, ApiError> {
    state.hub.images().ok_or_else(|| {
        ApiError::new(
            Code::Unimplemented,
            "this backend has no image store: on Kubernetes the nodes pull images",
        )
    })
}

/// Images in the hub's store.
#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, body = ImageList), (status = 501, body = ErrorBody)))]
async fn list_images(
    State(state): State<AppState>,
    Api(view): Api,
) -> ApiResult<ApiJson<ImageList>> {
    Ok(ApiJson(ImageList {
        items: images(&state)?.list(view.tenant()).await.map_err(api)?,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ImportQuery {
    /// `name:tag` for the image (else the archive's own tag, if any).
    tag: Option<String>,
    /// Which image of an OCI layout holding several: its
    /// `org.opencontainers.image.ref.name`.
    #[serde(rename = "ref")]
    #[param(rename = "ref")]
    pick: Option<String>,
}

/// Import an OCI layout or `docker save` archive (an uncompressed tar;
/// a layout directory is tarred by the client). The body streams into the
/// store, bounded by `--max-upload-bytes`.
#[utoipa::path(post, path = "/v1/images/import", tag = "images", params(ImportQuery),
    request_body(content = String, content_type = "application/x-tar"),
    responses((status = 200, body = Image), (status = 400, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 501, body = ErrorBody)))]
async fn import_image(
    State(state): State<AppState>,
    Api(view): Api,
    ApiQuery(q): ApiQuery<ImportQuery>,
    request: Request,
) -> ApiResult<ApiJson<Image>> {
    let images = images(&state)?;
    refuse_simple_cross_origin(request.headers())?;
    let limits = state.limits;
    crate::http::upload::refuse_declared(&limits, request.headers())?;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let tag = q.tag.filter(|t| !t.is_empty());
    let pick = q.pick.filter(|p| !p.is_empty());
    let import = images.import(view.tenant(), Box::new(ChannelReader::new(rx)), tag, pick);
    let max = limits.max_upload_bytes;
    let feed = async move {
        let mut body = Body::into_data_stream(request.into_body());
        let mut total = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| std::io::Error::other(format!("request body: {e}")));
            if let Ok(c) = &chunk {
                total += c.len() as u64;
                if total > max {
                    // The import sees an error and keeps nothing.
                    let _ = tx
                        .send(Err(std::io::Error::other("body over --max-upload-bytes")))
                        .await;
                    return true;
                }
            }
            if tx.send(chunk).await.is_err() {
                // The import stopped reading: it has its answer.
                break;
            }
        }
        false
    };
    let (result, too_large) = tokio::join!(import, feed);
    if too_large {
        return Err(limits.upload_too_large().into());
    }
    Ok(ApiJson(result.map_err(api)?))
}

/// Pull an image from an OCI / Docker v2 registry, streaming progress as
/// NDJSON: `resolved`, then `layer` / `layer_done` per layer, and last
/// `done` (with the image) or `error` (`{code, message}`; nothing of the
/// image is listed). A request that breaks the API's rules (the
/// reference in the distribution grammar, the tag, credentials) is
/// refused with 400 before the stream starts.
/// Credentials in the body are for this pull only; without them the
/// hub's `--registry-config` is used, else none.
#[utoipa::path(post, path = "/v1/images/pull", tag = "images", request_body = PullRequest,
    responses(
        (status = 200, content_type = "application/x-ndjson", body = PullEvent,
         description = "One event per line; the last is `done` or `error`"),
        (status = 400, body = ErrorBody), (status = 501, body = ErrorBody)))]
async fn pull_image(
    State(state): State<AppState>,
    Api(tenant): Api,
    ApiJson(request): ApiJson<PullRequest>,
) -> ApiResult<Response> {
    let images = images(&state)?;
    request.validate().map_err(api)?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let tenant = tenant.tenant().to_string();
    // The pull goes on if the client goes away: others may be waiting on
    // it, and what it fetched is kept for the next one.
    tokio::spawn(async move {
        let _ = images.pull(&tenant, request, Some(tx)).await;
    });
    let lines = futures::stream::unfold(rx, |mut rx| async move {
        let event = rx.recv().await?;
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Some((
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from(line)),
            rx,
        ))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// A web page may send a "simple" request (form or text content types)
/// without a CORS preflight; an import from one is refused, so a page the
/// operator visits cannot fill a loopback hub's store.
fn refuse_simple_cross_origin(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    if !headers.contains_key(header::ORIGIN) {
        return Ok(());
    }
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if matches!(
        essence.as_str(),
        "" | "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
    ) {
        let mut e = ApiError::new(
            Code::InvalidArgument,
            "an import from a web page (it carries an Origin header) must say \
             Content-Type: application/x-tar",
        );
        e.status = Some(StatusCode::UNSUPPORTED_MEDIA_TYPE);
        return Err(e);
    }
    Ok(())
}

/// Remove a tag, or an image by id or by its last tag. An image a template
/// uses is `CONFLICT`.
#[utoipa::path(delete, path = "/v1/images/{reference}", tag = "images",
    params(("reference" = String, Path, description = "name:tag or sha256:<id>")),
    responses((status = 200, body = Image), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 501, body = ErrorBody)))]
async fn delete_image(
    State(state): State<AppState>,
    Api(view): Api,
    ApiPath(reference): ApiPath<String>,
) -> ApiResult<ApiJson<Image>> {
    Ok(ApiJson(
        images(&state)?
            .remove(view.tenant(), reference)
            .await
            .map_err(api)?,
    ))
}

/// Remove untagged images no template uses, and every layer and blob no
/// image needs.
#[utoipa::path(post, path = "/v1/images/prune", tag = "images",
    responses((status = 200, body = PruneResult), (status = 501, body = ErrorBody)))]
async fn prune_images(
    State(state): State<AppState>,
    Api(view): Api,
) -> ApiResult<(StatusCode, ApiJson<PruneResult>)> {
    Ok((
        StatusCode::OK,
        ApiJson(images(&state)?.prune(view.tenant()).await.map_err(api)?),
    ))
}

/// A blocking `Read` over chunks sent from async code: the request body
/// streams into an import without being buffered whole.
pub struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    chunk: bytes::Bytes,
}

impl ChannelReader {
    pub fn new(rx: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>) -> Self {
        ChannelReader {
            rx,
            chunk: bytes::Bytes::new(),
        }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(c)) => self.chunk = c,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}
