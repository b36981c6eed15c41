//! Trace context on outgoing calls (issue #30 §5), without this crate
//! knowing OpenTelemetry: the Python SDK links it and exports nothing.
//!
//! Two sources, both off by default:
//! - an **injector** a binary installs once when it exports traces
//!   (`sandhub-telemetry` writes the current span's `traceparent`); while
//!   one is set, every sandboxd call also gets a client span of its own.
//! - **per-call headers** a caller scopes around its calls
//!   ([`with_headers`]): the Python SDK passes its OpenTelemetry context
//!   this way, so one Python call carries one context.

use std::{future::Future, sync::OnceLock};

use http::{HeaderMap, HeaderName};

/// Writes the current context into outgoing headers.
pub type Injector = fn(&mut HeaderMap);

static INJECTOR: OnceLock<Injector> = OnceLock::new();

/// Installs the process's injector (once; later calls change nothing).
pub fn set_injector(injector: Injector) {
    let _ = INJECTOR.set(injector);
}

tokio::task_local! {
    static EXTRA: HeaderMap;
}

/// The only headers [`with_headers`] passes on: a trace context, never
/// something that could change what a call means (auth, routing).
const PASSED: [&str; 2] = ["traceparent", "tracestate"];

/// Runs `call` with `headers` sent on every hub request it makes. Only
/// `traceparent` and `tracestate` are taken; the hub checks them again.
pub async fn with_headers<F: Future>(headers: HeaderMap, call: F) -> F::Output {
    let mut kept = HeaderMap::new();
    for name in PASSED {
        for value in headers.get_all(name) {
            kept.append(HeaderName::from_static(name), value.clone());
        }
    }
    EXTRA.scope(kept, call).await
}

/// A client span for a sandboxd call named `name`, when traces are on.
pub(crate) fn call_span(name: &str) -> tracing::Span {
    if INJECTOR.get().is_none() {
        return tracing::Span::none();
    }
    tracing::info_span!(
        target: "sandhub::trace",
        "call",
        otel.name = name,
        otel.kind = "client",
    )
}

/// Adds the context to `headers`: the scoped headers if any, then the
/// injector's (the current span's context wins when both exist).
pub(crate) fn apply(headers: &mut HeaderMap) {
    let _ = EXTRA.try_with(|extra| {
        for name in PASSED {
            headers.remove(name);
            for value in extra.get_all(name) {
                headers.append(HeaderName::from_static(name), value.clone());
            }
        }
    });
    if let Some(inject) = INJECTOR.get() {
        inject(headers);
    }
}

/// Whether [`apply`] may add anything (cheap check before building a map).
pub(crate) fn active() -> bool {
    INJECTOR.get().is_some() || EXTRA.try_with(|_| ()).is_ok()
}
