//! Plain HTTP (every request that is not gRPC: HTTP/1.x, or HTTP/2 that is
//! not gRPC) on hyper's path: header or path routing, browser sessions for
//! path-routed URLs, then the direct exchange to a known Pod address, or
//! hyper's pooled client (which also carries upgrades, see
//! [`super::upgrade`]).

use std::{net::SocketAddr, time::Duration};

use http::{
    header,
    uri::{PathAndQuery, Scheme},
    HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use hyper::body::Incoming;

use super::{headers, host_of, session, unix_now, upgrade, Conn, Proxy, Resolved, Routed};
use crate::{
    authz::Access,
    body::RequestBody,
    error::ProxyError,
    http1::outbound,
    response::ProxyBody,
    routing::{parse_headers, parse_path, HeaderRules, Target},
};

impl Proxy {
    /// One plain request, from its routing to the sandbox's answer.
    pub(super) async fn http(
        &self,
        mut req: Request<Incoming>,
        conn: &Conn,
        routed: &mut Routed,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        if req.method() == Method::CONNECT {
            return Err(ProxyError::MethodNotAllowed("CONNECT is not supported."));
        }
        // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host.
        if req.version() == Version::HTTP_11
            && req.headers().get_all(header::HOST).iter().count() != 1
        {
            return Err(ProxyError::BadRequest("Invalid Host header."));
        }
        let proto = self.proto(&req, conn);
        let path_route = self
            .settings
            .path_prefix
            .as_deref()
            .and_then(|p| parse_path(p, req.uri().path()));
        let (target, new_path) = match path_route {
            None => (
                parse_headers(
                    req.headers(),
                    HeaderRules {
                        grpc: false,
                        allow_loopback: self.settings.allow_loopback_pod_ip,
                    },
                )?,
                None,
            ),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(route)) => {
                if !session::origin_allowed(
                    req.headers(),
                    host_of(&req),
                    proto,
                    &self.settings.allowed_origins,
                ) {
                    return Err(ProxyError::Forbidden("Origin not allowed."));
                }
                let target = Target {
                    id: route.id.to_owned(),
                    namespace: route.namespace.to_owned(),
                    port: route.port,
                    pod_ip: None,
                    uid: None,
                    timeout: None,
                };
                routed.set(&target);
                if let Some((token, rest)) = req.uri().query().and_then(session::take_query_token) {
                    return self
                        .bootstrap(&req, &target, &token, &rest, route.base, proto)
                        .await;
                }
                let pq = match req.uri().query() {
                    Some(q) => format!("{}?{q}", route.rest),
                    None => route.rest.to_owned(),
                };
                let pq = PathAndQuery::try_from(pq)
                    .map_err(|_| ProxyError::BadRequest("Invalid path."))?;
                (target, Some(pq))
            }
        };
        let path_routed = new_path.is_some();
        routed.set(&target);
        self.authorize(&req, &target, path_routed).await?;

        let limit = self.settings.max_request_body_bytes;
        if limit > 0 {
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit) {
                return Err(ProxyError::BodyTooLarge);
            }
        }
        let upgrade = req.version() <= Version::HTTP_11 && headers::is_upgrade(req.headers());
        let Resolved {
            authority,
            addr,
            cached_uid,
        } = self.resolve(&target)?;
        let original_host = host_of(&req).and_then(|h| HeaderValue::from_str(h).ok());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let direct = addr.filter(|_| !upgrade && outbound::eligible(&req));

        let (mut parts, body) = req.into_parts();
        if path_routed {
            session::strip_cookie(&mut parts.headers);
        }
        headers::rewrite_request(
            &mut parts.headers,
            upgrade,
            false,
            &conn.client_ip,
            original_host,
            proto,
        );
        let pq = new_path
            .or_else(|| parts.uri.path_and_query().cloned())
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(authority);
        uri.path_and_query = Some(pq);
        parts.uri = Uri::from_parts(uri).map_err(|e| ProxyError::Internal(e.to_string()))?;
        parts.version = Version::HTTP_11;
        let body = RequestBody::new(body, limit, &self.metrics.tx_bytes);
        let budget = self.budget(&target);
        if let Some(addr) = direct {
            return self
                .direct(addr, parts, body, budget, &target, cached_uid.as_deref())
                .await;
        }
        let sent = self
            .upstreams
            .http1
            .request(Request::from_parts(parts, body));
        let result = self.within(budget, &target, sent).await?;
        let resp = result.map_err(|e| self.upstream_failure(&e, &target, cached_uid.as_deref()))?;

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_side) = client_upgrade else {
                return Err(ProxyError::Upstream(target.id));
            };
            return Ok(upgrade::switch(client_side, resp, &self.metrics));
        }
        let (mut parts, body) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers, false, false);
        Ok(Response::from_parts(
            parts,
            ProxyBody::upstream(body, &self.metrics.rx_bytes),
        ))
    }

    /// The plain HTTP/1.1 exchange to a known address, on this worker's own pool.
    async fn direct(
        &self,
        addr: SocketAddr,
        parts: http::request::Parts,
        body: RequestBody,
        budget: Option<Duration>,
        t: &Target,
        cached_uid: Option<&str>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let policy = self.upstreams.dial_policy();
        let sent = outbound::exchange(addr, &parts, body, policy, &self.metrics);
        match self.within(budget, t, sent).await? {
            Ok(resp) => Ok(resp.map(ProxyBody::Direct)),
            Err(e) => Err(self.exchange_failure(e, t, cached_uid)),
        }
    }

    /// Trades `?sandbox_token=` for a session cookie (after checking it).
    async fn bootstrap<B>(
        &self,
        req: &Request<B>,
        target: &Target,
        token: &str,
        rest_query: &str,
        base: &str,
        proto: &'static str,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let access = Access {
            token: Some(token),
            namespace: &target.namespace,
            id: &target.id,
            pins_pod: false,
        };
        let exp = self.authz.check(&access, &self.metrics).await?;
        let path = req.uri().path();
        let location = if rest_query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{rest_query}")
        };
        let spec = session::CookieSpec {
            path: base.trim_end_matches('/'),
            same_site: self.settings.same_site,
            secure: proto == "https",
            max_age: exp.map(|e| e.saturating_sub(unix_now())),
        };
        session::bootstrap_response(token, &location, &spec).ok_or(ProxyError::BadRequest(
            "The token cannot be used as a session cookie.",
        ))
    }
}
