//! The caller's OpenTelemetry context on every call (issue #30 §5): when
//! `opentelemetry-api` is importable (the `sandhub[otel]` extra),
//! `sandhub._otel.current_context` gives the current span's `traceparent`
//! and `tracestate`, read on the caller's thread (so in its contextvars:
//! the asyncio task's own context for `AsyncHub`), and the call's future
//! runs scoped with them (`sandhub_client::propagate::with_headers`), so
//! every hub request it makes carries them. Without the package, one
//! cached `None` check per call.

use std::{future::Future, pin::Pin};

use http::{HeaderMap, HeaderName, HeaderValue};
use pyo3::{prelude::*, sync::PyOnceLock};

static CURRENT: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// The headers of the current context, if there is one to send.
fn headers(py: Python<'_>) -> Option<HeaderMap> {
    let current = CURRENT.get_or_init(py, || {
        py.import("sandhub._otel")
            .and_then(|m| m.getattr("current_context"))
            .ok()
            .filter(|f| !f.is_none())
            .map(Bound::unbind)
    });
    let pairs: Vec<(String, String)> = current.as_ref()?.bind(py).call0().ok()?.extract().ok()?;
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        // The client keeps only traceparent and tracestate; the hub
        // checks their grammar again.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            map.append(name, value);
        }
    }
    (!map.is_empty()).then_some(map)
}

/// `fut`, carrying the caller's context when it has one.
pub fn scoped<T, F>(py: Python<'_>, fut: F) -> Pin<Box<dyn Future<Output = T> + Send>>
where
    F: Future<Output = T> + Send + 'static,
{
    match headers(py) {
        Some(h) => Box::pin(sandhub_client::propagate::with_headers(h, fut)),
        None => Box::pin(fut),
    }
}
