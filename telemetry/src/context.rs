//! Trace context in and out of HTTP headers and gRPC metadata (which are
//! HTTP/2 headers): the inbound parent of a server span, and the outbound
//! context of a client call. Nothing here does anything while export is
//! off ([`crate::enabled`] is false): callers check first, so an off
//! binary creates no spans and reads no headers.

use http::{HeaderMap, HeaderValue};
use opentelemetry::{
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
    Context,
};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::w3c::{self, TraceParent};

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// A remote parent: the context a request arrived with (or the hub's own
/// request span, handed down in a request's extensions to code that runs
/// on another task, such as an MCP tool call).
#[derive(Clone, Debug)]
pub struct Parent(Context);

impl Parent {
    /// The parent `headers` name, if they name one validly: exactly one
    /// `traceparent` in W3C's grammar (two are ambiguous: none is taken),
    /// and the `tracestate` fields if they pass [`w3c::tracestate`].
    pub fn from_headers(headers: &HeaderMap) -> Option<Parent> {
        let mut parents = headers.get_all(TRACEPARENT).iter();
        let (Some(value), None) = (parents.next(), parents.next()) else {
            return None;
        };
        let parent = TraceParent::parse(value.as_bytes())?;
        let state = w3c::tracestate(headers.get_all(TRACESTATE).iter().map(|v| v.as_bytes()))
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let span = SpanContext::new(
            TraceId::from_bytes(parent.trace_id),
            SpanId::from_bytes(parent.span_id),
            TraceFlags::new(parent.flags & TraceFlags::SAMPLED.to_u8()),
            true,
            state,
        );
        Some(Parent(Context::new().with_remote_span_context(span)))
    }

    /// `span`'s own context, for its children on other tasks.
    pub fn of(span: &Span) -> Parent {
        Parent(span.context())
    }

    /// Makes this the parent of `span` (before `span` is first entered).
    pub fn adopt(self, span: &Span) {
        // Fails only for a span already started, which callers never pass.
        let _ = span.set_parent(self.0);
    }
}

/// Writes `span`'s context as `traceparent` (and `tracestate` when it has
/// one) into `headers`, replacing any there. A span that is not recorded
/// (export off, or filtered out) has no valid context and writes nothing.
pub fn inject(span: &Span, headers: &mut HeaderMap) {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return;
    }
    let parent = TraceParent {
        trace_id: sc.trace_id().to_bytes(),
        span_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    };
    if let Ok(v) = HeaderValue::from_str(&parent.format()) {
        headers.insert(TRACEPARENT, v);
    }
    let state = sc.trace_state().header();
    match HeaderValue::from_str(&state) {
        Ok(v) if !state.is_empty() => {
            headers.insert(TRACESTATE, v);
        }
        _ => {
            headers.remove(TRACESTATE);
        }
    }
}

/// A server span named `name` for a request that arrived with `headers`:
/// its parent is the caller's context if it sent a valid one, else it
/// starts a trace. [`Span::none`] while export is off.
pub fn server_span(name: &str, headers: &HeaderMap) -> Span {
    if !crate::enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: "sandhub::trace",
        "request",
        otel.name = name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(parent) = Parent::from_headers(headers) {
        parent.adopt(&span);
    }
    span
}

/// A client span for a call named `name` to another of our services,
/// child of the current span. [`Span::none`] while export is off.
pub fn client_span(name: &str) -> Span {
    if !crate::enabled() {
        return Span::none();
    }
    tracing::info_span!(
        target: "sandhub::trace",
        "call",
        otel.name = name,
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
    )
}

/// Renames `span` once it is known what it was (a route template matched
/// after the span began). Recording `otel.name` would not do: a span whose
/// context a child has taken is started, and keeps its first name.
pub fn rename(span: &Span, name: String) {
    if !span.is_none() {
        span.context().span().update_name(name);
    }
}

/// The gRPC packages our services serve (`process.v1`, `keep.v1`,
/// `watcher.v1`); a span is named by an RPC path only when it is one of
/// theirs, so a caller cannot mint span names.
const RPC_PREFIXES: [&str; 3] = ["/process.v1.", "/keep.v1.", "/watcher.v1."];
/// No RPC of ours has a longer path.
const MAX_RPC_PATH: usize = 80;

/// `process.v1.ProcessService/Execute` for the path
/// `/process.v1.ProcessService/Execute`; `None` for any other path.
pub fn rpc_name(path: &str) -> Option<&str> {
    (path.len() <= MAX_RPC_PATH
        && RPC_PREFIXES.iter().any(|p| path.starts_with(p))
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"./_".contains(&b)))
    .then(|| &path[1..])
}

/// Records a server span's HTTP status (5xx marks the span an error).
pub fn record_status(span: &Span, status: u16) {
    if span.is_none() {
        return;
    }
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// [`inject`] of the current span: what a binary that exports installs as
/// the `sandhub-client` injector (`propagate::set_injector`).
pub fn inject_current(headers: &mut HeaderMap) {
    inject(&Span::current(), headers);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_rpc_paths_name_spans() {
        assert_eq!(
            rpc_name("/process.v1.ProcessService/Execute"),
            Some("process.v1.ProcessService/Execute")
        );
        assert_eq!(rpc_name("/v1/files/etc/passwd"), None);
        assert_eq!(rpc_name("/process.v1.X/a b"), None);
        assert_eq!(rpc_name(&format!("/process.v1.{}", "x".repeat(100))), None);
    }

    #[test]
    fn a_parent_needs_exactly_one_valid_traceparent() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(good));
        h.insert(TRACESTATE, HeaderValue::from_static("a=1"));
        let p = Parent::from_headers(&h).unwrap();
        let sc = p.0.span().span_context().clone();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_state().header(), "a=1");
        h.append(TRACEPARENT, HeaderValue::from_static(good));
        assert!(Parent::from_headers(&h).is_none(), "two traceparents");
        assert!(Parent::from_headers(&HeaderMap::new()).is_none());
    }
}
