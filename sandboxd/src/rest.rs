//! REST (stub).
use std::sync::Arc;
use axum::Router;
use crate::daemon::Daemon;
pub fn router(d: Arc<Daemon>) -> Router { crate::files::routes().with_state(d) }
