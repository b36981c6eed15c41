//! The readiness grace: a member that never gets Ready is replaced after
//! it, unless the scheduler cannot place its Pod; those are held, with a
//! WarmPoolNotProgressing event, and WarmPoolProgressing once they schedule.

mod claim_common;

use std::collections::BTreeMap;
use std::time::Duration;

use claim_common::{eventually, Env, WAIT};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use sandhub_api::k8s::claim::PodMetadata;
use sandhub_api::k8s::conditions::events;
use sandhub_api::k8s::names;
use sandhub_api::k8s::warmpool::{StartFailures, UpdateStrategyType};
use sandhub_api::k8s::SandboxWarmPool;
use serde_json::json;

const FAKE_NODE: &str = "fake-node-0";
const GRACE: [&str; 4] = [
    "--sandbox-warm-pool-readiness-grace-period=2s",
    "--sandbox-warm-pool-unschedulable-recheck-interval=1s",
    "--sandbox-warm-pool-max-batch-size=300",
    "--sandbox-warm-pool-concurrent-workers=1",
];

async fn member_names(env: &Env) -> Vec<String> {
    let hash = names::name_hash("pool");
    let mut v: Vec<String> = env
        .sandboxes()
        .await
        .into_iter()
        .filter(|sb| {
            sb.metadata.deletion_timestamp.is_none()
                && sb.labels().get(names::WARM_POOL_SANDBOX) == Some(&hash)
        })
        .map(|sb| sb.name_any())
        .collect();
    v.sort();
    v
}

async fn has_event(env: &Env, reason: &str) -> bool {
    let evs = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    evs.items
        .iter()
        .any(|e| e.reason.as_deref() == Some(reason))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_readiness_grace_unschedulable() {
    let Some(env) = Env::start("pool-unsched", &GRACE).await else {
        return;
    };
    let key = format!("sandhub.dev/test-{}", env.ns.name());
    let selector = BTreeMap::from([(key.clone(), "yes".to_string())]);
    env.template("tpl", |t| {
        t.blueprint.pod_template.spec.node_selector = Some(selector)
    })
    .await;
    env.pool("pool", "tpl", 2, UpdateStrategyType::OnReplenish)
        .await;
    let first = eventually(WAIT, "two members", || async {
        let m = member_names(&env).await;
        (m.len() == 2).then_some(m)
    })
    .await;
    eventually(WAIT, "WarmPoolNotProgressing", || async {
        has_event(&env, events::WARM_POOL_NOT_PROGRESSING)
            .await
            .then_some(())
    })
    .await;
    // Well past the grace period: held, not replaced.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        member_names(&env).await,
        first,
        "unschedulable members were replaced"
    );
    // Let the scheduler place them: the pool fills and says it progresses.
    let nodes: Api<Node> = Api::all(env.client());
    nodes
        .patch(
            FAKE_NODE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {key.as_str(): "yes"}}})),
        )
        .await
        .unwrap();
    env.pool_ready("pool", 2).await;
    eventually(WAIT, "WarmPoolProgressing", || async {
        has_event(&env, events::WARM_POOL_PROGRESSING)
            .await
            .then_some(())
    })
    .await;
    // (Their names may change now: with a 2 s grace, a member caught
    // between scheduled and Ready is past its grace and rightly replaced.)
    nodes
        .patch(
            FAKE_NODE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {key.as_str(): null}}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_readiness_grace_replaces_stuck_members() {
    let Some(env) = Env::start("pool-stuck", &GRACE).await else {
        return;
    };
    env.template("tpl", |t| {
        t.blueprint.pod_template.metadata = Some(PodMetadata {
            labels: None,
            annotations: Some(BTreeMap::from([(
                "sandhub.dev/fake-node-fail".into(),
                "ImagePullBackOff".into(),
            )])),
        })
    })
    .await;
    env.pool("pool", "tpl", 1, UpdateStrategyType::OnReplenish)
        .await;
    let first = eventually(WAIT, "a member", || async {
        let m = member_names(&env).await;
        (m.len() == 1).then_some(m)
    })
    .await;
    eventually(WAIT, "the stuck member replaced", || async {
        let m = member_names(&env).await;
        (m.len() == 1 && m != first).then_some(())
    })
    .await;
    // Each replacement is a failed warm start, counted on the pool for the
    // hub's `pool_start_failed`, with the member's Ready condition.
    let failures = eventually(WAIT, "start failures on the pool", || async {
        let pool = env.api::<SandboxWarmPool>().get("pool").await.ok()?;
        StartFailures::of(&pool).filter(|f| f.failures >= 1)
    })
    .await;
    assert!(
        failures.last_error.contains(&first[0]) && failures.last_error.contains("not Ready within"),
        "{failures:?}"
    );
    // Counted on and on, never back.
    let more = eventually(WAIT, "a second failure counted", || async {
        let pool = env.api::<SandboxWarmPool>().get("pool").await.ok()?;
        StartFailures::of(&pool).filter(|f| f.failures > failures.failures)
    })
    .await;
    assert!(more.failures > failures.failures);
}
