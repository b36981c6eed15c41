//! Failed exchanges, classified once: which `{"detail"}` the client gets,
//! which `upstream_errors_total` reason is counted, and whether a cached Pod
//! that proved unreachable is evicted.

use super::Proxy;
use crate::{
    body::BodyTooLarge,
    error::ProxyError,
    http1::outbound::{body_too_large, DialError, DialFailure, ExchangeError},
    routing::Target,
};

impl Proxy {
    /// Classifies a failed direct exchange and counts it.
    pub(crate) fn exchange_failure(
        &self,
        e: ExchangeError,
        t: &Target,
        cached_uid: Option<&str>,
    ) -> ProxyError {
        match e {
            ExchangeError::Dial(e) => match e.downcast_ref::<DialError>() {
                Some(dial) => self.dial_failure(dial, t, cached_uid),
                None => ProxyError::Dial(t.id.clone()),
            },
            e if body_too_large(&e) => ProxyError::BodyTooLarge,
            // The client's body broke off or was malformed: its fault, not the sandbox's.
            ExchangeError::Body(_) => ProxyError::BadRequest("Invalid request body."),
            e => {
                let reason = if matches!(e, ExchangeError::Io(_)) {
                    "eof"
                } else {
                    "other"
                };
                self.metrics.upstream_error(&t.namespace, reason);
                tracing::warn!(sandbox = %t.id, namespace = %t.namespace, reason, error = %e, "backend exchange failed");
                ProxyError::Upstream(t.id.clone())
            }
        }
    }

    fn dial_failure(&self, dial: &DialError, t: &Target, cached_uid: Option<&str>) -> ProxyError {
        self.metrics.upstream_error(&t.namespace, "dial");
        tracing::warn!(sandbox = %t.id, namespace = %t.namespace, error = %dial, "backend unreachable");
        if dial.failure == DialFailure::Unreachable {
            if let (Some(cache), Some(uid)) = (&self.cache, cached_uid) {
                cache.evict(uid);
            }
        }
        ProxyError::Dial(t.id.clone())
    }

    /// Classifies a failed exchange, counts it, and evicts a cached Pod that
    /// proved unreachable (a refused dial means the Pod is there but not
    /// listening yet: it stays).
    pub(super) fn upstream_failure(
        &self,
        e: &hyper_util::client::legacy::Error,
        t: &Target,
        cached_uid: Option<&str>,
    ) -> ProxyError {
        if let Some(dial) = DialError::find(e) {
            return self.dial_failure(dial, t, cached_uid);
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        let mut reason = "other";
        while let Some(err) = source {
            if err.is::<BodyTooLarge>() {
                return ProxyError::BodyTooLarge;
            }
            if let Some(h) = err.downcast_ref::<hyper::Error>() {
                if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                    reason = "eof";
                } else if h.is_timeout() {
                    reason = "timeout";
                }
            }
            source = err.source();
        }
        self.metrics.upstream_error(&t.namespace, reason);
        tracing::warn!(sandbox = %t.id, namespace = %t.namespace, reason, error = %e, "backend exchange failed");
        ProxyError::Upstream(t.id.clone())
    }
}
