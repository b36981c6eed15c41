//! REST `/v1/files/{path}` (stub).
use std::sync::Arc;
use axum::Router;
use crate::daemon::Daemon;
pub fn routes() -> Router<Arc<Daemon>> { Router::new() }
