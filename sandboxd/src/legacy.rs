//! The legacy python-runtime API on `--legacy-port` (8888): what the
//! `k8s-agent-sandbox` SDK speaks through the router, a gateway, or a direct
//! URL. Error bodies carry upstream's `message` text plus our `code` word.

use std::{sync::Arc, time::Duration};

use axum::{
    extract::{DefaultBodyLimit, Request, State},
    http::{header, StatusCode, Uri},
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use futures::StreamExt;
use sandhub_api::{
    error::{Code, ErrorBody},
    legacy::{
        ExecuteRequest, ExecuteResponse, ExistsResponse, ListEntry, Message, TIMEOUT_EXIT_CODE,
    },
};

use crate::{
    confine::{kind_of, Kind, RelPath},
    error::{Error, Result},
    files::{self, BodyStream},
    process::{self, Spec},
    rest, Daemon,
};

/// `POST /execute` bodies are small JSON; anything bigger is a mistake.
const MAX_EXECUTE_BODY: usize = 1 << 20;

pub fn router(daemon: Arc<Daemon>) -> Router {
    Router::new()
        .route("/", get(root))
        .route("/execute", post(execute))
        .route("/upload", post(upload).layer(DefaultBodyLimit::disable()))
        .route("/download/{*path}", get(download))
        .route("/list", get(list))
        .route("/list/", get(list))
        .route("/list/{*path}", get(list))
        .route("/exists/{*path}", get(exists))
        .fallback(rest::not_found)
        .method_not_allowed_fallback(rest::method_not_allowed)
        .layer(middleware::from_fn_with_state(
            daemon.clone(),
            rest::require_token,
        ))
        .layer(middleware::from_fn_with_state(
            daemon.clone(),
            rest::count_http_requests,
        ))
        .with_state(daemon)
}

async fn root() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "message": "Sandbox Runtime is active."}))
}

fn legacy_error(status: StatusCode, code: Code, message: &str) -> Response {
    (status, Json(ErrorBody::new(code, message))).into_response()
}

/// Upstream's fixed messages: "Access denied" for any escape, and the
/// route's own `not_found` text (when it has one) for a missing path.
fn legacy_failure(e: Error, not_found: Option<&str>) -> Response {
    match (e, not_found) {
        (Error::PermissionDenied(_), _) => legacy_error(
            StatusCode::FORBIDDEN,
            Code::PermissionDenied,
            "Access denied",
        ),
        (Error::NotFound(_), Some(message)) => {
            legacy_error(StatusCode::NOT_FOUND, Code::NotFound, message)
        }
        (other, _) => other.into_response(),
    }
}

async fn execute(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), MAX_EXECUTE_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return Error::TooLarge(format!("execute body exceeds {MAX_EXECUTE_BODY} bytes"))
                .into_response()
        }
    };
    let req: ExecuteRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return Error::InvalidArgument(format!("body must be {{\"command\": string}}: {e}"))
                .into_response()
        }
    };
    let timeout = match req.timeout_seconds {
        None => daemon.config.legacy_exec_timeout,
        Some(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
        Some(s) => {
            return Error::InvalidArgument(format!("timeout_seconds must be positive, not {s}"))
                .into_response()
        }
    };
    match run_command(&daemon, &req.command, timeout).await {
        Ok(done) => Json(done).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Upstream answers every execution failure with 200 and exit code 1, so
/// that the SDK surfaces it as a failed command rather than an HTTP error.
/// The one exception is a sandbox at its process limit: the command was
/// never tried, so that is a 429 `RESOURCE_EXHAUSTED` a client can retry.
async fn run_command(daemon: &Daemon, command: &str, timeout: Duration) -> Result<ExecuteResponse> {
    let failed = |why: String| ExecuteResponse {
        stdout: String::new(),
        stderr: format!("Failed to execute command: {why}"),
        exit_code: 1,
        timed_out: false,
    };
    let Some(argv) = shlex::split(command) else {
        return Ok(failed("unbalanced quotes in command".into()));
    };
    if argv.is_empty() {
        return Ok(failed("empty command".into()));
    }
    let spec = Spec {
        argv,
        timeout: Some(timeout),
        ..Spec::default()
    };
    Ok(match process::run(daemon, spec).await {
        Ok(done) => ExecuteResponse {
            stdout: String::from_utf8_lossy(&done.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&done.stderr).into_owned(),
            exit_code: if done.timed_out {
                TIMEOUT_EXIT_CODE
            } else {
                done.exit_code
            },
            timed_out: done.timed_out,
        },
        Err(e @ Error::ResourceExhausted(_)) => return Err(e),
        Err(e) => failed(e.to_string()),
    })
}

async fn upload(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    match upload_inner(&daemon, request).await {
        Ok(name) => Json(Message {
            message: format!("File '{name}' uploaded successfully."),
        })
        .into_response(),
        Err(e) => legacy_failure(e, None),
    }
}

async fn upload_inner(daemon: &Daemon, request: Request) -> Result<String> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let boundary = multer::parse_boundary(&content_type)
        .map_err(|e| Error::InvalidArgument(format!("upload must be multipart/form-data: {e}")))?;
    let mut multipart = multer::Multipart::new(request.into_body().into_data_stream(), boundary);
    loop {
        let field = multipart
            .next_field()
            .await
            .map_err(|e| Error::InvalidArgument(format!("bad multipart body: {e}")))?
            .ok_or_else(|| Error::InvalidArgument("multipart body has no `file` part".into()))?;
        if field.name() != Some("file") {
            continue;
        }
        // The part's filename is the destination path, relative to the root.
        let name = field
            .file_name()
            .ok_or_else(|| Error::InvalidArgument("the `file` part has no filename".into()))?
            .to_string();
        let rel = RelPath::parse(&name)?;
        let data: BodyStream =
            Box::pin(field.map(|r| {
                r.map_err(|e| Error::InvalidArgument(format!("bad multipart body: {e}")))
            }));
        files::write_atomic(
            &daemon.root(),
            &rel,
            0o644,
            data,
            daemon.config.max_upload_bytes,
        )
        .await?;
        return Ok(name);
    }
}

fn legacy_path(uri: &Uri, prefix: &str) -> Result<RelPath> {
    files::request_path(uri.path(), prefix)
}

async fn download(State(daemon): State<Arc<Daemon>>, uri: Uri) -> Response {
    let result = async {
        let rel = legacy_path(&uri, "/download")?;
        let file = daemon.root().open_read(&rel)?;
        let st = rustix::fs::fstat(&file).map_err(|e| Error::io(e.into(), &rel.display()))?;
        if kind_of(&st) != Kind::File {
            return Err(Error::NotFound("File not found".into()));
        }
        let stream = crate::transfer::read_body(file, 0, st.st_size as u64);
        Ok((
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_LENGTH, st.st_size.to_string()),
            ],
            axum::body::Body::from_stream(stream),
        )
            .into_response())
    }
    .await;
    result.unwrap_or_else(|e| legacy_failure(e, Some("File not found")))
}

async fn list(State(daemon): State<Arc<Daemon>>, uri: Uri) -> Response {
    let result = async {
        let rel = legacy_path(&uri, "/list")?;
        if kind_of(&daemon.root().stat(&rel)?) != Kind::Directory {
            return Err(Error::NotFound("Path is not a directory".into()));
        }
        let entries: Vec<ListEntry> = daemon
            .root()
            .list(&rel)?
            .into_iter()
            .filter_map(|(name, st)| {
                let kind = files::entry_type(&st)?;
                let modified = files::mtime(&st)
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                Some(ListEntry {
                    name,
                    size: st.st_size as u64,
                    kind,
                    mod_time: modified,
                })
            })
            .collect();
        Ok(Json(entries).into_response())
    }
    .await;
    result.unwrap_or_else(|e| legacy_failure(e, Some("Path is not a directory")))
}

async fn exists(State(daemon): State<Arc<Daemon>>, uri: Uri) -> Response {
    let raw = uri
        .path()
        .strip_prefix("/exists/")
        .unwrap_or("")
        .to_string();
    let decoded = percent_encoding::percent_decode_str(&raw)
        .decode_utf8_lossy()
        .into_owned();
    let result = legacy_path(&uri, "/exists").and_then(|rel| match daemon.root().stat(&rel) {
        Ok(_) => Ok(true),
        Err(Error::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    });
    match result {
        Ok(exists) => Json(ExistsResponse {
            path: decoded,
            exists,
        })
        .into_response(),
        Err(e) => legacy_failure(e, None),
    }
}
