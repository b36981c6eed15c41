//! The claim decisions, one rule per test, on objects built in memory.

use super::*;
use crate::object::controller_ref;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sandhub_api::k8s::claim::ClaimSandboxStatus;
use sandhub_api::k8s::common::PodMetadata;
use sandhub_api::k8s::warmpool::UpdateStrategy;
use sandhub_api::k8s::{SandboxClaimSpec, SandboxClaimStatus, SandboxSpec};
use sandhub_api::k8s::{SandboxTemplateSpec, SandboxWarmPoolSpec};
use std::collections::BTreeMap;

fn claim() -> SandboxClaim {
    let mut c = SandboxClaim::new("c", SandboxClaimSpec::default());
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some("claim-uid".into());
    c.metadata.resource_version = Some("7".into());
    c.spec.warm_pool_ref.name = "pool".into();
    c
}

fn pool() -> SandboxWarmPool {
    let mut p = SandboxWarmPool::new("pool", SandboxWarmPoolSpec::default());
    p.metadata.uid = Some("pool-uid".into());
    p
}

fn template() -> SandboxTemplate {
    SandboxTemplate::new("tpl", SandboxTemplateSpec::default())
}

fn sandbox(
    name: &str,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> Sandbox {
    let mut sb = Sandbox::new(name, SandboxSpec::default());
    sb.metadata.namespace = Some("ns".into());
    sb.metadata.owner_references = owner.map(|o| vec![o]);
    sb
}

fn ours(name: &str) -> Sandbox {
    sandbox(name, Some(controller_ref(&claim())))
}

fn member(name: &str) -> Sandbox {
    sandbox(name, Some(controller_ref(&pool())))
}

fn reason_of(o: &Outcome) -> &'static str {
    match o {
        Outcome::Unbound { reason, .. } => reason,
        other => panic!("not unbound: {other:?}"),
    }
}

#[test]
fn recorded_prefers_the_status_over_the_annotation() {
    let mut c = claim();
    assert_eq!(recorded(&c), (None, false));
    c.metadata.annotations = Some(BTreeMap::from([(
        names::SANDBOX_NAME_ANNOTATION.to_string(),
        "from-annotation".to_string(),
    )]));
    assert_eq!(recorded(&c), (Some("from-annotation".into()), false));
    c.status = Some(SandboxClaimStatus {
        sandbox: Some(ClaimSandboxStatus {
            name: "from-status".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(recorded(&c), (Some("from-status".into()), true));
}

#[test]
fn a_named_sandbox_that_is_ours_is_bound_wherever_the_name_came_from() {
    for from_status in [true, false] {
        let named = decide_named(&claim(), "s", from_status, Some(ours("s")));
        assert!(matches!(named, Named::Bound(sb) if sb.name_any() == "s"));
    }
}

#[test]
fn an_adoption_cut_between_its_two_writes_is_finished() {
    let named = decide_named(&claim(), "m", false, Some(member("m")));
    assert!(matches!(named, Named::FinishAdoption(sb) if sb.name_any() == "m"));
    // A member that is going away, or of another pool, is not ours to finish.
    let mut gone = member("m");
    gone.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    assert!(matches!(
        decide_named(&claim(), "m", false, Some(gone)),
        Named::Forget
    ));
    let mut other = claim();
    other.spec.warm_pool_ref.name = "other".into();
    assert!(matches!(
        decide_named(&other, "m", false, Some(member("m"))),
        Named::Forget
    ));
}

#[test]
fn the_annotation_of_a_sandbox_someone_else_got_is_forgotten() {
    let theirs = sandbox(
        "t",
        Some(controller_ref(&{
            let mut c = SandboxClaim::new("other", SandboxClaimSpec::default());
            c.metadata.uid = Some("other-uid".into());
            c
        })),
    );
    assert!(matches!(
        decide_named(&claim(), "t", false, Some(theirs)),
        Named::Forget
    ));
    assert!(matches!(
        decide_named(&claim(), "t", false, None),
        Named::Forget
    ));
}

#[test]
fn a_status_naming_a_lost_sandbox_reports_it_missing() {
    let Named::Missing(o) = decide_named(&claim(), "s", true, None) else {
        panic!("not missing");
    };
    assert_eq!(reason_of(&o), reason::SANDBOX_MISSING);
    assert!(
        matches!(&o, Outcome::Unbound { message, requeue: None, .. } if message == "Sandbox \"s\" not found")
    );
    let Named::Missing(o) = decide_named(&claim(), "m", true, Some(member("m"))) else {
        panic!("not missing");
    };
    assert!(
        matches!(&o, Outcome::Unbound { message, .. } if message.contains("is not controlled by claim \"c\"")),
        "{o:?}"
    );
}

/// The resourceVersion of the Sandbox an outcome binds ("" when unset).
fn bound_version(o: Option<Outcome>) -> Option<String> {
    match o? {
        Outcome::Bound(sb) => Some(sb.resource_version().unwrap_or_default()),
        other => panic!("not bound: {other:?}"),
    }
}

#[test]
fn an_earlier_cold_sandbox_is_found_in_the_memo_or_the_cache() {
    assert!(decide_earlier(&claim(), None, None).is_none());
    let mut memo = ours("c");
    memo.metadata.resource_version = Some("8".into());
    assert_eq!(
        bound_version(decide_earlier(&claim(), Some(memo.clone()), None)),
        Some("8".into())
    );
    // The cache shows ours: it wins over the memo.
    let mut fresher = ours("c");
    fresher.metadata.resource_version = Some("9".into());
    assert_eq!(
        bound_version(decide_earlier(&claim(), Some(memo), Some(&fresher))),
        Some("9".into())
    );
    assert_eq!(
        bound_version(decide_earlier(&claim(), None, Some(&fresher))),
        Some("9".into())
    );
}

#[test]
fn a_foreign_sandbox_holding_the_claims_name_is_a_reconciler_error() {
    let o = decide_earlier(&claim(), None, Some(&sandbox("c", None))).unwrap();
    assert_eq!(reason_of(&o), reason::RECONCILER_ERROR);
    // A pool member of that name is no obstacle: go on.
    assert!(decide_earlier(&claim(), None, Some(&member("c"))).is_none());
}

#[test]
fn env_or_volume_claims_force_a_cold_start() {
    let allowed = vec!["sandbox.users.io".to_string()];
    assert!(matches!(
        decide_route(&claim(), &template(), &allowed),
        Route::Warm
    ));
    let mut env = claim();
    env.spec.env = Some(vec![Default::default()]);
    assert!(matches!(
        decide_route(&env, &template(), &allowed),
        Route::Cold
    ));
    let mut vct = claim();
    vct.spec.volume_claim_templates = Some(vec![Default::default()]);
    assert!(matches!(
        decide_route(&vct, &template(), &allowed),
        Route::Cold
    ));
    // So do the hub's volume mounts (checked when the Sandbox is built).
    let mut mounts = claim();
    mounts.metadata.annotations = Some(std::collections::BTreeMap::from([(
        sandhub_api::k8s::volumes::MOUNTS_ANNOTATION.to_string(),
        "[]".to_string(),
    )]));
    assert!(matches!(
        decide_route(&mounts, &template(), &allowed),
        Route::Cold
    ));
    let mut empty = claim();
    empty.spec.env = Some(vec![]);
    assert!(matches!(
        decide_route(&empty, &template(), &allowed),
        Route::Warm
    ));
}

#[test]
fn metadata_outside_the_allowed_domains_is_refused_before_any_adoption() {
    let mut c = claim();
    c.spec.additional_pod_metadata = Some(PodMetadata {
        labels: Some(BTreeMap::from([("example.com/team".into(), "a".into())])),
        annotations: None,
    });
    let Route::Refuse(o) = decide_route(&c, &template(), &["sandbox.users.io".into()]) else {
        panic!("not refused");
    };
    assert_eq!(reason_of(&o), reason::INVALID_METADATA);
}

#[test]
fn pending_members_are_waited_for_only_while_the_claim_is_young() {
    let cand = Candidate {
        name: "m".into(),
        node: None,
        ready: true,
        has_ip: true,
        template_hash: None,
        template_name: None,
    };
    assert!(matches!(
        decide_take(Take::Got(cand.clone()), Duration::from_secs(60)),
        Next::Adopt(c) if c == cand
    ));
    let Next::Wait(o) = decide_take(Take::Pending, Duration::from_millis(500)) else {
        panic!("not waiting");
    };
    assert!(matches!(
        o,
        Outcome::Unbound {
            requeue: Some(PENDING_RETRY),
            ..
        }
    ));
    assert!(matches!(
        decide_take(Take::Pending, PENDING_WAIT),
        Next::Cold
    ));
    assert!(matches!(
        decide_take(Take::Empty, Duration::ZERO),
        Next::Cold
    ));
}

#[test]
fn claim_age_counts_from_creation_and_never_goes_negative() {
    let now = Timestamp::from_second(1_800_000_010).unwrap();
    let mut c = claim();
    assert_eq!(claim_age(&c, now), Duration::ZERO);
    c.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_800_000_000).unwrap()));
    assert_eq!(claim_age(&c, now), Duration::from_secs(10));
    c.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_800_000_020).unwrap()));
    assert_eq!(claim_age(&c, now), Duration::ZERO);
}

#[test]
fn stale_members_are_refused_only_under_recreate() {
    let stale = Candidate {
        name: "m".into(),
        node: None,
        ready: true,
        has_ip: true,
        template_hash: Some("old-hash".into()),
        template_name: Some("tpl".into()),
    };
    assert!(acceptable(&pool(), &template())(&stale));
    let mut recreate = pool();
    recreate.spec.update_strategy = Some(UpdateStrategy {
        type_: UpdateStrategyType::Recreate,
    });
    assert!(!acceptable(&recreate, &template())(&stale));
    let fresh = Candidate {
        template_hash: Some(template_hash(&template())),
        ..stale
    };
    assert!(acceptable(&recreate, &template())(&fresh));
}

#[test]
fn the_naming_write_is_guarded_by_the_claims_resource_version() {
    let p = naming_patch(&claim(), "m", None);
    assert_eq!(p["metadata"]["resourceVersion"], "7");
    assert_eq!(
        p["metadata"]["annotations"][names::SANDBOX_NAME_ANNOTATION],
        "m"
    );
    assert!(p["metadata"]["annotations"]
        .get(names::CONTROLLER_FIRST_OBSERVED_AT)
        .is_none());
    let p = naming_patch(&claim(), "m", Some("2026-01-01T00:00:00Z".into()));
    assert_eq!(
        p["metadata"]["annotations"][names::CONTROLLER_FIRST_OBSERVED_AT],
        "2026-01-01T00:00:00Z"
    );
    let f = forget_patch(&claim());
    assert_eq!(f["metadata"]["resourceVersion"], "7");
    assert!(f["metadata"]["annotations"][names::SANDBOX_NAME_ANNOTATION].is_null());
}

#[test]
fn first_observed_is_stamped_once_unless_disabled() {
    let mut c = claim();
    assert!(needs_first_observed(&c, false));
    assert!(!needs_first_observed(&c, true));
    c.metadata.annotations = Some(BTreeMap::from([(
        names::CONTROLLER_FIRST_OBSERVED_AT.to_string(),
        "x".to_string(),
    )]));
    assert!(!needs_first_observed(&c, false));
}

#[test]
fn exhausted_adoption_retries_soon() {
    let o = adoption_exhausted();
    assert_eq!(reason_of(&o), reason::ADOPTION_CONFLICT);
    assert!(matches!(
        o,
        Outcome::Unbound {
            requeue: Some(ALREADY_EXISTS_RETRY),
            ..
        }
    ));
}
