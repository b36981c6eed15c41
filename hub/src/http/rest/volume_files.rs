//! Files in a named volume with no sandbox running
//! (`/v1/volumes/{name}/files/{path}`), in the shapes of the sandbox
//! files API (`files.rs`): `GET` a file's bytes or a directory's
//! [`DirectoryListing`] (`type=file|directory` to insist), `HEAD` for its
//! headers, `PUT` a raw body (`mode`), `DELETE` (`recursive`). The walk
//! itself, which follows no link, is `crate::volume_files`.

use axum::{
    body::Body,
    extract::{Request, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Json,
};
use sandhub_api::{
    error::{Code, ErrorBody},
    sandboxd::{DirectoryListing, EntryType},
};
use sandhub_client::{sandboxd::SandboxdClient, WriteOptions};
use serde::Deserialize;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::{
    backend::TenantView,
    http::{
        upload::{self, Upload},
        volume_store::Store,
        Api, ApiError, ApiPath, ApiQuery, ApiResult, AppState,
    },
    volume_files::{FileError, Found, VolPath},
};

impl From<FileError> for ApiError {
    fn from(e: FileError) -> Self {
        ApiError {
            error: e.error,
            status: e.status.and_then(|s| StatusCode::from_u16(s).ok()),
        }
    }
}

/// As `files.rs`: the catch-all segment cannot be spelled in OpenAPI, so
/// the routes are made by hand and documented from the handlers.
#[derive(OpenApi)]
#[openapi(paths(get_volume_file, head_volume_file, put_volume_file, delete_volume_file))]
struct VolumeFilesDoc;

pub fn routes() -> OpenApiRouter<AppState> {
    let methods = || {
        get(get_volume_file)
            .head(head_volume_file)
            .put(put_volume_file)
            .delete(delete_volume_file)
    };
    OpenApiRouter::with_openapi(VolumeFilesDoc::openapi())
        .route("/v1/volumes/{name}/files", methods())
        .route("/v1/volumes/{name}/files/", methods())
        .route("/v1/volumes/{name}/files/{*path}", methods())
}

#[derive(Debug, Deserialize)]
struct FilePath {
    name: String,
    #[serde(default)]
    path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GetQuery {
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutQuery {
    mode: Option<String>,
    #[serde(default)]
    append: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    #[serde(default)]
    recursive: bool,
}

fn word(kind: EntryType) -> &'static str {
    match kind {
        EntryType::File => "file",
        EntryType::Directory => "directory",
    }
}

/// `type=file|directory`: CONFLICT when the path is the other kind.
fn check_kind(want: Option<&str>, have: EntryType, path: &VolPath) -> ApiResult<()> {
    let want = match want {
        None => return Ok(()),
        Some("file") => EntryType::File,
        Some("directory") => EntryType::Directory,
        Some(other) => {
            return Err(ApiError::new(
                Code::InvalidArgument,
                format!("type must be `file` or `directory`, not {other:?}"),
            ))
        }
    };
    if want != have {
        return Err(ApiError::new(
            Code::Conflict,
            format!(
                "{} is a {}, not a {}",
                path.display(),
                word(have),
                word(want)
            ),
        ));
    }
    Ok(())
}

/// `Last-Modified` for an entry, as the sandbox files API sends it.
fn last_modified(entry: &sandhub_api::sandboxd::FileEntry) -> String {
    humantime::parse_rfc3339(&entry.modified_at)
        .map(httpdate::fmt_http_date)
        .unwrap_or_default()
}

fn listing_response(listing: DirectoryListing, with_body: bool) -> Response {
    if with_body {
        return Json(listing).into_response();
    }
    let len = serde_json::to_vec(&listing).map(|v| v.len()).unwrap_or(0);
    (
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::empty(),
    )
        .into_response()
}

fn file_headers(size: u64) -> [(header::HeaderName, String); 2] {
    [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (header::CONTENT_LENGTH, size.to_string()),
    ]
}

/// `get_or_head` through a Pod's sandboxd.
async fn remote_get(
    sandboxd: &SandboxdClient,
    path: &VolPath,
    kind: Option<&str>,
    with_body: bool,
) -> ApiResult<Response> {
    let rel = path.relative();
    let entry = sandboxd.stat(&rel).await?.ok_or_else(|| {
        ApiError::new(Code::NotFound, format!("{}: no such file", path.display()))
    })?;
    check_kind(kind, entry.kind, path)?;
    if entry.kind == EntryType::Directory {
        return Ok(listing_response(
            sandboxd.list_files(&rel).await?,
            with_body,
        ));
    }
    if !with_body {
        return Ok((file_headers(entry.size), Body::empty()).into_response());
    }
    let stream = sandboxd.read_file(&rel).await?;
    Ok((file_headers(entry.size), Body::from_stream(stream)).into_response())
}

async fn get_or_head(
    api: &dyn TenantView,
    name: &str,
    raw: &str,
    kind: Option<&str>,
    with_body: bool,
) -> ApiResult<Response> {
    let path = VolPath::parse(raw)?;
    let dir = match Store::open(api, name).await? {
        Store::Local(dir) => dir,
        Store::Pod(sandboxd) => return remote_get(&sandboxd, &path, kind, with_body).await,
    };
    if !with_body {
        let entry = dir.stat(path.clone()).await?;
        check_kind(kind, entry.kind, &path)?;
        if entry.kind == EntryType::Directory {
            let listing = dir.list(path).await?;
            return Ok(listing_response(listing, false));
        }
        return Ok((
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_LENGTH, entry.size.to_string()),
                (header::LAST_MODIFIED, last_modified(&entry)),
            ],
            Body::empty(),
        )
            .into_response());
    }
    match dir.get(path.clone()).await? {
        Found::Directory(listing) => {
            check_kind(kind, EntryType::Directory, &path)?;
            Ok(listing_response(listing, true))
        }
        Found::File { file, entry } => {
            check_kind(kind, EntryType::File, &path)?;
            // Streamed from the fd opened above: nothing is looked up
            // by name again while the bytes go out. Large reads: each
            // one is a hop to the blocking pool (4 KiB ones made a 256 MiB
            // download 9x slower than the sandbox files API's).
            let stream = tokio_util::io::ReaderStream::with_capacity(
                tokio::fs::File::from_std(file),
                crate::volume_files::IO_CHUNK,
            );
            Ok(Response::builder()
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .header(header::CONTENT_LENGTH, entry.size)
                .header(header::LAST_MODIFIED, last_modified(&entry))
                .body(Body::from_stream(stream))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
        }
    }
}

/// Read a file of a volume (raw bytes) or list a directory, with no
/// sandbox running. A symbolic link anywhere on the path is refused (403),
/// never followed; listings leave links and special files out.
#[utoipa::path(get, path = "/v1/volumes/{name}/files/{path}", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name"),
           ("path" = String, Path, description = "Path in the volume"),
           ("type" = Option<String>, Query, description = "`file` or `directory`: 409 if the path is the other kind")),
    responses(
        (status = 200, description = "A file's bytes, or a directory's listing",
         content((String = "application/octet-stream"), (DirectoryListing = "application/json"))),
        (status = 400, body = ErrorBody, description = "A bad path (NUL, `..`, too long)"),
        (status = 403, body = ErrorBody, description = "A symbolic link on the path"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The hub has no disk-quota volume"),
        (status = 501, body = ErrorBody, description = "not on this backend"),
    ))]
async fn get_volume_file(
    Api(api): Api,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
    ApiQuery(q): ApiQuery<GetQuery>,
) -> ApiResult<Response> {
    get_or_head(api.as_ref(), &name, &path, q.kind.as_deref(), true).await
}

/// Headers of a volume's file or directory (a file's `Content-Length`), no body.
#[utoipa::path(head, path = "/v1/volumes/{name}/files/{path}", tag = "volumes",
    params(("name" = String, Path), ("path" = String, Path),
           ("type" = Option<String>, Query)),
    responses((status = 200), (status = 400), (status = 403), (status = 404), (status = 409),
              (status = 412, description = "The hub has no disk-quota volume"),
              (status = 501, description = "not on this backend")))]
async fn head_volume_file(
    Api(api): Api,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
    ApiQuery(q): ApiQuery<GetQuery>,
) -> ApiResult<Response> {
    get_or_head(api.as_ref(), &name, &path, q.kind.as_deref(), false).await
}

/// `mode` as the sandbox files API takes it: `^0[0-7]{3}$`.
fn parse_mode(mode: Option<&str>) -> ApiResult<u32> {
    let Some(m) = mode else {
        return Ok(0o644);
    };
    let ok = m.len() == 4 && m.starts_with('0') && m.bytes().all(|b| (b'0'..=b'7').contains(&b));
    if !ok {
        return Err(ApiError::new(
            Code::InvalidArgument,
            format!("mode must match ^0[0-7]{{3}}$, not {m:?}"),
        ));
    }
    u32::from_str_radix(m, 8).map_err(|e| ApiError::new(Code::InvalidArgument, e.to_string()))
}

/// Write a file of a volume (raw body), creating its parents, with no
/// sandbox running. The whole file is written beside its name and renamed
/// over it, so a failed upload leaves the old file (or none). Created
/// files and directories belong to the sandboxes' root. A body over the
/// hub's `--max-upload-bytes` is 413; a volume that fills up is 507.
#[utoipa::path(put, path = "/v1/volumes/{name}/files/{path}", tag = "volumes",
    params(("name" = String, Path), ("path" = String, Path),
           ("mode" = Option<String>, Query, description = "^0[0-7]{3}$, default 0644")),
    request_body(content = String, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "The hub has no disk-quota volume"),
              (status = 413, body = ErrorBody),
              (status = 501, body = ErrorBody, description = "not on this backend"),
              (status = 507, body = ErrorBody, description = "The volume is full (its size_mb)")))]
async fn put_volume_file(
    State(state): State<AppState>,
    Api(api): Api,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
    ApiQuery(q): ApiQuery<PutQuery>,
    request: Request,
) -> ApiResult<Response> {
    let limits = state.limits;
    upload::refuse_declared(&limits, request.headers())?;
    if q.append {
        return Err(ApiError::new(
            Code::InvalidArgument,
            "append is not supported on volume files; write the whole file",
        ));
    }
    let mode = parse_mode(q.mode.as_deref())?;
    let path = VolPath::parse(&path)?;
    let files = Store::open(api.as_ref(), &name).await?;
    let Upload {
        data,
        tripped,
        remainder,
    } = upload::capped(&limits, request.into_body());
    let result = match files {
        Store::Local(dir) => dir.write(path, data, mode).await.map_err(ApiError::from),
        Store::Pod(sandboxd) => sandboxd
            .write_file(
                &path.relative(),
                data,
                WriteOptions {
                    mode: Some(mode),
                    ..Default::default()
                },
            )
            .await
            .map_err(ApiError::from),
    };
    if tripped.is_set() {
        return Err(limits.upload_too_large().into());
    }
    if result.is_err() {
        // Refused before the body ended (a full volume): the client is
        // still sending and must get this answer, not a reset.
        remainder
            .drain(limits.max_upload_bytes, crate::guard::DRAIN_TIMEOUT)
            .await;
    }
    result?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Delete a volume's file, link (the link itself, never its target) or
/// empty directory; a directory with contents with `recursive=true`.
#[utoipa::path(delete, path = "/v1/volumes/{name}/files/{path}", tag = "volumes",
    params(("name" = String, Path), ("path" = String, Path), ("recursive" = Option<bool>, Query)),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "The hub has no disk-quota volume"),
              (status = 501, body = ErrorBody, description = "not on this backend")))]
async fn delete_volume_file(
    Api(api): Api,
    ApiPath(FilePath { name, path }): ApiPath<FilePath>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult<StatusCode> {
    let path = VolPath::parse(&path)?;
    match Store::open(api.as_ref(), &name).await? {
        Store::Local(dir) => dir.delete(path, q.recursive).await?,
        Store::Pod(sandboxd) => sandboxd.delete_file(&path.relative(), q.recursive).await?,
    }
    Ok(StatusCode::NO_CONTENT)
}
