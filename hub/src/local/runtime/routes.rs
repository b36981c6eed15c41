//! The routes the hub's local backend adds to the sandboxd inside each
//! sandbox: today only the workspace reset, which needs mount rights that
//! workloads (under seccomp) do not have but sandboxd does.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use sandboxd::Daemon;
use sandhub_api::error::{Code, ErrorBody};

use super::workspace::{reset_workspace, WorkspaceLayout};

/// `POST` here resets the sandbox's workspace to its seed layers: every
/// workload process is killed, the upper layer dropped, sandboxd's root
/// reopened on the fresh overlay. Answers `{"elapsed_us": N}`.
pub const RESET_ROUTE: &str = "/v1/_sandhub/reset";

/// Resets must not interleave: each one swaps the overlay's directories.
static RESETTING: Mutex<()> = Mutex::new(());

pub(crate) fn extra_routes() -> Router<Arc<Daemon>> {
    Router::new().route(RESET_ROUTE, post(reset))
}

async fn reset(State(daemon): State<Arc<Daemon>>) -> Response {
    let done = tokio::task::spawn_blocking(move || -> std::io::Result<u128> {
        let _one_at_a_time = RESETTING.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        reset_workspace(&WorkspaceLayout::discover()?)?;
        // The old root fd points into the detached overlay.
        daemon.reload_root()?;
        // The reset killed every workload, the entrypoint too.
        daemon.start_entrypoint();
        Ok(started.elapsed().as_micros())
    })
    .await;
    match done {
        Ok(Ok(us)) => Json(serde_json::json!({ "elapsed_us": us })).into_response(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "workspace reset failed");
            internal(format!("workspace reset failed: {e}"))
        }
        Err(e) => internal(format!("workspace reset task failed: {e}")),
    }
}

fn internal(message: String) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(ErrorBody {
            code: Code::Internal,
            message,
        }),
    )
        .into_response()
}
