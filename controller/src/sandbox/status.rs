//! The Sandbox status as a pure function of what the reconciler observed: conditions
//! (Ready, Suspended, PodScheduled, Finished) and the Pod/Service fields.

use k8s_openapi::api::core::v1::Pod;
use sandhub_api::k8s::conditions::{
    finished, messages, sandbox as reason, scheduled, suspended, types,
};
use sandhub_api::k8s::{names, SandboxStatus};

use crate::object::conditions as cond;

/// The Pod the reconciler found under the Sandbox's Pod name.
#[derive(Clone, Copy, Debug)]
pub enum PodView<'a> {
    None,
    Owned(&'a Pod),
    /// A Pod of that name that this Sandbox does not control.
    NotOwned,
}

impl PodView<'_> {
    fn owned(&self) -> Option<&Pod> {
        match self {
            PodView::Owned(p) => Some(p),
            _ => None,
        }
    }
}

pub struct Observed<'a> {
    pub generation: Option<i64>,
    pub suspended: bool,
    pub pod: PodView<'a>,
    pub multiple_pods: bool,
    pub service_required: bool,
    /// Name of the Service, when one exists.
    pub service: Option<String>,
    pub service_fqdn: Option<String>,
    pub name_hash: &'a str,
    /// A reconcile step failed with this message.
    pub error: Option<String>,
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn pod_condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn pod_ips(pod: &Pod) -> Vec<String> {
    let Some(st) = pod.status.as_ref() else {
        return vec![];
    };
    let ips: Vec<String> = st
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if ips.is_empty() {
        st.pod_ip
            .clone()
            .into_iter()
            .filter(|ip| !ip.is_empty())
            .collect()
    } else {
        ips
    }
}

/// `(ready, message)` for a Pod that exists and is not terminal.
fn pod_readiness(pod: &Pod) -> (bool, String) {
    let phase = phase(pod);
    if phase != "Running" {
        return (false, messages::pod_phase(phase));
    }
    if pod_condition(pod, "Ready").is_none_or(|c| c.status != "True") {
        return (false, messages::POD_RUNNING_NOT_READY.to_string());
    }
    if pod_ips(pod).is_empty() {
        return (false, messages::POD_READY_NO_IPS.to_string());
    }
    (true, "Pod is Ready".to_string())
}

/// The new status. `old` supplies the conditions whose transition times are kept and
/// the fields that persist (selector, a pre-existing Finished while suspended).
pub fn compute(old: &SandboxStatus, o: &Observed) -> SandboxStatus {
    let mut conds = old.conditions.clone();
    let g = o.generation;
    let owned = o.pod.owned();

    // Suspended: persistent once set.
    if o.suspended {
        let (status, why) = match o.pod {
            PodView::None => ("True", suspended::POD_TERMINATED),
            PodView::Owned(_) => ("False", suspended::POD_TERMINATING),
            PodView::NotOwned => ("False", suspended::POD_NOT_OWNED),
        };
        cond::set(&mut conds, cond::new(types::SUSPENDED, status, why, "", g));
    } else if cond::find(&conds, types::SUSPENDED).is_some() {
        cond::set(
            &mut conds,
            cond::new(types::SUSPENDED, "False", suspended::NOT_SUSPENDED, "", g),
        );
    }

    // PodScheduled mirrors the owned Pod.
    match owned {
        Some(pod) => {
            let c = match pod_condition(pod, "PodScheduled") {
                Some(pc) => {
                    let why = match pc.reason.as_deref() {
                        Some(r) if !r.is_empty() => r.to_string(),
                        _ if pc.status == "True" => scheduled::POD_SCHEDULED.to_string(),
                        _ => scheduled::POD_SCHEDULING_UNKNOWN.to_string(),
                    };
                    cond::new(
                        types::POD_SCHEDULED,
                        &pc.status,
                        &why,
                        pc.message.clone().unwrap_or_default(),
                        g,
                    )
                }
                None => cond::new(
                    types::POD_SCHEDULED,
                    "Unknown",
                    scheduled::POD_SCHEDULING_UNKNOWN,
                    "",
                    g,
                ),
            };
            cond::set(&mut conds, c);
        }
        None => cond::remove(&mut conds, types::POD_SCHEDULED),
    }

    // Finished: from the owned Pod's terminal phase, never while suspended (a Pod being
    // deleted for suspend turns Failed/Succeeded before it goes; v1.0.9 #2079), nor from a
    // Pod already being deleted: a resume right after a suspend finds the old Pod still on
    // its way out, and that is no death of the sandbox (its new Pod comes once it is gone).
    let terminal = owned
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(phase)
        .filter(|p| *p == "Succeeded" || *p == "Failed");
    if !o.suspended {
        match terminal {
            Some("Succeeded") => cond::set(
                &mut conds,
                cond::new(types::FINISHED, "True", finished::POD_SUCCEEDED, "", g),
            ),
            Some(_) => cond::set(
                &mut conds,
                cond::new(types::FINISHED, "True", finished::POD_FAILED, "", g),
            ),
            None => cond::remove(&mut conds, types::FINISHED),
        }
    }

    // Ready.
    let svc_suffix = if o.service_required {
        if o.service.is_some() {
            messages::SERVICE_EXISTS
        } else {
            messages::SERVICE_DOES_NOT_EXIST
        }
    } else {
        ""
    };
    let ready = if let Some(err) = &o.error {
        cond::new(
            types::READY,
            "False",
            reason::RECONCILER_ERROR,
            messages::reconciler_error(err),
            g,
        )
    } else if o.multiple_pods {
        cond::new(
            types::READY,
            "False",
            reason::MULTIPLE_PODS,
            "More than one Pod is controlled by this Sandbox",
            g,
        )
    } else if o.suspended {
        let msg = if matches!(o.pod, PodView::None) {
            messages::SANDBOX_SUSPENDED
        } else {
            messages::SANDBOX_SUSPENDING
        };
        cond::new(types::READY, "False", reason::SANDBOX_SUSPENDED, msg, g)
    } else {
        match (owned, terminal) {
            (Some(_), Some("Succeeded")) => cond::new(
                types::READY,
                "False",
                reason::POD_SUCCEEDED,
                messages::pod_phase("Succeeded"),
                g,
            ),
            (Some(_), Some(_)) => cond::new(
                types::READY,
                "False",
                reason::POD_FAILED,
                messages::pod_phase("Failed"),
                g,
            ),
            (Some(pod), None) => {
                let (pod_ok, msg) = pod_readiness(pod);
                let svc_ok = !o.service_required || o.service.is_some();
                let (status, why) = if pod_ok && svc_ok {
                    ("True", reason::DEPENDENCIES_READY)
                } else {
                    ("False", reason::DEPENDENCIES_NOT_READY)
                };
                cond::new(types::READY, status, why, format!("{msg}{svc_suffix}"), g)
            }
            (None, _) => {
                let msg = match o.pod {
                    PodView::NotOwned => "Pod exists but is not owned by this Sandbox".to_string(),
                    _ => messages::POD_DOES_NOT_EXIST.to_string(),
                };
                cond::new(
                    types::READY,
                    "False",
                    reason::DEPENDENCIES_NOT_READY,
                    format!("{msg}{svc_suffix}"),
                    g,
                )
            }
        }
    };
    cond::set(&mut conds, ready);

    let (pod_ips, node_name) = match owned.filter(|_| !o.suspended) {
        Some(pod) => (
            pod_ips(pod),
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
        ),
        None => (vec![], String::new()),
    };
    let selector = if owned.is_some() || !old.selector.is_empty() {
        format!("{}={}", names::SANDBOX_NAME_HASH, o.name_hash)
    } else {
        String::new()
    };
    SandboxStatus {
        service_fqdn: o.service_fqdn.clone().unwrap_or_default(),
        service: o.service.clone().unwrap_or_default(),
        conditions: conds,
        selector,
        pod_ips,
        node_name,
    }
}

/// The status write to make, if any: a nodeName-only change waits until Ready (it would
/// otherwise cost one write per scheduled Pod during a burst for no reader).
pub fn needs_write(old: &SandboxStatus, new: &SandboxStatus) -> bool {
    let same_except_node = old.service_fqdn == new.service_fqdn
        && old.service == new.service
        && old.selector == new.selector
        && old.pod_ips == new.pod_ips
        && cond::same(&old.conditions, &new.conditions);
    if !same_except_node {
        return true;
    }
    old.node_name != new.node_name && cond::is_true(&new.conditions, types::READY)
}

/// A JSON merge patch of the whole status; empty fields become null so they are cleared.
pub fn patch(new: &SandboxStatus) -> serde_json::Value {
    let s = |v: &str| {
        if v.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::String(v.to_string())
        }
    };
    serde_json::json!({
        "status": {
            "serviceFQDN": s(&new.service_fqdn),
            "service": s(&new.service),
            "conditions": new.conditions,
            "selector": s(&new.selector),
            "podIPs": if new.pod_ips.is_empty() { serde_json::Value::Null } else { serde_json::json!(new.pod_ips) },
            "nodeName": s(&new.node_name),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodIP, PodSpec, PodStatus};
    use sandhub_api::k8s::conditions::sandbox as r;

    fn pod(phase: &str, ready: bool, ip: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: Some("fake-node-0".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![
                    PodCondition {
                        type_: "Ready".into(),
                        status: if ready { "True" } else { "False" }.into(),
                        ..Default::default()
                    },
                    PodCondition {
                        type_: "PodScheduled".into(),
                        status: "True".into(),
                        ..Default::default()
                    },
                ]),
                pod_ips: ip.map(|ip| vec![PodIP { ip: ip.into() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn observed<'a>(pod: PodView<'a>) -> Observed<'a> {
        Observed {
            generation: Some(1),
            suspended: false,
            pod,
            multiple_pods: false,
            service_required: false,
            service: None,
            service_fqdn: None,
            name_hash: "h",
            error: None,
        }
    }

    fn ready(st: &SandboxStatus) -> (String, String, String) {
        let c = cond::find(&st.conditions, types::READY).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn ready_needs_running_ready_and_an_ip() {
        let p = pod("Running", true, Some("10.244.0.5"));
        let st = compute(&SandboxStatus::default(), &observed(PodView::Owned(&p)));
        assert_eq!(
            ready(&st),
            (
                "True".into(),
                r::DEPENDENCIES_READY.into(),
                "Pod is Ready".into()
            )
        );
        assert_eq!(st.pod_ips, vec!["10.244.0.5"]);
        assert_eq!(st.node_name, "fake-node-0");
        assert_eq!(st.selector, "agents.x-k8s.io/sandbox-name-hash=h");
        assert_eq!(
            cond::find(&st.conditions, types::POD_SCHEDULED)
                .unwrap()
                .reason,
            "PodScheduled"
        );

        let p = pod("Pending", false, None);
        assert_eq!(
            ready(&compute(
                &SandboxStatus::default(),
                &observed(PodView::Owned(&p))
            ))
            .2,
            "Pod exists with phase: Pending"
        );
        let p = pod("Running", false, Some("10.0.0.1"));
        assert_eq!(
            ready(&compute(
                &SandboxStatus::default(),
                &observed(PodView::Owned(&p))
            ))
            .2,
            "Pod is Running but not Ready"
        );
        let p = pod("Running", true, None);
        assert_eq!(
            ready(&compute(
                &SandboxStatus::default(),
                &observed(PodView::Owned(&p))
            ))
            .2,
            "Pod is Ready but has no podIPs yet"
        );
        let st = compute(&SandboxStatus::default(), &observed(PodView::None));
        assert_eq!(ready(&st).2, "Pod does not exist");
        assert!(st.selector.is_empty());
    }

    #[test]
    fn a_required_service_gates_ready_and_is_named_in_the_message() {
        let p = pod("Running", true, Some("10.244.0.5"));
        let mut o = observed(PodView::Owned(&p));
        o.service_required = true;
        assert_eq!(ready(&compute(&SandboxStatus::default(), &o)).0, "False");
        assert_eq!(
            ready(&compute(&SandboxStatus::default(), &o)).2,
            "Pod is Ready; Service does not exist"
        );
        o.service = Some("sb".into());
        assert_eq!(
            ready(&compute(&SandboxStatus::default(), &o)),
            (
                "True".into(),
                r::DEPENDENCIES_READY.into(),
                "Pod is Ready; Service Exists".into()
            )
        );
    }

    #[test]
    fn terminal_pods_finish_the_sandbox_but_never_while_suspended() {
        let p = pod("Failed", false, None);
        let st = compute(&SandboxStatus::default(), &observed(PodView::Owned(&p)));
        assert_eq!(ready(&st).1, r::POD_FAILED);
        assert_eq!(
            cond::find(&st.conditions, types::FINISHED).unwrap().reason,
            "PodFailed"
        );

        // Suspend deletes the Pod; the kubelet marks it Failed/Succeeded on its way out.
        let mut o = observed(PodView::Owned(&p));
        o.suspended = true;
        let st = compute(&SandboxStatus::default(), &o);
        assert!(cond::find(&st.conditions, types::FINISHED).is_none());
        assert_eq!(
            ready(&st),
            (
                "False".into(),
                r::SANDBOX_SUSPENDED.into(),
                "Sandbox is suspending".into()
            )
        );
        let s = cond::find(&st.conditions, types::SUSPENDED).unwrap();
        assert_eq!(
            (s.status.as_str(), s.reason.as_str()),
            ("False", "PodTerminating")
        );
        assert!(st.pod_ips.is_empty());

        let mut o = observed(PodView::None);
        o.suspended = true;
        let st2 = compute(&st, &o);
        let s = cond::find(&st2.conditions, types::SUSPENDED).unwrap();
        assert_eq!(
            (s.status.as_str(), s.reason.as_str()),
            ("True", "PodTerminated")
        );
        assert_eq!(ready(&st2).2, "Sandbox is suspended");
        assert!(cond::find(&st2.conditions, types::POD_SCHEDULED).is_none());

        // Resumed while the old Pod, terminal, is still being deleted: not Finished.
        let mut going = pod("Succeeded", false, None);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let resuming = compute(&st2, &observed(PodView::Owned(&going)));
        assert!(cond::find(&resuming.conditions, types::FINISHED).is_none());
        assert_eq!(ready(&resuming).1, r::DEPENDENCIES_NOT_READY);

        // Resume: Suspended stays, as NotSuspended.
        let st3 = compute(&st2, &observed(PodView::None));
        let s = cond::find(&st3.conditions, types::SUSPENDED).unwrap();
        assert_eq!(
            (s.status.as_str(), s.reason.as_str()),
            ("False", "NotSuspended")
        );
    }

    #[test]
    fn errors_and_multiple_pods_win_over_pod_state() {
        let p = pod("Running", true, Some("10.244.0.5"));
        let mut o = observed(PodView::Owned(&p));
        o.multiple_pods = true;
        assert_eq!(
            ready(&compute(&SandboxStatus::default(), &o)).1,
            r::MULTIPLE_PODS
        );
        o.error = Some("boom".into());
        assert_eq!(
            ready(&compute(&SandboxStatus::default(), &o)),
            (
                "False".into(),
                r::RECONCILER_ERROR.into(),
                "Error seen: boom".into()
            )
        );
    }

    #[test]
    fn node_name_only_changes_wait_for_ready() {
        let p = pod("Pending", false, None);
        let old = compute(&SandboxStatus::default(), &observed(PodView::Owned(&p)));
        let mut new = old.clone();
        new.node_name = "n2".into();
        assert!(!needs_write(&old, &new));
        assert!(!needs_write(&old, &old.clone()));
        let patch = patch(&SandboxStatus::default());
        assert!(patch["status"]["podIPs"].is_null());
    }
}
