//! What one claim pass decides, as pure functions of the objects it has read
//! (the claim, the Sandboxes the caches or the API server showed, the pool
//! and template). [`super::reconcile`] reads, asks these, and applies the
//! answer; every rule here is unit-tested without a cluster, as
//! `warmpool/plan.rs` is for pools.
//!
//! A get-or-create pass asks, in order:
//! 1. [`decide_named`]: the claim already names a Sandbox;
//! 2. [`decide_earlier`]: a cold Sandbox named like the claim exists;
//! 3. [`decide_route`]: with pool and template known, warm or cold;
//! 4. [`decide_take`] per warm candidate, then [`decide_cold`].

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use sandhub_api::k8s::conditions::{claim as reason, messages};
use sandhub_api::k8s::names;
use sandhub_api::k8s::warmpool::UpdateStrategyType;
use sandhub_api::k8s::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};
use sandhub_api::sandboxd_token::SandboxdTokens;
use serde_json::{json, Value};

use super::build::{cold_sandbox, has_volume_mounts, template_pod_metadata, BuildError};
use super::metadata;
use crate::object::controlled_by_kind;
use crate::warmpool::build::template_hash;
use crate::warmpool::plan::is_stale;
use crate::warmpool::queue::{Candidate, Take};

/// How long a claim waits for a pending (IP-less) warm candidate, counted
/// from its creation, before it starts cold.
pub const PENDING_WAIT: Duration = Duration::from_secs(2);
/// How often it looks again meanwhile (upstream v1.0.0 tuned 500 ms to 100 ms).
pub const PENDING_RETRY: Duration = Duration::from_millis(100);
/// Requeue after a create hit AlreadyExists: the cache lags the API server.
pub const ALREADY_EXISTS_RETRY: Duration = Duration::from_millis(200);
/// Requeue while the pool or its template is missing (their watches also requeue).
pub const MISSING_REF_RETRY: Duration = Duration::from_secs(60);
/// Warm candidates tried per reconcile before giving up with AdoptionConflict.
pub const ADOPTION_ATTEMPTS: usize = 3;

/// What get-or-create found.
#[derive(Debug)]
pub enum Outcome {
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

pub fn unbound(
    reason: &'static str,
    message: impl Into<String>,
    requeue: Option<Duration>,
) -> Outcome {
    Outcome::Unbound {
        reason,
        message: message.into(),
        requeue,
    }
}

/// `sb` is controlled by this claim (same uid).
pub fn owned_by(sb: &Sandbox, claim: &SandboxClaim) -> bool {
    controlled_by_kind::<SandboxClaim>(&sb.metadata)
        .is_some_and(|o| Some(&o.uid) == claim.uid().as_ref())
}

/// `sb` is a live member of the pool named `pool`.
pub fn in_pool(sb: &Sandbox, pool: &str) -> bool {
    sb.metadata.deletion_timestamp.is_none()
        && controlled_by_kind::<SandboxWarmPool>(&sb.metadata).is_some_and(|o| o.name == pool)
}

pub fn recorded_in_status(claim: &SandboxClaim) -> Option<&str> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.sandbox.as_ref())
        .map(|s| s.name.as_str())
        .filter(|n| !n.is_empty())
}

/// The claim's recorded Sandbox: `status.sandbox.name` (`true`), else the
/// `sandbox-name` annotation an adoption writes first (`false`).
pub fn recorded(claim: &SandboxClaim) -> (Option<String>, bool) {
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

/// What to do about the Sandbox the claim already names.
#[derive(Debug)]
pub enum Named {
    /// Ours: done.
    Bound(Box<Sandbox>),
    /// Still a member of the claim's pool, named only by the annotation: an
    /// adoption that stopped between its two writes (restart). Finish it.
    FinishAdoption(Box<Sandbox>),
    /// `status.sandbox` names a Sandbox that is gone or not ours.
    Missing(Outcome),
    /// The annotation names a Sandbox this claim did not get (it went to
    /// another claim, or away): remove the annotation and start over.
    Forget,
}

/// `found`: the Sandbox named `name` as the caches (or the API server) show it.
pub fn decide_named(
    claim: &SandboxClaim,
    name: &str,
    from_status: bool,
    found: Option<Sandbox>,
) -> Named {
    match found {
        Some(sb) if owned_by(&sb, claim) => Named::Bound(Box::new(sb)),
        Some(sb) if !from_status && in_pool(&sb, &claim.spec.warm_pool_ref.name) => {
            Named::FinishAdoption(Box::new(sb))
        }
        found if from_status => {
            let message = match found {
                Some(_) => format!(
                    "Sandbox {name:?} is not controlled by claim {:?}",
                    claim.name_any()
                ),
                None => format!("Sandbox {name:?} not found"),
            };
            Named::Missing(unbound(reason::SANDBOX_MISSING, message, None))
        }
        _ => Named::Forget,
    }
}

/// A cold Sandbox (named like the claim) from an earlier pass. `memo`: the
/// one our own create wrote (the cache may not show it yet); `cached`: the
/// cache's Sandbox of the claim's name. `None`: nothing earlier, go on.
pub fn decide_earlier(
    claim: &SandboxClaim,
    memo: Option<Sandbox>,
    cached: Option<&Sandbox>,
) -> Option<Outcome> {
    let cached_ours = cached.is_some_and(|sb| owned_by(sb, claim));
    if let Some(mine) = memo {
        if !cached_ours {
            return Some(Outcome::Bound(Box::new(mine)));
        }
    }
    let sb = cached?;
    if cached_ours {
        return Some(Outcome::Bound(Box::new(sb.clone())));
    }
    // A pool member of that name may be adopted by someone; anything else
    // holds the name this claim's cold Sandbox needs.
    controlled_by_kind::<SandboxWarmPool>(&sb.metadata)
        .is_none()
        .then(|| {
            unbound(
                reason::RECONCILER_ERROR,
                messages::reconciler_error(&format!(
                    "Sandbox {:?} is not controlled by claim {:?}",
                    sb.name_any(),
                    claim.name_any()
                )),
                None,
            )
        })
}

/// How the claim gets a new Sandbox once its pool and template are known.
#[derive(Debug)]
pub enum Route {
    /// The claim cannot be served as written.
    Refuse(Outcome),
    /// Try a warm member first, then cold.
    Warm,
    /// The claim changes the blueprint (env, volume claim templates): cold only.
    Cold,
}

pub fn decide_route(
    claim: &SandboxClaim,
    template: &SandboxTemplate,
    allowed_label_domains: &[String],
) -> Route {
    let extra = claim
        .spec
        .additional_pod_metadata
        .clone()
        .unwrap_or_default();
    let tpl_meta = template_pod_metadata(template);
    if let Err(msg) = metadata::validate(
        &extra.labels.unwrap_or_default(),
        &extra.annotations.unwrap_or_default(),
        &tpl_meta.labels.unwrap_or_default(),
        &tpl_meta.annotations.unwrap_or_default(),
        allowed_label_domains,
    ) {
        return Route::Refuse(unbound(reason::INVALID_METADATA, msg, None));
    }
    // The hub's volume mounts too: a warm Pod was made without them.
    let cold_forced = has_volume_mounts(claim)
        || claim.spec.env.as_ref().is_some_and(|e| !e.is_empty())
        || claim
            .spec
            .volume_claim_templates
            .as_ref()
            .is_some_and(|v| !v.is_empty());
    if cold_forced {
        Route::Cold
    } else {
        Route::Warm
    }
}

/// The cold Sandbox to create, or why the claim cannot have one.
pub fn decide_cold(
    claim: &SandboxClaim,
    template: &SandboxTemplate,
    tokens: Option<&SandboxdTokens>,
) -> Result<Sandbox, Outcome> {
    cold_sandbox(claim, template, tokens).map_err(|e| match e {
        BuildError::VolumeMounts(m) => unbound(reason::INVALID_METADATA, m, None),
        BuildError::EnvVarsInjectionRejected(m) => {
            unbound(reason::ENV_VARS_INJECTION_REJECTED, m, None)
        }
        BuildError::VolumeClaimTemplatesError(m) => {
            unbound(reason::VOLUME_CLAIM_TEMPLATES_ERROR, m, None)
        }
    })
}

/// Which warm members a claim may take: under the Recreate strategy, none
/// built from an older template.
pub fn acceptable(
    pool: &SandboxWarmPool,
    template: &SandboxTemplate,
) -> impl Fn(&Candidate) -> bool {
    let recreate = pool.spec.update_strategy_type() == UpdateStrategyType::Recreate;
    let cur_hash = template_hash(template);
    let tpl_name = template.name_any();
    move |c: &Candidate| {
        !recreate
            || !is_stale(
                c.template_hash.as_deref(),
                c.template_name.as_deref(),
                &cur_hash,
                &tpl_name,
            )
    }
}

/// What the warm index's answer means for the claim.
#[derive(Debug)]
pub enum Next {
    Adopt(Candidate),
    /// Only members without an IP exist and the claim is young: wait for them.
    Wait(Outcome),
    /// Nothing (usable) to adopt: create cold.
    Cold,
}

/// `age`: how long ago the claim was created.
pub fn decide_take(take: Take, age: Duration) -> Next {
    match take {
        Take::Got(c) => Next::Adopt(c),
        Take::Pending if age < PENDING_WAIT => Next::Wait(unbound(
            reason::SANDBOX_CREATE_PENDING,
            "Waiting for a warm Sandbox to get an IP",
            Some(PENDING_RETRY),
        )),
        Take::Pending | Take::Empty => Next::Cold,
    }
}

/// How long ago the claim was created (zero when unknown or in the future).
pub fn claim_age(claim: &SandboxClaim, now: Timestamp) -> Duration {
    claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| now.duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

/// The claim should get the controller-first-observed annotation now.
pub fn needs_first_observed(claim: &SandboxClaim, annotations_disabled: bool) -> bool {
    !annotations_disabled
        && !claim
            .annotations()
            .contains_key(names::CONTROLLER_FIRST_OBSERVED_AT)
}

/// An adoption's first write: the claim names `candidate`, under the
/// claim's resourceVersion, so a claim read from a stale cache fails here.
/// `first_observed` folds that annotation into the same write.
pub fn naming_patch(
    claim: &SandboxClaim,
    candidate: &str,
    first_observed: Option<String>,
) -> Value {
    let mut annotations = json!({names::SANDBOX_NAME_ANNOTATION: candidate});
    if let Some(at) = first_observed {
        annotations[names::CONTROLLER_FIRST_OBSERVED_AT] = json!(at);
    }
    json!({"metadata": {
        "resourceVersion": claim.resource_version(),
        "annotations": annotations,
    }})
}

/// Removes the `sandbox-name` annotation, under the claim's resourceVersion.
pub fn forget_patch(claim: &SandboxClaim) -> Value {
    json!({"metadata": {
        "resourceVersion": claim.resource_version(),
        "annotations": {names::SANDBOX_NAME_ANNOTATION: null},
    }})
}

/// Every warm candidate of this pass went to someone else.
pub fn adoption_exhausted() -> Outcome {
    unbound(
        reason::ADOPTION_CONFLICT,
        format!("{ADOPTION_ATTEMPTS} warm Sandboxes were taken by others while adopting; retrying"),
        Some(ALREADY_EXISTS_RETRY),
    )
}

#[cfg(test)]
mod tests;
