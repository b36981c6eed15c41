//! Health: the probes (`/healthz`, `/readyz`) and the metrics (`/metrics`,
//! and the middleware that counts every request).

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};
use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use sandhub_api::error::{Code, ErrorBody};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{ApiError, AppState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub code: u16,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Histogram,
    pub sandboxes: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub inflight: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sandhub");
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 20),
        );
        let sandboxes = Gauge::default();
        let inflight = Gauge::default();
        registry.register(
            "http_requests",
            "REST requests by method and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "REST request latency",
            request_seconds.clone(),
        );
        registry.register(
            "sandboxes",
            "Sandboxes the hub holds (claimed and warm)",
            sandboxes.clone(),
        );
        registry.register(
            "http_inflight_requests",
            "REST requests being served",
            inflight.clone(),
        );
        Metrics {
            registry,
            requests,
            request_seconds,
            sandboxes,
            inflight,
        }
    }
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "service", security(()),
    responses((status = 200, description = "ok", body = String)))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the state store answers.
#[utoipa::path(get, path = "/readyz", tag = "service", security(()),
    responses((status = 200, body = String), (status = 503, body = ErrorBody)))]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.hub.ready().await {
        Ok(()) => "ok".into_response(),
        Err(e) => ApiError::new(Code::Unavailable, e.message).into_response(),
    }
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "service", security(()),
    responses((status = 200, body = String, content_type = "application/openmetrics-text")))]
async fn metrics(State(state): State<AppState>) -> Response {
    if let Ok(n) = state.hub.sandbox_count().await {
        state.metrics.sandboxes.set(n as i64);
    }
    let mut out = String::new();
    let _ = encode(&mut out, &state.metrics.registry);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

pub async fn count_requests(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().to_string();
    let started = std::time::Instant::now();
    metrics.inflight.inc();
    let response = next.run(request).await;
    metrics.inflight.dec();
    metrics
        .request_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics
        .requests
        .get_or_create(&RequestLabels {
            method,
            code: response.status().as_u16(),
        })
        .inc();
    response
}
