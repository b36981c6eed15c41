//! Lifecycle events: one vocabulary ([`EventType`]) on both backends, an
//! append-only log with increasing ids, and the live feed `GET /v1/events`
//! streams from.
//!
//! # Layout
//!
//! ```text
//! mod.rs     the vocabulary, Event, EventArgs (the operator's flags), EventLog:
//!            emit() from any module, the writer thread, subscribe() and after()
//! sqlite.rs  the local backend's log: a table in the hub's SQLite file, pruned by
//!            age (--event-retention) and count (--event-max-count)
//! memory.rs  a bounded in-memory ring, for the kubernetes backend (per replica;
//!            ids given by kube/events.rs, kept in order)
//! ```
//!
//! Emitting never waits for storage: [`EventLog::emit`] pushes onto a
//! bounded queue and wakes one writer thread, which lets a batch gather for
//! a moment (`GATHER`), stores what queued in one transaction and only then
//! broadcasts it. So an action pays a mutex
//! and a push, a burst of actions shares one commit, and every event a
//! consumer has seen is already stored: a reconnect with `Last-Event-ID`
//! after a `kill -9` of the hub misses nothing it was sent and repeats
//! nothing. A full queue (the disk stalled) drops events and counts them,
//! rather than slowing the actions they record.

mod memory;
mod sqlite;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use clap::Args;
use sandhub_api::error::Code;
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::backend::{now_ms, rfc3339};

pub use memory::MemoryLog;
pub use sqlite::{AppendHook, SqliteLog};

/// What happened: the same words on both backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// A sandbox was admitted (cold start begins; `details.launch`).
    Created,
    /// A sandbox is running and answers.
    Ready,
    /// A warm sandbox was handed to a caller from a pool (`pool`).
    Claimed,
    Suspended,
    /// A sandbox's processes were frozen in place (`pause`; local backend).
    Paused,
    /// A Suspended sandbox runs again, or a Paused one was thawed.
    Resumed,
    Reset,
    /// A snapshot was taken (`details.snapshot_id`).
    Snapshotted,
    /// A sandbox was forked (`sandbox_id` is the source; `details.fork_id`).
    Forked,
    /// A sandbox is gone (`details.reason`, a [`DeleteReason`]).
    Deleted,
    /// A sandbox stopped on its own and is kept Finished for a while
    /// (`details.reason`: `died` or `hub_recovery`).
    Finished,
    /// The kernel killed a process of the sandbox for memory.
    OomKilled,
    /// The sandbox's entrypoint ended (`details.exit_code`, `signal`).
    EntrypointExited,
    /// The sandbox's disk quota refused a write.
    DiskQuotaExceeded,
    /// A create asked a pool with no ready member: it started cold.
    PoolStarved,
    /// A warm start of a pool failed (`details.last_error`).
    PoolStartFailed,
    /// A template was replaced (`details.template`), or a pool's template
    /// changed (`pool`, `details.template`).
    TemplateChanged,
}

impl EventType {
    pub const ALL: [EventType; 17] = [
        EventType::Created,
        EventType::Ready,
        EventType::Claimed,
        EventType::Suspended,
        EventType::Paused,
        EventType::Resumed,
        EventType::Reset,
        EventType::Snapshotted,
        EventType::Forked,
        EventType::Deleted,
        EventType::Finished,
        EventType::OomKilled,
        EventType::EntrypointExited,
        EventType::DiskQuotaExceeded,
        EventType::PoolStarved,
        EventType::PoolStartFailed,
        EventType::TemplateChanged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Created => "created",
            EventType::Ready => "ready",
            EventType::Claimed => "claimed",
            EventType::Suspended => "suspended",
            EventType::Paused => "paused",
            EventType::Resumed => "resumed",
            EventType::Reset => "reset",
            EventType::Snapshotted => "snapshotted",
            EventType::Forked => "forked",
            EventType::Deleted => "deleted",
            EventType::Finished => "finished",
            EventType::OomKilled => "oom_killed",
            EventType::EntrypointExited => "entrypoint_exited",
            EventType::DiskQuotaExceeded => "disk_quota_exceeded",
            EventType::PoolStarved => "pool_starved",
            EventType::PoolStartFailed => "pool_start_failed",
            EventType::TemplateChanged => "template_changed",
        }
    }

    pub fn parse(s: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// `created, ready, ...`: for messages that list what is accepted.
    pub fn names() -> String {
        EventType::ALL.map(EventType::as_str).join(", ")
    }
}

/// Why a sandbox was deleted (`details.reason` of `deleted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// Its owner deleted it.
    ByCaller,
    /// It reached its `shutdown_at`.
    Deadline,
    /// It was idle past its `idle_timeout_seconds`.
    IdleTimeout,
    /// It was Finished and its time to live ran out.
    Reaped,
    /// Its start failed (`details.last_error`); nothing of it is left.
    StartFailed,
}

impl DeleteReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteReason::ByCaller => "by_caller",
            DeleteReason::Deadline => "deadline",
            DeleteReason::IdleTimeout => "idle_timeout",
            DeleteReason::Reaped => "reaped",
            DeleteReason::StartFailed => "start_failed",
        }
    }
}

/// An event as an action reports it; the log gives it its id.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub tenant: String,
    pub kind: EventType,
    pub sandbox_id: Option<String>,
    pub pool: Option<String>,
    /// The sandbox's labels, so consumers can filter on them.
    pub labels: BTreeMap<String, String>,
    pub details: serde_json::Value,
    /// Unix milliseconds of the action (not of the write).
    pub at_ms: i64,
    /// The id the event must get, where its producer derives one (the
    /// kubernetes backend: from the object's resourceVersion, so every
    /// replica names it alike); `None`: the log gives the next id.
    pub id: Option<u64>,
}

impl NewEvent {
    /// An event of one sandbox.
    pub fn sandbox(
        tenant: &str,
        kind: EventType,
        id: &str,
        labels: &BTreeMap<String, String>,
    ) -> Self {
        NewEvent {
            tenant: tenant.to_string(),
            kind,
            sandbox_id: Some(id.to_string()),
            pool: None,
            labels: labels.clone(),
            details: serde_json::Value::Object(Default::default()),
            at_ms: now_ms(),
            id: None,
        }
    }

    /// An event of one pool (or of the tenant, with `pool` None).
    pub fn pool(tenant: &str, kind: EventType, pool: Option<&str>) -> Self {
        NewEvent {
            tenant: tenant.to_string(),
            kind,
            sandbox_id: None,
            pool: pool.map(str::to_string),
            labels: BTreeMap::new(),
            details: serde_json::Value::Object(Default::default()),
            at_ms: now_ms(),
            id: None,
        }
    }

    pub fn with_pool(mut self, pool: Option<&str>) -> Self {
        self.pool = pool.map(str::to_string);
        self
    }

    /// Adds `key: value` to the details.
    pub fn detail(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        if let serde_json::Value::Object(m) = &mut self.details {
            m.insert(key.to_string(), value.into());
        }
        self
    }

    pub fn reason(self, r: DeleteReason) -> Self {
        self.detail("reason", r.as_str())
    }
}

/// One stored event, as `GET /v1/events` and webhooks send it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Increasing, never reused: what `Last-Event-ID` names.
    pub id: u64,
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    pub kind: EventType,
    /// RFC 3339, milliseconds.
    pub time: String,
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

impl Event {
    pub fn stored(id: u64, e: NewEvent) -> Event {
        Event {
            id,
            kind: e.kind,
            time: rfc3339(e.at_ms),
            tenant: e.tenant,
            sandbox_id: e.sandbox_id,
            pool: e.pool,
            labels: e.labels,
            details: e.details,
        }
    }
}

/// The operator's bounds on the event log and its streams.
#[derive(Debug, Clone, Args)]
pub struct EventArgs {
    /// How long the local backend keeps lifecycle events (what a
    /// reconnecting `GET /v1/events` can resume from).
    #[arg(long, env = "SANDHUB_EVENT_RETENTION", default_value = "24h", value_parser = sandhub_common::parse_duration)]
    pub event_retention: Duration,

    /// Most events kept (all tenants), whatever their age; the oldest go
    /// first. On kubernetes, the size of each replica's in-memory ring.
    #[arg(long, env = "SANDHUB_EVENT_MAX_COUNT", default_value_t = 1_000_000)]
    pub event_max_count: u64,

    /// How many events one `GET /v1/events` consumer may fall behind the
    /// live feed before it is sent a final `error` event and disconnected
    /// (it resumes from the log with `Last-Event-ID`). Shared ring: memory
    /// is bounded whatever the number of consumers.
    #[arg(long, env = "SANDHUB_EVENT_BUFFER", default_value_t = 4096)]
    pub event_buffer: usize,

    /// Most `GET /v1/events` streams one tenant may hold open; past it, 429.
    #[arg(
        long,
        env = "SANDHUB_EVENT_MAX_STREAMS_PER_TENANT",
        default_value_t = 32
    )]
    pub event_max_streams_per_tenant: usize,

    /// How often an open event stream sends a comment, so proxies keep it.
    #[arg(long, env = "SANDHUB_EVENT_HEARTBEAT", default_value = "15s", value_parser = sandhub_common::parse_duration)]
    pub event_heartbeat: Duration,
}

impl Default for EventArgs {
    fn default() -> Self {
        EventArgs {
            event_retention: Duration::from_secs(24 * 3600),
            event_max_count: 1_000_000,
            event_buffer: 4096,
            event_max_streams_per_tenant: 32,
            event_heartbeat: Duration::from_secs(15),
        }
    }
}

/// Where events are kept: SQLite ([`SqliteLog`]) or a ring ([`MemoryLog`]).
pub trait Sink: Send + Sync + 'static {
    /// Stores a batch in order, giving each the next id.
    fn append(&self, batch: Vec<NewEvent>) -> Result<Vec<Event>>;
    /// Up to `limit` of `tenant`'s events with ids above `after`, in order.
    fn after(&self, tenant: &str, after: u64, limit: usize) -> Result<Vec<Event>>;
    /// Drops events older than `before_ms`, and all but the newest `keep`.
    fn prune(&self, before_ms: i64, keep: u64) -> Result<u64>;
    /// The newest id stored (of any tenant); 0 when none is.
    fn newest(&self) -> Result<u64>;
}

/// The `tenant` of an event every tenant sees: on kubernetes, an event of
/// an operator's pool or template (no tenant label; every tenant may use
/// them). No tenant key is empty, so it names nobody's own events.
pub const SHARED: &str = "";

/// Events queued for the writer, at most this many: past it (the store
/// stalled for long) new ones are dropped and counted, never waited for.
const MAX_QUEUED: usize = 65_536;
/// How often the writer prunes the log.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

struct Queue {
    pending: VecDeque<NewEvent>,
    /// The writer holds a batch it has not stored yet.
    writing: bool,
}

/// One event of the live feed, with its JSON made once for every stream
/// that sends it (each consumer used to serialize each event itself).
#[derive(Debug)]
pub struct Live {
    pub event: Event,
    json: std::sync::OnceLock<String>,
}

impl From<Event> for Live {
    fn from(event: Event) -> Self {
        Live {
            event,
            json: std::sync::OnceLock::new(),
        }
    }
}

impl std::ops::Deref for Live {
    type Target = Event;
    fn deref(&self) -> &Event {
        &self.event
    }
}

impl Live {
    /// The event as JSON, serialized by the first stream that asks.
    pub fn json(&self) -> &str {
        self.json
            .get_or_init(|| serde_json::to_string(&self.event).unwrap_or_default())
    }
}

/// How long the writer lets a batch gather once an event woke it. Woken,
/// it would commit at once, and often on the CPU of the request that
/// emitted (the scheduler favours the waker's CPU for the woken), before
/// that request had answered: the answer then waited for the commit (the
/// warm claim's regression, issue #34). Leaving the CPU first lets the
/// answer go, and a burst of actions shares one commit.
const GATHER: Duration = Duration::from_millis(2);
/// A batch this big is stored without gathering more.
const GATHER_AT_MOST: usize = 256;

/// The log and its live feed. Cheap to emit into from any module.
pub struct EventLog {
    queue: Mutex<Queue>,
    wake: Condvar,
    live: broadcast::Sender<Arc<Live>>,
    sink: Arc<dyn Sink>,
    args: EventArgs,
    streams: Mutex<HashMap<String, usize>>,
    dropped: AtomicU64,
    /// Events emitted by type and reason since the hub started, for
    /// `sandhub_events_total` (the reaper's and recovery's counters are its
    /// `deleted`/`finished` rows). Keys come from closed sets only.
    counts: Mutex<HashMap<(&'static str, &'static str), u64>>,
    /// Signalled after each batch is stored (for [`EventLog::flush`]).
    flushed: Condvar,
    /// What an event's `tenant` holds for a tenant: its name (`None`, the
    /// local backend), or what this gives (kubernetes: the digest its
    /// labels carry, all the watches see). Streams send the caller's name.
    tenant_key: Option<fn(&str) -> String>,
}

/// The reasons a `reason` detail may carry, as metric label values; any
/// other value (none is emitted today) is counted as `other`.
const REASONS: &[&str] = &[
    "by_caller",
    "deadline",
    "idle_timeout",
    "reaped",
    "start_failed",
    "died",
    "hub_recovery",
];

impl EventLog {
    /// The local backend's log, in the hub's SQLite file at `db`; `hook`
    /// writes more rows with each event (the webhook outbox).
    pub fn sqlite(
        db: &Path,
        args: &EventArgs,
        hook: Option<Arc<dyn AppendHook>>,
    ) -> Result<Arc<EventLog>> {
        Ok(Self::start(
            Arc::new(SqliteLog::open(db, hook)?),
            args,
            None,
        ))
    }

    /// A per-process ring (the kubernetes backend), whose events name
    /// tenants by `tenant_key` (and [`SHARED`] for everyone's).
    pub fn memory(args: &EventArgs, tenant_key: fn(&str) -> String) -> Arc<EventLog> {
        Self::start(
            Arc::new(MemoryLog::new(args.event_max_count.clamp(1, 1 << 20))),
            args,
            Some(tenant_key),
        )
    }

    /// What this log's events hold in `tenant` for `tenant`.
    pub fn tenant_key(&self, tenant: &str) -> String {
        match self.tenant_key {
            Some(f) => f(tenant),
            None => tenant.to_string(),
        }
    }

    /// Whether `e` is for the tenant whose key ([`EventLog::tenant_key`]) is `key`.
    pub fn visible(&self, e: &Event, key: &str) -> bool {
        e.tenant == key || (self.tenant_key.is_some() && e.tenant == SHARED)
    }

    fn start(
        sink: Arc<dyn Sink>,
        args: &EventArgs,
        tenant_key: Option<fn(&str) -> String>,
    ) -> Arc<EventLog> {
        let (live, _) = broadcast::channel(args.event_buffer.clamp(1, 1 << 20));
        let log = Arc::new(EventLog {
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                writing: false,
            }),
            wake: Condvar::new(),
            live,
            sink,
            args: args.clone(),
            streams: Mutex::new(HashMap::new()),
            dropped: AtomicU64::new(0),
            counts: Mutex::new(HashMap::new()),
            flushed: Condvar::new(),
            tenant_key,
        });
        let writer = log.clone();
        std::thread::Builder::new()
            .name("sandhub-events".into())
            .spawn(move || writer.write_loop())
            .expect("spawning the event writer thread");
        log
    }

    pub fn args(&self) -> &EventArgs {
        &self.args
    }

    /// Records an event. Never blocks on storage and never fails: the
    /// action it records must not pay for it (see the module docs).
    pub fn emit(&self, event: NewEvent) {
        let reason = match event.details.get("reason").and_then(|r| r.as_str()) {
            None => "",
            Some(r) => REASONS
                .iter()
                .find(|k| **k == r)
                .copied()
                .unwrap_or("other"),
        };
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((event.kind.as_str(), reason))
            .or_default() += 1;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.pending.len() >= MAX_QUEUED {
            drop(q);
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "the event queue is full; events are dropped");
            }
            return;
        }
        q.pending.push_back(event);
        drop(q);
        self.wake.notify_one();
    }

    /// Events emitted since the hub started, by type and reason (`""`
    /// where the type has none).
    pub fn counts(&self) -> Vec<((&'static str, &'static str), u64)> {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The live feed: every event of every tenant, after it is stored.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Live>> {
        self.live.subscribe()
    }

    /// `tenant`'s stored events after id `after`, up to `limit`; `tenant`
    /// is a key ([`EventLog::tenant_key`]).
    pub fn after(&self, tenant: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.sink.after(tenant, after, limit)
    }

    /// The newest stored id: where a stream without `Last-Event-ID` starts.
    pub fn newest(&self) -> Result<u64> {
        self.sink.newest()
    }

    /// Waits (blocking) until everything emitted so far is stored, up to
    /// `timeout`; for shutdown.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        while (q.writing || !q.pending.is_empty()) && Instant::now() < deadline {
            let (g, _) = self
                .flushed
                .wait_timeout(q, Duration::from_millis(5))
                .unwrap_or_else(|p| p.into_inner());
            q = g;
        }
    }

    /// One more open stream of `tenant`, within the cap; the guard counts
    /// it until dropped.
    pub fn open_stream(self: &Arc<Self>, tenant: &str) -> Result<StreamSlot> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let n = streams.entry(tenant.to_string()).or_default();
        if *n >= self.args.event_max_streams_per_tenant {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "{} event streams are open for this tenant, the most allowed \
                     (--event-max-streams-per-tenant); close one first",
                    *n
                ),
            ));
        }
        *n += 1;
        Ok(StreamSlot {
            log: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    fn write_loop(&self) {
        let mut last_prune = Instant::now() - PRUNE_EVERY;
        loop {
            let batch: Vec<NewEvent> = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                q.writing = false;
                self.flushed.notify_all();
                while q.pending.is_empty() && last_prune.elapsed() < PRUNE_EVERY {
                    let (g, _) = self
                        .wake
                        .wait_timeout(q, PRUNE_EVERY)
                        .unwrap_or_else(|p| p.into_inner());
                    q = g;
                }
                if !q.pending.is_empty() && q.pending.len() < GATHER_AT_MOST {
                    // Still "writing" for `flush`: the batch is on its way.
                    q.writing = true;
                    drop(q);
                    std::thread::sleep(GATHER);
                    q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                }
                q.writing = !q.pending.is_empty();
                q.pending.drain(..).collect()
            };
            if !batch.is_empty() {
                match self.sink.append(batch) {
                    Ok(stored) => {
                        for e in stored {
                            // No receiver is fine: nobody streams now.
                            let _ = self.live.send(Arc::new(Live::from(e)));
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "storing lifecycle events"),
                }
            }
            if last_prune.elapsed() >= PRUNE_EVERY {
                last_prune = Instant::now();
                let before = now_ms().saturating_sub(
                    i64::try_from(self.args.event_retention.as_millis()).unwrap_or(i64::MAX),
                );
                match self.sink.prune(before, self.args.event_max_count) {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(pruned = n, "old lifecycle events pruned"),
                    Err(e) => tracing::warn!(error = %e, "pruning lifecycle events"),
                }
            }
        }
    }
}

/// An open event stream, counted against its tenant's cap until dropped.
pub struct StreamSlot {
    log: Arc<EventLog>,
    tenant: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.log.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = streams.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&self.tenant);
            }
        }
    }
}

/// Which events a consumer asked for (`GET /v1/events`' filters).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub sandbox_id: Option<String>,
    /// Empty: every type.
    pub types: Vec<EventType>,
    /// The event's labels must carry all of these.
    pub labels: BTreeMap<String, String>,
}

impl Filter {
    pub fn matches(&self, e: &Event) -> bool {
        self.sandbox_id
            .as_ref()
            .is_none_or(|id| e.sandbox_id.as_ref() == Some(id))
            && (self.types.is_empty() || self.types.contains(&e.kind))
            && self.labels.iter().all(|(k, v)| e.labels.get(k) == Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> EventArgs {
        EventArgs {
            event_buffer: 8,
            event_max_streams_per_tenant: 2,
            ..EventArgs::default()
        }
    }

    fn wait_for(log: &EventLog, tenant: &str, n: usize) -> Vec<Event> {
        for _ in 0..500 {
            let got = log.after(tenant, 0, 1000).unwrap();
            if got.len() >= n {
                return got;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("{n} events of {tenant} never stored");
    }

    #[test]
    fn the_vocabulary_round_trips() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(
                serde_json::to_value(t).unwrap(),
                serde_json::json!(t.as_str())
            );
        }
        assert_eq!(EventType::parse("exploded"), None);
    }

    #[test]
    fn ids_increase_survive_reopen_and_tenants_are_apart() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        let last = {
            let log = EventLog::sqlite(&db, &args(), None).unwrap();
            let l = BTreeMap::from([("team".to_string(), "a".to_string())]);
            log.emit(NewEvent::sandbox("t1", EventType::Created, "sb-1", &l));
            log.emit(NewEvent::sandbox("t2", EventType::Created, "sb-2", &l));
            log.emit(
                NewEvent::sandbox("t1", EventType::Deleted, "sb-1", &l)
                    .reason(DeleteReason::ByCaller),
            );
            let got = wait_for(&log, "t1", 2);
            assert_eq!(got.len(), 2);
            assert!(got[0].id < got[1].id);
            assert_eq!(got[1].details["reason"], "by_caller");
            assert_eq!(got[1].labels["team"], "a");
            assert_eq!(
                wait_for(&log, "t2", 1)[0].sandbox_id.as_deref(),
                Some("sb-2")
            );
            got[1].id
        };
        let log = EventLog::sqlite(&db, &args(), None).unwrap();
        log.emit(NewEvent::pool("t1", EventType::PoolStarved, Some("p")));
        let got = wait_for(&log, "t1", 3);
        assert!(got[2].id > last, "ids are never reused after a reopen");
        assert_eq!(log.after("t1", last, 10).unwrap().len(), 1);
    }

    #[test]
    fn pruning_keeps_the_newest_and_the_young() {
        let dir = tempfile::tempdir().unwrap();
        let sink = SqliteLog::open(&dir.path().join("db"), None).unwrap();
        let mut old = NewEvent::pool("t", EventType::PoolStarved, None);
        old.at_ms = 1;
        let young = NewEvent::pool("t", EventType::PoolStarved, None);
        sink.append(vec![old, young.clone(), young.clone(), young])
            .unwrap();
        assert_eq!(sink.prune(1000, 100).unwrap(), 1);
        assert_eq!(sink.prune(0, 2).unwrap(), 1);
        let left = sink.after("t", 0, 10).unwrap();
        assert_eq!(left.len(), 2);
        assert_eq!(left[0].id, 3);
    }

    #[test]
    fn the_ring_forgets_the_oldest() {
        let ring = MemoryLog::new(2);
        for _ in 0..3 {
            ring.append(vec![NewEvent::pool("t", EventType::PoolStarved, None)])
                .unwrap();
        }
        let left = ring.after("t", 0, 10).unwrap();
        assert_eq!(left.iter().map(|e| e.id).collect::<Vec<_>>(), vec![2, 3]);
    }

    /// What an action pays to emit: a push and a notify, never a write.
    #[test]
    fn emitting_costs_microseconds() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::sqlite(&dir.path().join("db"), &args(), None).unwrap();
        let labels = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let n = 20_000;
        let start = Instant::now();
        for _ in 0..n {
            log.emit(NewEvent::sandbox("t", EventType::Created, "sb-1", &labels));
        }
        let each = start.elapsed() / n;
        log.flush(Duration::from_secs(60));
        eprintln!("emit: {each:?} per event (debug build)");
        assert!(each < Duration::from_millis(1), "{each:?} per emit");
        assert_eq!(log.dropped(), 0);
        assert_eq!(log.after("t", 0, 100_000).unwrap().len(), n as usize);
    }

    #[test]
    fn streams_are_capped_per_tenant() {
        let log = EventLog::memory(&args(), str::to_string);
        let a = log.open_stream("t").unwrap();
        let _b = log.open_stream("t").unwrap();
        let err = log.open_stream("t").err().unwrap();
        assert_eq!(err.code, Code::ResourceExhausted);
        let _other = log.open_stream("u").unwrap();
        drop(a);
        log.open_stream("t").unwrap();
    }

    #[test]
    fn filters_match_sandbox_type_and_labels() {
        let e = Event::stored(
            1,
            NewEvent::sandbox(
                "t",
                EventType::Ready,
                "sb",
                &BTreeMap::from([("k".into(), "v".into())]),
            ),
        );
        assert!(Filter::default().matches(&e));
        let f = |sandbox: Option<&str>, types: Vec<EventType>, labels: &[(&str, &str)]| Filter {
            sandbox_id: sandbox.map(Into::into),
            types,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        assert!(f(Some("sb"), vec![EventType::Ready], &[("k", "v")]).matches(&e));
        assert!(!f(Some("other"), vec![], &[]).matches(&e));
        assert!(!f(None, vec![EventType::Created], &[]).matches(&e));
        assert!(!f(None, vec![], &[("k", "w")]).matches(&e));
    }
}
