//! Size: every read and write of one claim pass, in the order its races depend on.
//!
//! One SandboxClaim reconcile (§2.3): expiry, validation, get-or-create
//! (reuse, warm adoption, cold create), then the status.
//!
//! The two races upstream fixed in v1.0.9 are closed here by construction:
//! - duplicates (#2010): adoption first records the Sandbox on the claim under
//!   the claim's resourceVersion, and a cold create re-reads the claim from the
//!   API server first and uses the claim's own name, so a stale cache can
//!   neither adopt twice nor create a second Sandbox;
//! - stuck claims (#1944): a status write that conflicts is retried on a fresh
//!   read instead of dropped, and Sandbox owner changes requeue the claim.
//!
//! What each step means is decided in [`super::plan`]; this file holds the
//! reads and writes, all of them, so that every write of a claim pass (and
//! the order the two races above depend on) reads in one place.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use sandhub_api::k8s::conditions::{claim as reason, events, messages, types};
use sandhub_api::k8s::names;
use sandhub_api::k8s::{
    Sandbox, SandboxClaim, SandboxClaimStatus, SandboxTemplate, SandboxWarmPool,
};
use serde_json::json;

use super::build::adoption_patch;
use super::events::EventQueue;
use super::memo::Memo;
use super::plan::{
    self, unbound, Named, Next, Outcome, Route, ADOPTION_ATTEMPTS, ALREADY_EXISTS_RETRY,
    MISSING_REF_RETRY,
};
use super::status::{bound_status, finished_at, unbound_status};
use super::{latency, lifecycle};
use crate::context::Context;
use crate::error::{is_code, Error};
use crate::object::conditions::find as condition;
use crate::object::{controlled_by_kind, sandbox_ready};
use crate::warmpool::queue::WarmIndex;

/// Recheck interval of a claim whose Sandbox is not Ready yet.
pub const NOT_READY_RECHECK: Duration = Duration::from_millis(500);

pub struct ClaimCtx {
    pub ctx: Arc<Context>,
    pub index: Arc<WarmIndex>,
    pub sandboxes: Store<Sandbox>,
    pub pools: Store<SandboxWarmPool>,
    pub templates: Store<SandboxTemplate>,
    pub events: Option<EventQueue>,
    pub memo: Memo,
}

pub fn error_policy(_claim: Arc<SandboxClaim>, err: &Error, cx: Arc<ClaimCtx>) -> Action {
    cx.ctx
        .metrics
        .inc_reconcile_error("sandboxclaim", err.metric_label());
    match err {
        Error::LostRace(_) => Action::requeue(Duration::from_millis(50)),
        e => {
            tracing::warn!(error = %e, "claim reconcile failed");
            Action::requeue(Duration::from_secs(1))
        }
    }
}

pub async fn reconcile(claim: Arc<SandboxClaim>, cx: Arc<ClaimCtx>) -> Result<Action, Error> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = claim.namespace().unwrap_or_default();
    let claims: Api<SandboxClaim> = Api::namespaced(cx.ctx.client.clone(), &ns);
    let mut claim = cx
        .memo
        .fresher_claim(&claim)
        .unwrap_or_else(|| (*claim).clone());

    let lc = claim.spec.lifecycle.clone().unwrap_or_default();
    let expiry = lifecycle::expiry(
        lc.shutdown_time.as_ref().map(|t| t.0),
        finished_at(claim.status.as_ref()),
        lc.ttl_seconds_after_finished,
    );
    let remaining = lifecycle::remaining(expiry, Timestamp::now());
    if remaining == Some(Duration::ZERO) {
        return expire(&claims, claim, lc.shutdown_policy, &cx).await;
    }

    let mut bound_to = None;
    let (status, requeue) = match get_or_create(&claims, &mut claim, &cx).await? {
        Outcome::Again => return Ok(Action::requeue(Duration::ZERO)),
        Outcome::Bound(sb) => {
            bound_to = Some(latency::Bound::of(&sb));
            let old = claim.status.clone().unwrap_or_default();
            let pending = if sb.status.is_none() {
                reason::SANDBOX_CREATE_PENDING
            } else {
                reason::SANDBOX_NOT_READY
            };
            let st = bound_status(&old, &sb, claim.metadata.generation, pending);
            // The Sandbox cache and the Sandbox trigger are two watches: a
            // trigger can arrive before the cache shows its change. While not
            // Ready, look again soon rather than trust the next trigger.
            let ready = sandbox_ready(&sb);
            (st, (!ready).then_some(NOT_READY_RECHECK))
        }
        Outcome::Unbound {
            reason,
            message,
            requeue,
        } => {
            let old = claim.status.clone().unwrap_or_default();
            (
                unbound_status(&old, reason, &message, claim.metadata.generation),
                requeue,
            )
        }
    };
    if plan::needs_first_observed(&claim, cx.ctx.flags.disable_claim_observability_annotations) {
        let patch = json!({"metadata": {"annotations": {names::CONTROLLER_FIRST_OBSERVED_AT: now_rfc3339()}}});
        claim = claims
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        cx.memo.wrote_claim(&claim);
    }
    let was_ready = latency::ready(claim.status.as_ref());
    let now_ready = latency::ready(Some(&status));
    let newly_bound = plan::recorded_in_status(&claim).is_none() && status.sandbox.is_some();
    if write_status(&claims, claim.clone(), status, &cx.memo).await? {
        if let Some(b) = &bound_to {
            if newly_bound {
                latency::record_bound(&cx.ctx.metrics, &claim, b);
            }
            if now_ready && !was_ready {
                latency::record_ready(&cx.ctx.metrics, &claim, b, Timestamp::now());
            }
        }
    }
    let wait = match (requeue, remaining) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(wait.map_or_else(Action::await_change, Action::requeue))
}

fn now_rfc3339() -> String {
    Timestamp::now().to_string()
}

/// Writes `status` if it differs, under the claim's resourceVersion. On a
/// conflict it re-reads the claim and writes again (#1944: dropping the
/// write left claims Ready=False forever when nothing else requeued them).
async fn write_status(
    claims: &Api<SandboxClaim>,
    mut claim: SandboxClaim,
    status: SandboxClaimStatus,
    memo: &Memo,
) -> Result<bool, Error> {
    for _ in 0..2 {
        if claim.status.as_ref() == Some(&status)
            || (claim.status.is_none() && status == SandboxClaimStatus::default())
        {
            return Ok(false);
        }
        claim.status = Some(status.clone());
        match claims
            .replace_status(&claim.name_any(), &PostParams::default(), &claim)
            .await
        {
            Ok(written) => {
                memo.wrote_claim(&written);
                return Ok(true);
            }
            Err(e) if is_code(&e, 409) => match claims.get_opt(&claim.name_any()).await? {
                Some(fresh) if fresh.uid() == claim.uid() => {
                    memo.forget_claim(&fresh);
                    claim = fresh
                }
                _ => return Ok(false),
            },
            Err(e) if is_code(&e, 404) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::LostRace(format!(
        "status of claim {}",
        claim.name_any()
    )))
}

/// Expiry: Ready=False/ClaimExpired (once, with an event), then Delete or
/// DeleteForeground the claim, or Retain it and delete its Sandbox.
async fn expire(
    claims: &Api<SandboxClaim>,
    claim: SandboxClaim,
    policy: sandhub_api::k8s::claim::ClaimShutdownPolicy,
    cx: &ClaimCtx,
) -> Result<Action, Error> {
    use sandhub_api::k8s::claim::ClaimShutdownPolicy as P;
    let already = claim
        .status
        .as_ref()
        .and_then(|s| condition(&s.conditions, types::READY))
        .is_some_and(|c| c.reason == reason::CLAIM_EXPIRED);
    let name = claim.name_any();
    if !already {
        publish(
            cx,
            &claim,
            EventType::Normal,
            events::CLAIM_EXPIRED,
            "Claim Expired",
            "Claim expired".into(),
        );
        let old = claim.status.clone().unwrap_or_default();
        let st = unbound_status(
            &old,
            reason::CLAIM_EXPIRED,
            messages::CLAIM_EXPIRED,
            claim.metadata.generation,
        );
        write_status(claims, claim.clone(), st, &cx.memo).await?;
    }
    let ignore_404 = |r: Result<(), kube::Error>| match r {
        Err(e) if is_code(&e, 404) => Ok(()),
        other => other,
    };
    // Told once: the delete is asked again only while the claim has no
    // deletionTimestamp yet (a foreground delete keeps it a while).
    if policy != P::Retain && claim.metadata.deletion_timestamp.is_none() {
        publish(
            cx,
            &claim,
            EventType::Normal,
            events::CLAIM_EXPIRED,
            "Deleting",
            format!("Deleting Claim (ShutdownPolicy={})", policy_name(&policy)),
        );
    }
    match policy {
        P::Delete => ignore_404(
            claims
                .delete(&name, &DeleteParams::background())
                .await
                .map(|_| ()),
        )?,
        P::DeleteForeground => {
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                ..Default::default()
            };
            ignore_404(claims.delete(&name, &dp).await.map(|_| ()))?
        }
        P::Retain => {
            let sandboxes: Api<Sandbox> = Api::namespaced(
                cx.ctx.client.clone(),
                &claim.namespace().unwrap_or_default(),
            );
            let owned = sandboxes_of(&claim, cx)
                .into_iter()
                .filter(|sb| sb.metadata.deletion_timestamp.is_none());
            for sb in owned {
                ignore_404(
                    sandboxes
                        .delete(&sb.name_any(), &DeleteParams::background())
                        .await
                        .map(|_| ()),
                )?;
            }
        }
    }
    Ok(Action::await_change())
}

/// Sandboxes the cache shows controlled by `claim`.
fn sandboxes_of(claim: &SandboxClaim, cx: &ClaimCtx) -> Vec<Arc<Sandbox>> {
    let uid = claim.uid();
    let ns = claim.namespace();
    cx.sandboxes.state_filter(|sb| {
        sb.namespace() == ns
            && controlled_by_kind::<SandboxClaim>(&sb.metadata)
                .is_some_and(|o| Some(&o.uid) == uid.as_ref())
    })
}

/// The Sandbox named `name`: the cache first, the API server when the cache
/// has not seen it yet.
async fn lookup(
    api: &Api<Sandbox>,
    cx: &ClaimCtx,
    claim: &SandboxClaim,
    name: &str,
) -> Result<Option<Sandbox>, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let cached = cx.sandboxes.get(&ObjectRef::new(name).within(&ns));
    if let Some(sb) = &cached {
        if plan::owned_by(sb, claim) {
            return Ok(Some((**sb).clone()));
        }
    }
    // The cache may not show our own adoption or create yet.
    if let Some(mine) = cx
        .memo
        .sandbox_of(&ns, name, claim.uid().as_deref().unwrap_or_default())
    {
        return Ok(Some(mine));
    }
    match cached {
        Some(sb) => Ok(Some((*sb).clone())),
        None => Ok(api.get_opt(name).await?),
    }
}

/// Finds or makes the claim's Sandbox: each step reads, asks [`plan`] what
/// the objects mean, and applies the answer.
async fn get_or_create(
    claims: &Api<SandboxClaim>,
    claim: &mut SandboxClaim,
    cx: &ClaimCtx,
) -> Result<Outcome, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let sandboxes: Api<Sandbox> = Api::namespaced(cx.ctx.client.clone(), &ns);

    // 1. A Sandbox the claim already names.
    if let (Some(name), from_status) = plan::recorded(claim) {
        let found = lookup(&sandboxes, cx, claim, &name).await?;
        return match plan::decide_named(claim, &name, from_status, found) {
            Named::Bound(sb) => Ok(Outcome::Bound(sb)),
            Named::Missing(outcome) => Ok(outcome),
            Named::FinishAdoption(sb) => finish_adoption(&sandboxes, claim, &sb, cx).await,
            Named::Forget => forget_name(claims, claim, cx).await,
        };
    }

    // 2. A cold Sandbox (named like the claim) from an earlier pass.
    // The cache only: a miss costs nothing here, as a create of an existing
    // name fails with AlreadyExists below.
    let memo = cx.memo.sandbox_of(
        &ns,
        &claim.name_any(),
        claim.uid().as_deref().unwrap_or_default(),
    );
    let cached = cx
        .sandboxes
        .get(&ObjectRef::new(&claim.name_any()).within(&ns));
    if let Some(outcome) = plan::decide_earlier(claim, memo, cached.as_deref()) {
        return Ok(outcome);
    }

    // 3. Pool and template.
    let (pool, template) = match resolve_refs(claim, cx).await? {
        Ok(found) => found,
        Err(outcome) => return Ok(outcome),
    };

    // 4. The claim's extra Pod metadata; 5. warm adoption, unless the claim
    // changes the blueprint.
    match plan::decide_route(claim, &template, &cx.ctx.shared.allowed_label_domains()) {
        Route::Refuse(outcome) => return Ok(outcome),
        Route::Cold => {}
        Route::Warm => {
            if let Some(outcome) =
                adopt_warm(claims, &sandboxes, claim, &pool, &template, cx).await?
            {
                return Ok(outcome);
            }
        }
    }

    // 6. Cold create.
    let sb = match plan::decide_cold(claim, &template, cx.ctx.sandboxd_tokens.as_ref()) {
        Ok(sb) => sb,
        Err(outcome) => return Ok(outcome),
    };
    create_cold(claims, &sandboxes, claim, sb, cx).await
}

/// Finishes an adoption that stopped between its two writes.
async fn finish_adoption(
    sandboxes: &Api<Sandbox>,
    claim: &SandboxClaim,
    sb: &Sandbox,
    cx: &ClaimCtx,
) -> Result<Outcome, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let name = sb.name_any();
    let Some((_, template)) = resolve_refs(claim, cx).await?.ok() else {
        return Ok(Outcome::Again);
    };
    let patch = adoption_patch(sb, claim, &template);
    match sandboxes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(sb) => {
            cx.memo.wrote_sandbox(&sb);
            cx.index.adopted(&ns, &claim.spec.warm_pool_ref.name, &name);
            publish(
                cx,
                claim,
                EventType::Normal,
                events::SANDBOX_ADOPTED,
                "Adoption",
                format!("Adopted warm pool Sandbox {name:?}"),
            );
            Ok(Outcome::Bound(Box::new(sb)))
        }
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => Ok(Outcome::Again),
        Err(e) => Err(e.into()),
    }
}

/// Removes the `sandbox-name` annotation of a Sandbox the claim did not get.
async fn forget_name(
    claims: &Api<SandboxClaim>,
    claim: &SandboxClaim,
    cx: &ClaimCtx,
) -> Result<Outcome, Error> {
    patch_claim(claims, claim, &plan::forget_patch(claim), cx).await?;
    Ok(Outcome::Again)
}

/// A merge patch of the claim, guarded by the resourceVersion the patch
/// names. `None`: it lost a race (409) or the claim is gone (404), and the
/// memo forgets the claim so the next pass reads it afresh.
async fn patch_claim(
    claims: &Api<SandboxClaim>,
    claim: &SandboxClaim,
    patch: &serde_json::Value,
    cx: &ClaimCtx,
) -> Result<Option<SandboxClaim>, kube::Error> {
    match claims
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(updated) => {
            cx.memo.wrote_claim(&updated);
            Ok(Some(updated))
        }
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => {
            cx.memo.forget_claim(claim);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Creates the claim's cold Sandbox.
async fn create_cold(
    claims: &Api<SandboxClaim>,
    sandboxes: &Api<Sandbox>,
    claim: &mut SandboxClaim,
    sb: Sandbox,
    cx: &ClaimCtx,
) -> Result<Outcome, Error> {
    // #2010: the cache may not show a Sandbox this claim already got; the
    // API server does.
    match claims.get_opt(&claim.name_any()).await? {
        Some(fresh) if fresh.uid() == claim.uid() => {
            if plan::recorded(&fresh).0.is_some() {
                return Ok(Outcome::Again);
            }
            *claim = fresh;
        }
        _ => return Ok(Outcome::Again),
    }
    match sandboxes.create(&PostParams::default(), &sb).await {
        Ok(sb) => {
            cx.memo.wrote_sandbox(&sb);
            publish(
                cx,
                claim,
                EventType::Normal,
                events::SANDBOX_PROVISIONED,
                "Provisioning",
                format!("Created Sandbox {:?}", sb.name_any()),
            );
            Ok(Outcome::Bound(Box::new(sb)))
        }
        Err(e) if is_code(&e, 409) => Ok(unbound(
            reason::SANDBOX_CREATE_PENDING,
            "Sandbox is being created",
            Some(ALREADY_EXISTS_RETRY),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The claim's pool and the pool's template, from the caches or (on a miss,
/// which may be cache lag) the API server.
async fn resolve_refs(
    claim: &SandboxClaim,
    cx: &ClaimCtx,
) -> Result<Result<(SandboxWarmPool, SandboxTemplate), Outcome>, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let client = &cx.ctx.client;
    let pool_name = &claim.spec.warm_pool_ref.name;
    let Some(pool) = cached_or_get(&cx.pools, client, &ns, pool_name).await? else {
        return Ok(Err(unbound(
            reason::WARM_POOL_NOT_FOUND,
            messages::warm_pool_not_found(pool_name),
            Some(MISSING_REF_RETRY),
        )));
    };
    let tpl_name = &pool.spec.sandbox_template_ref.name;
    let Some(template) = cached_or_get(&cx.templates, client, &ns, tpl_name).await? else {
        return Ok(Err(unbound(
            reason::TEMPLATE_NOT_FOUND,
            format!("SandboxTemplate {tpl_name:?} not found"),
            Some(MISSING_REF_RETRY),
        )));
    };
    Ok(Ok((pool, template)))
}

/// `ns/name` from the cache, or from the API server when the cache has not seen it (yet).
async fn cached_or_get<K>(
    cache: &Store<K>,
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Option<K>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    if let Some(k) = cache.get(&ObjectRef::new(name).within(ns)) {
        return Ok(Some((*k).clone()));
    }
    Ok(Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

/// Takes a warm member for `claim`. `None`: nothing to adopt, create cold.
async fn adopt_warm(
    claims: &Api<SandboxClaim>,
    sandboxes: &Api<Sandbox>,
    claim: &mut SandboxClaim,
    pool: &SandboxWarmPool,
    template: &SandboxTemplate,
    cx: &ClaimCtx,
) -> Result<Option<Outcome>, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let accept = plan::acceptable(pool, template);
    for _ in 0..ADOPTION_ATTEMPTS {
        let take = cx.index.take(&ns, &pool_name, &accept);
        let cand = match plan::decide_take(take, plan::claim_age(claim, Timestamp::now())) {
            Next::Adopt(c) => c,
            Next::Wait(outcome) => return Ok(Some(outcome)),
            Next::Cold => return Ok(None),
        };
        // First write: the claim names its Sandbox, under the claim's
        // resourceVersion. A claim read from a stale cache fails here.
        let first_observed =
            plan::needs_first_observed(claim, cx.ctx.flags.disable_claim_observability_annotations)
                // Folded into this write: one round trip less on the warm path.
                .then(now_rfc3339);
        let patch = plan::naming_patch(claim, &cand.name, first_observed);
        match patch_claim(claims, claim, &patch, cx).await {
            Ok(Some(updated)) => *claim = updated,
            Ok(None) => {
                cx.index.release(&ns, &pool_name, &cand.name);
                return Ok(Some(Outcome::Again));
            }
            Err(e) => {
                cx.index.release(&ns, &pool_name, &cand.name);
                return Err(e.into());
            }
        }
        // Second write: the Sandbox changes hands, under its resourceVersion.
        let Some(sb) = lookup(sandboxes, cx, claim, &cand.name).await? else {
            cx.index.adopted(&ns, &pool_name, &cand.name);
            continue;
        };
        if let Some(adopted) = take_over(sandboxes, claim, sb, &pool_name, template, cx).await? {
            cx.ctx
                .refill
                .adopted(&format!("{ns}/{pool_name}"), std::time::Instant::now());
            publish(
                cx,
                claim,
                EventType::Normal,
                events::SANDBOX_ADOPTED,
                "Adoption",
                format!("Adopted warm pool Sandbox {:?}", cand.name),
            );
            return Ok(Some(Outcome::Bound(Box::new(adopted))));
        }
        // Lost this one (adopted elsewhere, deleted): the next candidate's
        // annotation write replaces the name.
        cx.index.adopted(&ns, &pool_name, &cand.name);
    }
    Ok(Some(plan::adoption_exhausted()))
}

/// The adoption's second write, retried once on a fresh read after a
/// conflict. `None`: the member is no longer the pool's to give.
async fn take_over(
    sandboxes: &Api<Sandbox>,
    claim: &SandboxClaim,
    mut sb: Sandbox,
    pool_name: &str,
    template: &SandboxTemplate,
    cx: &ClaimCtx,
) -> Result<Option<Sandbox>, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let name = sb.name_any();
    for retry in 0..2 {
        if !plan::in_pool(&sb, pool_name) {
            break;
        }
        let patch = adoption_patch(&sb, claim, template);
        match sandboxes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(adopted) => {
                cx.memo.wrote_sandbox(&adopted);
                cx.index.adopted(&ns, pool_name, &name);
                return Ok(Some(adopted));
            }
            Err(e) if is_code(&e, 409) && retry == 0 => match sandboxes.get_opt(&name).await? {
                Some(fresh) => sb = fresh,
                None => break,
            },
            Err(e) if is_code(&e, 409) || is_code(&e, 404) => break,
            Err(e) => {
                cx.index.release(&ns, pool_name, &name);
                return Err(e.into());
            }
        }
    }
    Ok(None)
}

/// Queues an event about `claim` (see [`super::events`]); `reason`,
/// `action` and `note` are upstream's words.
fn publish(
    cx: &ClaimCtx,
    claim: &SandboxClaim,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let Some(events) = &cx.events else {
        return;
    };
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    events.send(ev, claim.object_ref(&()));
}

/// A shutdown policy as the API spells it (upstream's event note names it).
fn policy_name(p: &sandhub_api::k8s::claim::ClaimShutdownPolicy) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
