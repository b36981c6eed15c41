//! Browser sessions for path-routed URLs. A browser cannot send an
//! Authorization header on a navigation or a WebSocket, so the first visit
//! carries the token in the query (`?sandbox_token=…`); the router checks it,
//! answers 303 to the same URL without it and sets an HttpOnly cookie scoped
//! to that one sandbox's path. Cookies ride along on cross-site requests too,
//! so every path-routed request with an Origin must come from the router's
//! own origin or an allowed one (this is what stops cross-site WebSocket
//! hijacking).

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::{config::SameSite, response::ProxyBody};

pub const COOKIE_NAME: &str = "sandbox_router_session";
pub const QUERY_TOKEN: &str = "sandbox_token";

/// The session cookie's value, if the request carries one.
pub fn cookie_token(h: &HeaderMap) -> Option<&str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE_NAME)
        .map(|(_, v)| v.trim_matches('"'))
        .filter(|v| !v.is_empty())
}

/// Removes the session cookie before the request goes to the sandbox: the
/// sandbox's code must not be able to replay the user's token.
pub fn strip_cookie(h: &mut HeaderMap) {
    if cookie_token(h).is_none() {
        return;
    }
    let kept: Vec<String> = h
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|kv| !kv.is_empty() && kv.split_once('=').map_or(*kv, |(k, _)| k) != COOKIE_NAME)
        .map(str::to_owned)
        .collect();
    h.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            h.insert(header::COOKIE, v);
        }
    }
}

/// Splits `sandbox_token` out of a raw query: (decoded token, the rest).
pub fn take_query_token(query: &str) -> Option<(String, String)> {
    let mut token = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((QUERY_TOKEN, v)) if token.is_none() => {
                token = Some(
                    percent_encoding::percent_decode_str(v)
                        .decode_utf8_lossy()
                        .into_owned(),
                )
            }
            _ if pair.is_empty() => {}
            _ => rest.push(pair),
        }
    }
    token.map(|t| (t, rest.join("&")))
}

/// Cookie values may hold only these (RFC 6265 cookie-octet, minus a few).
fn cookie_safe(v: &str) -> bool {
    !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=!#$%&'()*:<>?@[]^`{|}".contains(&b))
}

pub struct CookieSpec<'a> {
    pub path: &'a str,
    pub same_site: SameSite,
    pub secure: bool,
    /// Seconds until the token expires, when known.
    pub max_age: Option<u64>,
}

/// The 303 that trades a query token for a cookie; `None` if the token
/// cannot be a cookie value.
pub fn bootstrap_response(
    token: &str,
    location: &str,
    spec: &CookieSpec<'_>,
) -> Option<Response<ProxyBody>> {
    if !cookie_safe(token) {
        return None;
    }
    let mut cookie = format!(
        "{COOKIE_NAME}={token}; Path={}; HttpOnly; SameSite={}",
        spec.path,
        spec.same_site.as_str()
    );
    // Browsers drop SameSite=None cookies that are not Secure.
    if spec.secure || spec.same_site == SameSite::None {
        cookie.push_str("; Secure");
    }
    if let Some(age) = spec.max_age {
        cookie.push_str(&format!("; Max-Age={age}"));
    }
    let mut resp = Response::new(ProxyBody::empty());
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_str(location).ok()?);
    h.insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).ok()?);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Some(resp)
}

/// No Origin (not a browser, or a same-origin GET), the router's own origin,
/// or one of `allowed` (compared case-insensitively, without a trailing '/').
pub fn origin_allowed(
    h: &HeaderMap,
    own_host: Option<&str>,
    proto: &str,
    allowed: &[String],
) -> bool {
    let Some(origin) = h.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim().trim_end_matches('/');
    if allowed
        .iter()
        .any(|a| a.trim().trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    match (own_host, origin.split_once("://")) {
        (Some(host), Some((scheme, o_host))) => {
            scheme.eq_ignore_ascii_case(proto) && o_host.eq_ignore_ascii_case(host)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_found_and_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; sandbox_router_session=v1.x.y; b=2".parse().unwrap(),
        );
        assert_eq!(cookie_token(&h), Some("v1.x.y"));
        strip_cookie(&mut h);
        assert_eq!(h.get(header::COOKIE).unwrap(), "a=1; b=2");
        let mut only = HeaderMap::new();
        only.insert(header::COOKIE, "sandbox_router_session=t".parse().unwrap());
        strip_cookie(&mut only);
        assert!(only.get(header::COOKIE).is_none());
    }

    #[test]
    fn query_token_split() {
        assert_eq!(
            take_query_token("a=1&sandbox_token=v1.p%2Eq.s&b=2"),
            Some(("v1.p.q.s".into(), "a=1&b=2".into()))
        );
        assert_eq!(take_query_token("a=1"), None);
    }

    #[test]
    fn origins() {
        let mut h = HeaderMap::new();
        assert!(origin_allowed(&h, Some("r:8080"), "http", &[]));
        h.insert(header::ORIGIN, "http://r:8080".parse().unwrap());
        assert!(origin_allowed(&h, Some("r:8080"), "http", &[]));
        assert!(!origin_allowed(&h, Some("r:8080"), "https", &[]));
        h.insert(header::ORIGIN, "https://ide.example".parse().unwrap());
        assert!(!origin_allowed(&h, Some("r:8080"), "http", &[]));
        assert!(origin_allowed(
            &h,
            Some("r:8080"),
            "http",
            &["https://IDE.example/".into()]
        ));
        h.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(!origin_allowed(&h, Some("r:8080"), "http", &[]));
    }
}
