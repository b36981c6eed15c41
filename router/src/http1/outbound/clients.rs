//! hyper's pooled clients to sandboxes, HTTP/1.1 and h2c for gRPC, over
//! the retrying [`Dialer`]. They carry what the direct path does not: upgrades,
//! DNS-named targets, and (h2c) gRPC. The h2c client lives here beside its
//! HTTP/1.1 twin because both are built the same way over the same dialer.

use std::{sync::Arc, time::Duration};

use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioTimer},
};

use super::dial::{DialPolicy, Dialer};
use crate::body::RequestBody;

/// Pooled clients to sandboxes.
#[derive(Clone)]
pub struct Upstreams {
    pub http1: Client<Dialer, RequestBody>,
    pub h2c: Client<Dialer, RequestBody>,
    policy: Arc<DialPolicy>,
}

impl Upstreams {
    pub fn dial_policy(&self) -> &DialPolicy {
        &self.policy
    }

    pub fn new(dialer: Dialer) -> Self {
        let policy = dialer.policy.clone();
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_timer(TokioTimer::new())
            .build(dialer.clone());
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_while_idle(false)
            .build(dialer);
        Self { http1, h2c, policy }
    }
}
