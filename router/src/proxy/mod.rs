//! The request path: route, authorize, resolve, forward, answer.
//!
//! - [`headers`]: what the sandbox sees of the client's headers.
//! - [`session`]: browser sessions and Origin checks for path-routed URLs.
//! - [`tunnel`]: upgraded connections (WebSocket and others) after the 101.
//! - [`grpc_timeout`]: the `grpc-timeout` header.

pub mod grpc_timeout;
pub mod headers;
pub mod session;
pub mod tunnel;

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use http::{
    header,
    uri::{Authority, PathAndQuery, Scheme},
    HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use hyper::body::Incoming;

use crate::{
    authz::{bearer, Access, Authorizer},
    body::{BodyTooLarge, ProxyBody, RequestBody},
    cache::PodCache,
    config::{Args, SameSite},
    error::{json_response, ProxyError},
    h1,
    metrics::{InflightGuard, MethodLabel, Metrics},
    routing::{self, parse_headers, parse_path, HeaderRules, Target},
    upstream::{DialError, DialFailure, Upstreams},
};

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
    /// Serve plain HTTP/1.1 header-routed requests without hyper (see [`crate::fast`]).
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
            fast_path: a.http1_fast_path,
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

/// gRPC: HTTP/2 POST with content-type `application/grpc` or `application/grpc+<codec>`
/// (gRPC-Web is not gRPC here).
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == Method::POST
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|ct| ct.strip_prefix("application/grpc"))
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('+') || rest.starts_with(';'))
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
    pub async fn handle(&self, req: Request<Incoming>, conn: &Conn) -> Response<ProxyBody> {
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

    async fn http(
        &self,
        mut req: Request<Incoming>,
        conn: &Conn,
        routed: &mut Routed,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if req.method() == Method::CONNECT {
            return Err(ProxyError::MethodNotAllowed("CONNECT is not supported."));
        }
        // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host.
        if req.version() == Version::HTTP_11
            && req.headers().get_all(header::HOST).iter().count() != 1
        {
            return Err(ProxyError::BadRequest("Invalid Host header."));
        }
        let proto = self.proto(&req, conn);
        let path_route = self
            .settings
            .path_prefix
            .as_deref()
            .and_then(|p| parse_path(p, req.uri().path()));
        let (target, new_path) = match path_route {
            None => (
                parse_headers(
                    req.headers(),
                    HeaderRules {
                        grpc: false,
                        allow_loopback: self.settings.allow_loopback_pod_ip,
                    },
                )?,
                None,
            ),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(route)) => {
                if !session::origin_allowed(
                    req.headers(),
                    host_of(&req),
                    proto,
                    &self.settings.allowed_origins,
                ) {
                    return Err(ProxyError::Forbidden("Origin not allowed."));
                }
                let target = Target {
                    id: route.id.to_owned(),
                    namespace: route.namespace.to_owned(),
                    port: route.port,
                    pod_ip: None,
                    uid: None,
                    timeout: None,
                };
                routed.set(&target);
                if let Some((token, rest)) = req.uri().query().and_then(session::take_query_token) {
                    return self
                        .bootstrap(&req, &target, &token, &rest, route.base, proto)
                        .await;
                }
                let pq = match req.uri().query() {
                    Some(q) => format!("{}?{q}", route.rest),
                    None => route.rest.to_owned(),
                };
                let pq = PathAndQuery::try_from(pq)
                    .map_err(|_| ProxyError::BadRequest("Invalid path."))?;
                (target, Some(pq))
            }
        };
        let path_routed = new_path.is_some();
        routed.set(&target);
        self.authorize(&req, &target, path_routed).await?;

        let limit = self.settings.max_request_body_bytes;
        if limit > 0 {
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit) {
                return Err(ProxyError::BodyTooLarge);
            }
        }
        let upgrade = req.version() <= Version::HTTP_11 && headers::is_upgrade(req.headers());
        let Resolved {
            authority,
            addr,
            cached_uid,
        } = self.resolve(&target)?;
        let original_host = host_of(&req).and_then(|h| HeaderValue::from_str(h).ok());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let direct = addr.filter(|_| !upgrade && h1::eligible(&req));

        let (mut parts, body) = req.into_parts();
        if path_routed {
            session::strip_cookie(&mut parts.headers);
        }
        headers::rewrite_request(
            &mut parts.headers,
            upgrade,
            false,
            &conn.client_ip,
            original_host,
            proto,
        );
        let pq = new_path
            .or_else(|| parts.uri.path_and_query().cloned())
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(authority);
        uri.path_and_query = Some(pq);
        parts.uri = Uri::from_parts(uri).map_err(|e| ProxyError::Internal(e.to_string()))?;
        parts.version = Version::HTTP_11;
        let body = RequestBody::new(body, limit, &self.metrics.tx_bytes);
        let budget = self.budget(&target);
        if let Some(addr) = direct {
            return self
                .direct(addr, parts, body, budget, &target, cached_uid.as_deref())
                .await;
        }
        let sent = self
            .upstreams
            .http1
            .request(Request::from_parts(parts, body));
        let result = self.within(budget, &target, sent).await?;
        let mut resp =
            result.map_err(|e| self.upstream_failure(&e, &target, cached_uid.as_deref()))?;

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_side) = client_upgrade else {
                return Err(ProxyError::Upstream(target.id));
            };
            let sandbox_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(tunnel::splice(
                client_side,
                sandbox_side,
                self.metrics.rx_bytes.clone(),
                self.metrics.tx_bytes.clone(),
            ));
            let (parts, _) = resp.into_parts();
            return Ok(Response::from_parts(parts, ProxyBody::empty()));
        }
        let (mut parts, body) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers, false, false);
        Ok(Response::from_parts(
            parts,
            ProxyBody::upstream(body, &self.metrics.rx_bytes),
        ))
    }

    /// The plain HTTP/1.1 exchange to a known address, on this worker's own pool.
    async fn direct(
        &self,
        addr: SocketAddr,
        parts: http::request::Parts,
        body: RequestBody,
        budget: Option<Duration>,
        t: &Target,
        cached_uid: Option<&str>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let policy = self.upstreams.dial_policy();
        let sent = h1::exchange(addr, &parts, body, policy, &self.metrics);
        match self.within(budget, t, sent).await? {
            Ok(resp) => Ok(resp.map(ProxyBody::Direct)),
            Err(e) => Err(self.exchange_failure(e, t, cached_uid)),
        }
    }

    /// Classifies a failed direct exchange and counts it.
    pub(crate) fn exchange_failure(
        &self,
        e: h1::ExchangeError,
        t: &Target,
        cached_uid: Option<&str>,
    ) -> ProxyError {
        match e {
            h1::ExchangeError::Dial(dial) => self.dial_failure(&dial, t, cached_uid),
            e if e.body_too_large() => ProxyError::BodyTooLarge,
            // The client's body broke off or was malformed: its fault, not the sandbox's.
            h1::ExchangeError::Body(_) => ProxyError::BadRequest("Invalid request body."),
            e => {
                let reason = if matches!(e, h1::ExchangeError::Io(_)) {
                    "eof"
                } else {
                    "other"
                };
                self.metrics.upstream_error(&t.namespace, reason);
                tracing::warn!(sandbox = %t.id, namespace = %t.namespace, reason, error = %e, "backend exchange failed");
                ProxyError::Upstream(t.id.clone())
            }
        }
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

    fn dial_failure(&self, dial: &DialError, t: &Target, cached_uid: Option<&str>) -> ProxyError {
        self.metrics.upstream_error(&t.namespace, "dial");
        tracing::warn!(sandbox = %t.id, namespace = %t.namespace, error = %dial, "backend unreachable");
        if dial.failure == DialFailure::Unreachable {
            if let (Some(cache), Some(uid)) = (&self.cache, cached_uid) {
                cache.evict(uid);
            }
        }
        ProxyError::Dial(t.id.clone())
    }

    /// Trades `?sandbox_token=` for a session cookie (after checking it).
    async fn bootstrap<B>(
        &self,
        req: &Request<B>,
        target: &Target,
        token: &str,
        rest_query: &str,
        base: &str,
        proto: &'static str,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let access = Access {
            token: Some(token),
            namespace: &target.namespace,
            id: &target.id,
            pins_pod: false,
        };
        let exp = self.authz.check(&access, &self.metrics).await?;
        let path = req.uri().path();
        let location = if rest_query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{rest_query}")
        };
        let spec = session::CookieSpec {
            path: base.trim_end_matches('/'),
            same_site: self.settings.same_site,
            secure: proto == "https",
            max_age: exp.map(|e| e.saturating_sub(unix_now())),
        };
        session::bootstrap_response(token, &location, &spec).ok_or(ProxyError::BadRequest(
            "The token cannot be used as a session cookie.",
        ))
    }

    async fn grpc(
        &self,
        req: Request<Incoming>,
        conn: &Conn,
        routed: &mut Routed,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let target = parse_headers(
            req.headers(),
            HeaderRules {
                grpc: true,
                allow_loopback: self.settings.allow_loopback_pod_ip,
            },
        )?;
        routed.set(&target);
        self.authorize(&req, &target, false).await?;
        let started = Instant::now();
        let inbound = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout::parse);
        let deadline = match (inbound, self.settings.grpc_proxy_timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Resolved {
            authority,
            cached_uid,
            ..
        } = self.resolve(&target)?;
        let original_host = host_of(&req).and_then(|h| HeaderValue::from_str(h).ok());
        let proto = self.proto(&req, conn);
        let (mut parts, body) = req.into_parts();
        headers::rewrite_request(
            &mut parts.headers,
            false,
            true,
            &conn.client_ip,
            original_host,
            proto,
        );
        if let Some(d) = deadline {
            if let Ok(v) = HeaderValue::from_str(&grpc_timeout::encode(d)) {
                parts.headers.insert("grpc-timeout", v);
            }
        }
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(authority);
        uri.path_and_query = parts.uri.path_and_query().cloned();
        parts.uri = Uri::from_parts(uri).map_err(|e| ProxyError::Internal(e.to_string()))?;
        parts.version = Version::HTTP_2;
        let upstream_req = Request::from_parts(
            parts,
            RequestBody::new(
                body,
                self.settings.max_request_body_bytes,
                &self.metrics.tx_bytes,
            ),
        );
        let sent = self.upstreams.h2c.request(upstream_req);
        let result = self.within(deadline, &target, sent).await?;
        let resp = result.map_err(|e| self.upstream_failure(&e, &target, cached_uid.as_deref()))?;
        let remaining = deadline.map(|d| d.saturating_sub(started.elapsed()));
        let (mut parts, body) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers, false, false);
        Ok(Response::from_parts(
            parts,
            ProxyBody::grpc(body, &self.metrics.rx_bytes, remaining),
        ))
    }

    /// Classifies a failed exchange, counts it, and evicts a cached Pod that
    /// proved unreachable (a refused dial means the Pod is there but not
    /// listening yet: it stays).
    fn upstream_failure(
        &self,
        e: &hyper_util::client::legacy::Error,
        t: &Target,
        cached_uid: Option<&str>,
    ) -> ProxyError {
        if let Some(dial) = DialError::find(e) {
            return self.dial_failure(dial, t, cached_uid);
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let mut reason = "other";
        while let Some(err) = source {
            if err.is::<BodyTooLarge>() {
                return ProxyError::BodyTooLarge;
            }
            if let Some(h) = err.downcast_ref::<hyper::Error>() {
                if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                    reason = "eof";
                } else if h.is_timeout() {
                    reason = "timeout";
                }
            }
            source = err.source();
        }
        self.metrics.upstream_error(&t.namespace, reason);
        tracing::warn!(sandbox = %t.id, namespace = %t.namespace, reason, error = %e, "backend exchange failed");
        ProxyError::Upstream(t.id.clone())
    }
}
