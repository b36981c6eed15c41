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
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::{
    Sandbox, SandboxClaim, SandboxClaimStatus, SandboxTemplate, SandboxWarmPool,
};
use serde_json::json;

use super::build::{adoption_patch, cold_sandbox, BuildError};
use super::events::EventQueue;
use super::memo::Memo;
use super::status::{bound_status, finished_at, unbound_status};
use super::{latency, lifecycle, metadata};
use crate::context::Context;
use crate::warmpool::build::{controlled_by_kind, template_hash};
use crate::warmpool::plan::is_stale;
use crate::warmpool::queue::{Take, WarmIndex};

/// How long a claim waits for a pending (IP-less) warm candidate, counted
/// from its creation, before it starts cold.
pub const PENDING_WAIT: Duration = Duration::from_secs(2);
/// How often it looks again meanwhile (upstream v1.0.0 tuned 500 ms to 100 ms).
pub const PENDING_RETRY: Duration = Duration::from_millis(100);
/// Requeue after a create hit AlreadyExists: the cache lags the API server.
pub const ALREADY_EXISTS_RETRY: Duration = Duration::from_millis(200);
/// Requeue while the pool or its template is missing (their watches also requeue).
pub const MISSING_REF_RETRY: Duration = Duration::from_secs(60);
/// Recheck interval of a claim whose Sandbox is not Ready yet.
pub const NOT_READY_RECHECK: Duration = Duration::from_millis(500);
/// Warm candidates tried per reconcile before giving up with AdoptionConflict.
pub const ADOPTION_ATTEMPTS: usize = 3;

pub struct ClaimCtx {
    pub ctx: Arc<Context>,
    pub index: Arc<WarmIndex>,
    pub sandboxes: Store<Sandbox>,
    pub pools: Store<SandboxWarmPool>,
    pub templates: Store<SandboxTemplate>,
    pub events: Option<EventQueue>,
    pub memo: Memo,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A write lost an optimistic-lock race twice in a row; retried soon.
    #[error("conflict: {0}")]
    Conflict(String),
}

pub fn error_policy(_claim: Arc<SandboxClaim>, err: &Error, _cx: Arc<ClaimCtx>) -> Action {
    match err {
        Error::Conflict(_) => Action::requeue(Duration::from_millis(50)),
        Error::Kube(e) => {
            tracing::warn!(error = %e, "claim reconcile failed");
            Action::requeue(Duration::from_secs(1))
        }
    }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// What get-or-create found.
enum Outcome {
    Bound(Box<Sandbox>),
    Unbound {
        reason: &'static str,
        message: String,
        requeue: Option<Duration>,
    },
    /// Something changed under us (the fresh claim already names a Sandbox):
    /// reconcile again right away from the new state, writing nothing now.
    Again,
}

fn unbound(reason: &'static str, message: impl Into<String>, requeue: Option<Duration>) -> Outcome {
    Outcome::Unbound {
        reason,
        message: message.into(),
        requeue,
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
            let ready = crate::warmpool::build::sandbox_ready(&sb);
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
    if !cx.ctx.flags.disable_claim_observability_annotations
        && !claim
            .annotations()
            .contains_key(names::CONTROLLER_FIRST_OBSERVED_AT)
    {
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
    let newly_bound = recorded_in_status(&claim).is_none() && status.sandbox.is_some();
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
    Err(Error::Conflict(format!(
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
        .and_then(|s| crate::warmpool::build::condition(&s.conditions, types::READY))
        .is_some_and(|c| c.reason == reason::CLAIM_EXPIRED);
    let name = claim.name_any();
    if !already {
        publish(
            cx,
            &claim,
            EventType::Normal,
            events::CLAIM_EXPIRED,
            messages::CLAIM_EXPIRED.into(),
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

fn owned_by(sb: &Sandbox, claim: &SandboxClaim) -> bool {
    controlled_by_kind::<SandboxClaim>(&sb.metadata)
        .is_some_and(|o| Some(&o.uid) == claim.uid().as_ref())
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
        if owned_by(sb, claim) {
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

fn recorded_in_status(claim: &SandboxClaim) -> Option<&str> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.sandbox.as_ref())
        .map(|s| s.name.as_str())
        .filter(|n| !n.is_empty())
}

/// The claim's recorded Sandbox: `status.sandbox.name`, else the
/// `sandbox-name` annotation an adoption writes first.
fn recorded(claim: &SandboxClaim) -> (Option<String>, bool) {
    match recorded_in_status(claim) {
        Some(n) => (Some(n.to_string()), true),
        None => (
            claim
                .annotations()
                .get(names::SANDBOX_NAME_ANNOTATION)
                .cloned(),
            false,
        ),
    }
}

async fn get_or_create(
    claims: &Api<SandboxClaim>,
    claim: &mut SandboxClaim,
    cx: &ClaimCtx,
) -> Result<Outcome, Error> {
    let ns = claim.namespace().unwrap_or_default();
    let sandboxes: Api<Sandbox> = Api::namespaced(cx.ctx.client.clone(), &ns);

    // 1. A Sandbox the claim already names.
    if let (Some(name), from_status) = recorded(claim) {
        match lookup(&sandboxes, cx, claim, &name).await? {
            Some(sb) if owned_by(&sb, claim) => return Ok(Outcome::Bound(Box::new(sb))),
            Some(sb)
                if !from_status
                    && sb.metadata.deletion_timestamp.is_none()
                    && controlled_by_kind::<SandboxWarmPool>(&sb.metadata)
                        .is_some_and(|o| o.name == claim.spec.warm_pool_ref.name) =>
            {
                // An adoption that stopped between its two writes (restart).
                let Some((_, template)) = resolve_refs(claim, cx).await?.ok() else {
                    return Ok(Outcome::Again);
                };
                let patch = adoption_patch(&sb, claim, &template);
                return match sandboxes
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
                            format!("Adopted warm Sandbox {name}"),
                        );
                        Ok(Outcome::Bound(Box::new(sb)))
                    }
                    Err(e) if is_code(&e, 409) || is_code(&e, 404) => Ok(Outcome::Again),
                    Err(e) => Err(e.into()),
                };
            }
            found if from_status => {
                let message = match found {
                    Some(_) => format!(
                        "Sandbox {name:?} is not controlled by claim {:?}",
                        claim.name_any()
                    ),
                    None => format!("Sandbox {name:?} not found"),
                };
                return Ok(unbound(reason::SANDBOX_MISSING, message, None));
            }
            _ => {
                // The annotation names a Sandbox this claim did not get (it
                // went to another claim, or away): forget it and start over.
                let patch = json!({"metadata": {
                    "resourceVersion": claim.resource_version(),
                    "annotations": {names::SANDBOX_NAME_ANNOTATION: null},
                }});
                return match claims
                    .patch(
                        &claim.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(updated) => {
                        cx.memo.wrote_claim(&updated);
                        Ok(Outcome::Again)
                    }
                    Err(e) if is_code(&e, 409) || is_code(&e, 404) => {
                        cx.memo.forget_claim(claim);
                        Ok(Outcome::Again)
                    }
                    Err(e) => Err(e.into()),
                };
            }
        }
    }

    // 2. A cold Sandbox (named like the claim) from an earlier pass.
    // The cache only: a miss costs nothing here, as a create of an existing
    // name fails with AlreadyExists below.
    if let Some(mine) = cx.memo.sandbox_of(
        &ns,
        &claim.name_any(),
        claim.uid().as_deref().unwrap_or_default(),
    ) {
        if !cx
            .sandboxes
            .get(&ObjectRef::new(&claim.name_any()).within(&ns))
            .is_some_and(|sb| owned_by(&sb, claim))
        {
            return Ok(Outcome::Bound(Box::new(mine)));
        }
    }
    if let Some(sb) = cx
        .sandboxes
        .get(&ObjectRef::new(&claim.name_any()).within(&ns))
    {
        if owned_by(&sb, claim) {
            return Ok(Outcome::Bound(Box::new((*sb).clone())));
        }
        if controlled_by_kind::<SandboxWarmPool>(&sb.metadata).is_none() {
            return Ok(unbound(
                reason::RECONCILER_ERROR,
                messages::reconciler_error(&format!(
                    "Sandbox {:?} is not controlled by claim {:?}",
                    sb.name_any(),
                    claim.name_any()
                )),
                None,
            ));
        }
    }

    // 3. Pool and template.
    let (pool, template) = match resolve_refs(claim, cx).await? {
        Ok(found) => found,
        Err(outcome) => return Ok(outcome),
    };

    // 4. The claim's extra Pod metadata.
    let extra = claim
        .spec
        .additional_pod_metadata
        .clone()
        .unwrap_or_default();
    let tpl_meta = template
        .spec
        .blueprint
        .pod_template
        .metadata
        .clone()
        .unwrap_or_default();
    if let Err(msg) = metadata::validate(
        &extra.labels.unwrap_or_default(),
        &extra.annotations.unwrap_or_default(),
        &tpl_meta.labels.unwrap_or_default(),
        &tpl_meta.annotations.unwrap_or_default(),
        &cx.ctx.shared.allowed_label_domains(),
    ) {
        return Ok(unbound(reason::INVALID_METADATA, msg, None));
    }

    // 5. Warm adoption, unless the claim changes the blueprint.
    let cold_forced = claim.spec.env.as_ref().is_some_and(|e| !e.is_empty())
        || claim
            .spec
            .volume_claim_templates
            .as_ref()
            .is_some_and(|v| !v.is_empty());
    if !cold_forced {
        if let Some(outcome) = adopt_warm(claims, &sandboxes, claim, &pool, &template, cx).await? {
            return Ok(outcome);
        }
    }

    // 6. Cold create.
    let sb = match cold_sandbox(claim, &template) {
        Ok(sb) => sb,
        Err(BuildError::EnvVarsInjectionRejected(m)) => {
            return Ok(unbound(reason::ENV_VARS_INJECTION_REJECTED, m, None))
        }
        Err(BuildError::VolumeClaimTemplatesError(m)) => {
            return Ok(unbound(reason::VOLUME_CLAIM_TEMPLATES_ERROR, m, None))
        }
    };
    // #2010: the cache may not show a Sandbox this claim already got; the
    // API server does.
    match claims.get_opt(&claim.name_any()).await? {
        Some(fresh) if fresh.uid() == claim.uid() => {
            if recorded(&fresh).0.is_some() {
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
                format!("Created Sandbox {}", sb.name_any()),
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
    let recreate = pool.spec.update_strategy_type() == UpdateStrategyType::Recreate;
    let cur_hash = template_hash(template);
    let tpl_name = template.name_any();
    let accept = |c: &crate::warmpool::queue::Candidate| {
        !recreate
            || !is_stale(
                c.template_hash.as_deref(),
                c.template_name.as_deref(),
                &cur_hash,
                &tpl_name,
            )
    };
    for _ in 0..ADOPTION_ATTEMPTS {
        let cand = match cx.index.take(&ns, &pool_name, accept) {
            Take::Got(c) => c,
            Take::Pending => {
                let age = claim
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| Timestamp::now().duration_since(t.0))
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default();
                if age < PENDING_WAIT {
                    return Ok(Some(unbound(
                        reason::SANDBOX_CREATE_PENDING,
                        "Waiting for a warm Sandbox to get an IP",
                        Some(PENDING_RETRY),
                    )));
                }
                return Ok(None);
            }
            Take::Empty => return Ok(None),
        };
        // First write: the claim names its Sandbox, under the claim's
        // resourceVersion. A claim read from a stale cache fails here.
        let mut annotations = json!({names::SANDBOX_NAME_ANNOTATION: cand.name});
        if !cx.ctx.flags.disable_claim_observability_annotations
            && !claim
                .annotations()
                .contains_key(names::CONTROLLER_FIRST_OBSERVED_AT)
        {
            // Folded into this write: one round trip less on the warm path.
            annotations[names::CONTROLLER_FIRST_OBSERVED_AT] = json!(now_rfc3339());
        }
        let patch = json!({"metadata": {
            "resourceVersion": claim.resource_version(),
            "annotations": annotations,
        }});
        match claims
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(updated) => {
                cx.memo.wrote_claim(&updated);
                *claim = updated
            }
            Err(e) if is_code(&e, 409) || is_code(&e, 404) => {
                cx.memo.forget_claim(claim);
                cx.index.release(&ns, &pool_name, &cand.name);
                return Ok(Some(Outcome::Again));
            }
            Err(e) => {
                cx.index.release(&ns, &pool_name, &cand.name);
                return Err(e.into());
            }
        }
        // Second write: the Sandbox changes hands, under its resourceVersion.
        let Some(mut sb) = lookup(sandboxes, cx, claim, &cand.name).await? else {
            cx.index.adopted(&ns, &pool_name, &cand.name);
            continue;
        };
        for retry in 0..2 {
            let still_ours = sb.metadata.deletion_timestamp.is_none()
                && controlled_by_kind::<SandboxWarmPool>(&sb.metadata)
                    .is_some_and(|o| o.name == pool_name);
            if !still_ours {
                break;
            }
            let patch = adoption_patch(&sb, claim, template);
            match sandboxes
                .patch(&cand.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(adopted) => {
                    cx.memo.wrote_sandbox(&adopted);
                    cx.index.adopted(&ns, &pool_name, &cand.name);
                    cx.ctx
                        .refill
                        .adopted(&format!("{ns}/{pool_name}"), std::time::Instant::now());
                    publish(
                        cx,
                        claim,
                        EventType::Normal,
                        events::SANDBOX_ADOPTED,
                        format!("Adopted warm Sandbox {}", cand.name),
                    );
                    return Ok(Some(Outcome::Bound(Box::new(adopted))));
                }
                Err(e) if is_code(&e, 409) && retry == 0 => {
                    match sandboxes.get_opt(&cand.name).await? {
                        Some(fresh) => sb = fresh,
                        None => break,
                    }
                }
                Err(e) if is_code(&e, 409) || is_code(&e, 404) => break,
                Err(e) => {
                    cx.index.release(&ns, &pool_name, &cand.name);
                    return Err(e.into());
                }
            }
        }
        // Lost this one (adopted elsewhere, deleted): the next candidate's
        // annotation write replaces the name.
        cx.index.adopted(&ns, &pool_name, &cand.name);
    }
    Ok(Some(unbound(
        reason::ADOPTION_CONFLICT,
        format!("{ADOPTION_ATTEMPTS} warm Sandboxes were taken by others while adopting; retrying"),
        Some(ALREADY_EXISTS_RETRY),
    )))
}

/// Queues an event about `claim` (see [`super::events`]).
fn publish(cx: &ClaimCtx, claim: &SandboxClaim, type_: EventType, reason: &str, note: String) {
    let Some(events) = &cx.events else {
        return;
    };
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: reason.to_string(),
        secondary: None,
    };
    events.send(ev, claim.object_ref(&()));
}
