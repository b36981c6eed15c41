//! What a sandbox's answer may carry back to the browser. The server inside
//! is the tenant's workload, so its answer is hostile input:
//!
//! - on the hub's own origin (the path route `/v1/sandboxes/{id}/ports/...`,
//!   and E2B's header route when the request came to the hub's host) it is
//!   made an opaque origin with `Content-Security-Policy: sandbox`, so no
//!   script it serves is ever same-origin with the hub's API or console;
//! - its cookies never name a `Domain` (no tossing a cookie onto every
//!   sibling `{port}-{id}` host or the hub), never replace the hub's own
//!   port cookie, and on the hub's origin are kept under the port's path.

use axum::http::{header, HeaderMap, HeaderValue};
use bytes::Bytes;
use sandhub_common::hop::HOP_BY_HOP;
use sandhub_http1::outbound::ResponseHead;

use super::PORT_COOKIE as COOKIE;

/// Where a proxied answer is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// On the hub's own origin. `cookie_path` is the prefix the port's
    /// pages live under (its cookies are kept there); `None` drops every
    /// cookie (a route no browser navigates, such as E2B's header route).
    OnHubOrigin { cookie_path: Option<String> },
    /// On a host of its own (`{port}-{id}.<domain>`).
    OwnHost,
}

/// The sandbox policy for content on the hub's origin: scripts, forms and
/// popups still work, but in an opaque origin (no `allow-same-origin`),
/// so a page's `fetch()` to the API is cross-origin and carries
/// `Origin: null`, which the API refuses.
pub const SANDBOX_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Makes a proxied answer's headers safe for `served`.
pub fn harden(h: &mut HeaderMap, served: &Served) {
    rewrite_cookies(h, served);
    if let Served::OnHubOrigin { .. } = served {
        // Appended, not set: a policy of the server's own still applies
        // too (every CSP header is enforced), but cannot lift ours.
        h.append(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(SANDBOX_CSP),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        // No other site may embed it (`<img>`, `<script>`): what a
        // sandbox serves on a keyless hub is readable by no foreign page.
        h.insert(
            "cross-origin-resource-policy",
            HeaderValue::from_static("same-origin"),
        );
    }
}

/// [`harden`] for the fast path's response head (`http::fast`): the same
/// headers added, the same cookies kept and rewritten, and the per-hop
/// headers the head's parser leaves (it drops the framing ones) gone.
pub fn harden_head(head: &mut ResponseHead, served: &Served) {
    let on_hub = matches!(served, Served::OnHubOrigin { .. });
    let mut cookies = Vec::new();
    head.retain(|name, value| {
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("set-cookie") {
            cookies.push(value.to_vec());
            return false;
        }
        let hop = is("te") || HOP_BY_HOP.iter().any(|h| is(h.as_str()));
        // Set below, replacing the server's.
        let ours = on_hub && (is("x-content-type-options") || is("cross-origin-resource-policy"));
        !(hop || ours)
    });
    if let Some(prefix) = cookie_prefix(served) {
        for value in cookies {
            let kept = std::str::from_utf8(&value)
                .ok()
                .and_then(|v| host_only(v, prefix))
                .filter(|v| HeaderValue::from_str(v).is_ok());
            if let Some(kept) = kept {
                head.push(Bytes::from_static(b"set-cookie"), Bytes::from(kept));
            }
        }
    }
    if on_hub {
        for (name, value) in [
            ("content-security-policy", SANDBOX_CSP),
            ("x-content-type-options", "nosniff"),
            ("cross-origin-resource-policy", "same-origin"),
        ] {
            head.push(
                Bytes::from_static(name.as_bytes()),
                Bytes::from_static(value.as_bytes()),
            );
        }
    }
}

/// Where `served`'s cookies are kept: `Some(None)` as the server set them
/// (host-only), `Some(Some(prefix))` under the port's path, `None` dropped.
fn cookie_prefix(served: &Served) -> Option<Option<&str>> {
    match served {
        Served::OnHubOrigin { cookie_path: None } => None,
        Served::OnHubOrigin {
            cookie_path: Some(p),
        } => Some(Some(p.as_str())),
        Served::OwnHost => Some(None),
    }
}

fn rewrite_cookies(h: &mut HeaderMap, served: &Served) {
    let sent: Vec<HeaderValue> = h.get_all(header::SET_COOKIE).iter().cloned().collect();
    if sent.is_empty() {
        return;
    }
    h.remove(header::SET_COOKIE);
    let Some(prefix) = cookie_prefix(served) else {
        return;
    };
    for value in sent {
        let Some(kept) = value.to_str().ok().and_then(|v| host_only(v, prefix)) else {
            continue;
        };
        if let Ok(v) = HeaderValue::from_str(&kept) {
            h.append(header::SET_COOKIE, v);
        }
    }
}

/// One `Set-Cookie` made host-only: `Domain` dropped, the hub's own
/// cookie name refused, and under `prefix` (the port's path on the hub's
/// origin) its `Path` moved below it. `None`: the cookie is dropped.
fn host_only(cookie: &str, prefix: Option<&str>) -> Option<String> {
    let mut parts = cookie.split(';');
    let pair = parts.next()?.trim();
    let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
    // Cookie names are case-sensitive, but some servers fold them.
    if name.is_empty() || name.eq_ignore_ascii_case(COOKIE) {
        return None;
    }
    let mut out = vec![pair.to_string()];
    let mut path = None;
    for attr in parts.map(str::trim).filter(|a| !a.is_empty()) {
        let key = attr.split_once('=').map_or(attr, |(k, _)| k).trim();
        if key.eq_ignore_ascii_case("domain") {
            continue;
        }
        if key.eq_ignore_ascii_case("path") {
            path = Some(
                attr.split_once('=')
                    .map_or("", |(_, v)| v.trim())
                    .to_string(),
            );
            continue;
        }
        out.push(attr.to_string());
    }
    match (prefix, path) {
        (Some(prefix), path) => {
            let inner = path.as_deref().unwrap_or("/").trim_start_matches('/');
            out.push(format!("Path={}/{inner}", prefix.trim_end_matches('/')));
        }
        (None, Some(path)) => out.push(format!("Path={path}")),
        (None, None) => {}
    }
    Some(out.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookies(h: &HeaderMap) -> Vec<&str> {
        h.get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    fn with_cookies(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::SET_COOKIE, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn no_cookie_names_a_domain_or_takes_the_hubs_name() {
        let mut h = with_cookies(&[
            "a=1; Domain=sandboxes.test; Path=/x; HttpOnly",
            "sandhub_port=forged; Domain=sandboxes.test; Path=/",
            "SANDHUB_PORT=forged",
            "b=2",
        ]);
        harden(&mut h, &Served::OwnHost);
        assert_eq!(cookies(&h), ["a=1; HttpOnly; Path=/x", "b=2"]);
        assert!(h.get(header::CONTENT_SECURITY_POLICY).is_none());
    }

    #[test]
    fn on_the_hubs_origin_cookies_stay_under_the_port_and_pages_are_sandboxed() {
        let mut h = with_cookies(&["s=1; Path=/; Domain=127.0.0.1", "t=2"]);
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'self'"),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("sniff-please"),
        );
        let served = Served::OnHubOrigin {
            cookie_path: Some("/v1/sandboxes/sb-1/ports/80/".into()),
        };
        harden(&mut h, &served);
        assert_eq!(
            cookies(&h),
            [
                "s=1; Path=/v1/sandboxes/sb-1/ports/80/",
                "t=2; Path=/v1/sandboxes/sb-1/ports/80/"
            ]
        );
        let csp: Vec<_> = h.get_all(header::CONTENT_SECURITY_POLICY).iter().collect();
        assert_eq!(csp.len(), 2, "the server's policy and ours");
        assert!(csp.iter().any(|v| *v == SANDBOX_CSP));
        assert!(!SANDBOX_CSP.contains("allow-same-origin"));
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h["cross-origin-resource-policy"], "same-origin");
    }

    #[test]
    fn a_route_no_browser_navigates_keeps_no_cookie() {
        let mut h = with_cookies(&["a=1"]);
        harden(&mut h, &Served::OnHubOrigin { cookie_path: None });
        assert!(cookies(&h).is_empty());
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], SANDBOX_CSP);
    }
}
