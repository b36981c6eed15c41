//! Refills after claims: `--sandbox-warm-pool-replenish-delay` holds the
//! replacement of an adopted member for that long, and then the pool is
//! whole again.

mod claim_common;

use std::time::{Duration, Instant};

use claim_common::{eventually, Env, WAIT};
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::SandboxWarmPool;

async fn replicas(env: &Env) -> i32 {
    env.api::<SandboxWarmPool>()
        .get("pool")
        .await
        .expect("reading the pool")
        .status
        .map_or(0, |s| s.replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_replenish_delay_holds_the_refill() {
    let Some(env) = Env::start("refill-delay", &["--sandbox-warm-pool-replenish-delay=4s"]).await
    else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 2, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 2).await;

    env.claim("c1", "pool").await;
    env.claim_ready("c1").await;
    let adopted = Instant::now();
    // The pool is one short, and stays so while the delay lasts.
    eventually(WAIT, "the pool counts one member fewer", || async {
        (replicas(&env).await == 1).then_some(())
    })
    .await;
    while adopted.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            replicas(&env).await,
            1,
            "refilled during the replenish delay"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Then it refills.
    env.pool_ready("pool", 2).await;
    assert!(
        adopted.elapsed() >= Duration::from_secs(3),
        "refilled after {:?}",
        adopted.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmpool_refills_after_a_claim_burst_without_any_delay_flag() {
    let Some(env) = Env::start("refill-burst", &[]).await else {
        return;
    };
    env.template("tpl", |_| {}).await;
    env.pool("pool", "tpl", 4, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 4).await;
    for i in 0..4 {
        env.claim(&format!("c{i}"), "pool").await;
    }
    for i in 0..4 {
        env.claim_ready(&format!("c{i}")).await;
    }
    // The claims-first hold is short and capped: the pool is whole soon.
    // Its status may still count the members the claims just took, so the
    // Sandboxes themselves are counted until the four new ones exist.
    eventually(WAIT, "4 claimed and 4 new warm Sandboxes", || async {
        (env.sandboxes().await.len() >= 8).then_some(())
    })
    .await;
    env.pool_ready("pool", 4).await;
    assert_eq!(env.sandboxes().await.len(), 8, "4 claimed + 4 warm");
}

/// `--kube-api-qps` limits the controller's own request rate: a pool of 6
/// (a Sandbox, a Pod and status writes each, plus the watches) cannot fill
/// within a second at 4 requests/s, and still fills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_api_qps_limits_the_request_rate() {
    let Some(env) = Env::start("qps-limit", &["--kube-api-qps=4", "--kube-api-burst=1"]).await
    else {
        return;
    };
    env.template("tpl", |_| {}).await;
    let start = Instant::now();
    env.pool("pool", "tpl", 6, UpdateStrategyType::OnReplenish)
        .await;
    env.pool_ready("pool", 6).await;
    let took = start.elapsed();
    // 6 Sandbox creates + 6 Pod creates + their status writes ≥ 24 requests.
    assert!(
        took >= Duration::from_secs(4),
        "pool filled in {took:?} at 4 requests/s"
    );
}
