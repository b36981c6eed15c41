//! Header rewriting between client and sandbox.

use http::{header, HeaderMap, HeaderName, HeaderValue};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Drops the per-hop headers, including any the Connection header names
/// (one definition for the router and the hub's port proxy).
pub use sandhub_common::hop::strip_hop_by_hop;

/// Whether an HTTP/1.1 request asks to switch protocols (WebSocket and any other).
pub fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The request headers the sandbox sees: no credentials meant for the router,
/// no Host (the client sets the upstream's), no Origin on upgrades (the
/// router checked it; many servers reject foreign origins), and X-Forwarded-*.
pub fn rewrite_request(
    h: &mut HeaderMap,
    upgrade: bool,
    grpc: bool,
    client_ip: &HeaderValue,
    original_host: Option<HeaderValue>,
    proto: &'static str,
) {
    strip_hop_by_hop(h, upgrade, grpc);
    h.remove(header::HOST);
    h.remove(header::AUTHORIZATION);
    if upgrade {
        h.remove(header::ORIGIN);
    }
    // Every earlier hop, from however many lines the client sent.
    let prior: Vec<&str> = h
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter(|p| !p.is_empty())
        .collect();
    let xff = if prior.is_empty() {
        Some(client_ip.clone())
    } else {
        let ip = client_ip.to_str().unwrap_or_default();
        HeaderValue::from_str(&format!("{}, {ip}", prior.join(", "))).ok()
    };
    if let Some(v) = xff {
        h.insert(X_FORWARDED_FOR, v);
    }
    if let Some(host) = original_host {
        h.insert(X_FORWARDED_HOST, host);
    }
    h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_credentials_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "router:8080".parse().unwrap());
        h.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        h.insert(header::CONNECTION, "keep-alive, X-Secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("x-sandbox-id", "a".parse().unwrap());
        h.insert(X_FORWARDED_FOR, "1.2.3.4".parse().unwrap());
        rewrite_request(
            &mut h,
            false,
            false,
            &HeaderValue::from_static("127.0.0.1"),
            Some("router:8080".parse().unwrap()),
            "http",
        );
        assert!(h.get(header::HOST).is_none());
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert_eq!(h.get("x-sandbox-id").unwrap(), "a");
        assert_eq!(h.get(X_FORWARDED_FOR).unwrap(), "1.2.3.4, 127.0.0.1");
        assert_eq!(h.get(X_FORWARDED_HOST).unwrap(), "router:8080");
        assert_eq!(h.get(X_FORWARDED_PROTO).unwrap(), "http");
    }

    #[test]
    fn upgrades_keep_upgrade_and_lose_origin() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert(header::ORIGIN, "https://evil.example".parse().unwrap());
        assert!(is_upgrade(&h));
        rewrite_request(
            &mut h,
            true,
            false,
            &HeaderValue::from_static("10.0.0.1"),
            None,
            "https",
        );
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
        assert!(h.get(header::ORIGIN).is_none());
    }
}
