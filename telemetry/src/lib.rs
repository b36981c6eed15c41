//! sandhub-telemetry: OpenTelemetry traces for the hub, sandboxd, the
//! router, the controller and `sandhub-mcp` (issue #30 §5).
//!
//! # Layout
//! - [`export`]: `--otlp-endpoint` → the global subscriber with an OTLP/HTTP
//!   exporter layer (batch, bounded queue, counted losses), or without one.
//! - [`context`]: the parent a request names in `traceparent`/`tracestate`,
//!   writing a span's context into outgoing headers, and the server and
//!   client spans every binary makes the same way.
//! - `http`: the exporter's blocking HTTP/1.1 client (plain `http://`).
//! - [`w3c`]: the strict W3C Trace Context grammar (pure; inbound headers
//!   are attacker-controlled).
//!
//! Export is off unless a binary is given an endpoint. Off, no
//! OpenTelemetry layer is installed and [`enabled`] is false, so callers
//! create no spans at all ([`tracing::Span::none`]): tracing costs a
//! relaxed atomic load per operation.

use std::sync::atomic::{AtomicBool, Ordering};

pub mod context;
pub mod export;
mod http;
pub mod w3c;

pub use context::{
    client_span, inject, inject_current, record_status, rename, server_span, Parent,
};
pub use export::{dropped_spans, exported_spans, init, Guard};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// The `tracing` target of every span made for export; only these are
/// exported (`sandhub-client` and the controller name it literally).
pub const TARGET: &str = "sandhub::trace";

/// Whether spans are exported (an endpoint was given and the layer is in).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}
