//! Claim lifecycle: expiry with each shutdown policy, and suspend with
//! `ttlSecondsAfterFinished: 0` that must not expire the claim (#2079).

mod claim_common;

use std::time::Duration;

use claim_common::{eventually, Env, WAIT};
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use sandhub_api::k8s::claim::{ClaimLifecycle, ClaimShutdownPolicy};
use sandhub_api::k8s::common::PersistentVolumeClaimTemplate;
use sandhub_api::k8s::conditions::{claim as reason, messages, types};
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::{Sandbox, SandboxClaim};
use serde_json::json;

fn expiring(env: &Env, name: &str, policy: ClaimShutdownPolicy, in_secs: i64) -> SandboxClaim {
    let mut c = env.claim_obj(name, "pool");
    c.spec.lifecycle = Some(ClaimLifecycle {
        shutdown_time: Some(Time(
            Timestamp::now()
                .saturating_add(SignedDuration::from_secs(in_secs))
                .unwrap(),
        )),
        ttl_seconds_after_finished: None,
        shutdown_policy: policy,
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_lifecycle_expiry() {
    let Some(env) = Env::start("claim-expiry", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 3, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 3).await;
    for (name, policy) in [
        ("del", ClaimShutdownPolicy::Delete),
        ("fg", ClaimShutdownPolicy::DeleteForeground),
        ("keep", ClaimShutdownPolicy::Retain),
    ] {
        env.create_claim(expiring(&env, name, policy, 4)).await;
    }
    let mut sandbox_of = Vec::new();
    for name in ["del", "fg", "keep"] {
        let c = env.claim_ready(name).await;
        sandbox_of.push(c.status.unwrap().sandbox.unwrap().name);
    }
    let claims = env.api::<SandboxClaim>();
    let sandboxes = env.api::<Sandbox>();
    // Delete and DeleteForeground: the claim goes, and its Sandbox with it.
    for (i, name) in ["del", "fg"].iter().enumerate() {
        let sb = sandbox_of[i].clone();
        eventually(
            WAIT,
            &format!("claim {name} and Sandbox {sb} deleted"),
            || async {
                let gone_claim = claims.get_opt(name).await.ok()?.is_none();
                let gone_sb = sandboxes.get_opt(&sb).await.ok()?.is_none();
                (gone_claim && gone_sb).then_some(())
            },
        )
        .await;
    }
    // Retain: the claim stays, expired; its Sandbox goes.
    let kept = env.claim_reason("keep", reason::CLAIM_EXPIRED).await;
    let ready = kept
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == types::READY)
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        ("False", messages::CLAIM_EXPIRED)
    );
    let sb = sandbox_of[2].clone();
    eventually(WAIT, "retained claim's Sandbox deleted", || async {
        sandboxes.get_opt(&sb).await.ok()?.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        claims.get_opt("keep").await.unwrap().is_some(),
        "a Retain claim must survive its expiry"
    );
}

/// A PV the PVC of this test binds to (the test cluster has no provisioner).
async fn volume(env: &Env, class: &str) -> PersistentVolume {
    let pv = PersistentVolume {
        metadata: kube::api::ObjectMeta {
            name: Some(class.to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            host_path: Some(HostPathVolumeSource {
                path: format!("/tmp/{class}"),
                type_: None,
            }),
            ..Default::default()
        }),
        status: None,
    };
    Api::<PersistentVolume>::all(env.client())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_suspend_with_ttl_zero_survives() {
    let Some(env) = Env::start("claim-suspend", &[]).await else {
        return;
    };
    let class = format!("sandhub-{}", env.ns.name());
    let pv = volume(&env, &class).await;
    let vct = {
        let mut v = PersistentVolumeClaimTemplate::default();
        v.metadata.name = "data".into();
        v.spec = PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        v
    };
    env.template("tpl", |t| {
        t.blueprint.volume_claim_templates = Some(vec![vct])
    })
    .await;
    env.pool("pool", "tpl", 0, UpdateStrategyType::OnReplenish)
        .await;
    let mut c = env.claim_obj("susp", "pool");
    c.spec.lifecycle = Some(ClaimLifecycle {
        shutdown_time: None,
        ttl_seconds_after_finished: Some(0),
        shutdown_policy: ClaimShutdownPolicy::Delete,
    });
    env.create_claim(c).await;
    let c = env.claim_ready("susp").await;
    let sb_name = c.status.unwrap().sandbox.unwrap().name;
    let pvcs = env.api::<PersistentVolumeClaim>();
    let pvc_name = format!("data-{sb_name}");
    assert!(
        pvcs.get_opt(&pvc_name).await.unwrap().is_some(),
        "PVC {pvc_name} missing"
    );

    env.patch::<Sandbox>(&sb_name, json!({"spec": {"operatingMode": "Suspended"}}))
        .await;
    env.claim_until("susp", "not Ready (suspended)", |c| {
        claim_common::ready(c).is_some_and(|(s, _)| s == "False")
    })
    .await;
    // Give a wrongly mirrored Finished every chance to expire the claim.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let claim = env
        .api::<SandboxClaim>()
        .get_opt("susp")
        .await
        .unwrap()
        .expect("the claim was deleted");
    let conds = claim.status.unwrap().conditions;
    assert!(
        !conds
            .iter()
            .any(|c| c.type_ == types::FINISHED && c.status == "True"),
        "a suspended claim reports Finished: {conds:?}"
    );
    assert!(
        !conds.iter().any(|c| c.reason == reason::CLAIM_EXPIRED),
        "{conds:?}"
    );
    assert!(
        env.api::<Sandbox>()
            .get_opt(&sb_name)
            .await
            .unwrap()
            .is_some(),
        "the Sandbox was deleted"
    );
    let pvc = pvcs
        .get_opt(&pvc_name)
        .await
        .unwrap()
        .expect("the PVC was deleted");
    assert!(
        pvc.metadata.deletion_timestamp.is_none(),
        "the PVC is being deleted"
    );
    let pods = env
        .api::<k8s_openapi::api::core::v1::Pod>()
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        pods.items
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "a suspended Sandbox keeps a running Pod"
    );
    // Resume: the same Sandbox runs again, the claim is Ready again.
    env.patch::<Sandbox>(&sb_name, json!({"spec": {"operatingMode": "Running"}}))
        .await;
    let again = env.claim_ready("susp").await;
    assert_eq!(again.status.unwrap().sandbox.unwrap().name, sb_name);
    let client = env.client();
    drop(env);
    let _ = Api::<PersistentVolume>::all(client)
        .delete(&pv.name_any(), &DeleteParams::default())
        .await;
}

/// The claim startup metrics are observed once per claim, when it first
/// becomes Ready, with the Sandbox's launch type and template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_startup_metrics_are_observed_once_per_claim() {
    let Some(env) = Env::start("claim-metrics", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 2, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 2).await;
    env.claim("a", "pool").await;
    env.claim("b", "pool").await;
    env.claim_ready("a").await;
    env.claim_ready("b").await;
    let count = "agent_sandbox_claim_startup_latency_ms_count{launch_type=\"warm\",sandbox_template=\"tpl\"} 2";
    let text = eventually(WAIT, "two warm claim startups observed", || async {
        let t = env.metrics().await;
        t.contains(count).then_some(t)
    })
    .await;
    assert!(
        text.contains("agent_sandbox_claim_controller_startup_latency_ms_count{launch_type=\"warm\",sandbox_template=\"tpl\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("agent_sandbox_claim_creation_total{namespace=\""),
        "{text}"
    );
    // Later passes over the Ready claims observe nothing more.
    env.patch::<SandboxClaim>("a", json!({"metadata": {"labels": {"touched": "yes"}}}))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(env.metrics().await.contains(count));
}
