//! The claim's status, computed from its Sandbox (or from why there is none).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use sandhub_api::k8s::claim::ClaimSandboxStatus;
use sandhub_api::k8s::conditions::types;
use sandhub_api::k8s::{Sandbox, SandboxClaimStatus};

use crate::object::conditions::{
    find as condition, remove as remove_condition, set as set_condition,
};

/// A condition stamped with the claim's generation.
pub fn cond(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

/// The claim status for a claim bound to `sb`: Ready forwarded (under the
/// claim's generation), Finished mirrored, and the Sandbox's name, IPs and FQDN.
pub fn bound_status(
    old: &SandboxClaimStatus,
    sb: &Sandbox,
    generation: Option<i64>,
    not_ready_reason: &str,
) -> SandboxClaimStatus {
    let mut st = old.clone();
    let sb_status = sb.status.clone().unwrap_or_default();
    let ready = match condition(&sb_status.conditions, types::READY) {
        Some(r) => Condition {
            observed_generation: generation,
            last_transition_time: Time(Timestamp::now()),
            ..r.clone()
        },
        None => cond(
            types::READY,
            false,
            not_ready_reason,
            "Sandbox is not ready yet",
            generation,
        ),
    };
    set_condition(&mut st.conditions, ready);
    match condition(&sb_status.conditions, types::FINISHED) {
        Some(f) => {
            // Mirrored with the Sandbox's own transition time: the TTL after
            // finishing counts from when the Sandbox finished.
            let f = Condition {
                observed_generation: generation,
                ..f.clone()
            };
            match st
                .conditions
                .iter_mut()
                .find(|o| o.type_ == types::FINISHED)
            {
                Some(o) => *o = f,
                None => st.conditions.push(f),
            }
        }
        None => remove_condition(&mut st.conditions, types::FINISHED),
    }
    st.sandbox = Some(ClaimSandboxStatus {
        name: sb.name_any(),
        pod_ips: sb_status.pod_ips.clone(),
        service_fqdn: sb_status.service_fqdn.clone(),
    });
    st
}

/// The claim status for a claim without a (usable) Sandbox.
pub fn unbound_status(
    old: &SandboxClaimStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> SandboxClaimStatus {
    let mut st = old.clone();
    set_condition(
        &mut st.conditions,
        cond(types::READY, false, reason, message, generation),
    );
    st
}

/// When the claim's mirrored Finished condition became True.
pub fn finished_at(st: Option<&SandboxClaimStatus>) -> Option<Timestamp> {
    st.and_then(|s| condition(&s.conditions, types::FINISHED))
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::k8s::{SandboxSpec, SandboxStatus};

    fn sandbox(ready: bool, finished: bool) -> Sandbox {
        let mut sb = Sandbox::new("sb", SandboxSpec::default());
        let mut conds = vec![cond(
            types::READY,
            ready,
            if ready {
                "DependenciesReady"
            } else {
                "PodFailed"
            },
            "m",
            Some(7),
        )];
        if finished {
            let mut f = cond(types::FINISHED, true, "PodFailed", "", Some(7));
            f.last_transition_time = Time(Timestamp::from_second(1_800_000_000).unwrap());
            conds.push(f);
        }
        sb.status = Some(SandboxStatus {
            conditions: conds,
            pod_ips: vec!["10.244.0.5".into()],
            service_fqdn: "sb.ns.svc.cluster.local".into(),
            ..Default::default()
        });
        sb
    }

    #[test]
    fn ready_is_forwarded_with_the_claims_generation() {
        let st = bound_status(
            &SandboxClaimStatus::default(),
            &sandbox(true, false),
            Some(2),
            "SandboxNotReady",
        );
        let r = condition(&st.conditions, types::READY).unwrap();
        assert_eq!(
            (r.status.as_str(), r.reason.as_str(), r.observed_generation),
            ("True", "DependenciesReady", Some(2))
        );
        let s = st.sandbox.unwrap();
        assert_eq!(
            (s.name.as_str(), s.pod_ips.len(), s.service_fqdn.as_str()),
            ("sb", 1, "sb.ns.svc.cluster.local")
        );
    }

    #[test]
    fn finished_is_mirrored_with_its_transition_time_and_removed_when_gone() {
        let st = bound_status(
            &SandboxClaimStatus::default(),
            &sandbox(false, true),
            Some(1),
            "SandboxNotReady",
        );
        assert_eq!(
            finished_at(Some(&st)),
            Some(Timestamp::from_second(1_800_000_000).unwrap())
        );
        let st = bound_status(&st, &sandbox(true, false), Some(1), "SandboxNotReady");
        assert!(condition(&st.conditions, types::FINISHED).is_none());
        assert_eq!(finished_at(Some(&st)), None);
    }

    #[test]
    fn a_sandbox_without_ready_reports_the_given_reason() {
        let sb = Sandbox::new("sb", SandboxSpec::default());
        let st = bound_status(&SandboxClaimStatus::default(), &sb, None, "SandboxNotReady");
        assert_eq!(
            condition(&st.conditions, types::READY).unwrap().reason,
            "SandboxNotReady"
        );
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let mut conds = vec![];
        let mut first = cond(types::READY, false, "A", "", None);
        first.last_transition_time = Time(Timestamp::from_second(1).unwrap());
        set_condition(&mut conds, first);
        set_condition(&mut conds, cond(types::READY, false, "B", "", None));
        assert_eq!(
            conds[0].last_transition_time.0,
            Timestamp::from_second(1).unwrap()
        );
        assert_eq!(conds[0].reason, "B");
        set_condition(&mut conds, cond(types::READY, true, "C", "", None));
        assert_ne!(
            conds[0].last_transition_time.0,
            Timestamp::from_second(1).unwrap()
        );
    }
}
