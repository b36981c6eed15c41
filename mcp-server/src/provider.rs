//! Where a tool call's [`Sandboxes`] come from.
//!
//! The tool set never decides whose sandboxes it acts on: inside the hub
//! that is the tenant the request authenticated as (known only from the
//! HTTP request), for the stdio binary it is one fixed client. A provider
//! answers that question per call.

use std::sync::Arc;

use sandhub_client::Sandboxes;

/// Yields the [`Sandboxes`] a tool call acts on.
///
/// `parts` is the HTTP request that carried the call (its extensions hold
/// whatever the hub's middleware put there, e.g. the tenant); `None` on
/// stdio. An error is shown to the model as a failed tool call, so its
/// message should say what the user must fix (e.g. a missing API key).
pub trait SandboxesProvider: Send + Sync + 'static {
    fn sandboxes(
        &self,
        parts: Option<&http::request::Parts>,
    ) -> Result<Arc<dyn Sandboxes>, sandhub_client::Error>;

    /// Who the HTTP request `parts` acts as (the hub's tenant), if that
    /// differs between requests. A streamable-HTTP session is bound to the
    /// principal that opened it: the same `Mcp-Session-Id` with another
    /// principal is answered like an unknown session (404) and runs no
    /// tool. `None` (the default) binds nothing: one fixed client serves
    /// every request alike.
    fn principal(&self, _parts: &http::request::Parts) -> Option<String> {
        None
    }

    /// The hub's URL as this call's client should use it (what
    /// `expose_port` puts before `/v1/sandboxes/{id}/ports/{port}/`).
    /// By default the client's own ([`Sandboxes::hub_url`]).
    fn hub_url(&self, parts: Option<&http::request::Parts>) -> Option<String> {
        Sandboxes::hub_url(self.sandboxes(parts).ok()?.as_ref())
    }
}

/// One fixed client for every call (stdio against a hub URL, tests).
impl SandboxesProvider for Arc<dyn Sandboxes> {
    fn sandboxes(
        &self,
        _parts: Option<&http::request::Parts>,
    ) -> Result<Arc<dyn Sandboxes>, sandhub_client::Error> {
        Ok(self.clone())
    }
}
