//! Prometheus metrics with upstream sandbox-router's names.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(clippy::upper_case_acronyms)]
pub enum MethodLabel {
    GET,
    HEAD,
    POST,
    PUT,
    DELETE,
    PATCH,
    OPTIONS,
    CONNECT,
    TRACE,
    OTHER,
}

impl From<&http::Method> for MethodLabel {
    fn from(m: &http::Method) -> Self {
        match *m {
            http::Method::GET => Self::GET,
            http::Method::HEAD => Self::HEAD,
            http::Method::POST => Self::POST,
            http::Method::PUT => Self::PUT,
            http::Method::DELETE => Self::DELETE,
            http::Method::PATCH => Self::PATCH,
            http::Method::OPTIONS => Self::OPTIONS,
            http::Method::CONNECT => Self::CONNECT,
            http::Method::TRACE => Self::TRACE,
            _ => Self::OTHER,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: MethodLabel,
    pub code: u16,
    pub sandbox_namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamErrorLabels {
    pub sandbox_namespace: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthzLabels {
    pub sandbox_namespace: String,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Histogram,
    pub inflight: Gauge,
    pub upstream_errors: Family<UpstreamErrorLabels, Counter>,
    pub upstream_retries: Counter,
    pub cache_invalidations: Counter,
    pub authz_decisions: Family<AuthzLabels, Counter>,
    pub cert_reloads: Family<OutcomeLabels, Counter>,
    pub rx_bytes: Counter,
    pub tx_bytes: Counter,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "sandbox_router_requests",
            "Requests handled, by method, status code and sandbox namespace",
            requests.clone(),
        );
        let duration = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 180.0,
        ]);
        registry.register(
            "sandbox_router_request_duration_seconds",
            "Time until the response head was sent",
            duration.clone(),
        );
        let inflight = Gauge::default();
        registry.register(
            "sandbox_router_inflight_requests",
            "Requests being proxied now",
            inflight.clone(),
        );
        let upstream_errors = Family::<UpstreamErrorLabels, Counter>::default();
        registry.register(
            "sandbox_router_upstream_errors",
            "Failed upstream exchanges, by reason (dial, timeout, tls, eof, other)",
            upstream_errors.clone(),
        );
        let upstream_retries = Counter::default();
        registry.register(
            "sandbox_router_upstream_retries",
            "Dial retries after a dial failure",
            upstream_retries.clone(),
        );
        let cache_invalidations = Counter::default();
        registry.register(
            "sandbox_router_cache_invalidations",
            "Pod cache entries dropped because their Pod was unreachable",
            cache_invalidations.clone(),
        );
        let authz_decisions = Family::<AuthzLabels, Counter>::default();
        registry.register(
            "sandbox_router_authz_decisions",
            "Authorization decisions, by namespace and decision",
            authz_decisions.clone(),
        );
        let cert_reloads = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "sandbox_router_cert_reloads",
            "TLS certificate reloads, by outcome",
            cert_reloads.clone(),
        );
        let rx_bytes = Counter::default();
        registry.register(
            "sandbox_router_upstream_rx_bytes",
            "Bytes received from sandboxes (response bodies and upgraded streams)",
            rx_bytes.clone(),
        );
        let tx_bytes = Counter::default();
        registry.register(
            "sandbox_router_upstream_tx_bytes",
            "Bytes sent to sandboxes (request bodies and upgraded streams)",
            tx_bytes.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register("sandbox_router_build_info", "Build information", build_info);
        Self {
            requests,
            duration,
            inflight,
            upstream_errors,
            upstream_retries,
            cache_invalidations,
            authz_decisions,
            cert_reloads,
            rx_bytes,
            tx_bytes,
            registry,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// `sandbox_router_requests_total`, through a small per-thread cache of
    /// the counters: the shared family (a lock and a hash of the labels) is
    /// consulted once per label set and thread, not once per request.
    pub fn count_request(&self, method: MethodLabel, code: u16, namespace: &str) {
        type Cached = (MethodLabel, u16, String, Counter);
        thread_local! {
            static CACHE: std::cell::RefCell<Vec<Cached>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        const MAX_CACHED: usize = 128;
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if let Some((.., counter)) = c
                .iter()
                .find(|(m, k, ns, _)| *m == method && *k == code && ns == namespace)
            {
                counter.inc();
                return;
            }
            let labels = RequestLabels {
                method,
                code,
                sandbox_namespace: namespace.to_owned(),
            };
            let counter = self.requests.get_or_create(&labels).clone();
            counter.inc();
            if c.len() < MAX_CACHED {
                c.push((labels.method, code, labels.sandbox_namespace, counter));
            }
        });
    }

    pub fn upstream_error(&self, namespace: &str, reason: &'static str) {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                sandbox_namespace: namespace.to_owned(),
                reason,
            })
            .inc();
    }

    pub fn authz(&self, namespace: &str, decision: &'static str) {
        self.authz_decisions
            .get_or_create(&AuthzLabels {
                sandbox_namespace: namespace.to_owned(),
                decision,
            })
            .inc();
    }
}

/// Counts one request in flight for as long as it lives.
pub struct InflightGuard<'a>(&'a Gauge);

impl<'a> InflightGuard<'a> {
    pub fn new(g: &'a Gauge) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
