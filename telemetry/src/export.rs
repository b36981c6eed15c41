//! Turning export on: an OTLP/HTTP (protobuf) span exporter behind the
//! SDK's batch processor, as a `tracing` layer beside the log layer.
//!
//! The batch processor owns one thread and a bounded queue (2048 spans by
//! default, `OTEL_BSP_MAX_QUEUE_SIZE`); ending a span only queues it, and a
//! full queue drops the span, so a slow or unreachable collector never
//! holds up a request. Spans of a batch the collector did not take are
//! counted ([`dropped_spans`]) and dropped, never retried.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    trace::{BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter},
    Resource,
};
use sandhub_common::Logging;
use tracing::Level;
use tracing_subscriber::{filter::Targets, Layer};

/// How long one export POST may take before its batch is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans the collector accepted since start.
pub fn exported_spans() -> u64 {
    EXPORTED.load(Ordering::Relaxed)
}

/// Spans lost because their batch's export failed (collector down, slow,
/// or refusing). Spans dropped at a full queue are the SDK's to report: it
/// logs their number when the process stops.
pub fn dropped_spans() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// What `--otlp-endpoint` turns into. Keep it until the process ends:
/// dropping it flushes what is queued (bounded by the export timeout).
#[must_use = "dropping the guard stops export"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber: `logging`'s log layer and, when
/// `endpoint` is given, the OpenTelemetry layer exporting to it. Without
/// an endpoint no OpenTelemetry layer exists at all, and [`crate::enabled`]
/// stays false, so no span of ours is even created.
///
/// `endpoint` is the collector's base URL (`http://collector:4318`;
/// `/v1/traces` is added when it has no path) or the full traces URL.
/// The service name is `OTEL_SERVICE_NAME` if set, else `service`.
/// Panics if a subscriber is installed already (as `Logging::init`).
pub fn init(logging: Logging<'_>, endpoint: Option<&str>, service: &'static str) -> Guard {
    let Some(endpoint) = endpoint.map(str::trim).filter(|e| !e.is_empty()) else {
        logging.init();
        return Guard { provider: None };
    };
    match provider(endpoint, service) {
        Ok(provider) => {
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("sandhub"))
                // Our spans carry their own names and fields; where in the
                // source they were made says nothing to a trace reader.
                .with_location(false)
                .with_threads(false)
                // Only the spans made for traces (`target: "sandhub::trace"`),
                // whatever `RUST_LOG` says: log lines never become span
                // events, so nothing a log line says is exported.
                .with_filter(Targets::new().with_target(crate::TARGET, Level::INFO))
                .boxed();
            if let Err(e) = logging.try_init_with(Some(layer)) {
                panic!("logging is set up already: {e}");
            }
            crate::ENABLED.store(true, Ordering::Relaxed);
            tracing::info!(endpoint = %traces_url(endpoint), service, "exporting traces");
            Guard {
                provider: Some(provider),
            }
        }
        Err(e) => {
            // A bad endpoint must not stop a hub: it runs, untraced.
            logging.init();
            tracing::error!(endpoint, error = %e, "not exporting traces");
            Guard { provider: None }
        }
    }
}

fn provider(endpoint: &str, service: &'static str) -> Result<SdkTracerProvider, String> {
    let url = traces_url(endpoint);
    let parsed: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    if parsed.scheme_str() != Some("http") || parsed.host().is_none() {
        return Err(format!("{url}: expected http://host:port"));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(crate::http::BlockingHttp {
            timeout: EXPORT_TIMEOUT,
        })
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        // OTEL_EXPORTER_OTLP_HEADERS is read too: an operator's way to
        // add a collector's auth header. The endpoint given here wins over
        // OTEL_EXPORTER_OTLP_*ENDPOINT.
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let processor = BatchSpanProcessor::builder(Counting(exporter)).build();
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build())
}

/// `base` plus `/v1/traces` when `base` has no path of its own.
fn traces_url(base: &str) -> String {
    let trimmed = base.trim_end_matches('/');
    let path_start = trimmed
        .find("://")
        .map(|i| i + 3)
        .and_then(|i| trimmed[i..].find('/').map(|j| i + j));
    match path_start {
        Some(_) => trimmed.to_string(),
        None => format!("{trimmed}/v1/traces"),
    }
}

/// The OTLP exporter, counting what it delivered and what it lost.
#[derive(Debug)]
struct Counting<E>(E);

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.0.export(batch).await;
        match &result {
            Ok(()) => EXPORTED.fetch_add(n, Ordering::Relaxed),
            Err(_) => DROPPED.fetch_add(n, Ordering::Relaxed),
        };
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path_and_a_full_one_is_kept() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/custom/traces"),
            "http://c:4318/custom/traces"
        );
    }

    #[test]
    fn an_endpoint_that_is_not_http_is_refused() {
        assert!(provider("ftp://x:1", "t").is_err());
        // TLS goes through a local collector (telemetry/src/http.rs).
        assert!(provider("https://x:4318", "t").is_err());
        assert!(provider("not a url", "t").is_err());
    }
}
