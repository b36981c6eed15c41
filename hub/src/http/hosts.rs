//! Host-based routing for browser apps (`--sandbox-domain D`): a request
//! for `Host: {port}-{id}.D` goes to that port in that sandbox, path and
//! all, so an app that uses absolute paths (code-server, Jupyter, a dev
//! server) works as if it were served at the root. It is E2B's
//! `get_host()` shape too: with `--e2b`, port 49983 there is envd.
//!
//! A browser cannot send the API key. `POST /v1/sandboxes/{id}/port-urls/{port}`
//! (with the key) mints a short-lived URL whose `sandhub_token` query the
//! first visit trades for a cookie scoped to that one host (HttpOnly,
//! SameSite=Lax), then is redirected to the same URL without it. Scripts
//! may send the API key instead. Upgrades from a foreign Origin are refused
//! (CSWSH), as on the path-based routes.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode, Uri},
    middleware::Next,
    response::{IntoResponse, Response},
};
use sandhub_api::error::Code;

use super::{
    auth::{presented_key, ApiKeys, OPEN_TENANT},
    signing::Tokens,
    ApiError, AppState,
};
use crate::backend::now_s;

/// The query parameter a minted URL carries its token in.
pub const TOKEN_PARAM: &str = "sandhub_token";
/// The cookie the token is kept in, on that host only (named by the
/// proxy, which keeps it from every sandbox).
pub use super::proxy::PORT_COOKIE as COOKIE;
pub const DEFAULT_TTL_S: u64 = 3600;
pub const MAX_TTL_S: u64 = 24 * 3600;

/// What host routing needs to know.
pub struct HostRouting {
    /// `D` as configured (may carry `:port`, used in minted URLs).
    domain: String,
    /// `D` without a port, lowercased, for matching.
    suffix: String,
    tokens: Arc<Tokens>,
    /// Whether port 49983 is envd (`--e2b`).
    envd: bool,
}

impl HostRouting {
    pub fn new(domain: &str, tokens: Arc<Tokens>, envd: bool) -> Self {
        let bare = domain.rsplit_once(':').map_or(domain, |(h, p)| {
            if p.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                domain
            }
        });
        HostRouting {
            domain: domain.to_string(),
            suffix: format!(".{}", bare.trim_matches('.').to_ascii_lowercase()),
            tokens,
            envd,
        }
    }

    /// The sandbox port a `Host` names, if it is one of ours.
    pub fn target(&self, host: &str) -> Option<(u16, String)> {
        let host = host.to_ascii_lowercase();
        let name = match host.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h.to_string(),
            _ => host,
        };
        let label = name.strip_suffix(&self.suffix)?;
        let (port, id) = label.split_once('-')?;
        let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
        let plain = !id.is_empty()
            && !id.contains('.')
            && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        plain.then(|| (port, id.to_string()))
    }

    fn scope(id: &str, port: u16, expires: u64) -> String {
        format!("port:{id}:{port}:{expires}")
    }

    /// A browser URL for `port` of `tenant`'s sandbox `id`, good for
    /// `ttl_s` seconds, and when it expires (Unix seconds).
    pub fn mint(&self, tenant: &str, id: &str, port: u16, ttl_s: u64) -> (String, u64) {
        let expires = now_s() + ttl_s.clamp(1, MAX_TTL_S);
        let token = format!(
            "{expires}.{}",
            self.tokens.issue(tenant, &Self::scope(id, port, expires))
        );
        let url = format!(
            "http://{port}-{id}.{}/?{TOKEN_PARAM}={token}",
            self.domain.trim_matches('.')
        );
        (url, expires)
    }

    /// The tenant a token (from the query or the cookie) opens `port` of
    /// `id` for, while it has not expired.
    fn verify(&self, token: &str, id: &str, port: u16) -> Option<String> {
        let expires = expiry(token)?;
        if expires < now_s() {
            return None;
        }
        let (_, rest) = token.split_once('.')?;
        self.tokens.verify(rest, &Self::scope(id, port, expires))
    }
}

/// When a port token expires (Unix seconds): its first field.
fn expiry(token: &str) -> Option<u64> {
    token.split_once('.')?.0.parse().ok()
}

fn host_of(request: &Request) -> Option<String> {
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The sandbox whose host a request's `Origin` names, if it names one.
fn origin_sandbox(headers: &HeaderMap, hosts: &HostRouting) -> Option<String> {
    let origin = headers.get(header::ORIGIN)?.to_str().ok()?;
    let (_, host) = origin.trim().split_once("://")?;
    hosts.target(host.trim_end_matches('/')).map(|(_, id)| id)
}

/// `uri` without our token parameter (what the browser is sent back to).
fn without_token(uri: &Uri) -> String {
    let kept: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && kv.split('=').next() != Some(TOKEN_PARAM))
        .collect();
    if kept.is_empty() {
        uri.path().to_string()
    } else {
        format!("{}?{}", uri.path(), kept.join("&"))
    }
}

fn query_token(uri: &Uri) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == TOKEN_PARAM)
        .map(|(_, v)| v.to_string())
}

pub type HostState = (AppState, Option<Arc<ApiKeys>>, Arc<HostRouting>);

/// In front of everything: a request for `{port}-{id}.D` is that port's.
pub async fn route(
    State((state, keys, hosts)): State<HostState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some((port, id)) = host_of(&request).and_then(|h| hosts.target(&h)) else {
        return next.run(request).await;
    };
    let e2b_token = ["x-access-token", "e2b-traffic-access-token"]
        .iter()
        .any(|h| request.headers().contains_key(*h));
    if hosts.envd && (port == super::e2b::ENVD_PORT || e2b_token) {
        // E2B's host form (`get_host(port)`): envd, or another port with
        // the sandbox's access token; the header route decides.
        if let (Ok(id), Ok(p)) = (
            HeaderValue::from_str(&id),
            HeaderValue::from_str(&port.to_string()),
        ) {
            request.headers_mut().insert("e2b-sandbox-id", id);
            request.headers_mut().insert("e2b-sandbox-port", p);
        }
        request.extensions_mut().insert(super::ViaSandboxHost);
        return next.run(request).await;
    }
    // A minted URL's first visit: keep the token in a cookie, drop it
    // from the address bar (and from the Referer of what the page loads).
    if let Some(token) = query_token(request.uri()) {
        return match hosts.verify(&token, &id, port) {
            Some(_) => {
                let max_age = expiry(&token).unwrap_or(0).saturating_sub(now_s());
                let cookie =
                    format!("{COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax");
                let mut r = StatusCode::SEE_OTHER.into_response();
                if let (Ok(loc), Ok(c)) = (
                    HeaderValue::from_str(&without_token(request.uri())),
                    HeaderValue::from_str(&cookie),
                ) {
                    r.headers_mut().insert(header::LOCATION, loc);
                    r.headers_mut().insert(header::SET_COOKIE, c);
                }
                r
            }
            None => ApiError::new(
                Code::Unauthenticated,
                "the link's token is not valid (or has expired)",
            )
            .into_response(),
        };
    }
    let headers = request.headers();
    if let Some(other) = origin_sandbox(headers, &hosts).filter(|other| *other != id) {
        // Sibling hosts are same-site, so a browser sends this host's
        // SameSite=Lax cookie with a page's requests from another
        // sandbox's host: a workload's page must not act on another
        // sandbox's port with its viewer's link.
        return ApiError::new(
            Code::PermissionDenied,
            format!("a page of sandbox {other} cannot send requests to a port of sandbox {id}"),
        )
        .into_response();
    }
    let tenant = match (&keys, presented_key(headers)) {
        (Some(keys), Some(key)) => keys.tenant_of(key),
        _ => cookie_token(headers).and_then(|t| hosts.verify(&t, &id, port)),
    }
    .or_else(|| keys.is_none().then(|| OPEN_TENANT.to_string()));
    let Some(tenant) = tenant else {
        return ApiError::new(
            Code::Unauthenticated,
            format!(
                "open a link from POST /v1/sandboxes/{id}/port-urls/{port}, or send an API key"
            ),
        )
        .into_response();
    };
    let api = state.hub.tenant(&tenant);
    let uri = super::proxy::as_sent(request.uri());
    let served = super::proxy::Served::OwnHost;
    match super::proxy::forward(api.as_ref(), &state.ports, &id, port, uri, request, served).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing() -> HostRouting {
        HostRouting::new("sandboxes.test:7070", Arc::new(Tokens::random()), false)
    }

    #[test]
    fn hosts_name_a_port_and_a_sandbox() {
        let h = routing();
        assert_eq!(
            h.target("8080-sb-abc.sandboxes.test"),
            Some((8080, "sb-abc".into()))
        );
        assert_eq!(
            h.target("8080-SB-abc.Sandboxes.Test:7070"),
            Some((8080, "sb-abc".into()))
        );
        for other in [
            "sandboxes.test",
            "x.sandboxes.test",
            "0-sb.sandboxes.test",
            "70000-sb.sandboxes.test",
            "8080-.sandboxes.test",
            "8080-a.b.sandboxes.test",
            "8080-sb.sandboxes.test.evil",
            "8080-sb.othersandboxes.test",
            "localhost:7070",
        ] {
            assert_eq!(h.target(other), None, "{other}");
        }
    }

    #[test]
    fn minted_tokens_open_their_port_only_until_they_expire() {
        let h = routing();
        let (url, _) = h.mint("alice", "sb-1", 8080, 60);
        assert!(
            url.starts_with("http://8080-sb-1.sandboxes.test:7070/?sandhub_token="),
            "{url}"
        );
        let token = url.split_once('=').unwrap().1;
        assert_eq!(h.verify(token, "sb-1", 8080).as_deref(), Some("alice"));
        assert_eq!(h.verify(token, "sb-1", 8081), None);
        assert_eq!(h.verify(token, "sb-2", 8080), None);
        // A later expiry written into the token breaks its MAC.
        let (exp, rest) = token.split_once('.').unwrap();
        let later = format!("{}.{rest}", exp.parse::<u64>().unwrap() + 3600);
        assert_eq!(h.verify(&later, "sb-1", 8080), None);
        // An expired one is refused.
        let past = 1_000u64;
        let old = format!(
            "{past}.{}",
            h.tokens
                .issue("alice", &HostRouting::scope("sb-1", 8080, past))
        );
        assert_eq!(h.verify(&old, "sb-1", 8080), None);
    }

    #[test]
    fn origins_name_their_sandbox() {
        let h = routing();
        let with = |origin: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            origin_sandbox(&m, &h)
        };
        assert_eq!(
            with("http://3000-sb-a.sandboxes.test:7070").as_deref(),
            Some("sb-a")
        );
        assert_eq!(with("http://sandboxes.test:7070"), None);
        assert_eq!(with("https://evil.example"), None);
        assert_eq!(with("null"), None);
    }

    #[test]
    fn our_cookie_and_token_never_reach_the_sandbox() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sandhub_port=secret; b=2"),
        );
        assert_eq!(cookie_token(&headers).as_deref(), Some("secret"));
        super::super::proxy::strip_our_cookie(&mut headers);
        assert_eq!(headers.get(header::COOKIE).unwrap(), "a=1; b=2");
        let uri: Uri = "/app?x=1&sandhub_token=t&y=2".parse().unwrap();
        assert_eq!(without_token(&uri), "/app?x=1&y=2");
        assert_eq!(query_token(&uri).as_deref(), Some("t"));
        let uri: Uri = "/?sandhub_token=t".parse().unwrap();
        assert_eq!(without_token(&uri), "/");
    }
}
