//! The Kubernetes Events the controller records on claims, as upstream
//! records them (reason, action, note, type, reporting controller), once
//! per transition: a claim reconciled again and again gets no more.

mod claim_common;

use std::time::Duration;

use claim_common::{eventually, Env, WAIT};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, Patch, PatchParams};
use sandhub_api::k8s::claim::{ClaimEnvVar, ClaimLifecycle, ClaimShutdownPolicy};
use sandhub_api::k8s::conditions::events;
use sandhub_api::k8s::template::InjectionPolicy;
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::SandboxClaim;

/// The Events regarding claim `name`: (reason, action, note, type, controller).
async fn events_of(env: &Env, name: &str) -> Vec<(String, String, String, String, String)> {
    let mut out: Vec<_> = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("SandboxClaim") && r.name.as_deref() == Some(name)
            })
        })
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.action.unwrap_or_default(),
                e.note.unwrap_or_default(),
                e.type_.unwrap_or_default(),
                e.reporting_controller.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_get_upstreams_events_once_per_transition() {
    let Some(env) = Env::start("claim-events", &[]).await else {
        return;
    };
    // Env injection allowed: a claim with env starts cold.
    env.template("tpl", |t| {
        t.env_vars_injection_policy = InjectionPolicy::Allowed;
    })
    .await;
    env.pool("pool", "tpl", 1, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 1).await;

    // Warm: adopted from the pool.
    env.claim("warm", "pool").await;
    let warm = env.claim_ready("warm").await;
    let adopted = warm.status.unwrap().sandbox.unwrap().name;
    // Cold: a claim with env skips the pool.
    let mut cold = env.claim_obj("cold", "pool");
    cold.spec.env = Some(vec![ClaimEnvVar {
        name: "A".into(),
        value: "1".into(),
        container_name: None,
    }]);
    env.create_claim(cold).await;
    env.claim_ready("cold").await;

    let want_warm = vec![(
        events::SANDBOX_ADOPTED.to_string(),
        "Adoption".to_string(),
        format!("Adopted warm pool Sandbox {adopted:?}"),
        "Normal".to_string(),
        "sandboxclaim-controller".to_string(),
    )];
    let want_cold = vec![(
        events::SANDBOX_PROVISIONED.to_string(),
        "Provisioning".to_string(),
        "Created Sandbox \"cold\"".to_string(),
        "Normal".to_string(),
        "sandboxclaim-controller".to_string(),
    )];
    eventually(WAIT, "the adoption and provisioning events", || async {
        (events_of(&env, "warm").await == want_warm && events_of(&env, "cold").await == want_cold)
            .then_some(())
    })
    .await;

    // Reconciled again and again (each label change is a new generation
    // of metadata the controller sees): no new Event.
    let claims = env.api::<SandboxClaim>();
    for i in 0..5 {
        let patch = serde_json::json!({"metadata": {"labels": {"poke": i.to_string()}}});
        claims
            .patch("warm", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(events_of(&env, "warm").await, want_warm);

    // Expiry with policy Delete: "Claim Expired", then "Deleting", once each.
    let mut expiring = env.claim_obj("exp", "pool");
    expiring.spec.env = Some(vec![ClaimEnvVar {
        name: "A".into(),
        value: "1".into(),
        container_name: None,
    }]);
    expiring.spec.lifecycle = Some(ClaimLifecycle {
        shutdown_time: Some(Time(
            Timestamp::now()
                .saturating_add(SignedDuration::from_secs(3))
                .unwrap(),
        )),
        ttl_seconds_after_finished: None,
        shutdown_policy: ClaimShutdownPolicy::Delete,
    });
    env.create_claim(expiring).await;
    eventually(WAIT, "claim exp deleted at its shutdown time", || async {
        claims.get_opt("exp").await.ok()?.is_none().then_some(())
    })
    .await;
    let expired = |action: &str, note: &str| {
        (
            events::CLAIM_EXPIRED.to_string(),
            action.to_string(),
            note.to_string(),
            "Normal".to_string(),
            "sandboxclaim-controller".to_string(),
        )
    };
    let mut want = vec![
        expired("Claim Expired", "Claim expired"),
        expired("Deleting", "Deleting Claim (ShutdownPolicy=Delete)"),
    ];
    want.sort();
    eventually(WAIT, "the expiry events", || async {
        let got: Vec<_> = events_of(&env, "exp")
            .await
            .into_iter()
            .filter(|e| e.0 == events::CLAIM_EXPIRED)
            .collect();
        (got == want).then_some(())
    })
    .await;
}
