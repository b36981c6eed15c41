//! The request path: route, authorize, resolve, forward, answer. This file
//! holds what every protocol shares (settings, the target's resolution,
//! authorization, budgets, the access log and metrics); each protocol has
//! its own file.
//!
//! - `plain`: every request that is not gRPC, on hyper's path (header and
//!   path routing, browser sessions).
//! - [`upgrade`]: upgraded connections (WebSocket and others) after the 101.
//! - `grpc`: gRPC over h2c, with its deadline.
//! - [`fast`]: the proxy's half of the HTTP/1.1 fast path.
//! - `failure`: failed exchanges, classified and counted.
//! - [`headers`]: what the sandbox sees of the client's headers.
//! - [`session`]: browser sessions and Origin checks for path-routed URLs.
//! - [`grpc_timeout`]: the `grpc-timeout` header.

mod failure;
pub mod fast;
mod grpc;
pub mod grpc_timeout;
pub mod headers;
mod plain;
pub mod session;
pub mod upgrade;

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use http::{header, uri::Authority, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::{
    authz::{bearer, Access, Authorizer},
    cache::PodCache,
    config::{Args, SameSite},
    error::ProxyError,
    http1::outbound::Upstreams,
    metrics::{InflightGuard, MethodLabel, Metrics},
    response::{json_response, ProxyBody},
    routing::{self, Target},
};
pub use fast::FastProxy;
pub use grpc::is_grpc;

/// The settings the request path reads.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cluster_domain: String,
    /// HTTP budget until the response head; `None`: unlimited.
    pub proxy_timeout: Option<Duration>,
    /// gRPC cap; `None`: only the client's grpc-timeout applies.
    pub grpc_proxy_timeout: Option<Duration>,
    pub max_request_body_bytes: u64,
    pub allow_loopback_pod_ip: bool,
    pub access_log: bool,
    pub path_prefix: Option<String>,
    /// Serve plain HTTP/1.1 header-routed requests without hyper (see [`crate::http1::inbound`]).
    pub fast_path: bool,
    pub allowed_origins: Vec<String>,
    pub same_site: SameSite,
    pub trust_forwarded_proto: bool,
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl Settings {
    pub fn from_args(a: &Args) -> Self {
        let prefix = a.path_routing_prefix.trim();
        Self {
            cluster_domain: a.cluster_domain.trim_matches('.').to_owned(),
            proxy_timeout: nonzero(a.proxy_timeout),
            grpc_proxy_timeout: nonzero(a.grpc_proxy_timeout),
            max_request_body_bytes: a.max_request_body_bytes,
            allow_loopback_pod_ip: a.allow_loopback_pod_ip,
            access_log: a.access_log,
            path_prefix: (!prefix.is_empty()).then(|| routing::normalize_prefix(prefix)),
            // The fast path makes no spans: while traces export, every
            // request takes the hyper path, where `handle` makes one.
            fast_path: a.http1_fast_path && !sandhub_telemetry::enabled(),
            allowed_origins: a
                .authz_cookie_allowed_origins
                .iter()
                .map(|o| o.trim().to_owned())
                .filter(|o| !o.is_empty())
                .collect(),
            same_site: a.authz_cookie_samesite,
            trust_forwarded_proto: a.authz_trust_forwarded_proto,
        }
    }
}

/// How a connection reached the router.
#[derive(Debug, Clone)]
pub struct Conn {
    pub remote: SocketAddr,
    pub tls: bool,
    /// The client's address as an X-Forwarded-For entry, formatted once per connection.
    pub client_ip: HeaderValue,
}

impl Conn {
    pub fn new(remote: SocketAddr, tls: bool) -> Self {
        let ip = remote.ip().to_canonical().to_string();
        let client_ip = HeaderValue::from_str(&ip).expect("an IP address is a valid header value");
        Self {
            remote,
            tls,
            client_ip,
        }
    }
}

pub struct Proxy {
    pub settings: Settings,
    pub upstreams: Upstreams,
    pub authz: Arc<Authorizer>,
    pub cache: Option<Arc<PodCache>>,
    pub metrics: Arc<Metrics>,
}

/// Where a target lives: its authority, its socket address when known
/// without DNS, and the Pod-cache entry used (to evict if unreachable).
pub(crate) struct Resolved {
    pub authority: Authority,
    pub addr: Option<SocketAddr>,
    pub cached_uid: Option<String>,
}

/// One answered request, for the access log and the metrics.
pub(crate) struct Served<'a> {
    pub start: Instant,
    pub method: MethodLabel,
    /// Method and path, when the access log is on.
    pub logged: Option<(Method, String)>,
    pub status: u16,
    pub grpc_status: Option<&'a str>,
    pub namespace: &'a str,
    pub id: &'a str,
    pub remote: SocketAddr,
}

/// Filled in as soon as the target is known: labels for metrics and the log.
#[derive(Default)]
struct Routed {
    namespace: String,
    id: String,
}

impl Routed {
    fn set(&mut self, t: &Target) {
        self.namespace.clone_from(&t.namespace);
        self.id.clone_from(&t.id);
    }
}

fn host_of<B>(req: &Request<B>) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(Authority::as_str))
}

/// `ip:port` as an Authority, memoised per worker thread: formatting and
/// parsing an address on every request showed up in profiles.
fn authority_for(addr: SocketAddr) -> Result<Authority, ProxyError> {
    thread_local! {
        static CACHE: std::cell::RefCell<std::collections::HashMap<SocketAddr, Authority>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    const MAX_CACHED: usize = 4096;
    CACHE.with(|c| {
        if let Some(a) = c.borrow().get(&addr) {
            return Ok(a.clone());
        }
        let text = match addr.ip() {
            IpAddr::V4(v4) => format!("{v4}:{}", addr.port()),
            IpAddr::V6(v6) => format!("[{v6}]:{}", addr.port()),
        };
        let a = Authority::try_from(text)
            .map_err(|_| ProxyError::Internal("Bad upstream address.".into()))?;
        let mut c = c.borrow_mut();
        if c.len() >= MAX_CACHED {
            c.clear();
        }
        c.insert(addr, a.clone());
        Ok(a)
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Proxy {
    /// Serves one request; never fails (errors become answers).
    pub async fn handle(&self, mut req: Request<Incoming>, conn: &Conn) -> Response<ProxyBody> {
        if !sandhub_telemetry::enabled() {
            return self.handle_inner(req, conn).await;
        }
        // The caller's context in, ours out: sandboxd's span is this one's child.
        let name = sandhub_telemetry::context::rpc_name(req.uri().path())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{} proxy", req.method()));
        let span = sandhub_telemetry::server_span(&name, req.headers());
        sandhub_telemetry::inject(&span, req.headers_mut());
        let resp =
            tracing::Instrument::instrument(self.handle_inner(req, conn), span.clone()).await;
        sandhub_telemetry::record_status(&span, resp.status().as_u16());
        resp
    }

    async fn handle_inner(&self, req: Request<Incoming>, conn: &Conn) -> Response<ProxyBody> {
        let start = Instant::now();
        let _inflight = InflightGuard::new(&self.metrics.inflight);
        let method = MethodLabel::from(req.method());
        let logged = self
            .settings
            .access_log
            .then(|| (req.method().clone(), req.uri().path().to_owned()));
        let grpc = is_grpc(&req);
        let mut routed = Routed::default();
        let resp = if req.method() == Method::GET
            && req.uri().path() == "/healthz"
            && !req.headers().contains_key(routing::HEADER_ID)
        {
            json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
        } else if grpc {
            self.grpc(req, conn, &mut routed)
                .await
                .unwrap_or_else(|e| e.to_grpc())
        } else {
            self.http(req, conn, &mut routed)
                .await
                .unwrap_or_else(|e| e.to_http())
        };
        self.record(&Served {
            start,
            method,
            logged,
            status: resp.status().as_u16(),
            grpc_status: resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok()),
            namespace: &routed.namespace,
            id: &routed.id,
            remote: conn.remote,
        });
        resp
    }

    /// The access log line and the request metrics for one answered request.
    pub(crate) fn record(&self, r: &Served<'_>) {
        let elapsed = r.start.elapsed();
        if let Some((m, path)) = &r.logged {
            tracing::info!(
                target: "sandhub_router::access",
                method = %m,
                path,
                status = r.status,
                grpc_status = r.grpc_status,
                namespace = %r.namespace,
                sandbox = %r.id,
                remote = %r.remote,
                micros = elapsed.as_micros() as u64,
                "request"
            );
        }
        self.metrics
            .count_request(r.method.clone(), r.status, r.namespace);
        self.metrics.duration.observe(elapsed.as_secs_f64());
    }

    /// "https" when the client's connection was TLS (or a trusted proxy says so).
    fn proto<B>(&self, req: &Request<B>, conn: &Conn) -> &'static str {
        let forwarded_https = || {
            req.headers()
                .get(headers::X_FORWARDED_PROTO)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
        };
        if conn.tls || (self.settings.trust_forwarded_proto && forwarded_https()) {
            "https"
        } else {
            "http"
        }
    }

    /// Pod-IP header, then the cache by UID, then by namespace/name, then DNS.
    /// Also returns the cache entry used, to evict it if it proves unreachable.
    pub(crate) fn resolve(&self, t: &Target) -> Result<Resolved, ProxyError> {
        let cached = || {
            let cache = self.cache.as_ref()?;
            t.uid
                .as_deref()
                .and_then(|u| cache.by_uid(u))
                .or_else(|| cache.by_name(&t.namespace, &t.id))
        };
        let (addr, cached_uid) = match t.pod_ip {
            Some(ip) => (Some(SocketAddr::new(ip, t.port)), None),
            None => match cached() {
                Some((ip, uid)) => (Some(SocketAddr::new(ip, t.port)), Some(uid)),
                None => (None, None),
            },
        };
        let authority = match addr {
            Some(a) => authority_for(a)?,
            None => Authority::try_from(format!(
                "{}.{}.svc.{}:{}",
                t.id, t.namespace, self.settings.cluster_domain, t.port
            ))
            .map_err(|_| ProxyError::Internal("Bad upstream address.".into()))?,
        };
        Ok(Resolved {
            authority,
            addr,
            cached_uid,
        })
    }

    async fn authorize<B>(
        &self,
        req: &Request<B>,
        t: &Target,
        cookie_allowed: bool,
    ) -> Result<(), ProxyError> {
        if self.authz.is_allow_all() {
            return Ok(());
        }
        let token = bearer(req.headers()).or_else(|| {
            cookie_allowed
                .then(|| session::cookie_token(req.headers()))
                .flatten()
        });
        self.check_access(token, t).await
    }

    /// Whether `token` (if any) may reach `t`; allow-all never looks.
    pub(crate) async fn check_access(
        &self,
        token: Option<&str>,
        t: &Target,
    ) -> Result<(), ProxyError> {
        let access = Access {
            token,
            namespace: &t.namespace,
            id: &t.id,
            pins_pod: t.pod_ip.is_some() || t.uid.is_some(),
        };
        self.authz.check(&access, &self.metrics).await.map(|_| ())
    }

    /// Runs `work` within `budget` (if any); running out is a counted timeout.
    pub(crate) async fn within<F: std::future::Future>(
        &self,
        budget: Option<Duration>,
        t: &Target,
        work: F,
    ) -> Result<F::Output, ProxyError> {
        match budget {
            None => Ok(work.await),
            Some(b) => tokio::time::timeout(b, work).await.map_err(|_| {
                self.metrics.upstream_error(&t.namespace, "timeout");
                ProxyError::Timeout(t.id.clone())
            }),
        }
    }

    /// The budget until the response head: the flag, capped by the client's
    /// own `X-Sandbox-Timeout`.
    pub(crate) fn budget(&self, t: &Target) -> Option<Duration> {
        match (self.settings.proxy_timeout, t.timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
