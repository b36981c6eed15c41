//! The claim startup metrics (§2.6), observed once per claim.
//!
//! Upstream marks a recorded claim with annotations (`claim-first-ready-at`,
//! `creation-latency-recorded`), one more write per claim. Here the record is
//! the status transition itself: a claim's latency is observed right after
//! the status write that first made it Ready. That write is persisted, so a
//! restarted controller sees the claim Ready already and does not observe it
//! twice; the API server is spared a write per claim during a burst.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use sandhub_api::k8s::conditions::types;
use sandhub_api::k8s::names;
use sandhub_api::k8s::{Sandbox, SandboxClaim, SandboxClaimStatus};

use crate::metrics::{ClaimCreation, Metrics};
use crate::object::conditions::find as condition;
use crate::object::sandbox_ready;

/// What the metrics need to know about the claim's Sandbox.
#[derive(Debug, Clone)]
pub struct Bound {
    pub launch_type: String,
    pub template: String,
    pub ready: bool,
}

impl Bound {
    pub fn of(sb: &Sandbox) -> Self {
        Self {
            launch_type: sb
                .labels()
                .get(names::LAUNCH_TYPE)
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
            template: sb
                .annotations()
                .get(names::SANDBOX_TEMPLATE_REF_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            ready: sandbox_ready(sb),
        }
    }
}

pub fn ready(st: Option<&SandboxClaimStatus>) -> bool {
    st.and_then(|s| condition(&s.conditions, types::READY))
        .is_some_and(|c| c.status == "True")
}

fn annotation_time(claim: &SandboxClaim, key: &str) -> Option<Timestamp> {
    claim.annotations().get(key)?.parse().ok()
}

fn ms_between(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_millisecond() - from.as_millisecond()).max(0) as f64
}

/// The claim just got its Sandbox: `agent_sandbox_claim_creation_total`.
pub fn record_bound(m: &Metrics, claim: &SandboxClaim, b: &Bound) {
    m.inc_claim_creation(&ClaimCreation {
        namespace: claim.namespace().unwrap_or_default(),
        sandbox_template: b.template.clone(),
        launch_type: b.launch_type.clone(),
        warmpool_name: claim.spec.warm_pool_ref.name.clone(),
        pod_condition: if b.ready { "ready" } else { "not_ready" }.into(),
        created_by: claim
            .labels()
            .get(names::CREATED_BY)
            .cloned()
            .unwrap_or_default(),
    });
}

/// The claim just became Ready at `now`: the three startup latencies, each
/// from the moment its start is known (creation, first seen by a
/// controller, first requested by the client).
pub fn record_ready(m: &Metrics, claim: &SandboxClaim, b: &Bound, now: Timestamp) {
    if let Some(created) = claim.metadata.creation_timestamp.as_ref() {
        m.observe_claim_startup(&b.launch_type, &b.template, ms_between(created.0, now));
    }
    if let Some(t) = annotation_time(claim, names::CONTROLLER_FIRST_OBSERVED_AT) {
        m.observe_claim_controller_startup(&b.launch_type, &b.template, ms_between(t, now));
    }
    if let Some(t) = annotation_time(claim, names::CLIENT_FIRST_REQUESTED_AT) {
        m.observe_client_claim_startup(&b.launch_type, &b.template, ms_between(t, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use sandhub_api::k8s::SandboxClaimSpec;

    #[test]
    fn ready_claims_observe_each_known_start() {
        let m = Metrics::new();
        let mut c = SandboxClaim::new("c", SandboxClaimSpec::default());
        let now: Timestamp = "2026-11-29T12:00:10Z".parse().unwrap();
        c.metadata.creation_timestamp = Some(Time("2026-11-29T12:00:00Z".parse().unwrap()));
        c.annotations_mut().insert(
            names::CONTROLLER_FIRST_OBSERVED_AT.into(),
            "2026-11-29T12:00:04Z".into(),
        );
        let b = Bound {
            launch_type: "warm".into(),
            template: "tpl".into(),
            ready: true,
        };
        record_ready(&m, &c, &b, now);
        record_bound(&m, &c, &b);
        let text = m.encode();
        for want in [
            "agent_sandbox_claim_startup_latency_ms_sum{launch_type=\"warm\",sandbox_template=\"tpl\"} 10000.0",
            "agent_sandbox_claim_controller_startup_latency_ms_sum{launch_type=\"warm\",sandbox_template=\"tpl\"} 6000.0",
            "agent_sandbox_claim_creation_total{",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        // No client annotation: no client observation.
        assert!(!text.contains("agent_sandbox_client_claim_startup_latency_ms_count{"));
    }
}
