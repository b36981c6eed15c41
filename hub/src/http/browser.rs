//! Requests that only sandbox content could make are refused before any
//! route sees them.
//!
//! A page a sandbox serves through the path route (`/v1/sandboxes/{id}/
//! ports/...`) is on the hub's own host. Its answer carries
//! `Content-Security-Policy: sandbox` (see `proxy::answer`), so the
//! browser runs it in an opaque origin: its requests to the hub are
//! cross-origin, with `Origin: null`. The rule here:
//!
//! 1. `Origin: null` is refused on every hub route but the port routes
//!    themselves (the page's own traffic to its server): no legitimate
//!    client of the API, CLI, SDK or console runs in an opaque origin;
//! 2. a request the browser calls `Sec-Fetch-Site: same-origin` (or that
//!    has no `Sec-Fetch-Site`) whose `Referer` is a proxied port path is
//!    refused too, for a browser that did not apply the sandbox policy. (A page can suppress its Referer,
//!    which is why rule 1, not this one, is the one that holds.)
//!
//! Everything else a foreign page could send is already refused elsewhere:
//! a JSON body with an `Origin` must say `application/json` (a CORS
//! preflight, which the hub never grants), and upgrades need a same-origin
//! `Origin` (CSWSH).

use std::{
    convert::Infallible,
    future::{ready, Ready},
    task::{Context, Poll},
};

use axum::{
    extract::Request,
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use futures::future::Either;
use sandhub_api::error::Code;
use tower::{Layer, Service};

use super::ApiError;

/// The guard in front of every route. A plain layer rather than
/// `middleware::from_fn`: it runs on every request, proxied ones included,
/// and needs neither a boxed future nor a clone of the router per call.
#[derive(Debug, Clone, Copy)]
pub struct GuardLayer;

impl<S> Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard(inner)
    }
}

#[derive(Debug, Clone)]
pub struct Guard<S>(S);

impl<S> Service<Request> for Guard<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if !is_port_route(request.uri().path()) {
            if let Some(why) = refused(request.headers()) {
                let answer = ApiError::new(Code::PermissionDenied, why).into_response();
                return Either::Left(ready(Ok(answer)));
            }
        }
        Either::Right(self.0.call(request))
    }
}

/// `/v1/sandboxes/{id}/ports/{port}...`: traffic to a sandbox's server.
fn is_port_route(path: &str) -> bool {
    let mut parts = path.split('/');
    parts.next() == Some("")
        && parts.next() == Some("v1")
        && parts.next() == Some("sandboxes")
        && parts.next().is_some_and(|id| !id.is_empty())
        && parts.next() == Some("ports")
        && parts.next().is_some_and(|port| !port.is_empty())
}

fn refused(h: &HeaderMap) -> Option<&'static str> {
    let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if header("origin").is_some_and(|o| o.eq_ignore_ascii_case("null")) {
        return Some(
            "a request from an opaque origin (Origin: null), such as a page a sandbox \
             serves, never reaches the hub's API",
        );
    }
    // No Sec-Fetch-Site at all: a browser too old to send it may be too
    // old to apply the sandbox policy as well.
    let same_origin = header("sec-fetch-site").is_none_or(|s| s == "same-origin");
    let from_port_page = header("referer")
        .and_then(|r| r.split_once("://"))
        .and_then(|(_, rest)| rest.find('/').map(|at| &rest[at..]))
        .is_some_and(is_port_route);
    if same_origin && from_port_page {
        return Some(
            "a request from a page a sandbox serves never reaches the hub's API \
             (its Referer is a sandbox port's path)",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn port_routes_are_the_proxys_own() {
        assert!(is_port_route("/v1/sandboxes/sb-1/ports/80"));
        assert!(is_port_route("/v1/sandboxes/sb-1/ports/80/a/b.html"));
        assert!(!is_port_route("/v1/sandboxes/sb-1/ports"));
        assert!(!is_port_route("/v1/sandboxes/sb-1/ports/"));
        assert!(!is_port_route("/v1/sandboxes/sb-1/exec"));
        assert!(!is_port_route("/v1/sandboxes//ports/80"));
        assert!(!is_port_route("/x/v1/sandboxes/sb-1/ports/80"));
    }

    #[test]
    fn opaque_origins_and_port_pages_are_refused() {
        assert!(refused(&headers(&[("origin", "null")])).is_some());
        assert!(refused(&headers(&[("origin", " NULL ")])).is_some());
        assert!(refused(&headers(&[
            ("sec-fetch-site", "same-origin"),
            (
                "referer",
                "http://127.0.0.1:7070/v1/sandboxes/sb-1/ports/80/page.html"
            ),
        ]))
        .is_some());
        // The console and scripts on the hub's origin, and tools.
        assert!(refused(&headers(&[
            ("sec-fetch-site", "same-origin"),
            ("referer", "http://127.0.0.1:7070/"),
            ("origin", "http://127.0.0.1:7070"),
        ]))
        .is_none());
        assert!(refused(&headers(&[])).is_none());
        // A port page's Referer on a cross-site request (the sandboxed
        // page's own navigation): harmless and handled by the other rules.
        assert!(refused(&headers(&[
            ("sec-fetch-site", "cross-site"),
            (
                "referer",
                "http://127.0.0.1:7070/v1/sandboxes/sb-1/ports/80/"
            ),
        ]))
        .is_none());
        // No Sec-Fetch-Site: an old browser that may ignore the sandbox.
        assert!(refused(&headers(&[(
            "referer",
            "http://127.0.0.1:7070/v1/sandboxes/sb-1/ports/80/"
        )]))
        .is_some());
    }
}
