//! The SandboxWarmPool controller (§2.4): keeps `spec.replicas` Sandboxes of
//! the pool's template ready for claims to adopt.
//!
//! - [`queue`]: the warm candidate index claims take from (pure).
//! - [`plan`]: what a pass deletes and creates (pure).
//! - [`expectations`]: writes the cache has not shown yet (pure).
//! - [`build`]: pool members, secure defaults, ownership helpers (pure).
//! - [`reconcile`]: one pool's pass.

pub mod build;
pub mod expectations;
pub mod plan;
pub mod queue;
pub mod reconcile;

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use sandhub_api::k8s::conditions::launch_type;
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::{Sandbox, SandboxTemplate, SandboxWarmPool};

use crate::context::{cache, shared_cache, Context, SANDBOX_WARM_POOL_CONTROLLER};
use crate::object::controlled_by_kind;
use expectations::Expectations;
use reconcile::PoolCtx;

/// Runs the warm pool controller until the process stops.
pub async fn run(ctx: Arc<Context>) -> anyhow::Result<()> {
    let sandboxes = cache(ctx.watch_api::<Sandbox>(), ctx.watcher_config());
    // Template edits trigger from the store's own stream: a pass must see
    // the edit that woke it, or a Recreate rollout can stall.
    let (templates, template_changes) =
        shared_cache(ctx.watch_api::<SandboxTemplate>(), ctx.watcher_config());
    sandboxes.wait_until_ready().await?;
    templates.wait_until_ready().await?;
    tracing::info!("warm pool controller: caches synced");

    let cx = Arc::new(PoolCtx {
        ctx: ctx.clone(),
        sandboxes,
        templates,
        expectations: Expectations::new(),
        recorder: ctx.recorder(SANDBOX_WARM_POOL_CONTROLLER),
        not_progressing: Default::default(),
        start_failures: Default::default(),
    });
    let controller = Controller::new(ctx.watch_api::<SandboxWarmPool>(), ctx.watcher_config());
    let pools = controller.store();
    let by_sandbox = {
        let pools = pools.clone();
        move |sb: Sandbox| sandbox_to_pools(&pools, &sb)
    };
    let by_template = {
        let pools = pools.clone();
        move |t: Arc<SandboxTemplate>| {
            let ns = t.namespace();
            let name = t.name_any();
            pools
                .state_filter(|p| p.namespace() == ns && p.spec.sandbox_template_ref.name == name)
                .iter()
                .map(|p| ObjectRef::from_obj(&**p))
                .collect::<Vec<_>>()
        }
    };
    controller
        .with_config(Config::default().concurrency(ctx.flags.sandbox_warm_pool_concurrent_workers))
        .watches(ctx.watch_api::<Sandbox>(), ctx.watcher_config(), by_sandbox)
        .watches_shared_stream(template_changes, by_template)
        .run(
            |o, c| {
                crate::trace::reconciled("SandboxWarmPool", &*o.clone(), reconcile::reconcile(o, c))
            },
            reconcile::error_policy,
            cx,
        )
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "warm pool controller");
            }
            futures::future::ready(())
        })
        .await;
    Ok(())
}

/// Pools to requeue when `sb` changes: its controlling pool, the pool its
/// label names (orphans), and, for a member that was just adopted (it has
/// neither any more), the pools of its template, which must replenish.
fn sandbox_to_pools(
    pools: &Store<SandboxWarmPool>,
    sb: &Sandbox,
) -> Vec<ObjectRef<SandboxWarmPool>> {
    let ns = sb.namespace();
    let ns_str = ns.clone().unwrap_or_default();
    if let Some(o) = controlled_by_kind::<SandboxWarmPool>(&sb.metadata) {
        return vec![ObjectRef::new(&o.name).within(&ns_str)];
    }
    let labels = sb.labels();
    if let Some(h) = labels.get(names::WARM_POOL_SANDBOX) {
        return pools
            .state_filter(|p| p.namespace() == ns && name_hash(&p.name_any()) == *h)
            .iter()
            .map(|p| ObjectRef::from_obj(&**p))
            .collect();
    }
    if labels.get(names::LAUNCH_TYPE).map(String::as_str) == Some(launch_type::WARM) {
        if let Some(t) = sb.annotations().get(names::SANDBOX_TEMPLATE_REF_ANNOTATION) {
            return pools
                .state_filter(|p| p.namespace() == ns && p.spec.sandbox_template_ref.name == *t)
                .iter()
                .map(|p| ObjectRef::from_obj(&**p))
                .collect();
        }
    }
    Vec::new()
}
