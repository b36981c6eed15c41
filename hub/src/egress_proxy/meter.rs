//! The meter route: what this replica counted for one sandbox, for the
//! hub (`GET /v1/sandboxes/{id}/egress` and the counters of
//! `GET /v1/sandboxes/{id}` merge every replica's answer, kube/meters.rs).
//!
//! On the metrics port, which the namespace can reach (sandbox Pods can
//! not: their NetworkPolicy admits the proxy port only), so it wants the
//! hub's meter token (`SandboxdTokens::meter_token`, compared in constant
//! time). It answers counters and decisions only: names, addresses,
//! ports, reasons, bytes; never a credential or a secret.

use sandhub_api::{
    hub::{EgressDecision, EgressUsage},
    k8s::egress::{MeterReport, MAX_REPORTED_DECISIONS},
};
use sandhub_gateway::meter::{Decision, Meter, Totals};

pub fn usage(t: Totals) -> EgressUsage {
    EgressUsage {
        bytes_out: t.bytes_out,
        bytes_in: t.bytes_in,
        connections_opened: t.connections_opened,
        connections_refused: t.connections_refused,
    }
}

fn decision(d: Decision) -> EgressDecision {
    EgressDecision {
        at: crate::backend::rfc3339(d.at_ms as i64),
        name: d.name,
        address: d.address.to_string(),
        port: d.port,
        allowed: d.allowed,
        reason: (!d.reason.is_empty()).then_some(d.reason),
        bytes_out: d.bytes_out,
        bytes_in: d.bytes_in,
        brokered: d.brokered,
        udp: d.udp,
    }
}

/// A sandbox's report from its meter here (`None`: this replica carried
/// nothing of it yet: zeros).
pub fn report(meter: Option<&Meter>) -> MeterReport {
    let Some(m) = meter else {
        return MeterReport::default();
    };
    let mut decisions = m.decisions();
    let skip = decisions.len().saturating_sub(MAX_REPORTED_DECISIONS);
    MeterReport {
        usage: usage(m.totals()),
        decisions: decisions.drain(skip..).map(decision).collect(),
    }
}

/// Whether `header` (an `Authorization` value) is `Bearer <token>`.
pub fn authorized(header: Option<&str>, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return false;
    };
    given.len() == token.len() && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_carry_counts_and_decisions_and_want_the_meter_token() {
        assert_eq!(report(None), MeterReport::default());
        assert!(authorized(Some("Bearer abc"), "abc"));
        for bad in [
            None,
            Some("abc"),
            Some("Bearer abd"),
            Some("Bearer ab"),
            Some("bearer abc"),
        ] {
            assert!(!authorized(bad, "abc"), "{bad:?}");
        }
    }
}
