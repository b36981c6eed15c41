//! Per-operation latency (issue #30): `sandhub_operation_seconds{op,
//! backend, outcome}`, one histogram per operation a tenant asks of a
//! backend, observed where every front door passes (`guard.rs`), so REST,
//! MCP, Gym and E2B calls all count.
//!
//! Every label comes from a closed set: `op` is one of [`Op`]'s names,
//! `backend` the backend's kind, `outcome` `ok` or an error's code word.
//! Nothing a tenant sends (ids, paths) becomes a label, so the number of
//! series stays bounded.
//!
//! The same seam makes the operation's span when traces export (issue #30
//! §5): named by the operation, child of the request's server span, parent
//! of the sandboxd calls the backend makes. Its attributes are the same
//! closed set as the labels; ids, commands, paths and env never go in.

use std::{future::Future, time::Instant};

use tracing::{field::Empty, Instrument, Span};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use sandhub_api::hub::{Launch, Sandbox};
use sandhub_client::Result;

/// The operations measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A create that claimed a warm pool member.
    CreateWarm,
    /// A create that launched a new sandbox.
    CreateCold,
    /// A create that failed (whether it would have been warm is unknown).
    Create,
    Exec,
    /// Until the process runs and its events stream.
    Start,
    Reset,
    Snapshot,
    Fork,
    Suspend,
    Pause,
    Resume,
    Delete,
    Upload,
    /// Until the file's bytes start to stream.
    Download,
    /// A new connection to a sandbox port (the port proxy's per-connection cost).
    PortConnect,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::CreateWarm => "create_warm",
            Op::CreateCold => "create_cold",
            Op::Create => "create",
            Op::Exec => "exec",
            Op::Start => "start",
            Op::Reset => "reset",
            Op::Snapshot => "snapshot",
            Op::Fork => "fork",
            Op::Suspend => "suspend",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Delete => "delete",
            Op::Upload => "upload",
            Op::Download => "download",
            Op::PortConnect => "port_connect",
        }
    }

    /// A create's operation, by how its sandbox was launched.
    pub fn of_create(sandbox: &Sandbox) -> Op {
        match sandbox.launch {
            Launch::Warm => Op::CreateWarm,
            Launch::Cold => Op::CreateCold,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
    pub backend: &'static str,
    pub outcome: &'static str,
}

type Seconds = Family<OpLabels, Histogram, fn() -> Histogram>;

fn buckets() -> Histogram {
    // 100 µs to ~3.3 min: a warm claim to a cold image create.
    Histogram::new(exponential_buckets(0.0001, 2.0, 22))
}

/// The histograms; one per hub.
pub struct Operations {
    seconds: Seconds,
}

impl Default for Operations {
    fn default() -> Self {
        Operations {
            seconds: Family::new_with_constructor(buckets),
        }
    }
}

impl Operations {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "operation_seconds",
            "Latency of each operation tenants ask of the backend, by outcome",
            self.seconds.clone(),
        );
    }

    pub fn observe(&self, op: Op, backend: &'static str, outcome: &'static str, secs: f64) {
        self.seconds
            .get_or_create(&OpLabels {
                op: op.as_str(),
                backend,
                outcome,
            })
            .observe(secs);
    }

    /// Runs `call` and records its latency under `op` (or under what
    /// `classify` makes of its answer).
    pub async fn time<T, F>(
        &self,
        op: Op,
        backend: &'static str,
        classify: impl FnOnce(&T) -> Op,
        call: F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let span = span(op, backend);
        let t0 = Instant::now();
        let result = call.instrument(span.clone()).await;
        let secs = t0.elapsed().as_secs_f64();
        let (op, outcome) = match &result {
            Ok(v) => (classify(v), "ok"),
            Err(e) => (op, outcome(e.code)),
        };
        self.observe(op, backend, outcome, secs);
        if !span.is_none() {
            sandhub_telemetry::rename(&span, op.as_str().to_string());
            span.record("sandhub.op", op.as_str());
            span.record("sandhub.outcome", outcome);
            if outcome != "ok" {
                span.record("otel.status_code", "ERROR");
            }
        }
        result
    }
}

/// The operation's span, or none while traces are off (no export: no
/// span is even created).
fn span(op: Op, backend: &'static str) -> Span {
    if !sandhub_telemetry::enabled() {
        return Span::none();
    }
    tracing::info_span!(
        target: "sandhub::trace",
        "operation",
        otel.name = op.as_str(),
        otel.status_code = Empty,
        sandhub.op = op.as_str(),
        sandhub.backend = backend,
        sandhub.outcome = Empty,
    )
}

/// An error's code word, lowercased (a closed set).
fn outcome(code: sandhub_api::error::Code) -> &'static str {
    use sandhub_api::error::Code::*;
    match code {
        InvalidArgument => "invalid_argument",
        Unauthenticated => "unauthenticated",
        PermissionDenied => "permission_denied",
        NotFound => "not_found",
        Conflict => "conflict",
        FailedPrecondition => "failed_precondition",
        PayloadTooLarge => "payload_too_large",
        ResourceExhausted => "resource_exhausted",
        Unimplemented => "unimplemented",
        Unavailable => "unavailable",
        DeadlineExceeded => "deadline_exceeded",
        Internal => "internal",
    }
}
