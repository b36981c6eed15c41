//! Legacy runtime (stub).
use std::sync::Arc;
use axum::Router;
use crate::daemon::Daemon;
pub fn router(d: Arc<Daemon>) -> Router { Router::new().with_state(d) }
