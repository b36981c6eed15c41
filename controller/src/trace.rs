//! A span per reconcile (issue #30 §5), when `--otlp-endpoint` exports.
//! kube-runtime's own `reconciling object` span only covers making the
//! reconcile's future, not running it; this one covers the whole run, so
//! the kube client's API writes fall inside it. The controller takes no
//! requests, so there is no inbound context: each reconcile is a trace.

use std::future::Future;

use kube::{Resource, ResourceExt};
use tracing::{Instrument, Span};

/// `reconcile` of `obj` (a `kind`), inside its span.
pub fn reconciled<K, F>(
    kind: &'static str,
    obj: &K,
    reconcile: F,
) -> tracing::instrument::Instrumented<F>
where
    K: Resource,
    F: Future,
{
    let span = if sandhub_telemetry::enabled() {
        tracing::info_span!(
            target: "sandhub::trace",
            "reconcile",
            otel.name = format!("reconcile {kind}"),
            k8s.namespace = obj.namespace().unwrap_or_default(),
            k8s.name = obj.name_any(),
        )
    } else {
        Span::none()
    };
    reconcile.instrument(span)
}
