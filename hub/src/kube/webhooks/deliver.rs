//! The deliverer of the replica that holds the Lease.
//!
//! Every [`RELOAD`] it lists the webhooks' state ConfigMaps (the hub may
//! not list Secrets, so these say which tenants have webhooks), reads each
//! such tenant's registrations Secret by name, and keeps one task per
//! webhook: a task reads the tenant's events above its cursor from this
//! replica's ring (`EventLog::after`: the tenant's own and the operator's
//! shared ones, as its streams show them), sends them in order through
//! `Rules::attempt` (the same rules, signature and verdicts as the local
//! backend), and writes its progress to its ConfigMap: after each failure,
//! and otherwise at most every [`FLUSH_EVERY`] and whenever it goes idle.
//! A holder killed between two writes loses at most that much progress:
//! the next holder sends those events again (at least once).
//!
//! When this replica stops holding the Lease, every task ends before its
//! next send. Before each send a task reads its ConfigMap (one GET, next
//! to the POST it guards): a webhook deleted on any replica gets nothing
//! more once the `DELETE` has answered.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams},
    Api,
};
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{
    lease::Elector,
    progress::{Next, Progress},
    record::{self, Registration, Registrations},
    takes, ORPHAN_GRACE,
};
use crate::{
    backend::now_ms,
    events::{Event, EventLog},
    webhooks::{Delivery, Rules},
};

/// How often the holder reads the registrations again.
pub const RELOAD: Duration = Duration::from_secs(2);
/// Progress is written at most this often while deliveries succeed.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Events read from the ring per step.
const BATCH: usize = 64;

pub struct Deliverer {
    pub secrets: Api<Secret>,
    pub states: Api<ConfigMap>,
    pub log: Arc<EventLog>,
    pub rules: Arc<Rules>,
    pub elector: Arc<Mutex<Elector>>,
    /// `--webhook-concurrency`: sends in flight over all webhooks.
    pub limit: Semaphore,
}

/// One webhook, as its task sends to it.
#[derive(Clone, PartialEq, Eq)]
struct Hook {
    /// The tenant's name (the events' `tenant` when sent).
    tenant: String,
    /// Its label digest (what the ring files its events under).
    key: String,
    name: String,
    reg: Registration,
}

struct Worker {
    uid: String,
    hook: watch::Sender<Arc<Hook>>,
    stop: CancellationToken,
    /// A task that ended by itself (its state unreadable for a moment) is
    /// started again at the next reload.
    task: tokio::task::JoinHandle<()>,
}

/// The progress `cm` stores, if it is registration `uid`'s.
pub fn stored_progress(cm: &ConfigMap, uid: &str) -> Option<Progress> {
    let json = cm.data.as_ref()?.get(record::PROGRESS_KEY)?;
    let p: Progress = serde_json::from_str(json).ok()?;
    (p.uid == uid).then_some(p)
}

impl Deliverer {
    fn holding(&self) -> bool {
        self.elector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .holding(Instant::now())
    }

    pub async fn run(self) {
        let me = Arc::new(self);
        let mut workers: HashMap<String, Worker> = HashMap::new();
        loop {
            if me.holding() {
                match me.load().await {
                    Ok(found) => me.reconcile(&mut workers, found),
                    Err(e) => tracing::warn!(error = %e, "reading the webhooks to deliver"),
                }
            } else {
                for (_, w) in workers.drain() {
                    w.stop.cancel();
                }
            }
            tokio::time::sleep(RELOAD).await;
        }
    }

    /// Every registered webhook, by its state ConfigMap's name. Deletes
    /// state objects whose webhook is gone (after [`ORPHAN_GRACE`]).
    async fn load(&self) -> kube::Result<HashMap<String, Hook>> {
        let cms = self
            .states
            .list(&ListParams::default().labels(&format!("{}=true", record::STATE_LABEL)))
            .await?
            .items;
        // Per tenant: its registrations, `Ok(None)` without a Secret,
        // `Err` when the Secret does not parse (its webhooks wait, and
        // their state is kept).
        let mut tenants: HashMap<String, Result<Option<Registrations>, ()>> = HashMap::new();
        let mut found = HashMap::new();
        for cm in cms {
            let (Some(name), Some(id)) = (cm.metadata.name.clone(), record::identity_of(&cm))
            else {
                continue;
            };
            if name != record::state_name(&id.tenant_key, &id.name) {
                continue; // not one the hub wrote
            }
            if !tenants.contains_key(&id.tenant_key) {
                let secret = record::secret_name(&id.tenant_key);
                let regs = match self.secrets.get_opt(&secret).await? {
                    None => Ok(None),
                    Some(s) => Registrations::of(&s).map(Some).ok_or_else(|| {
                        tracing::warn!(secret = %secret,
                            "a tenant's webhooks Secret does not parse; its webhooks wait");
                    }),
                };
                tenants.insert(id.tenant_key.clone(), regs);
            }
            let orphan = match classify(tenants.get(&id.tenant_key), &id) {
                State::Live(regs, reg) => {
                    found.insert(
                        name.clone(),
                        Hook {
                            tenant: regs.tenant.clone(),
                            key: id.tenant_key.clone(),
                            name: id.name.clone(),
                            reg: reg.clone(),
                        },
                    );
                    false
                }
                State::Wait => false,
                State::Orphan => true,
            };
            let age = cm
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| {
                    k8s_openapi::jiff::Timestamp::now()
                        .duration_since(t.0)
                        .as_secs()
                })
                .unwrap_or(0);
            if orphan && age >= ORPHAN_GRACE.as_secs() as i64 {
                match self.states.delete(&name, &DeleteParams::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(found)
    }

    /// Starts, updates and stops tasks to match `found`.
    fn reconcile(
        self: &Arc<Self>,
        workers: &mut HashMap<String, Worker>,
        found: HashMap<String, Hook>,
    ) {
        workers.retain(|state, w| {
            let keep =
                !w.task.is_finished() && found.get(state).is_some_and(|h| h.reg.uid == w.uid);
            if !keep {
                w.stop.cancel();
            }
            keep
        });
        for (state, hook) in found {
            if let Some(w) = workers.get(&state) {
                w.hook.send_if_modified(|h| {
                    let changed = **h != hook;
                    if changed {
                        *h = Arc::new(hook.clone());
                    }
                    changed
                });
                continue;
            }
            let (tx, rx) = watch::channel(Arc::new(hook.clone()));
            let stop = CancellationToken::new();
            let task = tokio::spawn(self.clone().work(state.clone(), rx, stop.clone()));
            workers.insert(
                state,
                Worker {
                    uid: hook.reg.uid.clone(),
                    hook: tx,
                    stop,
                    task,
                },
            );
        }
    }

    /// Writes `p` to its ConfigMap; `false` when the ConfigMap is gone (the
    /// webhook was deleted: the task ends).
    async fn flush(&self, state: &str, p: &mut Progress) -> bool {
        let json = serde_json::to_string(&p).unwrap_or_default();
        let patch = serde_json::json!({"data": {record::PROGRESS_KEY: json}});
        match self
            .states
            .patch(state, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                p.dirty = false;
                true
            }
            Err(kube::Error::Api(e)) if e.code == 404 => false,
            Err(e) => {
                tracing::warn!(error = %e, state, "writing a webhook's delivery progress");
                true
            }
        }
    }

    /// One webhook's task: until stopped, send what is due, in order.
    async fn work(
        self: Arc<Self>,
        state: String,
        hook: watch::Receiver<Arc<Hook>>,
        stop: CancellationToken,
    ) {
        let first = hook.borrow().clone();
        let stored = match self.states.get_opt(&state).await {
            Ok(cm) => cm.and_then(|cm| stored_progress(&cm, &first.reg.uid)),
            Err(e) => {
                // Resuming from `after` could send everything again: wait
                // for the next reload to start this task anew.
                tracing::warn!(error = %e, state, "reading a webhook's delivery progress");
                return;
            }
        };
        let mut p = Progress::resume(stored, &first.reg.uid, first.reg.after);
        let mut live = self.log.subscribe();
        let mut flushed = Instant::now();
        while !stop.is_cancelled() {
            let h = hook.borrow().clone();
            let events = self.log.after(&h.key, p.cursor, BATCH).unwrap_or_default();
            let now = now_ms();
            // (wait, whether a new event ends the wait: not while the head
            // event waits for its retry, which no new event can hasten)
            let (wait, on_news) = match p.next(&events, |e| takes(&h.reg.events, e.kind), now) {
                Next::Deliver(e, attempt) => {
                    if !self.holding() {
                        break;
                    }
                    let Ok(_permit) = self.limit.acquire().await else {
                        break;
                    };
                    // Still registered? A `DELETE` on any replica removes the
                    // state first, so nothing is sent after it answers.
                    match self.states.get_opt(&state).await {
                        Ok(Some(cm))
                            if record::identity_of(&cm).is_some_and(|id| id.uid == h.reg.uid) => {}
                        // Deleted, or made again (the next reload starts its task).
                        Ok(_) => return,
                        Err(e) => {
                            tracing::warn!(error = %e, state, "reading a webhook's state");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                    let (id, created_at, body) = (e.id, event_ms(e, now), body(e, &h.tenant));
                    let (record, verdict) = self
                        .rules
                        .attempt(Delivery {
                            tenant: &h.tenant,
                            name: &h.name,
                            url: &h.reg.url,
                            secret: &h.reg.secret,
                            event_id: id,
                            body: &body,
                            attempt,
                            created_at,
                        })
                        .await;
                    p.settle(id, record, verdict);
                    if !verdict.done() || flushed.elapsed() >= FLUSH_EVERY {
                        if !self.flush(&state, &mut p).await {
                            return;
                        }
                        flushed = Instant::now();
                    }
                    continue;
                }
                Next::WaitUntil(at) => (
                    Duration::from_millis((at - now).clamp(10, 1000) as u64),
                    false,
                ),
                // A full batch of types it does not take: read on at once.
                Next::Idle if events.len() >= BATCH => continue,
                Next::Idle => (Duration::from_secs(1), true),
            };
            if p.dirty {
                if !self.flush(&state, &mut p).await {
                    return;
                }
                flushed = Instant::now();
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = live.recv(), if on_news => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if p.dirty && self.holding() {
            self.flush(&state, &mut p).await;
        }
    }
}

/// What a state ConfigMap naming `id` is, given its tenant's registrations
/// (`Ok(None)`: no Secret; `Err`: a Secret that does not parse).
enum State<'a> {
    /// Its webhook is registered: deliver.
    Live(&'a Registrations, &'a Registration),
    /// Not now: the Secret is unreadable, or the name was made again and
    /// its state not yet pointed at the new one. Kept.
    Wait,
    /// Its webhook is gone: the state may be deleted (after a grace).
    Orphan,
}

fn classify<'a>(
    regs: Option<&'a Result<Option<Registrations>, ()>>,
    id: &record::Identity,
) -> State<'a> {
    match regs {
        Some(Ok(Some(regs))) => match regs.hooks.get(&id.name) {
            Some(reg) if reg.uid == id.uid => State::Live(regs, reg),
            Some(_) => State::Wait,
            None => State::Orphan,
        },
        Some(Ok(None)) => State::Orphan,
        _ => State::Wait,
    }
}

/// The event as the tenant's webhook gets it: naming the tenant (the ring
/// files it under a digest, or none for an operator's pool or template).
fn body(e: &Event, tenant: &str) -> String {
    serde_json::to_string(&Event {
        tenant: tenant.to_string(),
        ..e.clone()
    })
    .unwrap_or_default()
}

/// When `e` happened (Unix ms): `--webhook-max-age` counts from it.
fn event_ms(e: &Event, or: i64) -> i64 {
    humantime::parse_rfc3339(&e.time)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(or, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventType, NewEvent};

    #[test]
    fn state_is_deleted_only_when_its_webhook_is_surely_gone() {
        let id = record::Identity {
            tenant_key: "k".into(),
            name: "ops".into(),
            uid: "u1".into(),
        };
        let reg = |uid: &str| Registration {
            uid: uid.into(),
            url: "http://x/".into(),
            events: vec![],
            secret: "0123456789abcdef".into(),
            updated_at: 0,
            after: 0,
        };
        let with = |uid: &str| {
            Ok(Some(Registrations {
                tenant: "alice".into(),
                hooks: [("ops".to_string(), reg(uid))].into(),
            }))
        };
        assert!(
            matches!(classify(Some(&with("u1")), &id), State::Live(r, _) if r.tenant == "alice")
        );
        assert!(matches!(classify(Some(&with("u2")), &id), State::Wait));
        assert!(
            matches!(classify(Some(&Err(())), &id), State::Wait),
            "unreadable: kept"
        );
        assert!(matches!(classify(Some(&Ok(None)), &id), State::Orphan));
        let other = Ok(Some(Registrations {
            tenant: "alice".into(),
            hooks: Default::default(),
        }));
        assert!(matches!(classify(Some(&other), &id), State::Orphan));
    }

    #[test]
    fn a_sent_event_names_the_tenant_and_keeps_its_time() {
        let mut n = NewEvent::pool("", EventType::TemplateChanged, None);
        n.at_ms = 1_700_000_000_123;
        let e = Event::stored(42, n);
        let sent: Event = serde_json::from_str(&body(&e, "alice")).unwrap();
        assert_eq!((sent.id, sent.tenant.as_str()), (42, "alice"));
        assert_eq!(event_ms(&e, 0), 1_700_000_000_123);
        let mut cm = record::new_state(&record::Identity {
            tenant_key: "k".into(),
            name: "n".into(),
            uid: "u1".into(),
        });
        assert!(stored_progress(&cm, "u1").is_none());
        cm.data.as_mut().unwrap().insert(
            record::PROGRESS_KEY.into(),
            serde_json::to_string(&Progress::fresh("u1", 9)).unwrap(),
        );
        assert_eq!(stored_progress(&cm, "u1").unwrap().cursor, 9);
        assert!(
            stored_progress(&cm, "u2").is_none(),
            "another registration's"
        );
    }
}
