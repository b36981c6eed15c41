//! Deciding from a request head alone whether the fast path serves it,
//! and writing the head the sandbox gets: the headers the hyper path's
//! `proxy::request_headers` would leave, in the client's order.
//!
//! Only the plain shape is taken: HTTP/1.1, a port route with a plain
//! sandbox id and port, a body framed by Content-Length (or none), and a
//! `Connection` header that names nothing but `close` or `keep-alive`.
//! Everything else goes to hyper and axum, which answer it as ever:
//! upgrades, `Expect`, chunked bodies, E2B's header route, port hosts
//! (`--sandbox-domain`), the hub's port cookie, and anything malformed.

use bytes::{BufMut, BytesMut};
use http::uri::PathAndQuery;
use sandhub_common::hop::HOP_BY_HOP;
use sandhub_http1::{
    inbound::{request_head, Parsed, MAX_HEADERS},
    wire::put_header,
};

use crate::http::{
    auth::{ApiKeys, OPEN_TENANT},
    hosts::HostRouting,
    proxy::{CREDENTIALS, PORT_COOKIE},
    rest::health::method_label,
};

/// The port route's three templates, as the request metrics label them.
const ROUTE_BARE: &str = "/v1/sandboxes/{id}/ports/{port}";
const ROUTE_ROOT: &str = "/v1/sandboxes/{id}/ports/{port}/";
const ROUTE_PATH: &str = "/v1/sandboxes/{id}/ports/{port}/{*path}";

/// One request the fast path serves, decided from its head alone.
pub struct Plan {
    pub head_len: usize,
    /// The method as a metrics label.
    pub method: &'static str,
    pub is_head: bool,
    /// `None`: no valid API key (the answer is UNAUTHENTICATED).
    pub tenant: Option<String>,
    pub id: String,
    pub port: u16,
    /// The route template, for the metrics.
    pub route: &'static str,
    pub content_length: u64,
    pub keep_alive: bool,
}

/// What the plan checks a head against.
pub struct Rules<'a> {
    pub keys: Option<&'a ApiKeys>,
    /// Port hosts (`--sandbox-domain`): a request for one is not the path route's.
    pub hosts: Option<&'a HostRouting>,
}

/// A port route's parts: the sandbox id, the port, and what follows the
/// port (`None`: nothing, not even a slash).
fn port_route(path: &str) -> Option<(&str, u16, Option<&str>)> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, after) = match rest.split_once('/') {
        Some((port, after)) => (port, Some(after)),
        None => (rest, None),
    };
    // Anything axum would decode or refuse (an escaped id, a bad port) is its to answer.
    let plain_id = !id.is_empty() && !id.contains('%');
    let port = match port.parse::<u32>() {
        Ok(p @ 1..=65535) if port.bytes().all(|b| b.is_ascii_digit()) => p as u16,
        _ => return None,
    };
    plain_id.then_some((id, port, after))
}

/// Whether a Cookie header carries the hub's own port cookie.
fn has_port_cookie(value: &[u8]) -> bool {
    value.split(|&b| b == b';').any(|kv| {
        let name = kv.split(|&b| b == b'=').next().unwrap_or_default();
        name.trim_ascii()
            .eq_ignore_ascii_case(PORT_COOKIE.as_bytes())
    })
}

/// Decides, from the bytes so far, whether the next request is served here
/// (and if so writes its head for the sandbox into `up_head`).
pub fn plan(buf: &[u8], up_head: &mut BytesMut, rules: &Rules<'_>) -> Parsed<Plan> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let req = match request_head(buf, &mut headers) {
        Ok(req) => req,
        Err(parsed) => return parsed,
    };
    let (method, target, head_len) = (req.method, req.target, req.len);
    if method == "CONNECT" || PathAndQuery::try_from(target).is_err() {
        return Parsed::Fallback;
    }
    // The fragment is the client's own business (hyper's URI drops it too).
    let target = target.split_once('#').map_or(target, |(t, _)| t);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let Some((id, port, after)) = port_route(path) else {
        return Parsed::Fallback;
    };
    let route = match after {
        None => ROUTE_BARE,
        Some("") => ROUTE_ROOT,
        Some(_) => ROUTE_PATH,
    };

    let mut content_length = None;
    let mut keep_alive = true;
    let mut host = None;
    let mut bearer = None;
    let mut api_key = None;
    for h in req.headers.iter() {
        let (name, value) = (h.name, h.value);
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("upgrade") || is("expect") || is("transfer-encoding") || is("e2b-sandbox-id") {
            return Parsed::Fallback;
        }
        if is("content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            match (n, content_length) {
                (None, _) => return Parsed::Fallback,
                (Some(n), Some(m)) if n != m => return Parsed::Fallback,
                (Some(n), _) => content_length = Some(n),
            }
        } else if is("connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                    // It names headers to drop: hyper's path drops them.
                    return Parsed::Fallback;
                }
            }
        } else if is("cookie") && has_port_cookie(value) {
            return Parsed::Fallback;
        } else if is("host") && host.is_none() {
            let claimed = rules.hosts.is_some_and(|hosts| {
                std::str::from_utf8(value).is_ok_and(|v| hosts.target(v).is_some())
            });
            if claimed {
                return Parsed::Fallback;
            }
            host = Some(value);
        } else if is("authorization") && bearer.is_none() {
            bearer = Some(value.strip_prefix(b"Bearer "));
        } else if is("x-api-key") && api_key.is_none() {
            api_key = Some(value);
        }
    }
    // As `auth::presented_key`: the first Authorization if it is a Bearer
    // key, else the first X-API-Key.
    let tenant = match rules.keys {
        None => Some(OPEN_TENANT.to_string()),
        Some(keys) => bearer
            .flatten()
            .or(api_key)
            .and_then(|key| keys.tenant_of(key)),
    };

    up_head.clear();
    up_head.put_slice(method.as_bytes());
    up_head.put_slice(b" /");
    up_head.put_slice(after.unwrap_or_default().as_bytes());
    if let Some(q) = query {
        up_head.put_u8(b'?');
        up_head.put_slice(q.as_bytes());
    }
    up_head.put_slice(b" HTTP/1.1\r\n");
    for h in req.headers.iter() {
        if !dropped(h.name, h.value, host.is_some()) {
            put_header(up_head, h.name.as_bytes(), h.value);
        }
    }
    use std::fmt::Write;
    let _ = write!(up_head, "host: localhost:{port}\r\n");
    if let Some(host) = host {
        put_header(up_head, b"x-forwarded-host", host);
    }
    if let Some(n) = content_length {
        let _ = write!(up_head, "content-length: {n}\r\n");
    }
    up_head.put_slice(b"\r\n");

    Parsed::Serve(Box::new(Plan {
        head_len,
        method: method_label(method),
        is_head: method == "HEAD",
        tenant,
        id: id.to_string(),
        port,
        route,
        content_length: content_length.unwrap_or(0),
        keep_alive,
    }))
}

/// Whether a client header stays off the sandbox's request: per-hop ones
/// (`te: trailers` aside), the hub's credentials, the router's routing
/// headers, and those written anew (Host, the length, and X-Forwarded-Host
/// when there is a Host to put in it).
fn dropped(name: &str, value: &[u8], has_host: bool) -> bool {
    let is = |n: &str| name.eq_ignore_ascii_case(n);
    HOP_BY_HOP.iter().any(|h| is(h.as_str()))
        || CREDENTIALS.iter().any(|c| is(c))
        || (is("te") && value != b"trailers")
        || is("host")
        || is("content-length")
        || (is("x-forwarded-host") && has_host)
        || name
            .get(..10)
            .is_some_and(|p| p.eq_ignore_ascii_case("x-sandbox-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(head: &str, keys: Option<&ApiKeys>) -> Option<(Plan, String)> {
        let mut up = BytesMut::new();
        let rules = Rules { keys, hosts: None };
        match plan(head.as_bytes(), &mut up, &rules) {
            Parsed::Serve(p) => Some((*p, String::from_utf8(up.to_vec()).unwrap())),
            _ => None,
        }
    }

    #[test]
    fn the_port_routes_plain_shape_is_taken_and_rewritten() {
        let (p, up) = planned(
            "POST /v1/sandboxes/sb-1/ports/8080/a%2Fb/c?x=1#frag HTTP/1.1\r\n\
             Host: hub:7000\r\nAuthorization: Bearer k\r\nX-Api-Key: k\r\n\
             X-Access-Token: t\r\nE2b-Traffic-Access-Token: t\r\nX-Sandbox-ID: other\r\n\
             X-Forwarded-Host: evil\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\
             TE: gzip\r\nContent-Length: 3\r\nAccept: */*\r\nCookie: a=1\r\n\r\nabc",
            None,
        )
        .expect("taken");
        assert_eq!(
            (
                p.id.as_str(),
                p.port,
                p.route,
                p.content_length,
                p.keep_alive
            ),
            ("sb-1", 8080, ROUTE_PATH, 3, true)
        );
        assert_eq!(p.tenant.as_deref(), Some(OPEN_TENANT));
        assert_eq!(
            up,
            "POST /a%2Fb/c?x=1 HTTP/1.1\r\naccept: */*\r\ncookie: a=1\r\n\
             host: localhost:8080\r\nx-forwarded-host: hub:7000\r\ncontent-length: 3\r\n\r\n"
                .replace("accept", "Accept")
                .replace("cookie: a", "Cookie: a")
        );
    }

    #[test]
    fn the_three_templates_and_their_targets() {
        for (path, route, target) in [
            ("/v1/sandboxes/s/ports/80", ROUTE_BARE, "GET / "),
            ("/v1/sandboxes/s/ports/80?q", ROUTE_BARE, "GET /?q "),
            ("/v1/sandboxes/s/ports/80/", ROUTE_ROOT, "GET / "),
            ("/v1/sandboxes/s/ports/80//a", ROUTE_PATH, "GET //a "),
        ] {
            let (p, up) = planned(&format!("GET {path} HTTP/1.1\r\n\r\n"), None).unwrap();
            assert_eq!(p.route, route, "{path}");
            assert!(up.starts_with(target), "{path}: {up}");
            assert!(!up.contains("x-forwarded-host"), "{up}");
        }
    }

    #[test]
    fn everything_but_the_plain_shape_goes_to_hyper() {
        for head in [
            "GET /v1/sandboxes/s/ports/80 HTTP/1.0\r\n\r\n",
            "GET /v1/sandboxes/s/ports HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes//ports/80 HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes/s%41/ports/80 HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes/s/ports/0 HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes/s/ports/65536 HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes/s/ports/+80 HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes/s/exec HTTP/1.1\r\n\r\n",
            "GET /v1/sandboxes/s/ports/80 HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            "POST /v1/sandboxes/s/ports/80 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /v1/sandboxes/s/ports/80 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            "POST /v1/sandboxes/s/ports/80 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST /v1/sandboxes/s/ports/80 HTTP/1.1\r\nContent-Length: +1\r\n\r\n",
            "GET /v1/sandboxes/s/ports/80 HTTP/1.1\r\nConnection: x-secret\r\n\r\n",
            "GET /v1/sandboxes/s/ports/80 HTTP/1.1\r\nCookie: a=1; SANDHUB_PORT=t\r\n\r\n",
            "GET /v1/sandboxes/s/ports/80 HTTP/1.1\r\nE2b-Sandbox-Id: s\r\n\r\n",
            "CONNECT /v1/sandboxes/s/ports/80 HTTP/1.1\r\n\r\n",
        ] {
            assert!(planned(head, None).is_none(), "{head}");
        }
        let mut up = BytesMut::new();
        let rules = Rules {
            keys: None,
            hosts: None,
        };
        assert!(matches!(
            plan(
                b"GET /v1/sandboxes/s/ports/80 HTTP/1.1\r\nHo",
                &mut up,
                &rules
            ),
            Parsed::Partial
        ));
    }

    #[test]
    fn the_tenant_is_the_bearer_keys_or_none() {
        let keys = ApiKeys::parse("aaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbb bob\n").unwrap();
        let head = |h: &str| format!("GET /v1/sandboxes/s/ports/80 HTTP/1.1\r\n{h}\r\n");
        let tenant = |h: &str| planned(&head(h), Some(&keys)).unwrap().0.tenant;
        assert_eq!(
            tenant("Authorization: Bearer aaaaaaaaaaaaaaaa\r\n").as_deref(),
            Some("alice")
        );
        assert_eq!(
            tenant("X-API-Key: bbbbbbbbbbbbbbbb\r\n").as_deref(),
            Some("bob")
        );
        assert_eq!(
            tenant("Authorization: Basic x\r\nX-API-Key: bbbbbbbbbbbbbbbb\r\n").as_deref(),
            Some("bob")
        );
        assert_eq!(tenant("Authorization: Bearer cccccccccccccccc\r\n"), None);
        assert_eq!(tenant(""), None);
    }
}
