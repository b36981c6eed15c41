//! The hub's server span (issue #30 §5): one per request on every front
//! door (REST, Gym, E2B, MCP share this app), child of the caller's
//! `traceparent` when it sent a valid one. The operation spans
//! (`ops.rs`) and the sandboxd client spans (`sandhub-client`) nest
//! under it. Off (no `--otlp-endpoint`), `app` leaves it out.

use axum::{extract::MatchedPath, extract::Request, middleware::Next, response::Response};
use sandhub_telemetry::Parent;
use tracing::Instrument;

pub async fn trace_request(mut request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let span = sandhub_telemetry::server_span(method.as_str(), request.headers());
    // Work that leaves this task (an MCP tool call runs on the session's
    // task) finds its parent here.
    request.extensions_mut().insert(Parent::of(&span));
    let response = next.run(request).instrument(span.clone()).await;
    // The route template (`/v1/sandboxes/{id}/exec`), never the raw path:
    // ids are the tenant's, and names must stay few.
    if let Some(route) = response.extensions().get::<MatchedPath>() {
        sandhub_telemetry::rename(&span, format!("{method} {}", route.as_str()));
    }
    sandhub_telemetry::record_status(&span, response.status().as_u16());
    response
}
