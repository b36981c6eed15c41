//! Prometheus metrics served at `/metrics` on the REST port.

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub method: String,
    pub code: String,
}

pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<RequestLabels, Counter>,
    pub grpc_requests: Family<RpcLabels, Counter>,
    pub exec_total: Counter,
    pub exec_seconds: Histogram,
    pub active_processes: Gauge,
    pub active_watches: Gauge,
    /// Whole-file downloads the fast path sent (`fast_get.rs`), a subset of
    /// the GET 200s in `http_requests`.
    pub fast_downloads: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sandboxd");
        let http_requests = Family::<RequestLabels, Counter>::default();
        let grpc_requests = Family::<RpcLabels, Counter>::default();
        let exec_total = Counter::default();
        // 250 µs .. ~65 s: from `true` to a test suite.
        let exec_seconds = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.00025, 2.0, 19),
        );
        let active_processes = Gauge::default();
        let active_watches = Gauge::default();
        let fast_downloads = Counter::default();
        registry.register(
            "http_requests",
            "REST and legacy HTTP requests by method and status",
            http_requests.clone(),
        );
        registry.register(
            "grpc_requests",
            "gRPC calls by method and status",
            grpc_requests.clone(),
        );
        registry.register("exec", "Processes started", exec_total.clone());
        registry.register(
            "exec_duration_seconds",
            "Wall time from spawn to exit of each process",
            exec_seconds.clone(),
        );
        registry.register(
            "active_processes",
            "Processes running now",
            active_processes.clone(),
        );
        registry.register(
            "active_watches",
            "WatchDir streams open now",
            active_watches.clone(),
        );
        registry.register(
            "fast_downloads",
            "Whole-file downloads sent with sendfile, outside hyper",
            fast_downloads.clone(),
        );
        Metrics {
            registry,
            http_requests,
            grpc_requests,
            exec_total,
            exec_seconds,
            active_processes,
            active_watches,
            fast_downloads,
        }
    }
}

impl Metrics {
    /// One REST or legacy request answered with `code`.
    pub fn count_http(&self, method: String, code: u16) {
        self.http_requests
            .get_or_create(&RequestLabels { method, code })
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
