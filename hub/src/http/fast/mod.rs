//! The port route's HTTP/1.1 fast path: a client's plain requests to
//! `/v1/sandboxes/{id}/ports/{port}/...` served by `sandhub-http1`'s server
//! (the one `sandhub-router` runs), without hyper's server, axum's router or
//! a connection task per kept upstream connection. The task serving the
//! client writes the request into a kept connection to the port and relays
//! the answer itself.
//!
//! It keeps every promise of the axum path, through the same code where it
//! can: the tenant of the bearer key (`auth`), the caps and timeouts
//! (`proxy::PortPool`), the Ready check before a kept connection is reused
//! and the namespace dial for a new one (the guarded backend view), the
//! headers the sandbox never sees (`proxy::CREDENTIALS`, per-hop, routing,
//! the port cookie), the answer's CSP and cookies (`proxy::harden_head`),
//! and the request metrics. What it does not take goes to hyper (`plan`).
//!
//! ```text
//! mod.rs   Ports (what the path needs) and the Handler the server asks
//! plan.rs  which heads it takes, and the head the sandbox gets
//! pool.rs  kept connections per worker thread, by tenant, sandbox and port
//! ```

mod plan;
mod pool;

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use http::Response;
use prometheus_client::metrics::counter::Counter;
use sandhub_api::error::Code;
use sandhub_http1::{
    inbound::{ClientIo, FastRequest, Handler, Parsed, Planned},
    outbound::{self, Answer, ExchangeError},
};

use super::{
    auth::ApiKeys,
    hosts::HostRouting,
    proxy::{harden_head, is_event_stream_type, PortPool, Served},
    rest::health::{InFlight, Metrics},
    ApiError, AppState,
};
use crate::backend::{Backend, TenantView};
use plan::{Plan, Rules};
use pool::{Kept, PortKey};

/// What the fast path needs of the hub: the same guarded backend view, keys,
/// port hosts, caps and metrics as the axum path.
pub struct Ports {
    hub: Arc<dyn Backend>,
    keys: Option<Arc<ApiKeys>>,
    hosts: Option<Arc<HostRouting>>,
    ports: Arc<PortPool>,
    metrics: Arc<Metrics>,
}

impl Ports {
    /// From the app's state (its backend already guarded, as `app()` makes it).
    pub fn new(state: &AppState, keys: Option<Arc<ApiKeys>>) -> Self {
        Ports {
            hub: state.hub.clone(),
            keys,
            hosts: state.hosts.clone(),
            ports: state.ports.clone(),
            metrics: state.metrics.clone(),
        }
    }

    /// Serves one planned request: the caps, the Ready check or a new
    /// connection, the exchange within the answer timeout, and the answer
    /// made safe for the hub's origin.
    async fn exchange<S: ClientIo>(
        &self,
        plan: &Plan,
        tenant: &str,
        req: &mut FastRequest<'_, S>,
    ) -> Result<Answer<Kept>, ApiError> {
        let (id, port) = (plan.id.as_str(), plan.port);
        let view = self.hub.tenant(tenant);
        let slot = self.ports.admit(tenant, id)?;
        let key = PortKey {
            tenant: tenant.to_string(),
            id: id.to_string(),
            port,
        };
        let idle = pool::take(&key);
        if idle.is_some() {
            // The sandbox may have gone since the connection was made.
            view.port_access(id).await?;
        }
        let dial = || dial(view.as_ref(), id, port);
        let limits = self.ports.limits();
        let sent = outbound::send(idle, dial, Kept { key, slot }, req, plan.is_head);
        let mut answer = match tokio::time::timeout(limits.response_timeout, sent).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(failure(port, e)),
            Err(_) => {
                return Err(ApiError::new(
                    Code::DeadlineExceeded,
                    format!(
                        "the server on port {port} in the sandbox sent no answer within {:?} \
                         (--port-response-timeout)",
                        limits.response_timeout
                    ),
                ))
            }
        };
        if answer.head.status == 101 {
            // Only an Upgrade (hyper's path) may switch protocols.
            return Err(ApiError::new(
                Code::Unavailable,
                format!("the server on port {port} switched protocols unasked"),
            ));
        }
        // Its cookies are kept under the port's path; the path is only
        // spelled out for an answer that sets one.
        let cookie_path = answer
            .head
            .get("set-cookie")
            .map(|_| format!("/v1/sandboxes/{id}/ports/{port}/"));
        harden_head(&mut answer.head, &Served::OnHubOrigin { cookie_path });
        let sse = answer
            .head
            .get("content-type")
            .is_some_and(is_event_stream_type);
        answer.idle_timeout = Some(if sse {
            limits.stream_idle_timeout
        } else {
            limits.idle_timeout
        });
        Ok(answer)
    }
}

/// A new connection to the port, from inside the sandbox's namespace.
async fn dial(
    view: &dyn TenantView,
    id: &str,
    port: u16,
) -> Result<tokio::net::TcpStream, ExchangeError> {
    let refused = |e: sandhub_client::Error| ExchangeError::Dial(Box::new(e));
    let route = view.connect_port(id, port).await.map_err(refused)?;
    if !route.headers.is_empty() {
        // A port reached through sandhub-router needs its routing headers: hyper's path.
        return Err(refused(sandhub_client::Error::new(
            Code::Unavailable,
            "this port is reached through a router; the fast path cannot carry it",
        )));
    }
    Ok(route.stream)
}

/// A failed exchange as the hub's answer: the backend's own refusal (not
/// found, not Ready), or the server inside unreachable.
fn failure(port: u16, e: ExchangeError) -> ApiError {
    match e {
        ExchangeError::Dial(e) => match e.downcast::<sandhub_client::Error>() {
            Ok(e) => ApiError::from(*e),
            Err(e) => ApiError::new(Code::Unavailable, e.to_string()),
        },
        e => ApiError::new(
            Code::Unavailable,
            format!("the server on port {port} in the sandbox: {e}"),
        ),
    }
}

/// The fast path serving one client connection.
pub struct Conn<'a>(pub &'a Ports);

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

impl Handler for Conn<'_> {
    type Plan = Plan;
    type Keep = Kept;

    fn plan(&self, buf: &[u8], up_head: &mut bytes::BytesMut) -> Parsed<Plan> {
        let rules = Rules {
            keys: self.0.keys.as_deref(),
            hosts: self.0.hosts.as_deref(),
        };
        plan::plan(buf, up_head, &rules)
    }

    fn in_flight(&self) -> impl Sized + '_ {
        InFlight::new(&self.0.metrics)
    }

    async fn exchange<S: ClientIo>(
        &self,
        plan: Plan,
        start: Instant,
        req: &mut FastRequest<'_, S>,
    ) -> Result<Answer<Kept>, Response<Bytes>> {
        let (result, route) = match plan.tenant.as_deref() {
            Some(tenant) => (self.0.exchange(&plan, tenant, req).await, plan.route),
            // Refused before routing, as by the auth layer: no route label.
            None => (Err(super::auth::unauthenticated()), "other"),
        };
        let status = match &result {
            Ok(answer) => answer.head.status,
            Err(e) => e.status().as_u16(),
        };
        self.0
            .metrics
            .count_request(plan.method, route, status, start);
        result.map_err(ApiError::into_whole)
    }

    fn rx_bytes(&self) -> Option<&Counter> {
        None
    }
}
