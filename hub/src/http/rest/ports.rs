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
    extract::{Request, State},
    http::{header, StatusCode, Uri},
    response::Response,
    routing::{any, get},
};
use hyper_util::rt::TokioIo;
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{PortList, PortUrl, PORT_FORWARD_UPGRADE},
};
use serde::Deserialize;
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{
    proxy::{forward, is_upgrade, same_origin, Served},
    Api, ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState,
};

/// The proxy routes need a catch-all segment, which OpenAPI cannot spell:
/// routed by hand, documented from the handler's annotation.
#[derive(OpenApi)]
#[openapi(paths(proxy_port, port_forward))]
struct PortsDoc;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(PortsDoc::openapi())
        .routes(routes!(list_ports))
        .routes(routes!(port_url))
        .route("/v1/sandboxes/{id}/ports/{port}", any(proxy_port))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(proxy_port))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(proxy_port))
        .route("/v1/sandboxes/{id}/port-forward/{port}", get(port_forward))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PortUrlQuery {
    /// How long the link opens the port, in seconds (default 3600, at most 86400).
    ttl_seconds: Option<u64>,
}

/// A browser link to a port, on its own host (`{port}-{id}.<domain>`, with
/// `--sandbox-domain`): its first visit trades the link's token for a
/// cookie scoped to that host. Whoever holds the link can use the port
/// until it expires.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/port-urls/{port}", tag = "ports",
    params(("id" = String, Path), ("port" = u16, Path, description = "TCP port, 1 to 65535"),
           PortUrlQuery),
    responses((status = 200, body = PortUrl), (status = 400, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody, description = "The hub has no --sandbox-domain")))]
async fn port_url(
    Api(api): Api,
    State(state): State<AppState>,
    ApiPath(PortPath { id, port }): ApiPath<PortPath>,
    ApiQuery(q): ApiQuery<PortUrlQuery>,
) -> ApiResult<ApiJson<PortUrl>> {
    let port = parse_port(&port)?;
    let Some(hosts) = &state.hosts else {
        return Err(ApiError::new(
            Code::FailedPrecondition,
            "port links need the hub started with --sandbox-domain",
        ));
    };
    api.get(&id).await?;
    let ttl = q.ttl_seconds.unwrap_or(crate::http::hosts::DEFAULT_TTL_S);
    if ttl == 0 || ttl > crate::http::hosts::MAX_TTL_S {
        return Err(ApiError::new(
            Code::InvalidArgument,
            format!("ttl_seconds must be 1 to {}", crate::http::hosts::MAX_TTL_S),
        ));
    }
    let (url, expires) = hosts.mint(api.tenant(), &id, port, ttl);
    Ok(ApiJson(PortUrl {
        url,
        expires_at: crate::backend::rfc3339(
            i64::try_from(expires).unwrap_or(i64::MAX / 1000) * 1000,
        ),
    }))
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
    State(state): State<AppState>,
    ApiPath(PortPath { id, port }): ApiPath<PortPath>,
    request: Request,
) -> ApiResult<Response> {
    let port = parse_port(&port)?;
    let uri = upstream_uri(request.uri())?;
    // Shown on the hub's own origin: sandboxed (opaque origin), and its
    // cookies kept under this port's path.
    let served = Served::OnHubOrigin {
        cookie_path: Some(format!("/v1/sandboxes/{id}/ports/{port}/")),
    };
    forward(api.as_ref(), &state.ports, &id, port, uri, request, served).await
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
    let route = api.connect_port(&id, port).await?;
    if !route.headers.is_empty() {
        return Err(ApiError::new(
            Code::FailedPrecondition,
            "raw TCP port-forward needs the hub to reach Pods directly; through \
             sandhub-router a port carries HTTP only (use /v1/sandboxes/{id}/ports/...)",
        ));
    }
    let mut stream = route.stream;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
