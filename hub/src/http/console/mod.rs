//! The web console (`/`): a single-page app built from `console/` and
//! embedded in the binary, and the one API route only a browser needs.
//!
//! The console is a client of the public API like any other: every datum
//! it shows comes from `/v1/...` with the key the user signed in with,
//! sent as a header. Its own files are the same for everyone and hold no
//! data, so they are served without a key (a browser cannot put a header
//! on a navigation); everything they then ask for needs one.
//!
//! A browser cannot put a header on a WebSocket either, so the terminal
//! first `POST`s for a ticket (with the key) and opens the PTY with it:
//! see [`tickets`].
//!
//! # Layout
//!
//! ```text
//! mod.rs      the routes (/, /assets/..., POST /v1/sandboxes/{id}/pty-tickets)
//!             and the headers every console answer carries (CSP, nosniff, ...)
//! assets.rs   the embedded files (a table build.rs writes), their types and ETags
//! tickets.rs  short-lived single-use tickets for the terminal's WebSocket
//! ```

mod assets;
pub mod tickets;

use std::sync::Arc;

use axum::{
    extract::{Extension, Path},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use sandhub_api::error::ErrorBody;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Api, ApiPath, ApiResult, AppState, Tenant};
pub use tickets::PtyTickets;

/// The console's policy. Scripts and styles only from the hub's own files
/// (no inline script, no `eval`), requests only to the hub itself, never
/// framed. `style-src` allows inline styles because the terminal (xterm)
/// and the plots (uPlot) position their elements with them; a style cannot
/// run script, and every string the console shows is rendered as text.
pub const CSP: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self'; \
    connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Whether `path` is one of the console's own files (served without a key).
pub fn is_console_path(path: &str) -> bool {
    path == "/" || path.starts_with("/assets/")
}

/// The console's files, for [`super::app`] to merge (outside `/v1`).
pub fn file_routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/assets/{*file}", get(asset))
}

/// The ticket route, for [`super::routes`] (it is part of the API).
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(mint_ticket))
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&format!("assets/{file}"), &headers)
}

fn serve(name: &str, request: &HeaderMap) -> Response {
    let Some(asset) = assets::get(name) else {
        return super::ApiError::new(sandhub_api::error::Code::NotFound, "no such console file")
            .into_response();
    };
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == asset.etag.as_bytes());
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        asset.bytes.into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    if let Ok(etag) = HeaderValue::from_str(&asset.etag) {
        h.insert(header::ETAG, etag);
    }
    // Files under assets/ are named by their content's hash (Vite), so
    // they never change; index.html names them, so it is always revalidated.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if asset.immutable {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        }),
    );
    harden(h);
    response
}

/// The headers every console answer carries.
fn harden(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
}

/// A ticket for one terminal: `GET /v1/sandboxes/{id}/pty?ticket=...`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct PtyTicket {
    /// Single use, for this sandbox only.
    ticket: String,
    /// Seconds until it expires unused.
    expires_in_seconds: u64,
}

/// Mints a ticket that opens this sandbox's terminal once, within
/// seconds, as the caller's tenant: a browser cannot send the API key on
/// a WebSocket, and the key itself never goes into a URL.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty-tickets", tag = "processes",
    params(("id" = String, Path)),
    responses((status = 200, body = PtyTicket), (status = 404, body = ErrorBody),
              (status = 429, body = ErrorBody, description = "Too many unused tickets")))]
async fn mint_ticket(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    Extension(tenant): Extension<Tenant>,
    Extension(tickets): Extension<Arc<PtyTickets>>,
) -> ApiResult<axum::Json<PtyTicket>> {
    // Another tenant's (or no) sandbox: 404, as everywhere.
    api.get(&id).await?;
    let ticket = tickets.mint(&tenant.0, &id)?;
    Ok(axum::Json(PtyTicket {
        ticket,
        expires_in_seconds: tickets::TTL.as_secs(),
    }))
}
