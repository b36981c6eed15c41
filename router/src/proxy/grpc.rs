//! gRPC: h2c to the sandbox through hyper's pooled client, with the
//! deadline from `grpc-timeout` (capped by `--grpc-proxy-timeout`) enforced
//! on the response head and, through the body, on the whole response.

use std::time::Instant;

use http::{header, uri::Scheme, HeaderValue, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;

use super::{grpc_timeout, headers, host_of, Conn, Proxy, Resolved, Routed};
use crate::{
    body::RequestBody,
    error::ProxyError,
    response::ProxyBody,
    routing::{parse_headers, HeaderRules},
};

/// gRPC: HTTP/2 POST with content-type `application/grpc` or `application/grpc+<codec>`
/// (gRPC-Web is not gRPC here).
pub fn is_grpc<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == Method::POST
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|ct| ct.strip_prefix("application/grpc"))
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('+') || rest.starts_with(';'))
}

impl Proxy {
    /// One gRPC call, from its routing metadata to the sandbox's answer.
    pub(super) async fn grpc(
        &self,
        req: Request<Incoming>,
        conn: &Conn,
        routed: &mut Routed,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let target = parse_headers(
            req.headers(),
            HeaderRules {
                grpc: true,
                allow_loopback: self.settings.allow_loopback_pod_ip,
            },
        )?;
        routed.set(&target);
        self.authorize(&req, &target, false).await?;
        let started = Instant::now();
        let inbound = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout::parse);
        let deadline = match (inbound, self.settings.grpc_proxy_timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Resolved {
            authority,
            cached_uid,
            ..
        } = self.resolve(&target)?;
        let original_host = host_of(&req).and_then(|h| HeaderValue::from_str(h).ok());
        let proto = self.proto(&req, conn);
        let (mut parts, body) = req.into_parts();
        headers::rewrite_request(
            &mut parts.headers,
            false,
            true,
            &conn.client_ip,
            original_host,
            proto,
        );
        if let Some(d) = deadline {
            if let Ok(v) = HeaderValue::from_str(&grpc_timeout::encode(d)) {
                parts.headers.insert("grpc-timeout", v);
            }
        }
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(authority);
        uri.path_and_query = parts.uri.path_and_query().cloned();
        parts.uri = Uri::from_parts(uri).map_err(|e| ProxyError::Internal(e.to_string()))?;
        parts.version = Version::HTTP_2;
        let upstream_req = Request::from_parts(
            parts,
            RequestBody::new(
                body,
                self.settings.max_request_body_bytes,
                &self.metrics.tx_bytes,
            ),
        );
        let sent = self.upstreams.h2c.request(upstream_req);
        let result = self.within(deadline, &target, sent).await?;
        let resp = result.map_err(|e| self.upstream_failure(&e, &target, cached_uid.as_deref()))?;
        let remaining = deadline.map(|d| d.saturating_sub(started.elapsed()));
        let (mut parts, body) = resp.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers, false, false);
        Ok(Response::from_parts(
            parts,
            ProxyBody::grpc(body, &self.metrics.rx_bytes, remaining),
        ))
    }
}
