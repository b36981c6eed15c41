//! What the front doors (REST, MCP, Gym) need from a backend: one view of
//! the sandboxes per tenant. The local hub and the Kubernetes backend both
//! provide it, so every front door works unchanged on either.

use std::sync::Arc;

use async_trait::async_trait;
use sandhub_api::hub::Snapshot;
use sandhub_client::{sandboxd::SandboxdClient, Result, Sandboxes};

/// One tenant's sandboxes: the whole [`Sandboxes`] API, plus what the REST
/// layer needs beyond it.
#[async_trait]
pub trait TenantView: Sandboxes {
    fn tenant(&self) -> &str;
    /// The sandboxd of a Ready sandbox, for routes that forward raw HTTP.
    async fn sandboxd(&self, id: &str, op: &str) -> Result<SandboxdClient>;
    /// Snapshots taken of a sandbox this tenant owns.
    async fn list_snapshots(&self, id: &str) -> Result<Vec<Snapshot>>;
}

/// A backend as the front doors see it.
#[async_trait]
pub trait Tenancy: Send + Sync + 'static {
    /// The view one API key has; `session` tags what an MCP session creates.
    fn tenant(&self, tenant: &str) -> Arc<dyn TenantView>;
    /// Readiness: the state behind the hub answers.
    async fn ready(&self) -> Result<()>;
    /// Sandboxes the hub holds (claimed and warm), for the metrics gauge.
    async fn sandbox_count(&self) -> Result<usize>;
}
