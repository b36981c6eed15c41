//! sandboxd's server spans (issue #30 §5): one per REST request and gRPC
//! call (`Execute`, `Start`, the file routes...), child of the caller's
//! `traceparent` (the hub's client span), so one trace runs from the
//! hub's front door into this process. Only with `--otlp-endpoint`,
//! which comes from sandboxd's own flags or environment at start: nothing
//! a request or the workload sends changes where spans go.
//!
//! Span names are route templates or RPC names, never raw paths (a file
//! path is the tenant's); no attribute carries a command, env or file name.

use axum::{
    extract::{MatchedPath, Request},
    middleware::Next,
    response::Response,
};
use tracing::Instrument;

pub async fn trace_request(request: Request, next: Next) -> Response {
    if !sandhub_telemetry::enabled() {
        return next.run(request).await;
    }
    let name = span_name(&request);
    let span = sandhub_telemetry::server_span(&name, request.headers());
    let response = next.run(request).instrument(span.clone()).await;
    sandhub_telemetry::record_status(&span, response.status().as_u16());
    response
}

fn span_name(request: &Request) -> String {
    // `/process.v1.ProcessService/Execute` → `process.v1.ProcessService/Execute`
    if let Some(rpc) = sandhub_telemetry::context::rpc_name(request.uri().path()) {
        return rpc.to_string();
    }
    // `Execute` over REST is still `Execute`.
    if request.uri().path() == sandhub_api::sandboxd::EXECUTE_ROUTE {
        return "process.v1.ProcessService/Execute".to_string();
    }
    match request.extensions().get::<MatchedPath>() {
        Some(route) => format!("{} {}", request.method(), route.as_str()),
        None => request.method().to_string(),
    }
}
