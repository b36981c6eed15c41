//! The headers of one HTTP hop, written once for every proxy and server:
//! which headers a proxy drops between client and upstream (RFC 9110
//! §7.6.1), and the `Connection: close` that a 413 carries.
//!
//! A leaf over the `http` types only.

use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};

/// Per-hop headers (RFC 9110 §7.6.1) that never travel past a proxy.
pub const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Drops the per-hop headers, including any the Connection header names.
/// `keep_upgrade`: an Upgrade handshake keeps `Upgrade` and gets
/// `Connection: upgrade` back. `keep_te_trailers`: `te: trailers` stays
/// (gRPC needs it); any other `te` always goes.
pub fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool, keep_te_trailers: bool) {
    if h.contains_key(header::CONNECTION) {
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
    }
    for name in &HOP_BY_HOP {
        h.remove(name);
    }
    if !keep_te_trailers || h.get(header::TE).is_some_and(|v| v != "trailers") {
        h.remove(header::TE);
    }
    if keep_upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        h.remove(header::UPGRADE);
    }
}

/// A 413 says `Connection: close`: the rest of its request body was never
/// read (or only up to a bound), so the connection cannot carry another
/// request, and the client must know not to reuse it (RFC 9112 §9.6), or
/// its next request fails mid-flight. Any other status is left alone.
pub fn close_if_too_large(status: StatusCode, headers: &mut HeaderMap) {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_hop_headers_and_the_ones_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, X-Secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::TE, "trailers".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h, false, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn te_trailers_stays_only_when_asked_and_only_as_trailers() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, "trailers".parse().unwrap());
        strip_hop_by_hop(&mut h, false, true);
        assert_eq!(h.get(header::TE).unwrap(), "trailers");
        h.insert(header::TE, "gzip".parse().unwrap());
        strip_hop_by_hop(&mut h, false, true);
        assert!(h.get(header::TE).is_none());
    }

    #[test]
    fn an_upgrade_keeps_upgrade_and_says_connection_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        strip_hop_by_hop(&mut h, true, false);
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        strip_hop_by_hop(&mut h, false, false);
        assert!(h.get(header::UPGRADE).is_none());
    }

    #[test]
    fn only_a_413_closes() {
        let mut h = HeaderMap::new();
        close_if_too_large(StatusCode::BAD_REQUEST, &mut h);
        assert!(h.is_empty());
        close_if_too_large(StatusCode::PAYLOAD_TOO_LARGE, &mut h);
        assert_eq!(h.get(header::CONNECTION).unwrap(), "close");
    }
}
