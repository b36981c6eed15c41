//! envd's plain HTTP routes: `GET /files?path=` (the file's bytes),
//! `POST /files?path=` (multipart `file` parts, or a raw
//! `application/octet-stream` body).

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{FromRequest, Multipart, Request},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use sandhub_api::error::Code;
use sandhub_client::{Error, Result, WriteOptions};
use serde::Deserialize;
use serde_json::json;

use super::{
    inside,
    paths::{base_name, Place},
};
use crate::backend::TenantView;

#[derive(Debug, Deserialize)]
pub struct FileQuery {
    #[serde(default)]
    path: Option<String>,
}

/// envd's REST errors: `{code: <HTTP status>, message}`.
pub fn rest_error(e: &Error) -> Response {
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // envd has no 412: a Precondition is the caller's mistake (400).
    let status = if status == StatusCode::PRECONDITION_FAILED {
        StatusCode::BAD_REQUEST
    } else {
        status
    };
    if status.is_server_error() {
        tracing::warn!(code = %e.code, message = %e.message, "envd file call failed");
    }
    (
        status,
        Json(json!({"code": status.as_u16(), "message": e.message})),
    )
        .into_response()
}

pub async fn download(api: &Arc<dyn TenantView>, id: &str, query: FileQuery) -> Response {
    let Some(path) = query.path.filter(|p| !p.is_empty()) else {
        return rest_error(&Error::new(
            Code::InvalidArgument,
            "give the file as ?path=",
        ));
    };
    let place = Place::parse(&path);
    let stream: Result<std::pin::Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>> = match &place {
        Place::Workspace(rel) if !rel.is_empty() => api.read_file(id, rel).await,
        other => inside::read(api, id, &other.absolute())
            .await
            .map(|s| Box::pin(s) as _),
    };
    match stream {
        Ok(stream) => (
            [(header::CONTENT_TYPE, "application/octet-stream")],
            Body::from_stream(stream),
        )
            .into_response(),
        Err(e) => rest_error(&e),
    }
}

/// One uploaded file, written where it belongs.
async fn store(
    api: &Arc<dyn TenantView>,
    id: &str,
    path: &str,
    data: impl Stream<Item = Result<Bytes>> + Send + Unpin + 'static,
    limit: u64,
) -> Result<serde_json::Value> {
    let place = Place::parse(path);
    // Beyond the workspace no sandboxd counts the bytes: count them here.
    let mut seen = 0u64;
    let data = data.map(move |chunk| {
        let chunk = chunk?;
        seen += chunk.len() as u64;
        if seen > limit {
            return Err(Error::new(
                Code::PayloadTooLarge,
                format!("uploads are limited to {limit} bytes"),
            ));
        }
        Ok(chunk)
    });
    match &place {
        Place::Workspace(rel) if !rel.is_empty() => {
            api.write_file(id, rel, Box::pin(data), WriteOptions::default())
                .await?
        }
        Place::Workspace(_) => {
            return Err(Error::new(
                Code::InvalidArgument,
                "cannot write over the workspace directory",
            ))
        }
        Place::Elsewhere(abs) => inside::write(api, id, abs, data).await?,
    }
    let abs = place.absolute();
    Ok(json!({"name": base_name(&abs), "type": "file", "path": abs}))
}

pub async fn upload(
    api: &Arc<dyn TenantView>,
    id: &str,
    query: FileQuery,
    request: Request,
    limit: u64,
) -> Response {
    let multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let query_path = query.path.filter(|p| !p.is_empty());
    if !multipart {
        let Some(path) = query_path else {
            return rest_error(&Error::new(
                Code::InvalidArgument,
                "give the file as ?path=",
            ));
        };
        let body = request
            .into_body()
            .into_data_stream()
            .map_err(|e| Error::new(Code::InvalidArgument, format!("reading the upload: {e}")));
        return match store(api, id, &path, body, limit).await {
            Ok(entry) => Json(json!([entry])).into_response(),
            Err(e) => rest_error(&e),
        };
    }
    let mut form = match Multipart::from_request(request, &()).await {
        Ok(form) => form,
        Err(e) => return rest_error(&Error::new(Code::InvalidArgument, e.body_text())),
    };
    let mut written = Vec::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => return rest_error(&Error::new(Code::InvalidArgument, e.body_text())),
        };
        // E2B names each part's destination in its filename; `?path=`
        // (one file) wins.
        let Some(path) = query_path
            .clone()
            .or_else(|| field.file_name().map(str::to_string))
        else {
            return rest_error(&Error::new(
                Code::InvalidArgument,
                "a part names no file (filename)",
            ));
        };
        let (tx, rx) = futures::channel::mpsc::channel::<Result<Bytes>>(4);
        let writing = store(api, id, &path, rx, limit);
        let feeding = async move {
            let mut field = field;
            let mut tx = tx;
            use futures::SinkExt;
            loop {
                match field.chunk().await {
                    Ok(Some(chunk)) => {
                        if tx.send(Ok(chunk)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx
                            .send(Err(Error::new(Code::InvalidArgument, e.body_text())))
                            .await;
                        break;
                    }
                }
            }
        };
        let (entry, ()) = tokio::join!(writing, feeding);
        match entry {
            Ok(entry) => written.push(entry),
            Err(e) => return rest_error(&e),
        }
    }
    Json(written).into_response()
}
