//! Lifecycle events on Kubernetes: every replica derives them from the
//! watches it keeps, so no replica writes anything and all of them tell
//! the same story with the same ids.
//!
//! - **Claims** (the watch behind [`super::claim_cache`]): `created` when
//!   a claim first appears; at its first Ready, `claimed` (a warm Sandbox
//!   was adopted from its pool) or `pool_starved` (the pool had none, it
//!   started cold), then `ready`; `suspended`, then `resumed` at the next
//!   Ready; `entrypoint_exited` when a replica recorded its entrypoint's
//!   exit on it (kube/entrypoints.rs); `oom_killed` when a replica recorded
//!   more OOM kills of its Pod on it (kube/oom.rs); `finished` when its Pod
//!   ended by itself; `deleted` when it is gone, with `reason` `deadline`
//!   (its `shutdownTime` passed: the
//!   controller deleted it), `start_failed` (it never came up and carries
//!   a terminal reason, `last_error`) or `by_caller` (the hub's delete, or
//!   anyone's).
//! - **SandboxWarmPools**: `template_changed` when a pool's template
//!   reference changes; `pool_start_failed` when the controller adds to the
//!   start failures it counts on the pool (`sandhub.io/start-failures`: a
//!   member never Ready within the readiness grace, or refused).
//! - **SandboxTemplates**: `template_changed` when a template's spec
//!   changes (its `generation` moves).
//!
//! **Ids.** An event's id is `resourceVersion × 16 + slot`, the slot being
//! its type's fixed place (`slot`): the resourceVersion of the
//! object write it was derived from (etcd's revision: one cluster-wide
//! order), so every replica that saw that write gives the event the same
//! id, and a `Last-Event-ID` from one replica means the same on another.
//! A watch delivers one resource's writes in order; writes of two
//! resources arrive through two watches, so events wait [`REORDER`] here
//! and leave in id order. An event that comes later than that behind a
//! higher id (a watch that lagged, or a deletion only seen when a watch
//! relisted) is stored in its place in the ring, where a replay finds it,
//! but a live stream already past its id does not get it.
//!
//! **What a replica knows.** At its start a replica lists the objects and
//! derives nothing from them (it did not see them change); from then on
//! it derives every change it sees. Its ring ([`crate::events::MemoryLog`],
//! `--event-max-count`) is memory only: a replica that restarts starts
//! empty, so a reconnect to it replays only what it saw since, while a
//! reconnect to a replica that ran throughout resumes with nothing missed
//! or repeated.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::StreamExt;
use kube::{
    runtime::{reflector::Store, watcher},
    Api, Resource,
};
use sandhub_api::k8s::{
    names, warmpool::StartFailures, SandboxClaim, SandboxTemplate, SandboxWarmPool,
};
use tokio::sync::mpsc;

use super::{
    model::{self, TEMPLATE_ANNOTATION, TENANT_LABEL},
    owner::HUB_NAME_ANNOTATION,
};
use crate::events::{DeleteReason, EventLog, EventType, NewEvent, SHARED};

/// How long derived events wait for a lower id from another watch.
pub const REORDER: Duration = Duration::from_millis(500);
/// Batches of derived events waiting for the reorderer; a watch that gets
/// this far ahead waits for it (the watches are ours, nobody else's).
const QUEUE: usize = 1024;
/// Ids per resourceVersion: one slot per event type.
const SLOTS: u64 = 16;

/// The id of an event of type `kind` derived from write `rv`; `None` for a
/// resourceVersion that is not a number (then the object makes no events).
pub fn event_id(rv: Option<&str>, kind: EventType) -> Option<u64> {
    let rv: u64 = rv?.parse().ok()?;
    rv.checked_mul(SLOTS)?.checked_add(slot(kind))
}

/// Each type's place among the events of one write: the order they are
/// told in (a claim that came up warm is `claimed`, then `ready`). A new
/// type must find a free slot here; there are 16 (all taken: another
/// type changes every id, so `SLOTS` grows only with a reason to).
fn slot(kind: EventType) -> u64 {
    match kind {
        EventType::Created => 0,
        EventType::PoolStarved => 1,
        EventType::Claimed => 2,
        // This backend has no pause, so never tells `paused`; it shares
        // the slot of the one of the two it does tell.
        EventType::Suspended | EventType::Paused => 3,
        EventType::Resumed => 4,
        EventType::Ready => 5,
        EventType::Reset => 6,
        EventType::Snapshotted => 7,
        EventType::Forked => 8,
        EventType::OomKilled => 9,
        EventType::DiskQuotaExceeded => 10,
        EventType::EntrypointExited => 11,
        EventType::Finished => 12,
        EventType::PoolStartFailed => 13,
        EventType::TemplateChanged => 14,
        EventType::Deleted => 15,
    }
}

fn stamped(mut e: NewEvent, rv: Option<&str>) -> Option<NewEvent> {
    e.id = Some(event_id(rv, e.kind)?);
    Some(e)
}

/// The name `object` has for its tenant: the hub name a tenant's object
/// keeps in an annotation, an operator's own name.
fn hub_name<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(HUB_NAME_ANNOTATION))
        .or(meta.name.as_ref())
        .cloned()
        .unwrap_or_default()
}

/// The key of the tenant `object` belongs to (its label's digest), or
/// [`SHARED`] for an operator's.
fn tenant_of<K: Resource>(object: &K) -> String {
    object
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(TENANT_LABEL))
        .cloned()
        .unwrap_or_else(|| SHARED.to_string())
}

/// What a replica remembers of one claim: enough to see transitions.
#[derive(Debug, Clone, Default)]
struct ClaimSeen {
    ready: bool,
    suspended: bool,
    finished: bool,
    ever_ready: bool,
    shutdown_at: Option<SystemTime>,
    terminal: Option<String>,
    rv: Option<String>,
    tenant: String,
    labels: BTreeMap<String, String>,
    pool: String,
    /// The entrypoint exit the claim records (kube/entrypoints.rs).
    exit: Option<super::entrypoints::Exit>,
    /// The OOM kills the claim records (kube/oom.rs).
    oom: Option<super::oom::OomRecord>,
    /// Its Pod's eviction for local storage, as recorded (kube/evictions.rs).
    eviction: Option<super::evictions::Eviction>,
}

/// Claims' transitions, fed every event of the claim watch.
#[derive(Default)]
pub struct ClaimTracker {
    seen: HashMap<String, ClaimSeen>,
    /// Listed during the current (re)list; `None` outside one.
    listing: Option<HashSet<String>>,
    /// The first list is the baseline: nothing is derived from it.
    primed: bool,
}

impl ClaimTracker {
    pub fn observe(&mut self, ev: &watcher::Event<SandboxClaim>) -> Vec<NewEvent> {
        match ev {
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(c) => {
                if let (Some(listing), Some(name)) = (&mut self.listing, &c.metadata.name) {
                    listing.insert(name.clone());
                }
                let derive = self.primed;
                self.apply(c, derive)
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let mut out = Vec::new();
                if self.primed {
                    // Gone while the watch was down: the last write we saw
                    // names it (a late id, see the module docs).
                    let gone: Vec<String> = self
                        .seen
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    for name in gone {
                        if let Some(s) = self.seen.remove(&name) {
                            let rv = s.rv.clone();
                            out.extend(stamped(
                                deleted(&name, &s, SystemTime::now()),
                                rv.as_deref(),
                            ));
                        }
                    }
                } else {
                    self.seen.retain(|k, _| listed.contains(k));
                }
                self.primed = true;
                out
            }
            watcher::Event::Apply(c) => self.apply(c, true),
            watcher::Event::Delete(c) => {
                let Some(name) = c.metadata.name.clone() else {
                    return Vec::new();
                };
                let mut s = self.seen.remove(&name).unwrap_or_default();
                note(&mut s, c);
                let at = c
                    .metadata
                    .deletion_timestamp
                    .as_ref()
                    .map(|t| SystemTime::from(t.0))
                    .unwrap_or_else(SystemTime::now);
                stamped(
                    deleted(&name, &s, at),
                    c.metadata.resource_version.as_deref(),
                )
                .into_iter()
                .collect()
            }
        }
    }

    fn apply(&mut self, c: &SandboxClaim, derive: bool) -> Vec<NewEvent> {
        let Some(name) = c.metadata.name.clone() else {
            return Vec::new();
        };
        let rv = c.metadata.resource_version.clone();
        let is_new = !self.seen.contains_key(&name);
        let s = self.seen.entry(name.clone()).or_default();
        let before = s.clone();
        note(s, c);
        let state = model::state_of(c);
        let ready = model::is_ready(c);
        s.ready = ready;
        s.suspended = state == sandhub_api::hub::SandboxState::Suspended;
        s.finished = state == sandhub_api::hub::SandboxState::Finished;
        s.ever_ready |= ready;
        if !derive {
            return Vec::new();
        }
        let event = |kind| NewEvent::sandbox(&s.tenant, kind, &name, &s.labels);
        let mut out = Vec::new();
        if is_new {
            let template = c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TEMPLATE_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            out.push(
                event(EventType::Created)
                    .with_pool(Some(&s.pool))
                    .detail("template", template),
            );
        }
        if s.suspended && !before.suspended {
            out.push(event(EventType::Suspended));
        }
        if ready && !before.ready {
            if before.suspended {
                out.push(event(EventType::Resumed));
            } else if !before.ever_ready {
                let bound = c
                    .status
                    .as_ref()
                    .and_then(|st| st.sandbox.as_ref())
                    .map(|b| b.name.as_str())
                    .unwrap_or_default();
                // A cold start names the Sandbox after the claim; an
                // adopted warm one keeps its pool-made name.
                let warm = bound != name;
                if warm {
                    out.push(event(EventType::Claimed).with_pool(Some(&s.pool)));
                } else if c.spec.env.is_none() {
                    // (A claim with env always starts cold: not starved.)
                    out.push(
                        NewEvent::pool(&s.tenant, EventType::PoolStarved, Some(&s.pool))
                            .detail("sandbox_id", name.as_str()),
                    );
                }
                out.push(
                    event(EventType::Ready).detail("launch", if warm { "warm" } else { "cold" }),
                );
            }
        }
        if let Some(exit) = s.exit.as_ref().filter(|e| before.exit.as_ref() != Some(e)) {
            let mut e = event(EventType::EntrypointExited);
            e.details = exit.details.clone();
            out.push(e);
        }
        if let Some((oom_kills, new_kills)) = s
            .oom
            .as_ref()
            .and_then(|now| super::oom::news(before.oom.as_ref(), now))
        {
            out.push(
                event(EventType::OomKilled)
                    .detail("oom_kills", oom_kills)
                    .detail("new_kills", new_kills),
            );
        }
        if s.finished && !before.finished {
            let mut e = event(EventType::Finished).detail("reason", "died");
            if let Some(t) = &s.terminal {
                e = e.detail("last_error", t.as_str());
            }
            out.push(e);
        }
        if let Some(ev) = s
            .eviction
            .as_ref()
            .filter(|e| before.eviction.as_ref() != Some(*e))
        {
            out.push(
                event(EventType::DiskQuotaExceeded)
                    .detail("evicted", true)
                    .detail("pod", ev.pod.as_str())
                    .detail("message", ev.message.as_str()),
            );
        }
        out.into_iter()
            .filter_map(|e| stamped(e, rv.as_deref()))
            .collect()
    }
}

/// Copies what later transitions and the delete need from `c` into `s`.
fn note(s: &mut ClaimSeen, c: &SandboxClaim) {
    s.rv = c.metadata.resource_version.clone();
    let labels = c.metadata.labels.clone().unwrap_or_default();
    s.tenant = labels
        .get(TENANT_LABEL)
        .cloned()
        .unwrap_or_else(|| s.tenant.clone());
    s.labels = labels
        .into_iter()
        .filter(|(k, _)| k != TENANT_LABEL && k != names::CREATED_BY)
        .collect();
    s.pool = super::owner::pool_hub_name_by_key(&s.tenant, &c.spec.warm_pool_ref.name);
    s.shutdown_at = c
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.shutdown_time.as_ref())
        .map(|t| SystemTime::from(t.0));
    s.exit = super::entrypoints::exit_of(c);
    s.oom = super::oom::record_of(c);
    s.eviction = super::evictions::record_of(c);
    if let Some((reason, message)) = model::terminal_reason(c) {
        s.terminal = Some(if message.is_empty() {
            reason
        } else {
            format!("{reason}: {message}")
        });
    }
}

/// `deleted` of claim `name`, gone at `at`, with why.
fn deleted(name: &str, s: &ClaimSeen, at: SystemTime) -> NewEvent {
    let e = NewEvent::sandbox(&s.tenant, EventType::Deleted, name, &s.labels);
    if s.shutdown_at.is_some_and(|d| d <= at) {
        e.reason(DeleteReason::Deadline)
    } else if !s.ever_ready && s.terminal.is_some() {
        e.reason(DeleteReason::StartFailed)
            .detail("last_error", s.terminal.clone().unwrap_or_default())
    } else {
        e.reason(DeleteReason::ByCaller)
    }
}

/// Pools' and templates' transitions: what each one was last seen as.
struct Watched<T> {
    seen: HashMap<String, T>,
    primed: bool,
}

impl<T> Default for Watched<T> {
    fn default() -> Self {
        Watched {
            seen: HashMap::new(),
            primed: false,
        }
    }
}

impl<T: PartialEq> Watched<T> {
    /// Records `object`'s `now`; true when it changed from a value seen
    /// before (never on the first list, nor for a new object).
    fn changed<K: Resource + Clone>(
        &mut self,
        ev: &watcher::Event<K>,
        now: impl Fn(&K) -> T,
    ) -> Option<K> {
        match ev {
            watcher::Event::Init => None,
            watcher::Event::InitDone => {
                self.primed = true;
                None
            }
            watcher::Event::Delete(k) => {
                if let Some(n) = &k.meta().name {
                    self.seen.remove(n);
                }
                None
            }
            watcher::Event::Apply(k) | watcher::Event::InitApply(k) => {
                let name = k.meta().name.clone()?;
                let value = now(k);
                let changed = self.seen.get(&name).is_some_and(|old| *old != value);
                self.seen.insert(name, value);
                // The first list is the baseline; a relist's differences
                // are changes missed while the watch was down.
                let derive = self.primed || matches!(ev, watcher::Event::Apply(_));
                (derive && changed).then(|| k.clone())
            }
        }
    }
}

/// Pools: their template reference, and the start failures the controller
/// counts on them (`StartFailures`).
#[derive(Default)]
pub struct PoolTracker {
    template: Watched<String>,
    failures: Watched<u64>,
}

impl PoolTracker {
    pub fn observe(&mut self, ev: &watcher::Event<SandboxWarmPool>) -> Vec<NewEvent> {
        let mut out = Vec::new();
        if let Some(p) = self
            .template
            .changed(ev, |p| p.spec.sandbox_template_ref.name.clone())
        {
            let tenant = tenant_of(&p);
            let template =
                super::owner::pool_hub_name_by_key(&tenant, &p.spec.sandbox_template_ref.name);
            out.extend(stamped(
                NewEvent::pool(&tenant, EventType::TemplateChanged, Some(&hub_name(&p)))
                    .detail("template", template),
                p.metadata.resource_version.as_deref(),
            ));
        }
        let failures = |p: &SandboxWarmPool| StartFailures::of(p).map_or(0, |f| f.failures);
        if let Some(p) = self.failures.changed(ev, failures) {
            // The controller only ever adds to the count.
            if let Some(f) = StartFailures::of(&p).filter(|f| f.failures > 0) {
                out.extend(stamped(
                    NewEvent::pool(
                        &tenant_of(&p),
                        EventType::PoolStartFailed,
                        Some(&hub_name(&p)),
                    )
                    .detail("last_error", f.last_error)
                    .detail("failures", f.failures),
                    p.metadata.resource_version.as_deref(),
                ));
            }
        }
        out
    }
}

#[derive(Default)]
pub struct TemplateTracker(Watched<Option<i64>>);

impl TemplateTracker {
    pub fn observe(&mut self, ev: &watcher::Event<SandboxTemplate>) -> Vec<NewEvent> {
        let Some(t) = self.0.changed(ev, |t| t.metadata.generation) else {
            return Vec::new();
        };
        stamped(
            NewEvent::pool(&tenant_of(&t), EventType::TemplateChanged, None)
                .detail("template", hub_name(&t)),
            t.metadata.resource_version.as_deref(),
        )
        .into_iter()
        .collect()
    }
}

/// Holds derived events [`REORDER`] long and lets them go in id order.
#[derive(Default)]
pub struct Reorder {
    waiting: BTreeMap<u64, (Instant, NewEvent)>,
}

impl Reorder {
    pub fn push(&mut self, e: NewEvent, now: Instant) {
        if let Some(id) = e.id {
            // Two watches never derive one id; a repeat is the same event.
            self.waiting.entry(id).or_insert((now, e));
        }
    }

    /// The events whose wait is over, lowest id first; an event waits for
    /// every lower one still waiting, so ids leave in order.
    pub fn due(&mut self, now: Instant) -> Vec<NewEvent> {
        let mut out = Vec::new();
        while let Some(entry) = self.waiting.first_entry() {
            if now.duration_since(entry.get().0) < REORDER {
                break;
            }
            out.push(entry.remove().1);
        }
        out
    }
}

/// Where the claim watch sends what it derived (see [`spawn`]).
pub type Feed = mpsc::Sender<Vec<NewEvent>>;

/// What [`spawn`] started: the feed the claim watch
/// ([`super::claim_cache`]) sends into, and the pool and template watches'
/// stores (kube/caches.rs reads them).
pub struct Spawned {
    pub feed: Feed,
    pub pools: Store<SandboxWarmPool>,
    pub templates: Store<SandboxTemplate>,
}

/// Starts the reorderer into `log` and the pool and template watches.
pub fn spawn(client: &kube::Client, namespace: &str, log: Arc<EventLog>) -> Spawned {
    let (tx, mut rx) = mpsc::channel::<Vec<NewEvent>>(QUEUE);
    tokio::spawn(async move {
        let mut reorder = Reorder::default();
        let mut tick = tokio::time::interval(REORDER / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                batch = rx.recv() => match batch {
                    Some(batch) => {
                        let now = Instant::now();
                        for e in batch {
                            reorder.push(e, now);
                        }
                    }
                    None => return,
                },
                _ = tick.tick() => {
                    for e in reorder.due(Instant::now()) {
                        log.emit(e);
                    }
                }
            }
        }
    });
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), namespace);
    let pools = watch(
        pools,
        tx.clone(),
        PoolTracker::default(),
        PoolTracker::observe,
    );
    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), namespace);
    let templates = watch(
        templates,
        tx.clone(),
        TemplateTracker::default(),
        TemplateTracker::observe,
    );
    Spawned {
        feed: tx,
        pools,
        templates,
    }
}

/// A watch of `api`'s objects, kept in the store it returns, whose changes
/// `observe` turns into events.
fn watch<K, T>(
    api: Api<K>,
    tx: Feed,
    mut tracker: T,
    observe: fn(&mut T, &watcher::Event<K>) -> Vec<NewEvent>,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    T: Send + 'static,
{
    let (store, events) = super::caches::reflect(api, watcher::Config::default());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        // The store is kept even once nobody takes the events.
        let mut tx = Some(tx);
        while let Some(ev) = events.next().await {
            match ev {
                Ok(ev) => {
                    let Some(feed) = &tx else { continue };
                    let out = observe(&mut tracker, &ev);
                    if !out.is_empty() && feed.send(out).await.is_err() {
                        tx = None;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "lifecycle event watch"),
            }
        }
    });
    store
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use sandhub_api::{
        hub::CreateSandbox,
        k8s::claim::{ClaimSandboxStatus, SandboxClaimStatus},
    };

    use super::*;
    use crate::events::MemoryLog;
    use crate::events::Sink;

    const TENANT: &str = "acme";

    fn claim(name: &str, rv: u64) -> SandboxClaim {
        let mut c = model::claim_for(
            name,
            TENANT,
            &super::super::owner::object_name(TENANT, "python"),
            "python",
            &CreateSandbox {
                labels: BTreeMap::from([("team".into(), "ml".into())]),
                ..Default::default()
            },
            SystemTime::now(),
            None,
        )
        .unwrap();
        c.metadata.resource_version = Some(rv.to_string());
        c
    }

    fn with(mut c: SandboxClaim, ready: (&str, &str), bound: Option<&str>) -> SandboxClaim {
        c.status = Some(SandboxClaimStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: ready.0.into(),
                reason: ready.1.into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            sandbox: bound.map(|n| ClaimSandboxStatus {
                name: n.into(),
                ..Default::default()
            }),
        });
        c
    }

    fn kinds(events: &[NewEvent]) -> Vec<&'static str> {
        events.iter().map(|e| e.kind.as_str()).collect()
    }

    fn primed() -> ClaimTracker {
        let mut t = ClaimTracker::default();
        assert!(t.observe(&watcher::Event::Init).is_empty());
        assert!(t.observe(&watcher::Event::InitDone).is_empty());
        t
    }

    #[test]
    fn a_warm_claims_life_reads_as_the_local_vocabulary() {
        let mut t = primed();
        let key = model::tenant_label_value(TENANT);
        let created = t.observe(&watcher::Event::Apply(claim("sb-1", 100)));
        assert_eq!(kinds(&created), ["created"]);
        assert_eq!(created[0].tenant, key);
        assert_eq!(
            created[0].pool.as_deref(),
            Some("python"),
            "the tenant's hub name"
        );
        assert_eq!(created[0].labels["team"], "ml");
        assert!(!created[0].labels.contains_key(TENANT_LABEL));
        assert_eq!(created[0].id, Some(100 * 16));
        assert_eq!(
            EventType::ALL
                .map(slot)
                .iter()
                .collect::<HashSet<_>>()
                .len(),
            16,
            "one slot per type"
        );
        // Nothing new, nothing derived: not one event per watch update.
        let pending = with(claim("sb-1", 101), ("False", "DependenciesNotReady"), None);
        assert!(t
            .observe(&watcher::Event::Apply(pending.clone()))
            .is_empty());
        assert!(t.observe(&watcher::Event::Apply(pending)).is_empty());
        let ready = with(
            claim("sb-1", 102),
            ("True", "DependenciesReady"),
            Some("python-abcde"),
        );
        let got = t.observe(&watcher::Event::Apply(ready.clone()));
        assert_eq!(kinds(&got), ["claimed", "ready"]);
        assert_eq!(got[1].details["launch"], "warm");
        assert!(got[0].id < got[1].id && got[1].id.unwrap() / 16 == 102);
        assert!(t.observe(&watcher::Event::Apply(ready)).is_empty());
        let suspended = with(
            claim("sb-1", 103),
            ("False", "SandboxSuspended"),
            Some("python-abcde"),
        );
        assert_eq!(
            kinds(&t.observe(&watcher::Event::Apply(suspended))),
            ["suspended"]
        );
        let back = with(
            claim("sb-1", 104),
            ("True", "DependenciesReady"),
            Some("python-abcde"),
        );
        assert_eq!(kinds(&t.observe(&watcher::Event::Apply(back))), ["resumed"]);
        let gone = t.observe(&watcher::Event::Delete(claim("sb-1", 105)));
        assert_eq!(kinds(&gone), ["deleted"]);
        assert_eq!(gone[0].details["reason"], "by_caller");
        assert_eq!(gone[0].id, event_id(Some("105"), EventType::Deleted));
    }

    #[test]
    fn a_cold_start_is_pool_starved_and_deadlines_and_failures_have_their_reasons() {
        let mut t = primed();
        t.observe(&watcher::Event::Apply(claim("sb-2", 10)));
        let ready = with(
            claim("sb-2", 11),
            ("True", "DependenciesReady"),
            Some("sb-2"),
        );
        let got = t.observe(&watcher::Event::Apply(ready));
        assert_eq!(kinds(&got), ["pool_starved", "ready"]);
        assert_eq!(got[0].pool.as_deref(), Some("python"));
        assert_eq!(got[1].details["launch"], "cold");
        // Past its shutdownTime: the controller's delete.
        let mut late = claim("sb-2", 12);
        late.spec.lifecycle =
            Some(model::deadline(0).unwrap()).and_then(|v| serde_json::from_value(v).ok());
        let gone = t.observe(&watcher::Event::Delete(late));
        assert_eq!(gone[0].details["reason"], "deadline");
        // Never Ready, with a terminal reason: its start failed.
        t.observe(&watcher::Event::Apply(claim("sb-3", 20)));
        let bad = with(claim("sb-3", 21), ("False", "TemplateNotFound"), None);
        t.observe(&watcher::Event::Apply(bad.clone()));
        let gone = t.observe(&watcher::Event::Delete(bad));
        assert_eq!(gone[0].details["reason"], "start_failed");
        assert!(gone[0].details["last_error"]
            .as_str()
            .unwrap()
            .contains("TemplateNotFound"));
    }

    #[test]
    fn an_exit_recorded_on_the_claim_is_told_once() {
        use super::super::entrypoints::{Exit, ANNOTATION};
        let mut t = primed();
        let ready = |rv, exit: Option<&Exit>| {
            let mut c = with(
                claim("sb-8", rv),
                ("True", "DependenciesReady"),
                Some("sb-8"),
            );
            if let Some(e) = exit {
                c.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION.into(), serde_json::to_string(e).unwrap());
            }
            c
        };
        t.observe(&watcher::Event::Apply(claim("sb-8", 70)));
        t.observe(&watcher::Event::Apply(ready(71, None)));
        let exit = Exit {
            run: 5,
            details: serde_json::json!({"state": "Error", "exit_code": 3}),
        };
        let got = t.observe(&watcher::Event::Apply(ready(72, Some(&exit))));
        assert_eq!(kinds(&got), ["entrypoint_exited"]);
        assert_eq!(got[0].details["exit_code"], 3);
        assert_eq!(got[0].id, event_id(Some("72"), EventType::EntrypointExited));
        // The same record again (another replica wrote the same): nothing.
        assert!(t
            .observe(&watcher::Event::Apply(ready(73, Some(&exit))))
            .is_empty());
        let next = Exit { run: 9, ..exit };
        assert_eq!(
            kinds(&t.observe(&watcher::Event::Apply(ready(74, Some(&next))))),
            ["entrypoint_exited"]
        );
    }

    #[test]
    fn oom_kills_recorded_on_the_claim_are_told_once_per_kill() {
        use super::super::oom::{OomRecord, ANNOTATION};
        let mut t = primed();
        let ready = |rv, record: Option<OomRecord>| {
            let mut c = with(
                claim("sb-9", rv),
                ("True", "DependenciesReady"),
                Some("sb-9"),
            );
            if let Some(r) = record {
                c.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION.into(), serde_json::to_string(&r).unwrap());
            }
            c
        };
        let rec = |pod: &str, kills| {
            Some(OomRecord {
                pod: pod.into(),
                kills,
            })
        };
        t.observe(&watcher::Event::Apply(claim("sb-9", 80)));
        t.observe(&watcher::Event::Apply(ready(81, None)));
        let got = t.observe(&watcher::Event::Apply(ready(82, rec("sb-9/10.0.0.2", 1))));
        assert_eq!(kinds(&got), ["oom_killed"]);
        assert_eq!(got[0].details["oom_kills"], 1);
        assert_eq!(got[0].details["new_kills"], 1);
        assert_eq!(got[0].id, event_id(Some("82"), EventType::OomKilled));
        // Written again by another replica: nothing.
        assert!(t
            .observe(&watcher::Event::Apply(ready(83, rec("sb-9/10.0.0.2", 1))))
            .is_empty());
        let got = t.observe(&watcher::Event::Apply(ready(84, rec("sb-9/10.0.0.2", 4))));
        assert_eq!(got[0].details["new_kills"], 3);
        // A new Pod (resumed) counts from 0: its first kill is news.
        let got = t.observe(&watcher::Event::Apply(ready(85, rec("sb-9/10.0.0.3", 1))));
        assert_eq!(kinds(&got), ["oom_killed"]);
        assert_eq!(got[0].details["new_kills"], 1);
    }

    #[test]
    fn an_eviction_for_local_storage_recorded_on_the_claim_is_told_once() {
        use super::super::evictions::{Eviction, ANNOTATION};
        let mut t = primed();
        let failed = |rv, record: Option<&Eviction>| {
            let mut c = with(claim("sb-7", rv), ("False", "PodFailed"), Some("sb-7"));
            if let Some(r) = record {
                c.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION.into(), serde_json::to_string(r).unwrap());
            }
            c
        };
        t.observe(&watcher::Event::Apply(claim("sb-7", 60)));
        t.observe(&watcher::Event::Apply(with(
            claim("sb-7", 61),
            ("True", "DependenciesReady"),
            Some("sb-7"),
        )));
        assert!(!kinds(&t.observe(&watcher::Event::Apply(failed(62, None))))
            .contains(&"disk_quota_exceeded"));
        let ev = Eviction {
            pod: "sb-7".into(),
            message:
                "Pod ephemeral local storage usage exceeds the total limit of containers 64Mi."
                    .into(),
        };
        let got = t.observe(&watcher::Event::Apply(failed(63, Some(&ev))));
        assert_eq!(kinds(&got), ["disk_quota_exceeded"]);
        assert_eq!(got[0].details["evicted"], true);
        assert_eq!(got[0].details["pod"], "sb-7");
        assert_eq!(got[0].details["message"], ev.message.as_str());
        assert_eq!(
            got[0].id,
            event_id(Some("63"), EventType::DiskQuotaExceeded)
        );
        // The same record written again by another replica: nothing.
        assert!(t
            .observe(&watcher::Event::Apply(failed(64, Some(&ev))))
            .is_empty());
    }

    #[test]
    fn the_first_list_is_a_baseline_and_a_relist_finds_the_deleted() {
        let mut t = ClaimTracker::default();
        t.observe(&watcher::Event::Init);
        let ready = with(
            claim("sb-4", 30),
            ("True", "DependenciesReady"),
            Some("sb-4"),
        );
        assert!(t
            .observe(&watcher::Event::InitApply(ready.clone()))
            .is_empty());
        assert!(t
            .observe(&watcher::Event::InitApply(claim("sb-5", 31)))
            .is_empty());
        assert!(t.observe(&watcher::Event::InitDone).is_empty());
        // Already Ready when this replica started: no second `ready`.
        assert!(t.observe(&watcher::Event::Apply(ready.clone())).is_empty());
        // The watch restarts; sb-5 went meanwhile.
        t.observe(&watcher::Event::Init);
        t.observe(&watcher::Event::InitApply(ready));
        let gone = t.observe(&watcher::Event::InitDone);
        assert_eq!(kinds(&gone), ["deleted"]);
        assert_eq!(gone[0].sandbox_id.as_deref(), Some("sb-5"));
        assert_eq!(gone[0].id, event_id(Some("31"), EventType::Deleted));
    }

    #[test]
    fn ids_are_the_same_on_every_replica_and_odd_versions_make_none() {
        // A replica that started later (its baseline saw the claim pending)
        // names the same write's events with the same ids.
        let mut a = primed();
        a.observe(&watcher::Event::Apply(claim("sb-6", 40)));
        let mut b = ClaimTracker::default();
        b.observe(&watcher::Event::Init);
        b.observe(&watcher::Event::InitApply(claim("sb-6", 40)));
        b.observe(&watcher::Event::InitDone);
        let ready = with(
            claim("sb-6", 41),
            ("True", "DependenciesReady"),
            Some("python-x"),
        );
        let ids = |evs: Vec<NewEvent>| evs.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(
            ids(a.observe(&watcher::Event::Apply(ready.clone()))),
            ids(b.observe(&watcher::Event::Apply(ready)))
        );
        assert_eq!(event_id(Some("not-a-number"), EventType::Ready), None);
        assert_eq!(
            event_id(Some(&u64::MAX.to_string()), EventType::Ready),
            None
        );
        let mut odd = claim("sb-7", 1);
        odd.metadata.resource_version = Some("x1".into());
        assert!(a.observe(&watcher::Event::Apply(odd)).is_empty());
    }

    #[test]
    fn templates_and_pools_change_only_on_a_change() {
        let mut t = TemplateTracker::default();
        let mut tpl = SandboxTemplate::new("python", Default::default());
        tpl.metadata.generation = Some(1);
        tpl.metadata.resource_version = Some("50".into());
        t.observe(&watcher::Event::Init);
        assert!(t
            .observe(&watcher::Event::InitApply(tpl.clone()))
            .is_empty());
        t.observe(&watcher::Event::InitDone);
        tpl.metadata.resource_version = Some("51".into());
        assert!(
            t.observe(&watcher::Event::Apply(tpl.clone())).is_empty(),
            "status only"
        );
        tpl.metadata.generation = Some(2);
        tpl.metadata.resource_version = Some("52".into());
        let got = t.observe(&watcher::Event::Apply(tpl));
        assert_eq!(kinds(&got), ["template_changed"]);
        assert_eq!(got[0].tenant, SHARED, "an operator's template: everyone's");
        assert_eq!(got[0].details["template"], "python");

        let mut p = PoolTracker::default();
        let mut pool = SandboxWarmPool::new("web-0123456789ab", Default::default());
        pool.metadata.labels = Some(BTreeMap::from([(
            TENANT_LABEL.to_string(),
            model::tenant_label_value(TENANT),
        )]));
        pool.metadata.annotations = Some(BTreeMap::from([(
            HUB_NAME_ANNOTATION.to_string(),
            "web".to_string(),
        )]));
        pool.spec.sandbox_template_ref.name = "a".into();
        pool.metadata.resource_version = Some("60".into());
        p.observe(&watcher::Event::InitDone);
        assert!(
            p.observe(&watcher::Event::Apply(pool.clone())).is_empty(),
            "new"
        );
        pool.spec.sandbox_template_ref.name = "b".into();
        pool.metadata.resource_version = Some("61".into());
        let got = p.observe(&watcher::Event::Apply(pool.clone()));
        assert_eq!(kinds(&got), ["template_changed"]);
        assert_eq!(got[0].pool.as_deref(), Some("web"));
        assert_eq!(got[0].tenant, model::tenant_label_value(TENANT));

        // The controller counts failed warm starts on the pool: each write
        // that adds to them is one `pool_start_failed`.
        let failed = |pool: &mut SandboxWarmPool, n: u64, rv: &str| {
            let f = StartFailures {
                failures: n,
                last_error: "warm Sandbox web-x was not Ready within 300s".into(),
            };
            pool.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    sandhub_api::k8s::warmpool::START_FAILURES_ANNOTATION.into(),
                    serde_json::to_string(&f).unwrap(),
                );
            pool.metadata.resource_version = Some(rv.into());
        };
        failed(&mut pool, 1, "62");
        let got = p.observe(&watcher::Event::Apply(pool.clone()));
        assert_eq!(kinds(&got), ["pool_start_failed"]);
        assert_eq!(got[0].details["failures"], 1);
        assert!(got[0].details["last_error"]
            .as_str()
            .unwrap()
            .contains("not Ready"));
        assert_eq!(got[0].pool.as_deref(), Some("web"));
        assert_eq!(got[0].id, event_id(Some("62"), EventType::PoolStartFailed));
        pool.metadata.resource_version = Some("63".into());
        assert!(
            p.observe(&watcher::Event::Apply(pool.clone())).is_empty(),
            "the same count again: nothing"
        );
        failed(&mut pool, 3, "64");
        assert_eq!(
            kinds(&p.observe(&watcher::Event::Apply(pool))),
            ["pool_start_failed"]
        );
    }

    #[test]
    fn the_reorderer_lets_ids_go_in_order_after_the_wait() {
        let mut r = Reorder::default();
        let t0 = Instant::now();
        let e = |id| NewEvent {
            id: Some(id),
            ..NewEvent::pool("k", EventType::PoolStarved, None)
        };
        r.push(e(20), t0);
        r.push(e(10), t0 + REORDER / 2);
        r.push(e(10), t0 + REORDER / 2);
        assert!(r.due(t0 + REORDER / 4).is_empty());
        // 20's wait is over, but 10 (lower, later) still waits: both wait.
        assert!(r.due(t0 + REORDER).is_empty());
        let out = r.due(t0 + REORDER * 2);
        assert_eq!(
            out.iter().map(|e| e.id).collect::<Vec<_>>(),
            [Some(10), Some(20)]
        );
    }

    #[test]
    fn the_ring_keeps_given_ids_in_order_once_and_shares_operator_events() {
        let ring = MemoryLog::new(3);
        let e = |id, tenant: &str| NewEvent {
            id: Some(id),
            ..NewEvent::pool(tenant, EventType::PoolStarved, None)
        };
        let stored = ring
            .append(vec![e(50, "k"), e(30, "k"), e(50, "k"), e(40, SHARED)])
            .unwrap();
        assert_eq!(
            stored.iter().map(|e| e.id).collect::<Vec<_>>(),
            [50, 30, 40]
        );
        let ids = |t| {
            ring.after(t, 0, 10)
                .unwrap()
                .iter()
                .map(|e| e.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids("k"), [30, 40, 50]);
        assert_eq!(ids("other"), [40], "only the shared one");
        assert_eq!(ring.newest().unwrap(), 50);
        // Full: a new id pushes out the lowest; one below all kept is dropped.
        ring.append(vec![e(60, "k"), e(10, "k")]).unwrap();
        assert_eq!(ids("k"), [40, 50, 60]);
        assert_eq!(ring.after("k", 45, 10).unwrap()[0].id, 50);
    }
}
