//! Listeners (stub).
use std::sync::Arc;
use crate::daemon::Daemon;
pub async fn run(_d: Arc<Daemon>) -> anyhow::Result<()> { Ok(()) }
