//! Health: the probes (`/healthz`, `/readyz`) and the metrics (`/metrics`,
//! and the middleware that counts every request).

use std::sync::Arc;

use axum::{
    extract::{MatchedPath, Request, State},
    http::header,
    response::{IntoResponse, Response},
};
use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use sandhub_api::error::{Code, ErrorBody};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{
    plain::{Entry, Plain},
    ApiError, AppState,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    /// The route template (`/v1/sandboxes/{id}/exec`), never the raw path,
    /// so ids never become labels; `other` for what no route matched
    /// (port hosts, envd traffic, 404s).
    pub route: String,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

/// Egress series (issue #27), one per tenant (never per sandbox: the
/// label set stays as small as the tenant list).
pub struct EgressMetrics {
    pub bytes_out: Family<TenantLabels, Counter>,
    pub bytes_in: Family<TenantLabels, Counter>,
    pub opened: Family<TenantLabels, Counter>,
    pub refused: Family<TenantLabels, Counter>,
    /// Gateways running now: one per egress sandbox that is up.
    pub gateways: Family<TenantLabels, Gauge<i64, std::sync::atomic::AtomicI64>>,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Histogram,
    pub sandboxes: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub inflight: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub egress: EgressMetrics,
    /// `sandhub_operation_seconds{op, backend, outcome}` (`crate::ops`).
    pub operations: Arc<crate::ops::Operations>,
    /// Pools' and tenants' gauges (`crate::gauges`).
    pub gauges: crate::gauges::GaugeMetrics,
    /// `sandhub_events_total{type, reason}`, from the event log's counts.
    pub events: Family<EventLabels, Counter>,
    pub events_dropped: Counter,
    /// `sandhub_webhook_deliveries_total{outcome}`.
    pub webhook_deliveries: Family<OutcomeLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub r#type: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
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
            "HTTP requests by method, route template and status",
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
        let egress = EgressMetrics {
            bytes_out: Default::default(),
            bytes_in: Default::default(),
            opened: Default::default(),
            refused: Default::default(),
            gateways: Default::default(),
        };
        registry.register(
            "egress_gateways",
            "Egress gateways running, by tenant (one per egress sandbox that is up)",
            egress.gateways.clone(),
        );
        for (name, help, f) in [
            (
                "egress_sent_bytes",
                "TCP payload bytes egress sandboxes sent out, by tenant",
                &egress.bytes_out,
            ),
            (
                "egress_received_bytes",
                "TCP payload bytes egress sandboxes received, by tenant",
                &egress.bytes_in,
            ),
            (
                "egress_connections_opened",
                "Connections egress gateways carried, by tenant",
                &egress.opened,
            ),
            (
                "egress_connections_refused",
                "Connections egress gateways refused, by tenant",
                &egress.refused,
            ),
        ] {
            registry.register(name, help, f.clone());
        }
        let operations = Arc::new(crate::ops::Operations::default());
        operations.register(&mut registry);
        let gauges = crate::gauges::GaugeMetrics::default();
        gauges.register(&mut registry);
        let events = Family::<EventLabels, Counter>::default();
        let events_dropped = Counter::default();
        let webhook_deliveries = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "events",
            "Lifecycle events by type and reason (deleted by the reaper: reason deadline, \
             idle_timeout or reaped; recovery: hub_recovery)",
            events.clone(),
        );
        registry.register(
            "events_dropped",
            "Lifecycle events dropped because the event queue was full",
            events_dropped.clone(),
        );
        registry.register(
            "webhook_deliveries",
            "Webhook delivery attempts by outcome (delivered, retrying, gave_up)",
            webhook_deliveries.clone(),
        );
        Metrics {
            gauges,
            events,
            events_dropped,
            webhook_deliveries,
            egress,
            operations,
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

/// Readiness: the state store answers, and the hub is not draining.
#[utoipa::path(get, path = "/readyz", tag = "service", security(()),
    responses((status = 200, body = String), (status = 503, body = ErrorBody)))]
async fn readyz(State(state): State<AppState>) -> Response {
    if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return ApiError::new(
            Code::Unavailable,
            "draining: this hub is stopping; other replicas take new requests",
        )
        .into_response();
    }
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
    match state.hub.gauges().await {
        Ok(g) => state.metrics.gauges.set(&g),
        // The last values stay: a scrape during an API hiccup shows them
        // rather than dropping every pool from the dashboards.
        Err(e) => tracing::debug!(error = %e.message, "reading pool and tenant gauges"),
    }
    for crate::backend::TenantEgress {
        tenant,
        usage: u,
        gateways,
    } in state.hub.egress_usage()
    {
        let l = TenantLabels { tenant };
        let e = &state.metrics.egress;
        // Absolute totals the hub keeps (they only grow while it runs).
        let set = |f: &Family<TenantLabels, Counter>, v: u64| {
            f.get_or_create(&l)
                .inner()
                .store(v, std::sync::atomic::Ordering::Relaxed)
        };
        set(&e.bytes_out, u.bytes_out);
        set(&e.bytes_in, u.bytes_in);
        set(&e.opened, u.connections_opened);
        set(&e.refused, u.connections_refused);
        e.gateways
            .get_or_create(&l)
            .set(i64::try_from(gateways).unwrap_or(i64::MAX));
    }
    let store = |c: &Counter, v: u64| c.inner().store(v, std::sync::atomic::Ordering::Relaxed);
    if let Some(log) = &state.events {
        for ((r#type, reason), n) in log.counts() {
            store(
                &state
                    .metrics
                    .events
                    .get_or_create(&EventLabels { r#type, reason }),
                n,
            );
        }
        store(&state.metrics.events_dropped, log.dropped());
    }
    if let Some(hooks) = &state.webhooks {
        let o = hooks.outcomes();
        for (outcome, n) in [
            ("delivered", &o.delivered),
            ("retrying", &o.retrying),
            ("gave_up", &o.gave_up),
        ] {
            store(
                &state
                    .metrics
                    .webhook_deliveries
                    .get_or_create(&OutcomeLabels { outcome }),
                n.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
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

/// Counts every request by method, route template and status, and times
/// it (`sandhub_http_requests_total`, `sandhub_http_request_seconds`).
#[derive(Clone)]
pub struct CountRequests(pub Arc<Metrics>);

impl Plain for CountRequests {
    type Carry = (Arc<Metrics>, &'static str, std::time::Instant, InFlight);

    fn enter(&self, request: &mut Request) -> Entry<Self::Carry> {
        let in_flight = InFlight::new(&self.0);
        let method = method_label(request.method().as_str());
        Entry::Pass((self.0.clone(), method, std::time::Instant::now(), in_flight))
    }

    fn leave((metrics, method, started, in_flight): Self::Carry, response: &mut Response) {
        drop(in_flight);
        let route = response
            .extensions()
            .get::<MatchedPath>()
            .map_or("other", |p| p.as_str());
        metrics.count_request(method, route, response.status().as_u16(), started);
    }
}

/// A request in the in-flight gauge, until it is dropped: when its answer
/// is made, or when the server drops the request first because its client
/// hung up (then no answer is ever made, and `leave` never runs).
pub struct InFlight(Gauge<i64, std::sync::atomic::AtomicI64>);

impl InFlight {
    pub fn new(metrics: &Metrics) -> Self {
        metrics.inflight.inc();
        InFlight(metrics.inflight.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A request's method as a label: a method outside the standard set is
/// one label, not one per spelling.
pub fn method_label(method: &str) -> &'static str {
    const STANDARD: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
    STANDARD
        .into_iter()
        .find(|m| *m == method)
        .unwrap_or("other")
}

impl Metrics {
    /// Counts one answered request (`route`: its template, or `other`),
    /// begun at `started`. Every request is counted here, whichever path
    /// served it (hyper's, or the port route's fast path).
    pub fn count_request(
        &self,
        method: &'static str,
        route: &str,
        code: u16,
        started: std::time::Instant,
    ) {
        self.request_seconds
            .observe(started.elapsed().as_secs_f64());
        self.requests
            .get_or_create(&RequestLabels {
                method: method.to_string(),
                route: route.to_string(),
                code,
            })
            .inc();
    }
}

/// Copies the route template that matched into the response, where
/// [`CountRequests`] (outside the router, so it sees every request) finds it.
#[derive(Clone, Copy)]
pub struct TagRoute;

impl Plain for TagRoute {
    type Carry = Option<MatchedPath>;

    fn enter(&self, request: &mut Request) -> Entry<Self::Carry> {
        Entry::Pass(request.extensions().get::<MatchedPath>().cloned())
    }

    fn leave(route: Self::Carry, response: &mut Response) {
        if let Some(route) = route {
            response.extensions_mut().insert(route);
        }
    }
}
