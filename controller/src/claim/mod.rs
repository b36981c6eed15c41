//! The SandboxClaim controller (§2.3): hands each claim one Sandbox, adopted
//! warm from its pool or created cold, and mirrors that Sandbox's state.
//!
//! - [`index`]: the Sandbox watch that feeds the warm candidate index.
//! - [`reconcile`]: one claim's pass (expiry, validation, get-or-create, status):
//!   it reads, asks [`plan`], and applies the answer.
//! - [`plan`]: what a pass decides, as pure functions (unit-tested without a cluster).
//! - [`build`]: the cold Sandbox and the adoption patch (pure).
//! - [`events`]: the background event publisher.
//! - [`latency`]: the claim startup metrics, once per claim.
//! - [`memo`]: our last writes, for passes that run ahead of the caches.
//! - [`status`], [`lifecycle`], [`metadata`], [`inject`]: pure rules.

pub mod build;
pub mod events;
pub mod index;
pub mod inject;
pub mod latency;
pub mod lifecycle;
pub mod memo;
pub mod metadata;
pub mod plan;
pub mod reconcile;
pub mod status;

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::ResourceExt;
use sandhub_api::k8s::names;
use sandhub_api::k8s::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};

use crate::context::{cache, Context, SANDBOX_CLAIM_CONTROLLER};
use crate::object::controlled_by_kind;
use crate::warmpool::queue::WarmIndex;
use reconcile::ClaimCtx;

/// Runs the claim controller until the process stops.
pub async fn run(ctx: Arc<Context>) -> anyhow::Result<()> {
    let index = Arc::new(WarmIndex::new());
    let (sandboxes, writer) = reflector::store();
    tokio::spawn(index::feed(
        ctx.watch_api::<Sandbox>(),
        ctx.watcher_config(),
        index.clone(),
        writer,
    ));
    let pools = cache(ctx.watch_api::<SandboxWarmPool>(), ctx.watcher_config());
    let templates = cache(ctx.watch_api::<SandboxTemplate>(), ctx.watcher_config());
    // Claims must not start before the index is filled: an empty index
    // sends every claim of a restart burst down the cold path.
    sandboxes.wait_until_ready().await?;
    pools.wait_until_ready().await?;
    templates.wait_until_ready().await?;
    tracing::info!("claim controller: caches synced");

    let events = (!ctx.flags.disable_claim_events)
        .then(|| events::EventQueue::start(ctx.recorder(SANDBOX_CLAIM_CONTROLLER)));
    let workers = ctx.flags.sandbox_claim_concurrent_workers;
    let cx = Arc::new(ClaimCtx {
        ctx: ctx.clone(),
        index,
        sandboxes,
        pools: pools.clone(),
        templates,
        events,
        memo: Default::default(),
    });

    let controller = Controller::new(ctx.watch_api::<SandboxClaim>(), ctx.watcher_config());
    let claims = controller.store();
    let by_sandbox = {
        let claims = claims.clone();
        move |sb: Sandbox| sandbox_to_claims(&claims, &sb)
    };
    let by_pool = {
        let claims = claims.clone();
        move |pool: SandboxWarmPool| {
            let ns = pool.namespace();
            let name = pool.name_any();
            waiting_claims(&claims, |c| {
                c.namespace() == ns && c.spec.warm_pool_ref.name == name
            })
        }
    };
    let by_template = {
        let claims = claims.clone();
        move |t: SandboxTemplate| {
            let ns = t.namespace();
            let name = t.name_any();
            let pool_names: Vec<String> = pools
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && p.spec.sandbox_template_ref.name == name)
                .map(|p| p.name_any())
                .collect();
            waiting_claims(&claims, |c| {
                c.namespace() == ns && pool_names.contains(&c.spec.warm_pool_ref.name)
            })
        }
    };
    controller
        .with_config(Config::default().concurrency(workers))
        .watches(ctx.watch_api::<Sandbox>(), ctx.watcher_config(), by_sandbox)
        .watches(
            ctx.watch_api::<SandboxWarmPool>(),
            ctx.watcher_config(),
            by_pool,
        )
        .watches(
            ctx.watch_api::<SandboxTemplate>(),
            ctx.watcher_config(),
            by_template,
        )
        .run(
            |o, c| {
                crate::trace::reconciled("SandboxClaim", &*o.clone(), reconcile::reconcile(o, c))
            },
            reconcile::error_policy,
            cx,
        )
        .for_each(|res| {
            if let Err(e) = res {
                tracing::debug!(error = %e, "claim controller");
            }
            futures::future::ready(())
        })
        .await;
    Ok(())
}

/// Claims to requeue when `sb` changes (#1944: an owner change must reach the
/// claim even when the claim's own watch saw nothing): its controlling claim,
/// the claim whose UID its label carries, claims whose annotation names it,
/// and a claim of the same name (a cold Sandbox the cache had not seen).
fn sandbox_to_claims(claims: &Store<SandboxClaim>, sb: &Sandbox) -> Vec<ObjectRef<SandboxClaim>> {
    let ns = sb.namespace();
    let ns_str = ns.clone().unwrap_or_default();
    let name = sb.name_any();
    let mut out = vec![ObjectRef::new(&name).within(&ns_str)];
    if let Some(o) = controlled_by_kind::<SandboxClaim>(&sb.metadata) {
        out.push(ObjectRef::new(&o.name).within(&ns_str));
    }
    let uid = sb.labels().get(names::CLAIM_UID);
    for c in claims.state_filter(|c| {
        c.namespace() == ns
            && ((uid.is_some() && c.uid().as_ref() == uid)
                || c.annotations().get(names::SANDBOX_NAME_ANNOTATION) == Some(&name))
    }) {
        out.push(ObjectRef::from_obj(&*c));
    }
    out
}

/// Claims matching `pred` that have no Sandbox yet.
fn waiting_claims(
    claims: &Store<SandboxClaim>,
    pred: impl Fn(&SandboxClaim) -> bool,
) -> Vec<ObjectRef<SandboxClaim>> {
    claims
        .state_filter(|c| {
            pred(c)
                && c.status
                    .as_ref()
                    .and_then(|s| s.sandbox.as_ref())
                    .is_none_or(|s| s.name.is_empty())
        })
        .iter()
        .map(|c| ObjectRef::from_obj(&**c))
        .collect()
}
