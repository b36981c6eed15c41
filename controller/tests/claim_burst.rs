//! A burst of concurrent claims on a warm pool: every claim ends Ready with
//! exactly one Sandbox, and no Sandbox belongs to two claims (upstream #2010,
//! #1944) — also when the controller is killed in the middle of the burst.

mod claim_common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use claim_common::{owned_by_claim, ready_true, Env};
use futures::future::join_all;
use kube::api::ListParams;
use kube::ResourceExt;
use sandhub_api::k8s::names;
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::SandboxClaim;

const BURST: usize = 40;

/// Every claim Ready and bound to a Sandbox it controls; every claim-owned
/// Sandbox owned by exactly one live claim and named by it; no claim owning two.
async fn assert_one_sandbox_per_claim(env: &Env, n: usize) {
    let claims: Vec<SandboxClaim> = env
        .api::<SandboxClaim>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(claims.len(), n);
    let sandboxes = env.sandboxes().await;
    let mut bound = HashSet::new();
    for c in &claims {
        assert!(
            ready_true(c),
            "claim {} not Ready: {:?}",
            c.name_any(),
            c.status
        );
        let owned = owned_by_claim(&sandboxes, &c.uid().unwrap());
        assert_eq!(
            owned.len(),
            1,
            "claim {} controls {} Sandboxes: {:?}",
            c.name_any(),
            owned.len(),
            owned.iter().map(|s| s.name_any()).collect::<Vec<_>>()
        );
        let name = &c.status.as_ref().unwrap().sandbox.as_ref().unwrap().name;
        assert_eq!(
            &owned[0].name_any(),
            name,
            "claim {} status names another Sandbox",
            c.name_any()
        );
        assert_eq!(owned[0].labels().get(names::CLAIM_UID), c.uid().as_ref());
        assert!(
            bound.insert(name.clone()),
            "Sandbox {name} is bound by two claims"
        );
    }
    // Orphans: Sandboxes that no pool and no live claim controls.
    let claim_uids: HashSet<String> = claims.iter().filter_map(|c| c.uid()).collect();
    let orphans: Vec<String> = sandboxes
        .iter()
        .filter(|sb| {
            !sb.owner_references().iter().any(|o| {
                o.controller == Some(true)
                    && (o.kind == "SandboxWarmPool" || claim_uids.contains(&o.uid))
            })
        })
        .map(|sb| sb.name_any())
        .collect();
    assert!(orphans.is_empty(), "orphaned Sandboxes: {orphans:?}");
}

async fn warm_pool(env: &Env, n: i32) {
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", n, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_warm_burst_no_duplicates() {
    let Some(env) = Env::start("claim-burst", &[]).await else {
        return;
    };
    warm_pool(&env, BURST as i32).await;
    let names: Vec<String> = (0..BURST).map(|i| format!("burst-{i}")).collect();
    join_all(names.iter().map(|n| env.claim(n, "pool"))).await;
    for n in &names {
        env.claim_ready(n).await;
    }
    assert_one_sandbox_per_claim(&env, BURST).await;
    // Each claim took a warm member: the burst fit the pool exactly.
    let sandboxes = env.sandboxes().await;
    let launch: HashMap<String, usize> = sandboxes
        .iter()
        .filter(|sb| sb.labels().contains_key(names::CLAIM_UID))
        .fold(HashMap::new(), |mut m, sb| {
            *m.entry(
                sb.labels()
                    .get(names::LAUNCH_TYPE)
                    .cloned()
                    .unwrap_or_default(),
            )
            .or_default() += 1;
            m
        });
    assert_eq!(launch.get("warm"), Some(&BURST), "launch types: {launch:?}");
    // The pool replenishes to its size with fresh members.
    env.pool_ready("pool", BURST as i32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_burst_controller_restart_no_duplicates_no_orphans_no_stuck() {
    let Some(mut env) = Env::start("claim-restart", &[]).await else {
        return;
    };
    warm_pool(&env, BURST as i32).await;
    let names: Vec<String> = (0..BURST).map(|i| format!("restart-{i}")).collect();
    let (first, second) = names.split_at(BURST / 2);
    // Kill -9 right after the first half arrives, while it is being handled:
    // some claims then have their annotation but not their Sandbox, some
    // nothing, some everything. The second half arrives while it is down.
    join_all(first.iter().map(|n| env.claim(n, "pool"))).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    env.kill_controller();
    join_all(second.iter().map(|n| env.claim(n, "pool"))).await;
    let bound_before = env
        .api::<SandboxClaim>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| ready_true(c))
        .count();
    eprintln!("{bound_before}/{BURST} claims Ready when the controller was killed");
    env.start_controller();
    for n in &names {
        env.claim_ready(n).await;
    }
    assert_one_sandbox_per_claim(&env, BURST).await;
    // And nothing changes afterwards: no late duplicate appears.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_one_sandbox_per_claim(&env, BURST).await;
    // Not asserted here: the pool refilling to its size after the restart.
    // claim_warm_burst_no_duplicates pins refilling without a restart; after
    // a mid-burst kill it once took longer than 90 s under the full suite's
    // load (see the issue note), which is a lead to chase, not this test's
    // contract.
}
