//! Carrying HTTP to a TCP port inside a sandbox: one request (any method,
//! body streamed), upgrades spliced both ways after 101, per-hop headers
//! and every credential stripped, Origin checked on upgrades (CSWSH).
//! The REST ports routes and the E2B facade both proxy through here.

use axum::{
    body::Body,
    extract::Request,
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri},
    response::Response,
};
use hyper_util::rt::TokioIo;
use sandhub_api::error::Code;

use crate::http::{ApiError, ApiResult};

/// Carries `request` to `port` in sandbox `id` as `uri` (path and query
/// as the server inside should see them), and its answer back.
pub async fn forward(
    api: &dyn crate::backend::TenantView,
    id: &str,
    port: u16,
    uri: Uri,
    mut request: Request,
) -> ApiResult<Response> {
    let upgrade = is_upgrade(request.headers());
    if upgrade && !same_origin(request.headers()) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            "cross-origin upgrade refused: Origin must match the hub's host",
        ));
    }
    let port_stream = api.connect_port(id, port).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(port_stream.stream))
            .await
            .map_err(|e| unavailable(port, e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "port connection ended");
        }
    });
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut upstream = hyper::Request::builder()
        .method(parts.method)
        .uri(uri)
        .body(body)
        .map_err(|e| ApiError::new(Code::InvalidArgument, e.to_string()))?;
    let mut headers = request_headers(parts.headers, port, upgrade);
    // The route's own (through sandhub-router), set after the client's
    // were cleaned, so no client can name another sandbox or port.
    for (name, value) in &port_stream.headers {
        headers.insert(name, value.clone());
    }
    *upstream.headers_mut() = headers;
    let routed = !port_stream.headers.is_empty();
    let mut response = sender
        .send_request(upstream)
        .await
        .map_err(|e| unavailable(port, e))?;
    if routed && looks_like_router_failure(&response) {
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
        tokio::spawn(async move {
            let (Ok(client), Ok(server)) = tokio::join!(client, server) else {
                return;
            };
            let (mut c, mut s) = (TokioIo::new(client), TokioIo::new(server));
            let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
        });
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, switched);
    Ok(Response::from_parts(parts, Body::new(body)))
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

/// Per-hop headers (RFC 9110 §7.6.1) that never travel past a proxy.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "trailer",
    "transfer-encoding",
];

/// Drops the per-hop headers, and any the Connection header names; an
/// upgrade keeps `Upgrade` and says `Connection: upgrade` again.
fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(keep_upgrade && name == header::UPGRADE) {
            h.remove(&name);
        }
    }
    for name in HOP_BY_HOP {
        h.remove(name);
    }
    if h.get(header::TE).is_some_and(|v| v != "trailers") {
        h.remove(header::TE);
    }
    if keep_upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        h.remove(header::UPGRADE);
    }
}

/// What the server inside sees: the client's headers without the hop-by-hop
/// ones, without any credential (the sandbox must never learn the
/// tenant's key) and, on upgrades, without Origin (checked here already;
/// many servers refuse a foreign one); `Host: localhost:{port}`, as a
/// browser on that machine would send, and the original in X-Forwarded-Host.
fn request_headers(mut h: HeaderMap, port: u16, upgrade: bool) -> HeaderMap {
    strip_hop_by_hop(&mut h, upgrade);
    // Nor any E2B credential (the API key, the sandbox's access tokens).
    for secret in [
        header::AUTHORIZATION.as_str(),
        "x-api-key",
        "x-access-token",
        "e2b-traffic-access-token",
    ] {
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
    if let Some(host) = h.remove(header::HOST) {
        h.insert(HeaderName::from_static("x-forwarded-host"), host);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("localhost:{port}")) {
        h.insert(header::HOST, v);
    }
    h
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
                ("cookie", "a=b"),
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
