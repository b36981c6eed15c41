//! One SandboxWarmPool reconcile (§2.4): adopt or drop orphans, wait out
//! unobserved writes, then delete (stale, stuck, surplus) and create
//! (slow-start batches) as [`plan`](super::plan) decides, and report status.
//! Failed warm starts (a member replaced for never getting Ready, a member
//! the API server refused) are counted on the pool's `sandhub.io/start-failures`
//! annotation, which the hub tells as `pool_start_failed`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use sandhub_api::k8s::conditions::{events, types};
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::warmpool::{StartFailures, UpdateStrategyType, START_FAILURES_ANNOTATION};
use sandhub_api::k8s::{Sandbox, SandboxTemplate, SandboxWarmPool, SandboxWarmPoolStatus};
use serde_json::json;

use super::build::{pool_sandbox, template_hash};
use super::expectations::{Expectations, Seen};
use super::plan::{is_stale, plan, slow_start_batches, DeleteReason, Inputs, Member, Strategy};
use crate::context::Context;
use crate::error::{is_code, Error};
use crate::object::conditions::find as condition;
use crate::object::{controller_of, controller_ref, sandbox_ready};

/// How often a pool without its template looks again (the template watch
/// also requeues it).
const MISSING_TEMPLATE_RETRY: Duration = Duration::from_secs(60);
/// How often a pool with members still starting is looked at again.
const STARTING_RECHECK: Duration = Duration::from_secs(1);
/// Requeue while writes are unobserved; their watch events usually come first.
const EXPECTATIONS_RETRY: Duration = Duration::from_secs(1);

pub struct PoolCtx {
    pub ctx: Arc<Context>,
    pub sandboxes: Store<Sandbox>,
    pub templates: Store<SandboxTemplate>,
    pub expectations: Expectations,
    pub recorder: Recorder,
    /// Pools that reported WarmPoolNotProgressing and have not recovered.
    pub not_progressing: Mutex<HashSet<String>>,
    /// Each pool's start failures as last written (the pool in the cache
    /// may not show this process's own last write yet).
    pub start_failures: Mutex<HashMap<String, u64>>,
}

pub fn error_policy(_pool: Arc<SandboxWarmPool>, err: &Error, cx: Arc<PoolCtx>) -> Action {
    cx.ctx
        .metrics
        .inc_reconcile_error("sandboxwarmpool", err.metric_label());
    tracing::warn!(error = %err, "warm pool reconcile failed");
    Action::requeue(Duration::from_secs(2))
}

fn pool_key(pool: &SandboxWarmPool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// The PodScheduled condition the Sandbox mirrors from its Pod says the
/// scheduler found no node.
fn unschedulable(sb: &Sandbox) -> bool {
    sb.status
        .as_ref()
        .and_then(|s| condition(&s.conditions, types::POD_SCHEDULED))
        .is_some_and(|c| c.status == "False" && c.reason == "Unschedulable")
}

pub async fn reconcile(pool: Arc<SandboxWarmPool>, cx: Arc<PoolCtx>) -> Result<Action, Error> {
    if pool.metadata.deletion_timestamp.is_some() {
        cx.expectations.forget(&pool_key(&pool));
        cx.ctx.refill.forget(&pool_key(&pool));
        return Ok(Action::await_change());
    }
    let ns = pool.namespace().unwrap_or_default();
    let sandboxes: Api<Sandbox> = cx.ctx.api_in(&ns);
    let key = pool_key(&pool);
    let hash = name_hash(&pool.name_any());
    let pool_uid = pool.uid().unwrap_or_default();

    let tpl_name = pool.spec.sandbox_template_ref.name.clone();
    let template = match cx.templates.get(&ObjectRef::new(&tpl_name).within(&ns)) {
        Some(t) => Some((*t).clone()),
        None => {
            cx.ctx
                .api_in::<SandboxTemplate>(&ns)
                .get_opt(&tpl_name)
                .await?
        }
    };
    let cur_hash = template.as_ref().map(template_hash);

    // A cache that has not shown our last creates or deletes would make us
    // repeat them. Checked before the members are read: the snapshot below
    // is then at least as new as every write this pool made.
    let seen = |name: &str| match cx.sandboxes.get(&ObjectRef::new(name).within(&ns)) {
        None => Seen::Absent,
        Some(sb) if sb.metadata.deletion_timestamp.is_some() => Seen::Terminating,
        Some(_) => Seen::Present,
    };
    if !cx.expectations.satisfied(&key, Instant::now(), seen) {
        return Ok(Action::requeue(EXPECTATIONS_RETRY));
    }

    // Members: Sandboxes carrying the pool's label. Orphans are adopted (or,
    // if stale, deleted); ones another controller holds are not ours.
    let labelled = cx.sandboxes.state_filter(|sb| {
        sb.namespace().as_deref() == Some(ns.as_str())
            && sb.labels().get(names::WARM_POOL_SANDBOX) == Some(&hash)
    });
    let mut members = Vec::new();
    for sb in labelled {
        let stale = match &cur_hash {
            Some(h) => is_stale(
                sb.labels()
                    .get(names::SANDBOX_TEMPLATE_HASH)
                    .map(String::as_str),
                sb.annotations()
                    .get(names::SANDBOX_TEMPLATE_REF_ANNOTATION)
                    .map(String::as_str),
                h,
                &tpl_name,
            ),
            None => false,
        };
        match controller_of(&sb.metadata) {
            Some(o) if o.uid == pool_uid => {}
            Some(_) => continue,
            None if sb.metadata.deletion_timestamp.is_some() => continue,
            None if stale => {
                delete_member(&sandboxes, &sb.name_any()).await?;
                continue;
            }
            None => {
                let patch = json!({"metadata": {
                    "resourceVersion": sb.resource_version(),
                    "ownerReferences": [controller_ref(&*pool)],
                }});
                match sandboxes
                    .patch(
                        &sb.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_code(&e, 409) || is_code(&e, 404) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        members.push(Member {
            name: sb.name_any(),
            created: sb
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or_else(Timestamp::now, |t| t.0),
            ready: sandbox_ready(&sb),
            terminating: sb.metadata.deletion_timestamp.is_some(),
            stale,
            unschedulable: unschedulable(&sb),
        });
    }

    let status = SandboxWarmPoolStatus {
        replicas: members.iter().filter(|m| !m.terminating).count() as i32,
        ready_replicas: members.iter().filter(|m| !m.terminating && m.ready).count() as i32,
        selector: format!("{}={hash}", names::WARM_POOL_SANDBOX),
        observed_generation: pool.metadata.generation,
    };
    if pool.status.as_ref() != Some(&status) {
        let patch = json!({"status": status});
        cx.ctx
            .api_in::<SandboxWarmPool>(&ns)
            .patch_status(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }

    let Some(template) = template else {
        tracing::info!(pool = %key, template = %tpl_name, "warm pool's template not found");
        return Ok(Action::requeue(MISSING_TEMPLATE_RETRY));
    };

    let strategy = match pool.spec.update_strategy_type() {
        UpdateStrategyType::Recreate => Strategy::Recreate,
        UpdateStrategyType::OnReplenish => Strategy::OnReplenish,
    };
    let flags = &cx.ctx.flags;
    let p = plan(&Inputs {
        desired: pool.spec.replicas.max(0) as usize,
        members: &members,
        strategy,
        now: Timestamp::now(),
        readiness_grace: flags.sandbox_warm_pool_readiness_grace_period,
        max_batch: flags.sandbox_warm_pool_max_batch_size as usize,
    });

    tracing::debug!(
        pool = %key,
        members = members.len(),
        terminating = members.iter().filter(|m| m.terminating).count(),
        desired = pool.spec.replicas,
        create = p.create,
        delete = p.delete.len(),
        "warm pool plan"
    );
    progress_events(&cx, &pool, &p.held_unschedulable).await;

    let stuck: Vec<&String> = p
        .delete
        .iter()
        .filter(|(_, why)| *why == DeleteReason::NotReadyTooLong)
        .map(|(n, _)| n)
        .collect();
    if let Some(last) = stuck.last() {
        let why = not_ready_reason(
            cx.sandboxes
                .get(&ObjectRef::new(last).within(&ns))
                .as_deref(),
        );
        let grace = flags.sandbox_warm_pool_readiness_grace_period;
        let error = format!("warm Sandbox {last} was not Ready within {grace:?}: {why}");
        record_start_failures(&cx, &pool, stuck.len(), error).await;
    }

    if !p.delete.is_empty() {
        let names: Vec<String> = p.delete.iter().map(|(n, _)| n.clone()).collect();
        cx.expectations
            .expect_deletes(&key, names.clone(), Instant::now());
        for (name, why) in &p.delete {
            tracing::debug!(pool = %key, sandbox = %name, reason = ?why, "deleting warm member");
            delete_member(&sandboxes, name).await?;
        }
    }

    let (create, refill_wait) = cx.ctx.refill.admit(&key, p.create, Instant::now());
    if create < p.create {
        tracing::debug!(pool = %key, held = p.create - create, wait = ?refill_wait, "refill held");
    }
    if create > 0 {
        let proto = pool_sandbox(&pool, &template, flags.enable_warm_pool_eviction);
        let pp = PostParams::default();
        for batch in slow_start_batches(create, flags.sandbox_warm_pool_max_batch_size as usize) {
            let results = join_all((0..batch).map(|_| sandboxes.create(&pp, &proto))).await;
            let created: Vec<String> = results
                .iter()
                .filter_map(|r| r.as_ref().ok())
                .map(|sb| sb.name_any())
                .collect();
            cx.expectations
                .expect_creates(&key, created, Instant::now());
            let refused = results.iter().filter(|r| r.is_err()).count();
            if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
                let error = format!("creating a warm Sandbox: {e}");
                record_start_failures(&cx, &pool, refused, error).await;
                // The rest would fail the same way; the next pass retries.
                return Err(e.into());
            }
        }
    }

    let recheck = (!p.held_unschedulable.is_empty())
        .then_some(flags.sandbox_warm_pool_unschedulable_recheck_interval);
    // Non-ready members are rechecked when their grace period ends.
    let grace_end = members
        .iter()
        .filter(|m| !m.ready && !m.terminating)
        .filter_map(|m| {
            let age: Duration = Timestamp::now()
                .duration_since(m.created)
                .try_into()
                .unwrap_or_default();
            flags
                .sandbox_warm_pool_readiness_grace_period
                .checked_sub(age)
        })
        .min()
        .map(|d| d + Duration::from_millis(100));
    // The Sandbox trigger and the member cache read above are separate
    // watches: a member's last change (turning Ready) can arrive before this
    // pass sees it, and no later event may come. Members still starting are
    // looked at again soon instead of at the end of their grace period.
    let starting = members
        .iter()
        .any(|m| !m.ready && !m.terminating && !m.unschedulable)
        .then_some(STARTING_RECHECK);
    // Likewise a member's deletion can trigger this pass before the cache
    // drops it: while any is terminating, its replacement is counted as
    // waiting, so look again soon rather than wait for an event that came.
    let terminating = members
        .iter()
        .any(|m| m.terminating)
        .then_some(STARTING_RECHECK);
    let wait = [recheck, grace_end, refill_wait, starting, terminating]
        .into_iter()
        .flatten()
        .min();
    Ok(wait.map_or_else(Action::await_change, Action::requeue))
}

/// A member's Ready condition, in words, for `last_error`.
fn not_ready_reason(sb: Option<&Sandbox>) -> String {
    let ready = sb
        .and_then(|sb| sb.status.as_ref())
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == types::READY));
    match ready {
        Some(c) if c.message.is_empty() => c.reason.clone(),
        Some(c) => format!("{}: {}", c.reason, c.message),
        None => "no Ready condition".to_string(),
    }
}

/// Adds `count` failed warm starts to the pool's [`START_FAILURES_ANNOTATION`]
/// (the hub tells each write as `pool_start_failed`). A failed write is
/// only logged: the pool's reconcile goes on.
async fn record_start_failures(
    cx: &PoolCtx,
    pool: &SandboxWarmPool,
    count: usize,
    mut error: String,
) {
    let key = pool_key(pool);
    let failures = {
        let mut known = cx.start_failures.lock().expect("start_failures poisoned");
        let before = StartFailures::of(pool)
            .map_or(0, |f| f.failures)
            .max(known.get(&key).copied().unwrap_or(0));
        let now = before.saturating_add(count as u64);
        known.insert(key.clone(), now);
        now
    };
    if error.len() > StartFailures::MAX_ERROR {
        let mut end = StartFailures::MAX_ERROR;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        error.truncate(end);
    }
    let record = StartFailures {
        failures,
        last_error: error,
    };
    let Ok(value) = serde_json::to_string(&record) else {
        return;
    };
    let patch = json!({"metadata": {"annotations": {START_FAILURES_ANNOTATION: value}}});
    let ns = pool.namespace().unwrap_or_default();
    if let Err(e) = cx
        .ctx
        .api_in::<SandboxWarmPool>(&ns)
        .patch(
            &pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(pool = %key, error = %e, "recording a warm pool's start failures");
    }
}

async fn delete_member(sandboxes: &Api<Sandbox>, name: &str) -> Result<(), Error> {
    match sandboxes.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, 404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// WarmPoolNotProgressing when members are held because they cannot be
/// scheduled, WarmPoolProgressing once none are.
async fn progress_events(cx: &PoolCtx, pool: &SandboxWarmPool, held: &[String]) {
    let key = pool_key(pool);
    let (type_, reason, note) = {
        let mut np = cx.not_progressing.lock().expect("not_progressing poisoned");
        match (held.is_empty(), np.contains(&key)) {
            (false, false) => {
                np.insert(key);
                (
                    EventType::Warning,
                    events::WARM_POOL_NOT_PROGRESSING,
                    format!(
                        "{} warm Sandbox(es) are past the readiness grace period and unschedulable: {}",
                        held.len(),
                        held.join(", ")
                    ),
                )
            }
            (true, true) => {
                np.remove(&key);
                (
                    EventType::Normal,
                    events::WARM_POOL_PROGRESSING,
                    "Warm pool is progressing again".to_string(),
                )
            }
            _ => return,
        }
    };
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        // Upstream's action for both.
        action: "Reconciling".into(),
        secondary: None,
    };
    if let Err(e) = cx.recorder.publish(&ev, &pool.object_ref(&())).await {
        tracing::debug!(error = %e, "publishing a warm pool event failed");
    }
}
