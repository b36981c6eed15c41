//! E2B's API on the hub's own listener (`sandhub serve --e2b`), so the
//! `e2b` SDK, and every framework's E2B provider, run on Sandhub unchanged:
//! `E2B_API_URL` and `E2B_SANDBOX_URL` are both the hub's URL and
//! `E2B_API_KEY` is a Sandhub API key.
//!
//! - `control.rs`: the control plane (`/v2/sandboxes`, `/sandboxes/...`),
//!   authenticated like every hub route (the key may come as `X-API-Key`);
//!   `network.rs` translates its outbound-network words into ours.
//! - envd, the in-sandbox data plane: any request naming a sandbox in
//!   `E2b-Sandbox-Id` is diverted here before the hub's own routes, and
//!   authorized by that sandbox's access token (`../signing.rs`), which also
//!   names its tenant. On port 49983 it is envd itself: `process.rs` (its
//!   streams' byte-bounded queues in `outbox.rs`) and `filesystem.rs`
//!   (Connect-RPC, `connect.rs`), `files.rs` (`/files`), `/health`; on any
//!   other port the request goes to that port in the sandbox.
//! - `paths.rs` and `inside.rs`: E2B paths reach the whole sandbox; the
//!   workspace through sandboxd, the rest through commands run inside.
//! - `volumes.rs`: E2B's volumes over the tenant's named volumes: the
//!   control plane (`/volumes`) and the content API (`/volumecontent/...`),
//!   which carries a volume token instead of an API key, so it is diverted
//!   here before auth too; `volume_store.rs` finds the volume's files (the
//!   hub's own directory, or a Kubernetes volume's helper Pod).

mod connect;
mod control;
mod files;
mod filesystem;
mod inside;
mod jupyter;
mod network;
mod outbox;
mod paths;
mod process;
pub(crate) use process::KEPT_LABEL;
mod signed;
mod volumes;

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, Query, Request, State},
    http::{HeaderMap, HeaderName, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{get, post},
    Extension, Json, Router,
};
use sandhub_api::error::Code;
use sandhub_client::Error;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::{backend::TenantView, http::AppState};

pub use crate::http::signing::Tokens;

/// The envd version we answer as: 0.5.7 is the first whose SDKs upload
/// file-like data as a raw octet-stream body.
pub const ENVD_VERSION: &str = "0.5.7";
/// envd's own port; any other names a port of the sandbox's.
pub const ENVD_PORT: u16 = 49983;

const SANDBOX_ID: HeaderName = HeaderName::from_static("e2b-sandbox-id");
const SANDBOX_PORT: HeaderName = HeaderName::from_static("e2b-sandbox-port");
const ACCESS_TOKEN: HeaderName = HeaderName::from_static("x-access-token");
const TRAFFIC_TOKEN: HeaderName = HeaderName::from_static("e2b-traffic-access-token");

/// What the facade keeps: the token key and the processes it started.
pub struct E2b {
    tokens: Arc<Tokens>,
    processes: Arc<process::Registry>,
    /// Whom a signed file URL may be from (its keys file's tenants, or
    /// the open tenant).
    tenants: Vec<String>,
    /// `--sandbox-domain`, told to the SDKs (`domain`) for `get_host()`.
    domain: Option<String>,
}

impl E2b {
    pub fn new(tokens: Arc<Tokens>, tenants: Vec<String>) -> Self {
        E2b {
            tokens,
            processes: Arc::default(),
            tenants,
            domain: None,
        }
    }

    /// With host routing under `domain` (`{port}-{id}.<domain>`).
    pub fn with_domain(mut self, domain: Option<String>) -> Self {
        self.domain = domain;
        self
    }
}

/// The control-plane routes, merged with the hub's own.
pub fn control_routes() -> Router<AppState> {
    control::routes().merge(volumes::routes())
}

/// A sandbox E2B's proxy would not find: the 502 its SDKs read as "not
/// running" (`... was not found`).
pub fn not_running(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(json!({"code": 502, "message": format!("The sandbox {id} was not found")})),
    )
        .into_response()
}

/// Who an envd request is for, once its token checked out.
#[derive(Clone)]
struct Envd {
    api: Arc<dyn TenantView>,
    tenant: String,
    id: String,
}

fn unauthorized(message: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"code": 401, "message": message})),
    )
        .into_response()
}

/// What [`divert`] needs: the hub, the facade, and envd's routes (built
/// once; each request brings its [`Envd`] in its extensions).
#[derive(Clone)]
pub struct Diversion {
    state: AppState,
    e2b: Arc<E2b>,
    envd: Router,
    /// The code-interpreter port's routes (`jupyter.rs`).
    jupyter: Router,
}

impl Diversion {
    pub fn new(state: AppState, e2b: Arc<E2b>) -> Self {
        let envd = envd_routes(state.limits.max_upload_bytes).layer(Extension(e2b.clone()));
        Diversion {
            state,
            e2b,
            envd,
            jupyter: jupyter::routes(),
        }
    }
}

/// In front of everything: a request naming a sandbox in
/// `E2b-Sandbox-Id` is envd traffic (or traffic for one of the sandbox's
/// ports), never a hub route.
pub async fn divert(
    State(Diversion {
        state,
        e2b,
        envd: envd_router,
        jupyter,
    }): State<Diversion>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(id) = request.headers().get(&SANDBOX_ID) else {
        if volumes::is_content(request.uri().path()) {
            return volumes::content(state, e2b, request).await;
        }
        return next.run(request).await;
    };
    let Some(id) = id
        .to_str()
        .ok()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
    else {
        return unauthorized("E2b-Sandbox-Id is not a sandbox id");
    };
    let headers = request.headers();
    let port = match headers
        .get(&SANDBOX_PORT)
        .map(|v| v.to_str().map(str::parse::<u16>))
    {
        None => ENVD_PORT,
        Some(Ok(Ok(p))) if p > 0 => p,
        Some(_) => {
            return files::rest_error(&Error::new(
                Code::InvalidArgument,
                "E2b-Sandbox-Port must be a port from 1 to 65535",
            ))
        }
    };
    let token = headers
        .get(&ACCESS_TOKEN)
        .or_else(|| headers.get(&TRAFFIC_TOKEN))
        .and_then(|v| v.to_str().ok());
    let by_token = token.and_then(|t| e2b.tokens.verify(t, &id));
    // A signed file URL needs no header but the sandbox's (or its host).
    let by_signature = || {
        let operation = match *request.method() {
            axum::http::Method::GET | axum::http::Method::HEAD => "read",
            axum::http::Method::POST => "write",
            _ => return None,
        };
        if port != ENVD_PORT || request.uri().path() != "/files" {
            return None;
        }
        let q: signed::SignedQuery =
            serde_urlencoded::from_str(request.uri().query().unwrap_or("")).ok()?;
        signed::verify(&e2b.tokens, &e2b.tenants, &id, operation, &q)
    };
    let Some(tenant) = by_token.or_else(by_signature) else {
        return unauthorized("send the sandbox's access token as X-Access-Token");
    };
    let envd = Envd {
        api: state.hub.tenant(&tenant),
        tenant,
        id,
    };
    if port == jupyter::JUPYTER_PORT {
        // The sandbox's kernels, not a server on that port (issue #33).
        request.extensions_mut().insert(envd);
        return match jupyter.oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
    }
    if port != ENVD_PORT {
        let uri = super::proxy::as_sent(request.uri());
        // On the hub's own host (no `{port}-{id}` host in front), what the
        // port answers must not act as the hub's origin.
        let served = if request
            .extensions()
            .get::<super::ViaSandboxHost>()
            .is_some()
        {
            super::proxy::Served::OwnHost
        } else {
            super::proxy::Served::OnHubOrigin { cookie_path: None }
        };
        let forwarded = super::proxy::forward(
            envd.api.as_ref(),
            &state.ports,
            &envd.id,
            port,
            uri,
            request,
            served,
        );
        return match forwarded.await {
            Ok(r) => r,
            Err(e) if matches!(e.error.code, Code::NotFound | Code::FailedPrecondition) => {
                not_running(&envd.id)
            }
            Err(e) => e.into_response(),
        };
    }
    request.extensions_mut().insert(envd);
    match envd_router.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

fn envd_routes(max_upload: u64) -> Router {
    Router::new()
        .route("/health", get(health))
        .route(
            "/files",
            get(download)
                .post(move |e, q, r| upload(e, q, r, max_upload))
                .layer(DefaultBodyLimit::max(
                    usize::try_from(max_upload).unwrap_or(usize::MAX),
                )),
        )
        .route("/process.Process/{method}", post(process_call))
        .route("/filesystem.Filesystem/{method}", post(filesystem_call))
        .fallback(|| async { files::rest_error(&Error::new(Code::NotFound, "no such envd route")) })
        .layer(DefaultBodyLimit::max(connect::MAX_MESSAGE))
}

/// A sandbox that is gone (or paused) answers as E2B's proxy does; one
/// paused or suspended with `auto_resume` goes on (the call resumes it).
async fn gone(envd: &Envd) -> Option<Response> {
    use sandhub_api::hub::SandboxState;
    match envd.api.get(&envd.id).await {
        Ok(sb) if sb.state == SandboxState::Ready => None,
        Ok(sb)
            if sb.auto_resume
                && matches!(sb.state, SandboxState::Paused | SandboxState::Suspended) =>
        {
            None
        }
        _ => Some(not_running(&envd.id)),
    }
}

/// `GET /health`: 204 while the sandbox runs; a sandbox that is gone (or
/// paused) answers as E2B's proxy does, 502 "... was not found", which
/// the SDK reads as "not running".
async fn health(Extension(envd): Extension<Envd>) -> Response {
    // Asking is not using it: a paused sandbox with `auto_resume` is not
    // running, and stays paused.
    match envd.api.get(&envd.id).await {
        Ok(sb) if sb.state == sandhub_api::hub::SandboxState::Ready => {
            StatusCode::NO_CONTENT.into_response()
        }
        _ => not_running(&envd.id),
    }
}

async fn download(Extension(envd): Extension<Envd>, Query(q): Query<files::FileQuery>) -> Response {
    if let Some(r) = gone(&envd).await {
        return r;
    }
    files::download(&envd.api, &envd.id, q).await
}

async fn upload(
    Extension(envd): Extension<Envd>,
    Query(q): Query<files::FileQuery>,
    request: Request,
    max_upload: u64,
) -> Response {
    if let Some(r) = gone(&envd).await {
        return r;
    }
    files::upload(&envd.api, &envd.id, q, request, max_upload).await
}

/// The call's request message. A body over the limit was refused while
/// it was read (`DefaultBodyLimit`): that is the Connect error too.
fn read_message(
    headers: &HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Value, Error> {
    let body = body.map_err(|e| {
        Error::new(
            Code::PayloadTooLarge,
            format!(
                "request messages are limited to {} bytes: {}",
                connect::MAX_MESSAGE,
                e.body_text()
            ),
        )
    })?;
    connect::request(headers, &body)
}

async fn process_call(
    Extension(envd): Extension<Envd>,
    Extension(e2b): Extension<Arc<E2b>>,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let fail = |e: &Error| {
        if streaming {
            connect::stream_error(e)
        } else {
            connect::unary_error(e)
        }
    };
    if let Some(r) = gone(&envd).await {
        return r;
    }
    let body = match read_message(&headers, body) {
        Ok(b) => b,
        Err(e) => return fail(&e),
    };
    let call = process::Call {
        api: &envd.api,
        registry: &e2b.processes,
        tenant: &envd.tenant,
        id: &envd.id,
        keepalive: connect::keepalive(&headers),
        deadline: connect::timeout(&headers),
    };
    match method.as_str() {
        "Start" => match call.start(body).await {
            Ok(frames) => connect::stream_response(frames),
            Err(e) => fail(&e),
        },
        "Connect" => match call.connect(body).await {
            Ok(frames) => connect::stream_response(frames),
            Err(e) => fail(&e),
        },
        other => match call.unary(other, body).await {
            Ok(v) => connect::unary_ok(&v),
            Err(e) => fail(&e),
        },
    }
}

async fn filesystem_call(
    Extension(envd): Extension<Envd>,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    if let Some(r) = gone(&envd).await {
        return r;
    }
    let body = match read_message(&headers, body) {
        Ok(b) => b,
        Err(e) => return connect::unary_error(&e),
    };
    match filesystem::call(&envd.api, &envd.id, &method, body).await {
        Ok(v) => connect::unary_ok(&v),
        Err(e) => connect::unary_error(&e),
    }
}
