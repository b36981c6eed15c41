//! Carrying HTTP to a TCP port inside a sandbox: one request (any method,
//! body streamed), upgrades spliced both ways after 101, per-hop headers
//! and every credential stripped, Origin checked on upgrades (CSWSH).
//! The REST ports routes, host routing and the E2B facade all proxy
//! through here.
//!
//! ```text
//! mod.rs     forward(): the request there and the answer back; kept connections
//! answer.rs  the answer made safe for where it is shown (CSP sandbox, cookies),
//!            as a HeaderMap or as the fast path's response head
//! limits.rs  caps on requests in flight, answer and idle timeouts
//! ```
//!
//! The port route's plain requests usually take the HTTP/1.1 fast path
//! instead (`http::fast`), which uses this module's caps, credentials list
//! and answer rules, so both paths keep the same promises.

mod answer;
mod limits;

pub use answer::{harden_head, Served, SANDBOX_CSP};

/// The cookie a host-routed port link is kept in: the hub's own, so every
/// route strips it from requests and no sandbox may set it.
pub const PORT_COOKIE: &str = "sandhub_port";
pub use limits::{Gate, ProxyLimits, Slot};

use axum::{
    body::Body,
    extract::Request,
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri},
    response::Response,
};
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use sandhub_api::error::Code;

use crate::http::{ApiError, ApiResult};

type Sender = hyper::client::conn::http1::SendRequest<Body>;
type PoolKey = (String, String, u16);

/// How long an idle connection to a port is kept, and how many per port.
pub const IDLE_FOR: Duration = Duration::from_secs(30);
pub const MAX_IDLE_PER_PORT: usize = 32;
/// Past this many ports with idle connections, dead entries are swept.
pub const SWEEP_AT: usize = 1024;

struct Idle {
    sender: Sender,
    /// The route's headers (through sandhub-router), sent with every request.
    route: HeaderMap,
    since: Instant,
}

impl Idle {
    fn alive(&self) -> bool {
        !self.sender.is_closed() && self.since.elapsed() < IDLE_FOR
    }
}

/// Keep-alive connections to sandbox ports, per tenant, sandbox and port,
/// as a browser or a load generator expects: a new connection per request
/// costs a hop into the sandbox's namespace and the server's accept.
/// A connection is reused only for the same tenant, after the sandbox is
/// checked to still be theirs and Ready; never for upgrades.
///
/// It also holds what bounds proxied traffic: the caps on requests in
/// flight and the timeouts ([`ProxyLimits`]).
#[derive(Default)]
pub struct PortPool {
    idle: Mutex<HashMap<PoolKey, Vec<Idle>>>,
    limits: ProxyLimits,
    gate: Gate,
}

impl PortPool {
    pub fn new(limits: ProxyLimits) -> Self {
        PortPool {
            limits,
            ..PortPool::default()
        }
    }

    /// Requests carried right now (every tenant).
    pub fn in_flight(&self) -> usize {
        self.gate.in_flight()
    }

    /// A slot for one more request to sandbox `id`'s ports, under the caps.
    pub fn admit(&self, tenant: &str, id: &str) -> ApiResult<Slot> {
        self.gate.admit(&self.limits, tenant, id)
    }

    pub fn limits(&self) -> &ProxyLimits {
        &self.limits
    }

    fn take(&self, key: &PoolKey) -> Option<(Sender, HeaderMap)> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(key)?;
        list.retain(Idle::alive);
        // One still streaming its last answer is not ready yet: left in.
        let found = list
            .iter()
            .position(|i| i.sender.is_ready())
            .map(|at| list.swap_remove(at));
        if list.is_empty() {
            idle.remove(key);
        }
        found.map(|i| (i.sender, i.route))
    }

    fn put(&self, key: PoolKey, sender: Sender, route: HeaderMap) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= SWEEP_AT {
            idle.retain(|_, list| {
                list.retain(Idle::alive);
                !list.is_empty()
            });
        }
        let list = idle.entry(key).or_default();
        list.retain(Idle::alive);
        if list.len() < MAX_IDLE_PER_PORT {
            list.push(Idle {
                sender,
                route,
                since: Instant::now(),
            });
        }
    }
}

/// A new connection to the port, and the headers its route needs.
async fn connect(
    api: &dyn crate::backend::TenantView,
    id: &str,
    port: u16,
) -> ApiResult<(Sender, HeaderMap)> {
    let port_stream = api.connect_port(id, port).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(port_stream.stream))
        .await
        .map_err(|e| unavailable(port, e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "port connection ended");
        }
    });
    Ok((sender, port_stream.headers))
}

fn with_route(mut request: hyper::Request<Body>, route: &HeaderMap) -> hyper::Request<Body> {
    // The route's own (through sandhub-router), set after the client's
    // were cleaned, so no client can name another sandbox or port.
    for (name, value) in route {
        request.headers_mut().insert(name, value.clone());
    }
    request
}

/// The path and query of `uri` as the client sent them (what a server
/// reached at the root of its own host, or by header, should see).
pub fn as_sent(uri: &Uri) -> Uri {
    uri.path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"))
}

/// Carries `request` to `port` in sandbox `id` as `uri` (path and query
/// as the server inside should see them), and its answer back, made safe
/// for where it is `served`. Each request holds a slot under the pool's
/// caps until its answer's body ends (or its upgraded connection closes).
pub async fn forward(
    api: &dyn crate::backend::TenantView,
    pool: &PortPool,
    id: &str,
    port: u16,
    uri: Uri,
    mut request: Request,
    served: Served,
) -> ApiResult<Response> {
    let upgrade = is_upgrade(request.headers());
    if upgrade && !same_origin(request.headers()) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            "cross-origin upgrade refused: Origin must match the hub's host",
        ));
    }
    let slot = pool.admit(api.tenant(), id)?;
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut upstream = hyper::Request::builder()
        .method(parts.method)
        .uri(uri)
        .body(body)
        .map_err(|e| ApiError::new(Code::InvalidArgument, e.to_string()))?;
    *upstream.headers_mut() = request_headers(parts.headers, port, upgrade);
    let key: PoolKey = (api.tenant().to_string(), id.to_string(), port);
    let sent = send(api, pool, &key, upstream, upgrade);
    let (mut response, sender, route) = tokio::time::timeout(pool.limits.response_timeout, sent)
        .await
        .map_err(|_| {
            ApiError::new(
                Code::DeadlineExceeded,
                format!(
                    "the server on port {port} in the sandbox sent no answer within {:?} \
                     (--port-response-timeout)",
                    pool.limits.response_timeout
                ),
            )
        })??;
    if !route.is_empty() && looks_like_router_failure(&response) {
        return router_failure(port, response).await;
    }
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    if switched {
        let Some(client) = client_upgrade else {
            // An upgrade the client did not ask for cannot be carried.
            return Err(ApiError::new(
                Code::Unavailable,
                format!("the server on port {port} switched protocols unasked"),
            ));
        };
        let server = hyper::upgrade::on(&mut response);
        let idle = pool.limits.stream_idle_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let (Ok(client), Ok(server)) = tokio::join!(client, server) else {
                return;
            };
            limits::splice(TokioIo::new(client), TokioIo::new(server), idle).await;
        });
        let (mut parts, _) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers, true);
        answer::harden(&mut parts.headers, &served);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    if !upgrade {
        // Ready again once this answer's body is through (`take` checks).
        pool.put(key, sender, route);
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    answer::harden(&mut parts.headers, &served);
    let idle = if is_event_stream(&parts.headers) {
        pool.limits.stream_idle_timeout
    } else {
        pool.limits.idle_timeout
    };
    Ok(Response::from_parts(
        parts,
        limits::watched_body(body, idle, slot),
    ))
}

/// Sends `upstream` on a kept connection (checked to still be the
/// tenant's) or a new one: the answer's head, the connection and its route.
async fn send(
    api: &dyn crate::backend::TenantView,
    pool: &PortPool,
    key: &PoolKey,
    upstream: hyper::Request<Body>,
    upgrade: bool,
) -> ApiResult<(hyper::Response<hyper::body::Incoming>, Sender, HeaderMap)> {
    let (id, port) = (key.1.as_str(), key.2);
    let mut unsent = Some(upstream);
    if !upgrade {
        if let Some((mut sender, route)) = pool.take(key) {
            // The sandbox may have gone (or changed hands: it cannot, ids
            // are never reused, but the check is the same as a new
            // connection's) since the connection was made.
            api.port_access(id).await?;
            let request = with_route(unsent.take().expect("not sent yet"), &route);
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender, route)),
                Err(mut e) => match e.take_message() {
                    // Closed before it was sent (the server's keep-alive
                    // ran out): the request goes on a new connection.
                    Some(request) => unsent = Some(request),
                    None => return Err(unavailable(port, e.into_error())),
                },
            }
        }
    }
    let (mut sender, route) = connect(api, id, port).await?;
    let request = unsent.take().expect("not sent yet");
    let response = sender
        .send_request(with_route(request, &route))
        .await
        .map_err(|e| unavailable(port, e))?;
    Ok((response, sender, route))
}

fn is_event_stream(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .is_some_and(|v| is_event_stream_type(v.as_bytes()))
}

/// Whether a Content-Type is an event stream (SSE), which is quiet by
/// nature and gets the stream idle timeout.
pub fn is_event_stream_type(content_type: &[u8]) -> bool {
    content_type
        .trim_ascii_start()
        .starts_with(b"text/event-stream")
}

/// What `sandhub-router` says when it cannot reach the port itself
/// (`{"detail": "Could not connect to the backend sandbox: ..."}`).
const ROUTER_FAILURES: [&str; 2] = [
    "Could not connect to the backend sandbox",
    "Timed out waiting for the backend sandbox",
];

/// A small JSON 502/504 (the router's own are; a server's may be too).
fn looks_like_router_failure(response: &hyper::Response<hyper::body::Incoming>) -> bool {
    let h = response.headers();
    matches!(
        response.status(),
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT
    ) && h
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
        && h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|n| n <= ROUTER_FAILURE_MAX)
}

const ROUTER_FAILURE_MAX: usize = 4096;

/// A 502/504 through the router: the router's own (nothing listens on the
/// port: the hub's UNAVAILABLE, as on a direct connection), or the
/// server's, passed on as it was.
async fn router_failure(
    port: u16,
    response: hyper::Response<hyper::body::Incoming>,
) -> ApiResult<Response> {
    use http_body_util::BodyExt;
    let (parts, body) = response.into_parts();
    let bytes = http_body_util::Limited::new(body, ROUTER_FAILURE_MAX)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let detail = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("detail").and_then(|d| d.as_str()).map(str::to_string));
    if let Some(detail) = detail.filter(|d| ROUTER_FAILURES.iter().any(|f| d.starts_with(f))) {
        return Err(ApiError::new(
            Code::Unavailable,
            format!("nothing accepts connections on port {port} in the sandbox: {detail}"),
        ));
    }
    let mut parts = parts;
    strip_hop_by_hop(&mut parts.headers, false);
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

fn unavailable(port: u16, e: hyper::Error) -> ApiError {
    ApiError::new(
        Code::Unavailable,
        format!("the server on port {port} in the sandbox: {e}"),
    )
}

/// Drops the per-hop headers, and any the Connection header names; an
/// upgrade keeps `Upgrade` and says `Connection: upgrade` again; `te:
/// trailers` stays (see [`sandhub_common::hop`]).
fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    sandhub_common::hop::strip_hop_by_hop(h, keep_upgrade, true);
}

/// The request headers that carry a credential of the hub's (the API key,
/// E2B's sandbox access tokens): the server inside never sees them.
pub const CREDENTIALS: [&str; 4] = [
    "authorization",
    "x-api-key",
    "x-access-token",
    "e2b-traffic-access-token",
];

/// What the server inside sees: the client's headers without the hop-by-hop
/// ones, without any credential (the sandbox must never learn the
/// tenant's key) and, on upgrades, without Origin (checked here already;
/// many servers refuse a foreign one); `Host: localhost:{port}`, as a
/// browser on that machine would send, and the original in X-Forwarded-Host.
fn request_headers(mut h: HeaderMap, port: u16, upgrade: bool) -> HeaderMap {
    strip_hop_by_hop(&mut h, upgrade);
    // Nor any E2B credential (the API key, the sandbox's access tokens).
    for secret in CREDENTIALS {
        h.remove(secret);
    }
    // Nor the router's routing headers: only the hub names the target.
    let routing: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with("x-sandbox-"))
        .cloned()
        .collect();
    for name in routing {
        h.remove(name);
    }
    if upgrade {
        h.remove(header::ORIGIN);
    }
    // Nor the hub's own port cookie, whichever route the request took.
    strip_our_cookie(&mut h);
    if let Some(host) = h.remove(header::HOST) {
        h.insert(HeaderName::from_static("x-forwarded-host"), host);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("localhost:{port}")) {
        h.insert(header::HOST, v);
    }
    h
}

/// The Cookie header without the hub's own (`sandhub_port`): the server
/// inside never learns the token that opens its port.
pub fn strip_our_cookie(headers: &mut HeaderMap) {
    let all: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|kv| !kv.is_empty())
        .map(str::to_string)
        .collect();
    let kept: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|kv| {
            let name = kv.split_once('=').map_or(*kv, |(k, _)| k).trim();
            !name.eq_ignore_ascii_case(PORT_COOKIE)
        })
        .collect();
    if kept.len() == all.len() && headers.get_all(header::COOKIE).iter().count() <= 1 {
        return;
    }
    headers.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(header::COOKIE, v);
        }
    }
}

/// Whether an HTTP/1.1 request asks to switch protocols.
pub fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The CSWSH check: no Origin (not a browser) or an Origin whose host is the
/// one the request was sent to. A page elsewhere cannot open a WebSocket
/// into a sandbox with the hub's open-tenant access or a browser's cookies.
pub fn same_origin(h: &HeaderMap) -> bool {
    let Some(origin) = h.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(Ok(host))) = (origin.to_str(), h.get(header::HOST).map(|v| v.to_str()))
    else {
        return false;
    };
    match origin.trim().trim_end_matches('/').split_once("://") {
        Some((scheme, o_host)) => {
            (scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https"))
                && o_host.eq_ignore_ascii_case(host.trim())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn origin_must_name_the_host_asked() {
        assert!(same_origin(&headers(&[("host", "hub:8080")])));
        assert!(same_origin(&headers(&[
            ("host", "hub:8080"),
            ("origin", "http://HUB:8080/")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "hub:8080"),
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "hub:8080"),
            ("origin", "null")
        ])));
        assert!(!same_origin(&headers(&[("origin", "http://hub:8080")])));
    }

    #[test]
    fn the_tenant_key_never_reaches_the_sandbox() {
        let h = request_headers(
            headers(&[
                ("authorization", "Bearer k"),
                ("host", "hub:1"),
                ("connection", "keep-alive, x-secret"),
                ("x-secret", "1"),
                ("cookie", "a=b; sandhub_port=secret"),
            ]),
            8000,
            false,
        );
        assert!(h.get("authorization").is_none());
        assert!(h.get("x-secret").is_none());
        assert_eq!(h["host"], "localhost:8000");
        assert_eq!(h["x-forwarded-host"], "hub:1");
        assert_eq!(h["cookie"], "a=b");
    }

    #[test]
    fn upgrades_keep_upgrade_and_lose_origin() {
        let h = request_headers(
            headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("origin", "http://hub:1"),
            ]),
            1,
            true,
        );
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert!(h.get("origin").is_none());
    }
}
