//! A sandbox's TCP ports: `ANY /v1/sandboxes/{id}/ports/{port}/{path...}`
//! proxies HTTP/1.1 (streamed and chunked bodies, SSE) and Upgrade
//! (WebSocket and any other protocol, spliced both ways after 101) to
//! `localhost:{port}` inside the sandbox; `GET /v1/sandboxes/{id}/ports`
//! lists what listens. The backend makes the connection (the local one
//! from inside the sandbox's network namespace); this module speaks HTTP
//! over it, with the tenant's key like every sandbox route (another
//! tenant's sandbox is NOT_FOUND).

use axum::{
    body::Body,
    extract::Request,
    http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri},
    response::Response,
    routing::{any, get},
};
use hyper_util::rt::TokioIo;
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{PortList, PORT_FORWARD_UPGRADE},
};
use serde::Deserialize;
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiError, ApiJson, ApiPath, ApiResult, AppState};

/// The proxy routes need a catch-all segment, which OpenAPI cannot spell:
/// routed by hand, documented from the handler's annotation.
#[derive(OpenApi)]
#[openapi(paths(proxy_port, port_forward))]
struct PortsDoc;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(PortsDoc::openapi())
        .routes(routes!(list_ports))
        .route("/v1/sandboxes/{id}/ports/{port}", any(proxy_port))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(proxy_port))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(proxy_port))
        .route("/v1/sandboxes/{id}/port-forward/{port}", get(port_forward))
}

/// TCP ports listening inside the sandbox (any address, IPv4 and IPv6).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "ports",
    params(("id" = String, Path)),
    responses((status = 200, body = PortList), (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
              (status = 503, body = ErrorBody)))]
async fn list_ports(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<PortList>> {
    let ports = api.list_ports(&id).await?;
    Ok(ApiJson(PortList { ports }))
}

#[derive(Debug, Deserialize)]
struct PortPath {
    id: String,
    port: String,
}

/// Any request (any method, body streamed) to a port inside the sandbox;
/// the answer comes back as the server gave it. WebSocket and other
/// upgrades are spliced both ways after 101; a cross-origin upgrade is
/// refused (403).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/{path}", tag = "ports",
    params(("id" = String, Path), ("port" = u16, Path, description = "TCP port, 1 to 65535"),
           ("path" = String, Path, description = "Path on the server inside the sandbox")),
    responses(
        (status = 200, description = "The sandbox server's answer, whatever it is"),
        (status = 400, body = ErrorBody, description = "Bad port"),
        (status = 403, body = ErrorBody, description = "Cross-origin upgrade"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 503, body = ErrorBody, description = "Nothing accepts connections on the port"),
    ))]
async fn proxy_port(
    Api(api): Api,
    ApiPath(PortPath { id, port }): ApiPath<PortPath>,
    mut request: Request,
) -> ApiResult<Response> {
    let port = parse_port(&port)?;
    let upgrade = is_upgrade(request.headers());
    if upgrade && !same_origin(request.headers()) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            "cross-origin upgrade refused: Origin must match the hub's host",
        ));
    }
    let uri = upstream_uri(request.uri())?;
    let stream = api.connect_port(&id, port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
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
    *upstream.headers_mut() = request_headers(parts.headers, port, upgrade);
    let mut response = sender
        .send_request(upstream)
        .await
        .map_err(|e| unavailable(port, e))?;
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

/// A raw TCP tunnel to a port (what `sandhub port-forward` uses): the
/// request upgrades to `sandhub-tcp` and, after 101, its bytes go to the
/// port and back as they are.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/port-forward/{port}", tag = "ports",
    params(("id" = String, Path), ("port" = u16, Path, description = "TCP port, 1 to 65535")),
    responses(
        (status = 101, description = "Switched to `sandhub-tcp`: raw TCP from here on"),
        (status = 400, body = ErrorBody, description = "Bad port, or not an upgrade to `sandhub-tcp`"),
        (status = 403, body = ErrorBody, description = "Cross-origin upgrade"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 503, body = ErrorBody, description = "Nothing accepts connections on the port"),
    ))]
async fn port_forward(
    Api(api): Api,
    ApiPath(PortPath { id, port }): ApiPath<PortPath>,
    mut request: Request,
) -> ApiResult<Response> {
    let port = parse_port(&port)?;
    let h = request.headers();
    let wanted = is_upgrade(h)
        && h.get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(PORT_FORWARD_UPGRADE));
    if !wanted {
        return Err(ApiError::new(
            Code::InvalidArgument,
            format!(
                "port-forward needs `Connection: upgrade` and `Upgrade: {PORT_FORWARD_UPGRADE}`"
            ),
        ));
    }
    if !same_origin(h) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            "cross-origin upgrade refused: Origin must match the hub's host",
        ));
    }
    let mut stream = api.connect_port(&id, port).await?;
    let client = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(client) = client.await else {
            return;
        };
        let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut stream).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, PORT_FORWARD_UPGRADE)
        .body(Body::empty())
        .map_err(|e| ApiError::new(Code::Internal, e.to_string()))
}

fn unavailable(port: u16, e: hyper::Error) -> ApiError {
    ApiError::new(
        Code::Unavailable,
        format!("the server on port {port} in the sandbox: {e}"),
    )
}

fn parse_port(s: &str) -> ApiResult<u16> {
    match s.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(ApiError::new(
            Code::InvalidArgument,
            format!("port must be a number from 1 to 65535, not {s:?}"),
        )),
    }
}

/// The still-encoded path after `/v1/sandboxes/{id}/ports/{port}`, plus the
/// query, so the server sees exactly what the client sent.
fn upstream_uri(uri: &Uri) -> ApiResult<Uri> {
    let rest = uri.path().splitn(7, '/').nth(6).unwrap_or("");
    let mut target = format!("/{rest}");
    if let Some(q) = uri.query() {
        target.push('?');
        target.push_str(q);
    }
    target
        .parse()
        .map_err(|e| ApiError::new(Code::InvalidArgument, format!("bad path: {e}")))
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
/// ones, without the hub's credentials (the sandbox must never learn the
/// tenant's key) and, on upgrades, without Origin (checked here already;
/// many servers refuse a foreign one); `Host: localhost:{port}`, as a
/// browser on that machine would send, and the original in X-Forwarded-Host.
fn request_headers(mut h: HeaderMap, port: u16, upgrade: bool) -> HeaderMap {
    strip_hop_by_hop(&mut h, upgrade);
    h.remove(header::AUTHORIZATION);
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
fn is_upgrade(h: &HeaderMap) -> bool {
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
fn same_origin(h: &HeaderMap) -> bool {
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
    fn ports_outside_1_to_65535_are_refused() {
        assert_eq!(parse_port("8080").unwrap(), 8080);
        assert_eq!(parse_port("65535").unwrap(), 65535);
        for bad in ["0", "65536", "-1", "", "80a", "99999999999"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_path_after_the_port_travels_encoded_with_its_query() {
        let u: Uri = "/v1/sandboxes/sb-1/ports/80/a%2Fb/c?x=1".parse().unwrap();
        assert_eq!(upstream_uri(&u).unwrap(), "/a%2Fb/c?x=1");
        let u: Uri = "/v1/sandboxes/sb-1/ports/80".parse().unwrap();
        assert_eq!(upstream_uri(&u).unwrap(), "/");
        let u: Uri = "/v1/sandboxes/sb-1/ports/80/".parse().unwrap();
        assert_eq!(upstream_uri(&u).unwrap(), "/");
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
