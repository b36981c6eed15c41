//! Assembles the HTTP surfaces: the REST router (files, health, metadata,
//! metrics) and the gRPC router, with auth and request metrics around both.

use std::sync::Arc;

use axum::{
    extract::{rejection::QueryRejection, Query, Request, State},
    http::{header, HeaderValue, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use sandhub_api::{
    proto::watcher::v1::file_watcher_service_server::FileWatcherServiceServer,
    proto::{
        self, keep::v1::kept_process_service_server::KeptProcessServiceServer,
        process::v1::process_service_server::ProcessServiceServer,
    },
    sandboxd::{is_secret_name, Health, Metadata, EXECUTE_ROUTE, ROUTED_AUTH_HEADER},
};

use crate::{
    error::Error,
    files,
    metrics::RpcLabels,
    process::{KeptProcessService, ProcessService},
    watcher::WatcherService,
    Daemon,
};

/// Paths that answer without a token, so that probes need no secret.
/// (`/` is the legacy runtime's liveness endpoint.)
const OPEN_PATHS: &[&str] = &["/v1/health", "/"];

pub fn router(daemon: Arc<Daemon>) -> Router {
    router_with(daemon, Router::new())
}

/// The REST router plus `extra` routes (the hub's local backend adds its
/// workspace controls), all behind the same auth and metrics.
pub fn router_with(daemon: Arc<Daemon>, extra: Router<Arc<Daemon>>) -> Router {
    Router::new()
        .merge(extra)
        .route("/v1/health", get(health))
        .route("/v1/metadata", get(metadata))
        .route(crate::entrypoint::ENTRYPOINT_ROUTE, get(entrypoint))
        .route(crate::entrypoint::ENTRYPOINT_LOG_ROUTE, get(entrypoint_log))
        .route(crate::usage::USAGE_ROUTE, get(usage))
        .route(EXECUTE_ROUTE, post(crate::process::unary::execute))
        .route("/metrics", get(metrics))
        .merge(files::routes())
        .merge(crate::meta::routes())
        .merge(crate::code::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            daemon.clone(),
            require_token,
        ))
        .layer(middleware::from_fn_with_state(
            daemon.clone(),
            count_http_requests,
        ))
        .layer(middleware::from_fn(crate::trace::trace_request))
        .with_state(daemon)
}

/// The gRPC services, as an axum router so that both surfaces share one
/// connection handler (and its idle timeout and graceful shutdown).
pub fn grpc_router(daemon: Arc<Daemon>) -> Router {
    grpc_router_on(grpc_base(), daemon)
}

/// What [`grpc_base`] builds.
pub type GrpcBase = tonic::service::Routes;

/// The gRPC services that need no daemon: reflection, whose descriptor
/// set took ~0.5 ms of a cold create to decode in sandboxd's fresh
/// process. The local backend builds it in its spare, ahead of need, and
/// hands it to [`grpc_router_on`].
pub fn grpc_base() -> GrpcBase {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor set is valid");
    tonic::service::Routes::new(reflection)
}

/// [`grpc_router`] on a [`grpc_base`] built earlier.
pub fn grpc_router_on(base: GrpcBase, daemon: Arc<Daemon>) -> Router {
    let process = ProcessServiceServer::new(ProcessService {
        daemon: daemon.clone(),
    })
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(usize::MAX);
    let kept = KeptProcessServiceServer::new(KeptProcessService {
        daemon: daemon.clone(),
    })
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(usize::MAX);
    let watcher = FileWatcherServiceServer::new(WatcherService {
        daemon: daemon.clone(),
    });
    base.add_service(process)
        .add_service(kept)
        .add_service(watcher)
        .into_axum_router()
        .layer(middleware::from_fn_with_state(
            daemon.clone(),
            require_grpc_token,
        ))
        .layer(middleware::from_fn_with_state(daemon, count_grpc_requests))
        .layer(middleware::from_fn(crate::trace::trace_request))
}

/// Behind sandhub-router, `Authorization` carries the router's own token
/// and is stripped before it gets here; the caller then presents ours in
/// [`ROUTED_AUTH_HEADER`]. Either header with the right token is enough.
fn check_presented(auth: &crate::auth::Auth, headers: &http::HeaderMap) -> Result<(), Error> {
    check_presented_values(
        auth,
        headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
        headers.get(ROUTED_AUTH_HEADER).map(HeaderValue::as_bytes),
    )
}

/// [`check_presented`] on the two headers' values (the first of each), for
/// the fast download path, which parses heads without a `HeaderMap`.
pub(crate) fn check_presented_values(
    auth: &crate::auth::Auth,
    authorization: Option<&[u8]>,
    routed: Option<&[u8]>,
) -> Result<(), Error> {
    match auth.check_header(authorization) {
        Err(_) if routed.is_some() => auth.check_header(routed),
        other => other,
    }
}

pub(crate) async fn require_token(
    State(daemon): State<Arc<Daemon>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(auth) = &daemon.auth {
        if !OPEN_PATHS.contains(&request.uri().path()) {
            if let Err(e) = check_presented(auth, request.headers()) {
                return e.into_response();
            }
        }
    }
    next.run(request).await
}

/// gRPC clients expect a gRPC status, not an HTTP 401 body. Reflection stays
/// open: it describes the public schema and nothing else.
async fn require_grpc_token(
    State(daemon): State<Arc<Daemon>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(auth) = &daemon.auth {
        let path = request.uri().path();
        if !path.starts_with("/grpc.reflection.") {
            if let Err(e) = check_presented(auth, request.headers()) {
                return tonic::Status::from(e).into_http();
            }
        }
    }
    next.run(request).await
}

pub(crate) async fn count_http_requests(
    State(daemon): State<Arc<Daemon>>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().to_string();
    let response = next.run(request).await;
    daemon
        .metrics
        .count_http(method, response.status().as_u16());
    response
}

async fn count_grpc_requests(
    State(daemon): State<Arc<Daemon>>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.uri().path().to_string();
    let response = next.run(request).await;
    // A failed call answers trailers-only, with the status in the headers;
    // a call that got as far as streaming reports OK here.
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(|c| format!("{:?}", tonic::Code::from(c)))
        .unwrap_or_else(|| "Ok".to_string());
    daemon
        .metrics
        .grpc_requests
        .get_or_create(&RpcLabels { method, code })
        .inc();
    response
}

async fn health(State(daemon): State<Arc<Daemon>>) -> Response {
    if daemon.is_draining() {
        return Error::Unavailable("sandboxd is shutting down".into()).into_response();
    }
    Json(Health {
        status: "ok".into(),
        uptime_seconds: daemon.started.elapsed().as_secs(),
    })
    .into_response()
}

async fn metadata(State(daemon): State<Arc<Daemon>>) -> Json<Metadata> {
    let prefix = &daemon.config.metadata_env_prefix;
    let env = std::env::vars()
        .filter(|(name, _)| name.starts_with(prefix.as_str()) && !is_secret_name(name))
        .collect();
    Json(Metadata { env })
}

/// `null` when the sandbox has no entrypoint.
async fn entrypoint(
    State(daemon): State<Arc<Daemon>>,
) -> Json<Option<crate::entrypoint::EntrypointRecord>> {
    Json(daemon.entrypoint_tracker.record())
}

/// The newest bytes of the entrypoint's output (`?tail=N`).
async fn entrypoint_log(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    use crate::entrypoint::LOG_TAIL_DEFAULT;
    let tail = request
        .uri()
        .query()
        .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "tail"))
        .map(|(_, v)| v.parse::<u64>());
    let tail = match tail {
        None => LOG_TAIL_DEFAULT,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return Error::InvalidArgument("tail: not a byte count".into()).into_response()
        }
    };
    match daemon.entrypoint_tracker.log_tail(tail) {
        None => Error::NotFound("this sandbox's entrypoint has no log".into()).into_response(),
        Some(Err(e)) => Error::io(e, crate::entrypoint::ENTRYPOINT_LOG).into_response(),
        Some(Ok(bytes)) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
    }
}

/// sandboxd's container's usage ring; `null` where it sees no cgroup v2 of
/// its own. The first call starts the sampling.
/// `?since=<Unix seconds>` keeps only the points ending at or after it: the
/// hub's OOM watch asks with `since` in the future and reads only the
/// counters, a few dozen bytes.
#[derive(serde::Deserialize)]
struct UsageQuery {
    #[serde(default)]
    since: u64,
}

async fn usage(
    State(daemon): State<Arc<Daemon>>,
    query: Result<Query<UsageQuery>, QueryRejection>,
) -> Result<Json<Option<crate::usage::UsageReport>>, Error> {
    let Query(q) = query.map_err(|e| Error::InvalidArgument(format!("usage query: {e}")))?;
    Ok(Json(daemon.usage.report(q.since)))
}

async fn metrics(State(daemon): State<Arc<Daemon>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        daemon.metrics.render(),
    )
        .into_response()
}

pub(crate) async fn not_found(request: Request) -> Error {
    Error::NotFound(format!("no route for {}", request.uri().path()))
}

pub(crate) async fn method_not_allowed(request: Request) -> Response {
    let mut response = Error::InvalidArgument(format!(
        "method {} is not allowed on {}",
        request.method(),
        request.uri().path()
    ))
    .into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}
