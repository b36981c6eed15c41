//! The Sandbox controller (spec §2.1). Each pass recomputes the desired children from the
//! Sandbox alone and writes only differences, in upstream's order:
//! expiry → PVCs → Pod → Service → status (one merge patch on the status subresource).
//!
//! - [`pvc`], [`pod`], [`service`]: the children;
//! - [`metadata`]: Pod label/annotation propagation (pure);
//! - [`status`]: conditions and status fields (pure);
//! - [`owner`]: ownership checks before any write to a child.

pub mod metadata;
pub mod owner;
pub mod pod;
pub mod pvc;
pub mod service;
pub mod status;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use sandhub_api::k8s::conditions::{events, messages, sandbox as reason, types};
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::sandbox::{OperatingMode, ShutdownPolicy};
use sandhub_api::k8s::validate::validate_volume_claim_templates;
use sandhub_api::k8s::{Sandbox, SandboxStatus};
use sandhub_api::sandboxd_token::SandboxdTokens;

use crate::context::{Context, SANDBOX_CONTROLLER};
use crate::error::Error;
use crate::metrics::{SandboxGaugeKey, SandboxLabels};
use crate::object::conditions as cond;
use crate::object::controller_ref;
use owner::{ownership, Ownership};
use status::{Observed, PodView};

/// How often a Sandbox whose Pod is still starting is looked at again.
const STARTING_RECHECK: Duration = Duration::from_secs(1);

/// Upstream requeues at least this long before an expiry, so a clock skew never spins.
const MIN_EXPIRY_REQUEUE: Duration = Duration::from_secs(2);
/// Retry interval for user errors (conflicting children, invalid spec) that only a change
/// of the objects can fix; the watches usually bring that change sooner.
const USER_ERROR_REQUEUE: Duration = Duration::from_secs(30);

/// Runs the Sandbox controller until the process stops.
pub async fn run(ctx: Arc<Context>) -> anyhow::Result<()> {
    // Only Pods and Services carrying the name-hash label can belong to a Sandbox.
    let children = ctx.watcher_config().labels(names::SANDBOX_NAME_HASH);
    let controller = Controller::new(ctx.watch_api::<Sandbox>(), ctx.watcher_config())
        .owns(ctx.watch_api::<Pod>(), children.clone())
        .owns(ctx.watch_api::<Service>(), children)
        .with_config(Config::default().concurrency(ctx.flags.sandbox_concurrent_workers));
    let _ = ctx.sandbox_store.set(controller.store());
    controller
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "sandbox reconcile failed");
            }
        })
        .await;
    Ok(())
}

fn error_policy(sb: Arc<Sandbox>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .inc_reconcile_error("sandbox", err.metric_label());
    tracing::warn!(sandbox = %sb.name_any(), namespace = ?sb.namespace(), error = %err, "reconcile error");
    Action::requeue(Duration::from_secs(1))
}

fn metric_labels(sb: &Sandbox) -> SandboxLabels {
    SandboxLabels {
        namespace: sb.namespace().unwrap_or_default(),
        sandbox_template: sb
            .annotations()
            .get(names::SANDBOX_TEMPLATE_REF_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        owned_by: owner::owned_by_label(sb),
    }
}

fn ms_since(t: &Timestamp) -> f64 {
    (Timestamp::now().as_millisecond() - t.as_millisecond()).max(0) as f64
}

async fn write_status(api: &Api<Sandbox>, name: &str, new: &SandboxStatus) -> Result<(), Error> {
    let patch = status::patch(new);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn delete_owned<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if obj.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: obj.meta().uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&obj.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Expiry: the first pass reports it, the next one cleans up (§2.1).
async fn expire(sb: &Sandbox, ctx: &Context, old: &SandboxStatus) -> Result<Action, Error> {
    let ns = sb.namespace().unwrap_or_default();
    let name = sb.name_any();
    let uid = sb.uid().unwrap_or_default();
    let hash = name_hash(&name);
    let api = ctx.api_in::<Sandbox>(&ns);
    let expired = cond::new(
        types::READY,
        "False",
        reason::SANDBOX_EXPIRED,
        messages::SANDBOX_EXPIRED,
        sb.metadata.generation,
    );
    let already = cond::find(&old.conditions, types::READY)
        .is_some_and(|c| c.reason == reason::SANDBOX_EXPIRED);
    if !already {
        let mut new = old.clone();
        cond::set(&mut new.conditions, expired);
        cond::remove(&mut new.conditions, types::POD_SCHEDULED);
        write_status(&api, &name, &new).await?;
        let policy = match sb.spec.lifecycle.shutdown_policy {
            ShutdownPolicy::Delete => "Delete",
            ShutdownPolicy::Retain => "Retain",
        };
        ctx.metrics.inc_expired(&metric_labels(sb), policy);
        return Ok(Action::await_change());
    }

    let pods = ctx.api_in::<Pod>(&ns);
    if let Some(p) = pods.get_opt(&pod::pod_name(sb)).await? {
        if ownership(&p.metadata, &uid, &hash) == Ownership::Owned {
            delete_owned(&pods, &p).await?;
        }
    }
    let services = ctx.api_in::<Service>(&ns);
    if let Some(s) = services.get_opt(&name).await? {
        if ownership(&s.metadata, &uid, &hash) == Ownership::Owned {
            delete_owned(&services, &s).await?;
        }
    }
    match sb.spec.lifecycle.shutdown_policy {
        ShutdownPolicy::Delete => delete_owned(&api, sb).await?,
        ShutdownPolicy::Retain => {
            let ready = cond::find(&old.conditions, types::READY)
                .cloned()
                .into_iter()
                .collect();
            let new = SandboxStatus {
                conditions: ready,
                ..Default::default()
            };
            if *old != new {
                write_status(&api, &name, &new).await?;
            }
        }
    }
    Ok(Action::await_change())
}

/// Pods of this Sandbox: all listed by the name-hash label, plus the one under its Pod name.
struct PodsSeen {
    named: Option<Pod>,
    owned: Vec<Pod>,
}

async fn observe_pods(api: &Api<Pod>, sb: &Sandbox, hash: &str) -> Result<PodsSeen, Error> {
    let uid = sb.uid().unwrap_or_default();
    let lp = ListParams::default().labels(&format!("{}={hash}", names::SANDBOX_NAME_HASH));
    let listed = api.list(&lp).await?.items;
    let pod_name = pod::pod_name(sb);
    let mut named = listed.iter().find(|p| p.name_any() == pod_name).cloned();
    if named.is_none() {
        // An adoptable Pod may not carry the label yet.
        named = api.get_opt(&pod_name).await?;
    }
    let owned = listed
        .into_iter()
        .filter(|p| ownership(&p.metadata, &uid, hash) == Ownership::Owned)
        .collect();
    Ok(PodsSeen { named, owned })
}

/// Brings the Pod to what a Running Sandbox wants; returns it and whether it is ours.
async fn ensure_pod(
    api: &Api<Pod>,
    sb: &Sandbox,
    hash: &str,
    named: Option<Pod>,
    tokens: Option<&SandboxdTokens>,
) -> Result<(Option<Pod>, bool), Error> {
    let uid = sb.uid().unwrap_or_default();
    let want_meta = metadata::desired(sb, hash);
    let Some(have) = named else {
        let want = pod::desired(sb, &want_meta, tokens);
        let pp = PostParams {
            field_manager: Some(SANDBOX_CONTROLLER.into()),
            ..Default::default()
        };
        return match api.create(&pp, &want).await {
            Ok(p) => Ok((Some(p), true)),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let p = api.get_opt(&want.name_any()).await?;
                let ours = p
                    .as_ref()
                    .is_some_and(|p| ownership(&p.metadata, &uid, hash) == Ownership::Owned);
                Ok((p, ours))
            }
            Err(e) => Err(e.into()),
        };
    };
    let name = have.name_any();
    match ownership(&have.metadata, &uid, hash) {
        Ownership::Owned => match metadata::drift_patch(&have.metadata, &want_meta) {
            Some(patch) => Ok((
                Some(
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?,
                ),
                true,
            )),
            None => Ok((Some(have), true)),
        },
        Ownership::Adoptable => {
            let mut patch = metadata::drift_patch(&have.metadata, &want_meta)
                .unwrap_or_else(|| serde_json::json!({"metadata": {}}));
            patch["metadata"]["ownerReferences"] = serde_json::json!([controller_ref(sb)]);
            tracing::info!(pod = %name, sandbox = %sb.name_any(), "adopting Pod");
            Ok((
                Some(
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?,
                ),
                true,
            ))
        }
        Ownership::Foreign(owner) => Err(Error::ChildConflict(format!(
            "Pod {name} is controlled by {owner}"
        ))),
        Ownership::NotAdoptable => Err(Error::ChildConflict(format!(
            "Pod {name} exists, is not owned by this Sandbox and is not labelled {}=true",
            names::ADOPTABLE
        ))),
    }
}

/// Creates, updates, adopts or deletes the Service per `spec.service`; returns the name of
/// the Service that exists afterwards.
async fn ensure_service(
    api: &Api<Service>,
    sb: &Sandbox,
    hash: &str,
) -> Result<Option<String>, Error> {
    let uid = sb.uid().unwrap_or_default();
    let name = sb.name_any();
    let have = api.get_opt(&name).await?;
    match (sb.spec.blueprint.service, have) {
        (None, have) => Ok(have.map(|_| name)),
        (Some(false), None) => Ok(None),
        (Some(false), Some(s)) => match ownership(&s.metadata, &uid, hash) {
            Ownership::Owned => {
                delete_owned(api, &s).await?;
                Ok(None)
            }
            _ => Ok(None),
        },
        (Some(true), None) => {
            let pp = PostParams {
                field_manager: Some(SANDBOX_CONTROLLER.into()),
                ..Default::default()
            };
            match api.create(&pp, &service::desired(sb, hash)).await {
                Ok(_) => Ok(Some(name)),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(name)),
                Err(e) => Err(e.into()),
            }
        }
        (Some(true), Some(s)) => {
            let want = service::desired(sb, hash);
            let owned = match ownership(&s.metadata, &uid, hash) {
                Ownership::Owned => true,
                Ownership::Adoptable => false,
                Ownership::Foreign(owner) => {
                    return Err(Error::ChildConflict(format!("Service {name} is controlled by {owner}")))
                }
                Ownership::NotAdoptable => {
                    return Err(Error::ChildConflict(format!(
                        "Service {name} exists, is not owned by this Sandbox and is not labelled {}=true",
                        names::ADOPTABLE
                    )))
                }
            };
            if !owned || service::drifted(&s, &want) {
                let spec = want.spec.as_ref().expect("desired service has a spec");
                let patch = serde_json::json!({
                    "metadata": {"ownerReferences": [controller_ref(sb)], "labels": {names::SANDBOX_NAME_HASH: hash}},
                    "spec": {"selector": spec.selector, "ports": spec.ports},
                });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Ok(Some(name))
        }
    }
}

async fn reconcile(sb: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    if sb.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = sb.namespace().unwrap_or_default();
    let name = sb.name_any();
    let hash = name_hash(&name);
    let old = sb.status.clone().unwrap_or_default();

    let mut requeue = None;
    if let Some(t) = &sb.spec.lifecycle.shutdown_time {
        let left = t.0.as_millisecond() - Timestamp::now().as_millisecond();
        if left <= 0 {
            return expire(&sb, &ctx, &old).await;
        }
        requeue = Some(Duration::from_millis(left as u64).max(MIN_EXPIRY_REQUEUE));
    }

    let mut error: Option<String> = None;
    let vcts = sb
        .spec
        .blueprint
        .volume_claim_templates
        .as_deref()
        .unwrap_or_default();
    if let Err(e) = validate_volume_claim_templates(vcts) {
        error = Some(e.to_string());
    } else if let Err(e) = pvc::ensure(&ctx.api_in::<PersistentVolumeClaim>(&ns), &sb, &hash).await
    {
        match e {
            Error::ChildConflict(msg) => error = Some(msg),
            other => return Err(other),
        }
    }

    let pods = ctx.api_in::<Pod>(&ns);
    let seen = observe_pods(&pods, &sb, &hash).await?;
    let suspended = sb.spec.operating_mode == OperatingMode::Suspended;
    let multiple = seen.owned.len() > 1;
    let uid = sb.uid().unwrap_or_default();
    let named_owned = seen
        .named
        .as_ref()
        .is_some_and(|p| ownership(&p.metadata, &uid, &hash) == Ownership::Owned);

    let (pod, owned): (Option<Pod>, bool) = if suspended {
        for p in &seen.owned {
            delete_owned(&pods, p).await?;
        }
        if sb.annotations().contains_key(names::POD_NAME_ANNOTATION) {
            let patch = serde_json::json!({"metadata": {"annotations": {names::POD_NAME_ANNOTATION: null}}});
            ctx.api_in::<Sandbox>(&ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        (seen.named, named_owned)
    } else if multiple {
        // On the transition only: a Sandbox that stays in this state is
        // reconciled again and again, and each pass must not add an Event.
        let already = cond::find(&old.conditions, types::READY)
            .is_some_and(|c| c.reason == reason::MULTIPLE_PODS);
        if !already {
            let recorder = ctx.recorder(SANDBOX_CONTROLLER);
            let note = format!("{} Pods are controlled by this Sandbox", seen.owned.len());
            let ev = Event {
                type_: EventType::Warning,
                reason: events::MULTIPLE_PODS.into(),
                note: Some(note),
                action: "Reconciling".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&ev, &sb.object_ref(&())).await {
                tracing::debug!(error = %e, "event not published");
            }
        }
        (seen.named, named_owned)
    } else if error.is_some() {
        (seen.named, named_owned)
    } else {
        match ensure_pod(
            &pods,
            &sb,
            &hash,
            seen.named.clone(),
            ctx.sandboxd_tokens.as_ref(),
        )
        .await
        {
            Ok(found) => found,
            Err(Error::ChildConflict(msg)) => {
                error = Some(msg);
                (seen.named, false)
            }
            Err(e) => return Err(e),
        }
    };

    let service_name = match ensure_service(&ctx.api_in::<Service>(&ns), &sb, &hash).await {
        Ok(s) => s,
        Err(Error::ChildConflict(msg)) => {
            error.get_or_insert(msg);
            None
        }
        Err(e) => return Err(e),
    };
    let service_required = sb.spec.blueprint.service == Some(true)
        || (sb.spec.blueprint.service.is_none() && service_name.is_some());

    let view = match (&pod, owned) {
        (None, _) => PodView::None,
        (Some(p), true) => PodView::Owned(p),
        (Some(_), false) => PodView::NotOwned,
    };
    let observed = Observed {
        generation: sb.metadata.generation,
        suspended,
        pod: view,
        multiple_pods: multiple && !suspended,
        service_required,
        service_fqdn: service_name
            .as_ref()
            .map(|s| service::fqdn(s, &ns, &ctx.flags.cluster_domain)),
        service: service_name,
        name_hash: &hash,
        error: error.clone(),
    };
    let new = status::compute(&old, &observed);
    if status::needs_write(&old, &new) {
        write_status(&ctx.api_in::<Sandbox>(&ns), &name, &new).await?;
        record_transitions(&ctx, &sb, &old, &new);
    }

    // The Pod trigger and the state read here are separate watches, so a
    // Pod's last change can arrive before this pass can see it; a Sandbox
    // still starting is looked at again rather than trusted to a later event.
    let starting = !suspended
        && !new.conditions.iter().any(|c| {
            c.type_ == types::READY
                && (c.status == "True" || c.reason != reason::DEPENDENCIES_NOT_READY)
        });
    if starting && error.is_none() {
        requeue = Some(requeue.map_or(STARTING_RECHECK, |r: Duration| r.min(STARTING_RECHECK)));
    }
    Ok(match (error, requeue) {
        (Some(_), Some(r)) => Action::requeue(r.min(USER_ERROR_REQUEUE)),
        (Some(_), None) => Action::requeue(USER_ERROR_REQUEUE),
        (None, Some(r)) => Action::requeue(r),
        (None, None) => Action::await_change(),
    })
}

/// Metric events already recorded, as `<uid>` (creation) or
/// `<uid>/<event>/<transition time>`: a pass over a cached Sandbox that lags
/// our own status write sees the same transition again, and a Ready flap
/// must not count a creation twice.
fn creation_recorded() -> &'static Mutex<HashSet<String>> {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    SEEN.get_or_init(Default::default)
}

/// Whether `key` is recorded for the first time (see [`creation_recorded`]).
fn first_record(key: String) -> bool {
    creation_recorded()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key)
}

/// Lifecycle metrics from condition transitions between the old and new status.
fn record_transitions(ctx: &Context, sb: &Sandbox, old: &SandboxStatus, new: &SandboxStatus) {
    let labels = metric_labels(sb);
    let m = &ctx.metrics;
    let was = |t: &str| cond::find(&old.conditions, t).cloned();
    let now = |t: &str| cond::find(&new.conditions, t).cloned();

    let uid = sb.uid().unwrap_or_default();
    let once = |event: &str, at: &Time| first_record(format!("{uid}/{event}/{}", at.0));
    if let (None, Some(f)) = (was(types::FINISHED), now(types::FINISHED)) {
        if once("finished", &f.last_transition_time) {
            m.inc_finished(&labels, &f.reason);
        }
    }
    let terminated = |c: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>| {
        c.as_ref().is_some_and(|c| c.status == "True")
    };
    let suspended_now = now(types::SUSPENDED)
        .filter(|s| s.status == "True" && !terminated(&was(types::SUSPENDED)))
        .filter(|s| once("suspend", &s.last_transition_time));
    if suspended_now.is_some() {
        m.inc_suspend(&labels, "success");
        if let Some(r) = now(types::READY).filter(|r| r.reason == reason::SANDBOX_SUSPENDED) {
            m.observe_suspend_latency(&labels, ms_since(&r.last_transition_time.0));
        }
    }
    let old_ready = was(types::READY);
    let became_ready = old_ready.as_ref().is_none_or(|c| c.status != "True")
        && cond::is_true(&new.conditions, types::READY);
    if !became_ready {
        return;
    }
    match now(types::SUSPENDED) {
        Some(s) if s.status == "False" => {
            let after_last_ready = old_ready
                .as_ref()
                .is_none_or(|r| r.last_transition_time.0 <= s.last_transition_time.0);
            if after_last_ready && once("resume", &s.last_transition_time) {
                m.inc_resume(&labels, "success");
                m.observe_resume_latency(&labels, ms_since(&s.last_transition_time.0));
            }
        }
        Some(_) => {}
        None => {
            let first = first_record(uid.clone());
            if let (true, Some(created)) = (first, sb.metadata.creation_timestamp.as_ref()) {
                let launch = sb
                    .labels()
                    .get(names::LAUNCH_TYPE)
                    .cloned()
                    .unwrap_or_else(|| "cold".into());
                m.observe_creation(
                    &labels.namespace,
                    &launch,
                    &labels.sandbox_template,
                    ms_since(&created.0),
                );
            }
        }
    }
}

/// Recomputes the `agent_sandboxes` gauge from the controller's cache.
pub fn refresh_gauge(ctx: &Context) {
    let Some(store) = ctx.sandbox_store.get() else {
        return;
    };
    let mut counts: HashMap<SandboxGaugeKey, i64> = HashMap::new();
    let live: HashSet<String> = store.state().iter().filter_map(|sb| sb.uid()).collect();
    for sb in store.state() {
        let conds = sb
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let ready = cond::find(conds, types::READY);
        let key = SandboxGaugeKey {
            namespace: sb.namespace().unwrap_or_default(),
            ready_condition: ready
                .map(|c| c.status.clone())
                .unwrap_or_else(|| "Unknown".into()),
            expired: ready.is_some_and(|c| c.reason == reason::SANDBOX_EXPIRED),
            launch_type: sb
                .labels()
                .get(names::LAUNCH_TYPE)
                .cloned()
                .unwrap_or_default(),
            sandbox_template: sb
                .annotations()
                .get(names::SANDBOX_TEMPLATE_REF_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            owned_by: owner::owned_by_label(&sb),
            created_by: sb
                .labels()
                .get(names::CREATED_BY)
                .cloned()
                .unwrap_or_default(),
        };
        *counts.entry(key).or_default() += 1;
    }
    // Forget creation bookkeeping of Sandboxes that are gone.
    creation_recorded()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|key| live.contains(key.split('/').next().unwrap_or_default()));
    ctx.metrics.set_sandbox_counts(counts);
}
