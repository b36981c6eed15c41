//! HTTP endpoints: Prometheus `/metrics`, and `/healthz` + `/readyz` probes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::context::Context;

async fn metrics(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    crate::sandbox::refresh_gauge(&ctx);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ctx.metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(ctx): State<Arc<Context>>) -> (StatusCode, &'static str) {
    if ctx.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// Binds now (so a bad address fails the start) and serves in the background.
pub async fn spawn(
    addr: Option<SocketAddr>,
    what: &'static str,
    router: Router,
) -> anyhow::Result<()> {
    let Some(addr) = addr else { return Ok(()) };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("{what}: bind {addr}: {e}"))?;
    tracing::info!(address = %listener.local_addr()?, "{what} listening");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "{what} server stopped");
        }
    });
    Ok(())
}

pub fn metrics_router(ctx: Arc<Context>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(ctx)
}

pub fn probes_router(ctx: Arc<Context>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ctx)
}
