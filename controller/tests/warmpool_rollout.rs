//! Warm pool rollouts under both update strategies, and scaling through the
//! scale subresource.

mod claim_common;

use std::collections::HashSet;
use std::time::Duration;

use claim_common::{eventually, sandbox_ready, Env, WAIT};
use kube::api::{Patch, PatchParams};
use kube::ResourceExt;
use sandhub_api::k8s::names;
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::{Sandbox, SandboxTemplate, SandboxWarmPool};
use serde_json::json;

/// Names of the pool's live members and their template-hash labels.
async fn members(env: &Env) -> Vec<(String, String)> {
    let hash = names::name_hash("pool");
    let mut v: Vec<(String, String)> = env
        .sandboxes()
        .await
        .into_iter()
        .filter(|sb| {
            sb.metadata.deletion_timestamp.is_none()
                && sb.labels().get(names::WARM_POOL_SANDBOX) == Some(&hash)
        })
        .map(|sb| {
            (
                sb.name_any(),
                sb.labels()
                    .get(names::SANDBOX_TEMPLATE_HASH)
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

async fn change_image(env: &Env, image: &str) {
    env.patch::<SandboxTemplate>(
        "tpl",
        json!({"spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": image}]}}}}),
    )
    .await;
}

async fn relabel(env: &Env) {
    env.patch::<SandboxTemplate>(
        "tpl",
        json!({"spec": {"podTemplate": {"metadata": {"labels": {"sandbox.users.io/rev": "2"}}}}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_rollout_recreate() {
    let Some(env) = Env::start("pool-recreate", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 3, UpdateStrategyType::Recreate)
        .await;
    env.pool_ready("pool", 3).await;
    let before = members(&env).await;
    // A label-only edit never makes members stale.
    relabel(&env).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(members(&env).await, before);
    // A blueprint change replaces every unclaimed member at once.
    change_image(&env, "busybox:1.37").await;
    let old: HashSet<String> = before.iter().map(|(n, _)| n.clone()).collect();
    let after = eventually(WAIT, "all members replaced", || async {
        let m = members(&env).await;
        let fresh = m.len() == 3 && m.iter().all(|(n, _)| !old.contains(n));
        fresh.then_some(m)
    })
    .await;
    assert!(
        after
            .iter()
            .all(|(_, h)| *h != before[0].1 && *h == after[0].1),
        "{after:?}"
    );
    env.pool_ready("pool", 3).await;
    let sb: Sandbox = env.api::<Sandbox>().get(&after[0].0).await.unwrap();
    assert_eq!(
        sb.spec.blueprint.pod_template.spec.containers[0]
            .image
            .as_deref(),
        Some("busybox:1.37")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_rollout_onreplenish() {
    let Some(env) = Env::start("pool-replenish", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 3, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 3).await;
    let before = members(&env).await;
    change_image(&env, "busybox:1.37").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        members(&env).await,
        before,
        "OnReplenish replaced members without a claim"
    );
    // A claim takes one; its replacement is built from the new template.
    env.claim("c1", "pool").await;
    env.claim_ready("c1").await;
    let after = eventually(WAIT, "the claimed member replaced", || async {
        let m = members(&env).await;
        let new: Vec<_> = m
            .iter()
            .filter(|(n, _)| !before.iter().any(|(b, _)| b == n))
            .cloned()
            .collect();
        (m.len() == 3 && new.len() == 1).then_some((m, new))
    })
    .await;
    let (all, new) = after;
    assert_ne!(
        new[0].1, before[0].1,
        "the replacement has the old template hash"
    );
    assert_eq!(all.iter().filter(|(_, h)| *h == before[0].1).count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_scale_subresource() {
    let Some(env) = Env::start("pool-scale", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 1, UpdateStrategyType::OnReplenish)
        .await;
    let p = env.pool_ready("pool", 1).await;
    let status = p.status.unwrap();
    assert_eq!(
        status.selector,
        format!("{}={}", names::WARM_POOL_SANDBOX, names::name_hash("pool"))
    );
    assert_eq!(status.observed_generation, p.metadata.generation);
    let pools = env.api::<SandboxWarmPool>();
    // creationTimestamp has whole seconds: make the first member strictly older.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Up through /scale, as an HPA or `kubectl scale` would.
    pools
        .patch_scale(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    env.pool_ready("pool", 4).await;
    let scale = pools.get_scale("pool").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(4));
    let st = scale.status.unwrap();
    assert_eq!(st.replicas, 4);
    assert_eq!(st.selector.as_deref(), Some(status.selector.as_str()));
    // Down: a non-ready member would go first, then the newest.
    let by_age = {
        let mut m: Vec<Sandbox> = env
            .sandboxes()
            .await
            .into_iter()
            .filter(|sb| sandbox_ready(sb) && sb.metadata.deletion_timestamp.is_none())
            .collect();
        m.sort_by_key(|sb| sb.metadata.creation_timestamp.clone());
        m.into_iter().map(|sb| sb.name_any()).collect::<Vec<_>>()
    };
    pools
        .patch_scale(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    env.pool_ready("pool", 1).await;
    let left = members(&env).await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].0, by_age[0],
        "scale-down kept a newer member over the oldest"
    );
}
