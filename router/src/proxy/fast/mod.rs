//! The proxy's half of the HTTP/1.1 fast path ([`crate::http1::inbound`]):
//! which requests it takes and the head the sandbox gets (`plan`), then
//! authorization, the exchange within the proxy budget, and the metrics and
//! access log, with the same code and errors as the hyper path.

mod plan;

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{Method, Response};
use prometheus_client::metrics::counter::Counter;

use super::{Conn, Proxy, Served};
use crate::{
    error::ProxyError,
    http1::{
        inbound::{ClientIo, FastRequest, Handler, Parsed, Planned},
        outbound::{self, Answer},
        pool::ByAddr,
    },
    metrics::{InflightGuard, MethodLabel},
    response::ProxyBody,
};
use plan::Plan;

/// The proxy, serving one fast-path client connection.
pub struct FastProxy<'a> {
    pub proxy: &'a Proxy,
    pub conn: &'a Conn,
}

impl Planned for Plan {
    fn head_len(&self) -> usize {
        self.head_len
    }
    fn content_length(&self) -> u64 {
        self.content_length
    }
    fn keep_alive(&self) -> bool {
        self.keep_alive
    }
}

impl Handler for FastProxy<'_> {
    type Plan = Plan;
    type Keep = ByAddr;

    fn plan(&self, buf: &[u8], up_head: &mut BytesMut) -> Parsed<Plan> {
        plan::plan(buf, up_head, self.conn, self.proxy)
    }

    fn in_flight(&self) -> impl Sized + '_ {
        InflightGuard::new(&self.proxy.metrics.inflight)
    }

    async fn exchange<S: ClientIo>(
        &self,
        plan: Plan,
        start: Instant,
        req: &mut FastRequest<'_, S>,
    ) -> Result<Answer, Response<Bytes>> {
        let proxy = self.proxy;
        let answer = send(proxy, &plan, req).await.and_then(|a| {
            // Only an Upgrade (hyper's path) may switch protocols.
            if a.head.status == 101 {
                proxy
                    .metrics
                    .upstream_error(&plan.target.namespace, "other");
                return Err(ProxyError::Upstream(plan.target.id.clone()));
            }
            Ok(a)
        });
        let status = match &answer {
            Ok(a) => a.head.status,
            Err(e) => e.status().as_u16(),
        };
        proxy.record(&Served {
            start,
            method: MethodLabel::from(&plan.method),
            logged: plan.logged,
            status,
            grpc_status: None,
            namespace: &plan.target.namespace,
            id: &plan.target.id,
            remote: self.conn.remote,
        });
        answer.map_err(|e| whole(e.to_http()))
    }

    fn rx_bytes(&self) -> Option<&Counter> {
        Some(&self.proxy.metrics.rx_bytes)
    }
}

/// Authorizes the planned request, then sends it to the sandbox within
/// the proxy budget and reads the response head.
async fn send(
    proxy: &Proxy,
    plan: &Plan,
    req: &mut FastRequest<'_, impl ClientIo>,
) -> Result<Answer, ProxyError> {
    let t = &plan.target;
    proxy.check_access(plan.token.as_deref(), t).await?;
    let limit = proxy.settings.max_request_body_bytes;
    if limit > 0 && plan.content_length > limit {
        return Err(ProxyError::BodyTooLarge);
    }
    let policy = proxy.upstreams.dial_policy();
    let is_head = plan.method == Method::HEAD;
    let sent = outbound::send(plan.addr, req, is_head, policy, &proxy.metrics);
    let result = proxy.within(proxy.budget(t), t, sent).await?;
    // A request that got an answer went out whole; a failed one as far as it got.
    let tx = if result.is_ok() {
        plan.content_length
    } else {
        req.sent()
    };
    if tx > 0 {
        proxy.metrics.tx_bytes.inc_by(tx);
    }
    result.map_err(|e| proxy.exchange_failure(e, t, plan.cached_uid.as_deref()))
}

/// The router's own answer with its body in hand (its answers are small).
fn whole(resp: Response<ProxyBody>) -> Response<Bytes> {
    resp.map(|body| match body {
        ProxyBody::Full(Some(b)) => b,
        _ => Bytes::new(),
    })
}
