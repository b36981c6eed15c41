//! How the hub's model maps onto the CRDs: a hub sandbox is a SandboxClaim
//! (the claim's name is the sandbox id), a hub pool a SandboxWarmPool. Pure
//! functions, so the mapping is tested without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use sandhub_api::{
    hub::{CreateSandbox, Launch, Pool, Sandbox, SandboxState},
    k8s::{
        claim::{ClaimEnvVar, ClaimLifecycle, ClaimShutdownPolicy},
        conditions::{claim as claim_reason, launch_type, sandbox as sandbox_reason, types},
        names, SandboxClaim, SandboxClaimSpec, SandboxWarmPool,
    },
};
use sha2::{Digest, Sha256};

/// Which tenant owns a claim: a digest, because tenant names need not be
/// valid label values, and a label must never reveal another tenant's name.
pub const TENANT_LABEL: &str = "sandhub.io/tenant";
/// The template a claim was made for (the pool's, at creation time).
pub const TEMPLATE_ANNOTATION: &str = "sandhub.io/template";
/// Marks claims the hub made, so it lists and counts only its own.
pub const CREATED_BY_HUB: &str = "sandhub";

pub fn tenant_label_value(tenant: &str) -> String {
    // 40 hex digits: well under the 63-character label limit, far beyond
    // any collision an attacker could search for.
    let digest = Sha256::digest(tenant.as_bytes());
    digest.iter().take(20).map(|b| format!("{b:02x}")).collect()
}

/// The selector for one tenant's claims, narrowed by the caller's labels.
pub fn selector(tenant: &str, labels: &BTreeMap<String, String>) -> String {
    let mut parts = vec![
        format!("{TENANT_LABEL}={}", tenant_label_value(tenant)),
        format!("{}={CREATED_BY_HUB}", names::CREATED_BY),
    ];
    parts.extend(labels.iter().map(|(k, v)| format!("{k}={v}")));
    parts.join(",")
}

/// Whether a claim is an egress sandbox's (it records a proxy policy).
pub fn is_egress(claim: &SandboxClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(super::egress::POLICY_ANNOTATION))
}

/// What an egress sandbox's claim carries (kube/egress.rs): its recorded
/// policy and the proxy environment.
#[derive(Debug, Clone)]
pub struct EgressClaim {
    pub recorded: super::egress::Recorded,
    pub env: Vec<(String, String)>,
}

/// The claim for `request` in `pool`; `now` anchors `shutdown_after_seconds`.
/// A deadline no clock can hold is INVALID_ARGUMENT (the caller range-checks
/// first; this is the backstop that keeps `now + seconds` from panicking).
/// `egress`: set for a sandbox of a `network: egress` template (its
/// request's `network` is in its record); without it a request `network`
/// other than `none` is refused, as there is nothing to narrow.
pub fn claim_for(
    id: &str,
    tenant: &str,
    pool: &str,
    template: &str,
    request: &CreateSandbox,
    now: std::time::SystemTime,
    egress: Option<&EgressClaim>,
) -> Result<SandboxClaim, sandhub_client::Error> {
    if egress.is_none() {
        if let Some(n) = &request.network {
            super::egress::refuse_patch(n)?;
        }
    }
    let mut labels = request.labels.clone();
    labels.insert(TENANT_LABEL.into(), tenant_label_value(tenant));
    labels.insert(names::CREATED_BY.into(), CREATED_BY_HUB.into());
    let mut annotations = BTreeMap::from([
        (TEMPLATE_ANNOTATION.to_string(), template.to_string()),
        (
            names::CLIENT_FIRST_REQUESTED_AT.to_string(),
            humantime::format_rfc3339_seconds(now).to_string(),
        ),
    ]);
    if let Some(e) = egress {
        annotations.insert(
            super::egress::POLICY_ANNOTATION.to_string(),
            e.recorded.to_annotation(),
        );
    }
    let lifecycle = match request.shutdown_after_seconds {
        None => None,
        Some(secs) => Some(lifecycle_at(now, secs)?),
    };
    // The proxy's variables last, replacing any the request named: the
    // credential is the hub's to give (a claim's env forces a cold start,
    // so each egress Pod is made with its own).
    let mut vars: Vec<(String, String)> = request
        .env
        .iter()
        .filter(|(k, _)| !egress.is_some_and(|e| e.env.iter().any(|(p, _)| p == *k)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.extend(egress.iter().flat_map(|e| e.env.iter().cloned()));
    let env = (!vars.is_empty()).then(|| {
        vars.iter()
            .map(|(name, value)| ClaimEnvVar {
                name: name.clone(),
                value: value.clone(),
                container_name: None,
            })
            .collect()
    });
    let mut claim = SandboxClaim::new(
        id,
        SandboxClaimSpec {
            warm_pool_ref: sandhub_api::k8s::common::LocalRef { name: pool.into() },
            lifecycle,
            additional_pod_metadata: None,
            env,
            volume_claim_templates: None,
        },
    );
    claim.metadata = ObjectMeta {
        name: Some(id.into()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    };
    Ok(claim)
}

/// A claim deleted `secs` after `now`.
fn lifecycle_at(now: std::time::SystemTime, secs: u64) -> sandhub_client::Result<ClaimLifecycle> {
    let at = now
        .checked_add(std::time::Duration::from_secs(secs))
        .and_then(time)
        .ok_or_else(|| {
            sandhub_client::Error::invalid(format!(
                "shutdown_after_seconds {secs} is beyond any date a claim can hold"
            ))
        })?;
    Ok(ClaimLifecycle {
        shutdown_time: Some(at),
        ttl_seconds_after_finished: None,
        shutdown_policy: ClaimShutdownPolicy::Delete,
    })
}

/// A claim's lifecycle that deletes it `secs` from now (E2B's
/// `set_timeout`), as JSON for a merge patch.
pub fn deadline(secs: u64) -> sandhub_client::Result<serde_json::Value> {
    let lifecycle = lifecycle_at(std::time::SystemTime::now(), secs)?;
    serde_json::to_value(lifecycle).map_err(|e| sandhub_client::Error::internal(e.to_string()))
}

fn time(t: std::time::SystemTime) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::try_from(t).ok().map(Time)
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Reasons after which a claim never becomes Ready by itself.
pub fn terminal_reason(claim: &SandboxClaim) -> Option<(String, String)> {
    let conditions = claim.status.as_ref().map(|s| s.conditions.as_slice())?;
    let ready = condition(conditions, types::READY)?;
    let terminal = [
        claim_reason::TEMPLATE_NOT_FOUND,
        claim_reason::WARM_POOL_NOT_FOUND,
        claim_reason::INVALID_METADATA,
        claim_reason::ENV_VARS_INJECTION_REJECTED,
        claim_reason::VOLUME_CLAIM_TEMPLATES_ERROR,
        claim_reason::CLAIM_EXPIRED,
        claim_reason::SANDBOX_EXPIRED,
        sandbox_reason::POD_FAILED,
        sandbox_reason::POD_SUCCEEDED,
    ];
    (ready.status != "True" && terminal.contains(&ready.reason.as_str()))
        .then(|| (ready.reason.clone(), ready.message.clone()))
}

/// The Sandbox claim `id` is bound to, or (not bound yet) the one it will
/// make, which is named after the claim.
pub fn sandbox_name(claim: &SandboxClaim, id: &str) -> String {
    claim
        .status
        .as_ref()
        .and_then(|s| s.sandbox.as_ref())
        .map(|s| s.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| id.to_string())
}

pub fn is_ready(claim: &SandboxClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| {
        s.sandbox.as_ref().is_some_and(|sb| !sb.name.is_empty())
            && condition(&s.conditions, types::READY).is_some_and(|c| c.status == "True")
    })
}

pub fn state_of(claim: &SandboxClaim) -> SandboxState {
    let Some(status) = &claim.status else {
        return SandboxState::Pending;
    };
    if condition(&status.conditions, types::FINISHED).is_some_and(|c| c.status == "True") {
        return SandboxState::Finished;
    }
    match condition(&status.conditions, types::READY) {
        Some(c) if c.status == "True" => SandboxState::Ready,
        Some(c) if c.reason == sandbox_reason::SANDBOX_SUSPENDED => SandboxState::Suspended,
        Some(c)
            if c.reason == claim_reason::CLAIM_EXPIRED
                || c.reason == claim_reason::SANDBOX_EXPIRED =>
        {
            SandboxState::Expired
        }
        _ => SandboxState::Pending,
    }
}

/// The hub's view of a claim; `launch` comes from its Sandbox's label.
pub fn sandbox_of(claim: &SandboxClaim, launch: Option<&str>) -> Sandbox {
    let meta = &claim.metadata;
    let labels = meta
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != TENANT_LABEL && k != names::CREATED_BY)
        .collect();
    let template = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(TEMPLATE_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    let created_at = meta
        .creation_timestamp
        .as_ref()
        .map(|t| humantime::format_rfc3339_seconds(std::time::SystemTime::from(t.0)).to_string())
        .unwrap_or_default();
    let shutdown_at = claim
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.shutdown_time.as_ref())
        .map(|t| humantime::format_rfc3339_seconds(std::time::SystemTime::from(t.0)).to_string());
    Sandbox {
        id: meta.name.clone().unwrap_or_default(),
        template,
        state: state_of(claim),
        labels,
        launch: if launch == Some(launch_type::WARM) {
            Launch::Warm
        } else {
            Launch::Cold
        },
        created_at,
        shutdown_at,
        idle_timeout_seconds: None,
        idle_action: None,
        auto_resume: false,
        pool: Some(claim.spec.warm_pool_ref.name.clone()),
        forked_from: None,
        entrypoint: None,
        egress: None,
        // The sandbox's own narrowing, as its claim records it.
        network: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(super::egress::POLICY_ANNOTATION))
            .and_then(|j| super::egress::Recorded::from_annotation(j))
            .and_then(|r| r.sandbox),
        usage: None,
    }
}

pub fn pool_of(pool: &SandboxWarmPool) -> Pool {
    let status = pool.status.clone().unwrap_or_default();
    Pool {
        name: pool.metadata.name.clone().unwrap_or_default(),
        template: pool.spec.sandbox_template_ref.name.clone(),
        replicas: pool.spec.replicas.max(0) as u32,
        ready: status.ready_replicas.max(0) as u32,
        total: status.replicas.max(0) as u32,
        last_error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::k8s::claim::{ClaimSandboxStatus, SandboxClaimStatus};

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: time(std::time::SystemTime::UNIX_EPOCH).unwrap(),
            observed_generation: None,
        }
    }

    fn with_status(conditions: Vec<Condition>, sandbox: Option<&str>) -> SandboxClaim {
        let mut c = claim_for(
            "sb-a",
            "t",
            "python",
            "python",
            &CreateSandbox::default(),
            std::time::SystemTime::UNIX_EPOCH,
            None,
        )
        .unwrap();
        c.status = Some(SandboxClaimStatus {
            conditions,
            sandbox: sandbox.map(|n| ClaimSandboxStatus {
                name: n.into(),
                ..Default::default()
            }),
        });
        c
    }

    #[test]
    fn tenant_label_hides_the_tenant_and_fits_a_label() {
        let v = tenant_label_value("acme corp / team #1");
        assert_eq!(v.len(), 40);
        assert!(v.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(v, tenant_label_value("acme corp / team #2"));
    }

    #[test]
    fn claim_carries_tenant_labels_pool_env_and_deadline() {
        let req = CreateSandbox {
            labels: BTreeMap::from([("team".into(), "ml".into())]),
            env: BTreeMap::from([("A".into(), "1".into())]),
            shutdown_after_seconds: Some(60),
            ..Default::default()
        };
        let c = claim_for(
            "sb-x",
            "t1",
            "pool-a",
            "tpl",
            &req,
            std::time::SystemTime::UNIX_EPOCH,
            None,
        )
        .unwrap();
        let labels = c.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "ml");
        assert_eq!(labels[TENANT_LABEL], tenant_label_value("t1"));
        assert_eq!(labels[names::CREATED_BY], CREATED_BY_HUB);
        assert_eq!(c.spec.warm_pool_ref.name, "pool-a");
        assert_eq!(c.spec.env.as_ref().unwrap()[0].name, "A");
        let lifecycle = c.spec.lifecycle.unwrap();
        assert_eq!(lifecycle.shutdown_policy, ClaimShutdownPolicy::Delete);
        assert_eq!(
            std::time::SystemTime::from(lifecycle.shutdown_time.unwrap().0),
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(60)
        );
        assert_eq!(
            selector("t1", &BTreeMap::from([("team".into(), "ml".into())])),
            format!(
                "{TENANT_LABEL}={},agents.x-k8s.io/created-by=sandhub,team=ml",
                tenant_label_value("t1")
            )
        );
    }

    #[test]
    fn states_follow_the_claim_conditions() {
        let ready = with_status(
            vec![cond("Ready", "True", "DependenciesReady")],
            Some("sb-a"),
        );
        assert!(is_ready(&ready));
        assert_eq!(state_of(&ready), SandboxState::Ready);
        // Ready without a bound Sandbox is not ready yet.
        assert!(!is_ready(&with_status(
            vec![cond("Ready", "True", "x")],
            None
        )));
        let suspended = with_status(
            vec![cond("Ready", "False", "SandboxSuspended")],
            Some("sb-a"),
        );
        assert_eq!(state_of(&suspended), SandboxState::Suspended);
        let expired = with_status(vec![cond("Ready", "False", "ClaimExpired")], Some("sb-a"));
        assert_eq!(state_of(&expired), SandboxState::Expired);
        assert!(terminal_reason(&expired).is_some());
        let finished = with_status(
            vec![
                cond("Ready", "False", "PodFailed"),
                cond("Finished", "True", "PodFailed"),
            ],
            Some("sb-a"),
        );
        assert_eq!(state_of(&finished), SandboxState::Finished);
        let pending = with_status(vec![cond("Ready", "False", "DependenciesNotReady")], None);
        assert_eq!(state_of(&pending), SandboxState::Pending);
        assert!(terminal_reason(&pending).is_none());
        let missing_pool = with_status(vec![cond("Ready", "False", "WarmPoolNotFound")], None);
        assert_eq!(
            terminal_reason(&missing_pool).unwrap().0,
            "WarmPoolNotFound"
        );
    }

    #[test]
    fn hub_view_hides_bookkeeping_labels() {
        let c = with_status(
            vec![cond("Ready", "True", "DependenciesReady")],
            Some("sb-a"),
        );
        let s = sandbox_of(&c, Some("warm"));
        assert_eq!(s.id, "sb-a");
        assert_eq!(s.template, "python");
        assert_eq!(s.launch, Launch::Warm);
        assert_eq!(s.pool.as_deref(), Some("python"));
        assert!(!s.labels.contains_key(TENANT_LABEL));
        assert!(!s.labels.contains_key(names::CREATED_BY));
    }

    #[test]
    fn a_deadline_beyond_the_clock_is_invalid_argument_not_a_panic() {
        for secs in [u64::MAX, u64::MAX / 2, i64::MAX as u64, 1 << 60] {
            let req = CreateSandbox {
                shutdown_after_seconds: Some(secs),
                ..Default::default()
            };
            let e = claim_for(
                "sb",
                "t",
                "p",
                "p",
                &req,
                std::time::SystemTime::now(),
                None,
            )
            .unwrap_err();
            assert_eq!(e.code, sandhub_api::error::Code::InvalidArgument, "{secs}");
        }
    }

    #[test]
    fn an_egress_claim_carries_its_policy_and_the_proxy_env_over_the_requests() {
        use crate::kube::egress::{Recorded, TemplateNetwork, POLICY_ANNOTATION};
        let tpl = TemplateNetwork {
            network: serde_json::from_value(
                serde_json::json!({"mode": "egress", "allow_out": ["*.test"]}),
            )
            .unwrap(),
            egress_mb: None,
            secrets: Vec::new(),
        };
        let narrow = serde_json::from_value(
            serde_json::json!({"mode": "egress", "allow_out": ["pypi.test"]}),
        )
        .unwrap();
        let egress = EgressClaim {
            recorded: Recorded::new(&tpl, Some(narrow), &[]).unwrap(),
            env: vec![(
                "HTTP_PROXY".into(),
                "http://sb-e:c@sandhub-egress:3128".into(),
            )],
        };
        let req = CreateSandbox {
            env: BTreeMap::from([
                ("A".into(), "1".into()),
                ("HTTP_PROXY".into(), "http://elsewhere:1".into()),
            ]),
            ..Default::default()
        };
        let c = claim_for(
            "sb-e",
            "t",
            "p",
            "web",
            &req,
            std::time::SystemTime::UNIX_EPOCH,
            Some(&egress),
        )
        .unwrap();
        let rec =
            Recorded::from_annotation(&c.metadata.annotations.as_ref().unwrap()[POLICY_ANNOTATION])
                .unwrap();
        assert_eq!(rec, egress.recorded);
        // The hub's view shows the sandbox's own narrowing.
        assert_eq!(sandbox_of(&c, None).network, egress.recorded.sandbox);
        let env: Vec<_> = c
            .spec
            .env
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect();
        assert_eq!(
            env,
            [
                ("A".to_string(), "1".to_string()),
                (
                    "HTTP_PROXY".to_string(),
                    "http://sb-e:c@sandhub-egress:3128".to_string()
                )
            ]
        );
        // Without a proxy policy, a request network other than `none` is refused.
        let req = CreateSandbox {
            network: Some(sandhub_api::hub::Network::Egress.into()),
            ..Default::default()
        };
        let e = claim_for(
            "sb",
            "t",
            "p",
            "p",
            &req,
            std::time::SystemTime::now(),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, sandhub_api::error::Code::FailedPrecondition);
    }
}
