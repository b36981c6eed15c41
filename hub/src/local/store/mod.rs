//! The hub's state, in one SQLite file.
//!
//! Every change is one transaction, committed before the API answers, so a
//! `kill -9` of the hub at any moment loses nothing that was acknowledged.
//! WAL with `synchronous=NORMAL` survives a process crash (only power loss
//! could roll back the last commits), and keeps a warm claim to a single
//! indexed UPDATE of well under a millisecond.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
};

use rusqlite::{params, Connection, OptionalExtension, Row};
use sandhub_api::{
    error::Code,
    hub::{IdleAction, Launch, SandboxState},
};
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};

mod catalog;
mod gym;
mod secrets;
mod snapshots;
mod volumes;
pub use volumes::{PendingClone, SnapshotRefused, VolumeRefused, VolumeRow, VolumeSnapshotRow};

/// What a port's Ready check reads of a sandbox ([`Store::activity_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    pub state: SandboxState,
    /// Unix milliseconds.
    pub last_activity: i64,
    /// The process its runtime handle names, if it has one.
    pub shim: Option<Shim>,
}

/// A sandbox's shim process, as its runtime handle records it: the pid and
/// its start time (field 22 of `/proc/<pid>/stat`), which tell a reused pid
/// apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shim {
    pub pid: i32,
    pub start_time: u64,
}

/// One sandbox as stored. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRow {
    pub id: String,
    pub tenant: String,
    pub template: String,
    pub state: SandboxState,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub launch: Launch,
    pub created_at: i64,
    pub shutdown_at: Option<i64>,
    pub idle_timeout_seconds: Option<u64>,
    pub last_activity: i64,
    /// The warm pool this sandbox belongs to until it is claimed.
    pub pool: Option<String>,
    pub claimed: bool,
    pub forked_from: Option<String>,
    /// Backend-specific handle (pids, socket dir, pod name), as JSON.
    pub runtime: Option<serde_json::Value>,
    /// What its idle timeout does.
    pub idle_action: IdleAction,
    /// Whether a call that needs it running resumes it first.
    pub auto_resume: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub tenant: String,
    pub name: String,
    pub template: String,
    pub replicas: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    pub id: String,
    pub tenant: String,
    pub sandbox_id: String,
    pub created_at: i64,
    /// Bytes the layer takes on disk; `None` for rows from before sizes
    /// were recorded.
    pub size_bytes: Option<u64>,
}

pub struct Store {
    conn: Mutex<Connection>,
    /// The connection's `total_changes()` after its last use. SQLite adds
    /// every row an INSERT, UPDATE or DELETE touches, and this connection
    /// is the only one that writes these tables, so a value read before a
    /// lookup and still current later says no row changed in between
    /// ([`Store::generation`]).
    changes: AtomicU64,
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    template TEXT NOT NULL,
    state TEXT NOT NULL,
    labels TEXT NOT NULL,
    env TEXT NOT NULL,
    launch TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    shutdown_at INTEGER,
    idle_timeout_seconds INTEGER,
    last_activity INTEGER NOT NULL,
    pool TEXT,
    claimed INTEGER NOT NULL,
    forked_from TEXT,
    runtime TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_warm ON sandboxes (tenant, pool, claimed, state, created_at);
CREATE TABLE IF NOT EXISTS templates (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS pools (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    template TEXT NOT NULL,
    replicas INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
"#;

/// Columns added after a table's first release: added to an older
/// database when it opens.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("snapshots", "size_bytes", "INTEGER"),
    // NULL: `delete`, and no auto-resume (rows from before they existed).
    ("sandboxes", "idle_action", "TEXT"),
    ("sandboxes", "auto_resume", "INTEGER"),
];

fn add_missing_columns(conn: &Connection) -> rusqlite::Result<()> {
    for (table, column, ty) in ADDED_COLUMNS {
        let mut stmt = conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let have = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        if !have.iter().any(|c| c == column) {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {ty}"))?;
        }
    }
    Ok(())
}

const SNAPSHOT_COLUMNS: &str = "id, tenant, sandbox_id, created_at, size_bytes";

const SANDBOX_COLUMNS: &str = "id, tenant, template, state, labels, env, launch, created_at, \
    shutdown_at, idle_timeout_seconds, last_activity, pool, claimed, forked_from, runtime, \
    idle_action, auto_resume";

fn db_err(e: rusqlite::Error) -> Error {
    Error::internal(format!("state store: {e}"))
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serializes")
}

fn launch_str(l: Launch) -> &'static str {
    match l {
        Launch::Warm => "warm",
        Launch::Cold => "cold",
    }
}

fn sandbox_from_row(r: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    let text = |i: usize| r.get::<_, String>(i);
    let state = text(3)?;
    let labels: String = text(4)?;
    let env: String = text(5)?;
    let runtime: Option<String> = r.get(14)?;
    Ok(SandboxRow {
        id: text(0)?,
        tenant: text(1)?,
        template: text(2)?,
        state: SandboxState::parse(&state).unwrap_or(SandboxState::Finished),
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        env: serde_json::from_str(&env).unwrap_or_default(),
        launch: if text(6)? == "warm" {
            Launch::Warm
        } else {
            Launch::Cold
        },
        created_at: r.get(7)?,
        shutdown_at: r.get(8)?,
        idle_timeout_seconds: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
        last_activity: r.get(10)?,
        pool: r.get(11)?,
        claimed: r.get::<_, i64>(12)? != 0,
        forked_from: r.get(13)?,
        runtime: runtime.and_then(|s| serde_json::from_str(&s).ok()),
        idle_action: r
            .get::<_, Option<String>>(15)?
            .and_then(|s| IdleAction::parse(&s))
            .unwrap_or_default(),
        auto_resume: r.get::<_, Option<i64>>(16)?.unwrap_or(0) != 0,
    })
}

/// Statements kept parsed: more than the store has (a few dozen), so none
/// is parsed twice.
const STATEMENT_CACHE: usize = 128;

/// The connection as the store's queries see it: `execute` and
/// `query_row` go through SQLite's prepared-statement cache, so a
/// statement is parsed once, not per call. Parsing was most of a hot
/// read's cost: a third of the hub's CPU under proxied port traffic went
/// to `get_sandbox`, mostly in SQLite's parser.
struct Db<'a>(&'a Connection);

impl std::ops::Deref for Db<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.0
    }
}

impl Db<'_> {
    /// A transaction that reads and then writes on what it read. It takes
    /// the write lock at its start (`BEGIN IMMEDIATE`), waiting out another
    /// writer under the busy timeout. A deferred one would read a snapshot
    /// first, and the hub's other connections to this file (the event log,
    /// the webhooks' outbox) may commit before it writes: SQLite then
    /// refuses the write at once (`database is locked`), whatever the
    /// timeout.
    fn check_then_write(&self) -> rusqlite::Result<rusqlite::Transaction<'_>> {
        rusqlite::Transaction::new_unchecked(self.0, rusqlite::TransactionBehavior::Immediate)
    }
}

impl Db<'_> {
    fn execute<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.0.prepare_cached(sql)?.execute(params)
    }

    fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.0.prepare_cached(sql)?.query_row(params, f)
    }
}

impl Store {
    pub fn open(path: &Path) -> Result<Self> {
        let conn = crate::sqlite::open(path).map_err(db_err)?;
        crate::sqlite::checkpoint_late(&conn).map_err(db_err)?;
        conn.execute_batch(SCHEMA).map_err(db_err)?;
        conn.execute_batch(gym::SCHEMA).map_err(db_err)?;
        conn.execute_batch(secrets::SCHEMA).map_err(db_err)?;
        conn.execute_batch(volumes::SCHEMA).map_err(db_err)?;
        add_missing_columns(&conn).map_err(db_err)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // Without the query planner's stability guarantee, SQLite marks a
        // statement whose plan might depend on a bound value, and binding
        // that parameter again re-prepares it at its next step. The claim
        // and the pool refill (`tenant = ?1 AND pool = ?2` on the warm
        // index) were re-parsed on every call: 40% of a warm claim's store
        // time in `perf`. Our plans never depend on the values.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )
        .map_err(db_err)?;
        Ok(Store {
            changes: AtomicU64::new(conn.total_changes()),
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Db<'_>) -> rusqlite::Result<T>) -> Result<T> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&Db(&conn));
        // Published before the lock is let go: whoever reads a row after
        // this write also sees the generation it moved to.
        self.changes.store(conn.total_changes(), Ordering::Release);
        out.map_err(db_err)
    }

    /// Moves whenever any row of the store changes (no lock taken): what a
    /// cache of a lookup keeps, to know it still holds. Read it before the
    /// lookup, so a write racing the lookup leaves the entry stale.
    pub fn generation(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    pub fn insert_sandbox(&self, s: &SandboxRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                &format!(
                    "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
                     ?16, ?17)"
                ),
                params![
                    s.id,
                    s.tenant,
                    s.template,
                    s.state.as_str(),
                    json(&s.labels),
                    json(&s.env),
                    launch_str(s.launch),
                    s.created_at,
                    s.shutdown_at,
                    s.idle_timeout_seconds.map(|v| v as i64),
                    s.last_activity,
                    s.pool,
                    s.claimed as i64,
                    s.forked_from,
                    s.runtime.as_ref().map(json),
                    s.idle_action.as_str(),
                    s.auto_resume as i64,
                ],
            )
            .map(|_| ())
        })
    }

    pub fn set_state(&self, id: &str, state: SandboxState) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET state = ?2 WHERE id = ?1",
                params![id, state.as_str()],
            )
            .map(|_| ())
        })
    }

    pub fn set_runtime(
        &self,
        id: &str,
        state: SandboxState,
        runtime: Option<&serde_json::Value>,
    ) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET state = ?2, runtime = ?3 WHERE id = ?1",
                params![id, state.as_str(), runtime.map(json)],
            )
            .map(|_| ())
        })
    }

    pub fn set_shutdown_at(&self, id: &str, at: Option<i64>) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET shutdown_at = ?2 WHERE id = ?1",
                params![id, at],
            )
            .map(|_| ())
        })
    }

    pub fn touch(&self, id: &str, now: i64) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE sandboxes SET last_activity = ?2 WHERE id = ?1 AND last_activity < ?2",
                params![id, now],
            )
            .map(|_| ())
        })
    }

    /// The state, last activity and shim of a sandbox of `tenant` (as
    /// [`Store::get_sandbox`] finds it), without reading the rest of its
    /// row: what a proxied request and a dial of a port check each time.
    pub fn activity_of(&self, tenant: &str, id: &str) -> Result<Option<Activity>> {
        self.with(|c| {
            c.query_row(
                "SELECT state, last_activity, json_extract(runtime, '$.shim_pid'), \
                 json_extract(runtime, '$.start_time') FROM sandboxes \
                 WHERE id = ?1 AND tenant = ?2 AND claimed = 1",
                params![id, tenant],
                |r| {
                    let state = SandboxState::parse(&r.get::<_, String>(0)?)
                        .unwrap_or(SandboxState::Finished);
                    let shim = match (r.get::<_, Option<i64>>(2)?, r.get::<_, Option<i64>>(3)?) {
                        (Some(pid), Some(start_time)) => Some(Shim {
                            pid: i32::try_from(pid).unwrap_or(0),
                            start_time: u64::try_from(start_time).unwrap_or(0),
                        }),
                        _ => None,
                    };
                    Ok(Activity {
                        state,
                        last_activity: r.get(1)?,
                        shim,
                    })
                },
            )
            .optional()
        })
    }

    /// A sandbox of `tenant`; another tenant's sandbox is simply not found.
    pub fn get_sandbox(&self, tenant: &str, id: &str) -> Result<Option<SandboxRow>> {
        self.with(|c| {
            c.query_row(
                &format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                     WHERE id = ?1 AND tenant = ?2 AND claimed = 1"
                ),
                params![id, tenant],
                sandbox_from_row,
            )
            .optional()
        })
    }

    pub fn get_any(&self, id: &str) -> Result<Option<SandboxRow>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"),
                params![id],
                sandbox_from_row,
            )
            .optional()
        })
    }

    /// A tenant's claimed sandboxes, oldest first.
    pub fn list_sandboxes(&self, tenant: &str) -> Result<Vec<SandboxRow>> {
        self.query(
            &format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE tenant = ?1 AND claimed = 1 \
                 ORDER BY created_at, id"
            ),
            params![tenant],
        )
    }

    /// Every sandbox, claimed or warm: for restarts and the reaper.
    pub fn all_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        self.query(
            &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_at, id"),
            [],
        )
    }

    /// How many sandboxes of `tenant` are in one of `states`, by template:
    /// what its quota counts, read without decoding a single row (a create
    /// asks this under the admission lock, so its cost is every create's).
    pub fn count_by_template(
        &self,
        tenant: &str,
        states: &[SandboxState],
    ) -> Result<BTreeMap<String, u64>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT template, state, COUNT(*) FROM sandboxes WHERE tenant = ?1 \
                 GROUP BY template, state",
            )?;
            let mut counts = BTreeMap::new();
            let rows = stmt.query_map(params![tenant], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })?;
            for row in rows {
                let (template, state, n) = row?;
                // As `sandbox_from_row` reads it: an unknown word is Finished.
                let state = SandboxState::parse(&state).unwrap_or(SandboxState::Finished);
                if states.contains(&state) {
                    *counts.entry(template).or_default() += n.max(0) as u64;
                }
            }
            Ok(counts)
        })
    }

    /// Warm members of a pool, claimed or not excluded.
    pub fn pool_members(&self, tenant: &str, pool: &str) -> Result<Vec<SandboxRow>> {
        self.query(
            &format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                 WHERE tenant = ?1 AND pool = ?2 AND claimed = 0 ORDER BY created_at, id"
            ),
            params![tenant, pool],
        )
    }

    fn query(&self, sql: &str, p: impl rusqlite::Params) -> Result<Vec<SandboxRow>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(sql)?;
            let rows = stmt.query_map(p, sandbox_from_row)?;
            rows.collect()
        })
    }

    /// Hands the oldest ready warm member of a pool to its new owner in one
    /// statement: two concurrent claims can never get the same sandbox.
    pub fn claim_warm(&self, claim: &Claim<'_>) -> Result<Option<SandboxRow>> {
        self.with(|c| {
            c.query_row(
                &format!(
                    "UPDATE sandboxes SET claimed = 1, labels = ?3, shutdown_at = ?4, \
                     idle_timeout_seconds = ?5, last_activity = ?6, created_at = ?6, \
                     idle_action = ?7, auto_resume = ?8 \
                     WHERE id = (SELECT id FROM sandboxes WHERE tenant = ?1 AND pool = ?2 \
                                 AND claimed = 0 AND state = 'Ready' \
                                 ORDER BY created_at, id LIMIT 1) \
                     RETURNING {SANDBOX_COLUMNS}"
                ),
                params![
                    claim.tenant,
                    claim.pool,
                    json(claim.labels),
                    claim.shutdown_at,
                    claim.idle_timeout_seconds.map(|v| v as i64),
                    claim.now,
                    claim.idle_action.as_str(),
                    claim.auto_resume as i64,
                ],
                sandbox_from_row,
            )
            .optional()
        })
    }

    pub fn delete_sandbox(&self, id: &str) -> Result<()> {
        self.with(|c| {
            c.execute("DELETE FROM sandboxes WHERE id = ?1", params![id])
                .map(|_| ())
        })
    }
}

#[cfg(test)]
impl SandboxRow {
    /// A claimed, Pending, cold row `sb-1` of tenant `t` and template `web`,
    /// with `runtime` as its handle: what unit tests start from.
    pub fn for_tests(runtime: Option<serde_json::Value>) -> SandboxRow {
        SandboxRow {
            id: "sb-1".into(),
            tenant: "t".into(),
            template: "web".into(),
            state: SandboxState::Pending,
            labels: Default::default(),
            env: Default::default(),
            launch: Launch::Cold,
            created_at: 0,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: 0,
            pool: None,
            claimed: true,
            forked_from: None,
            idle_action: sandhub_api::hub::IdleAction::Delete,
            auto_resume: false,
            runtime,
        }
    }
}

/// What a warm claim writes onto the sandbox it takes.
pub struct Claim<'a> {
    pub tenant: &'a str,
    pub pool: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub shutdown_at: Option<i64>,
    pub idle_timeout_seconds: Option<u64>,
    pub now: i64,
    pub idle_action: IdleAction,
    pub auto_resume: bool,
}

/// Maps "nothing there" to the NOT_FOUND every API answers with.
pub fn found<T>(v: Option<T>, what: &str, name: &str) -> Result<T> {
    v.ok_or_else(|| Error::new(Code::NotFound, format!("{what} {name} not found")))
}

#[cfg(test)]
mod tests {
    use sandhub_api::hub::Template;

    use super::*;

    fn row(id: &str, tenant: &str, pool: Option<&str>, claimed: bool) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            tenant: tenant.into(),
            template: "default".into(),
            state: SandboxState::Ready,
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            launch: if pool.is_some() {
                Launch::Warm
            } else {
                Launch::Cold
            },
            created_at: 1,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: 1,
            pool: pool.map(Into::into),
            claimed,
            forked_from: None,
            runtime: Some(serde_json::json!({"pid": 1})),
            idle_action: IdleAction::Delete,
            auto_resume: false,
        }
    }

    #[test]
    fn tenants_never_see_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        s.insert_sandbox(&row("a", "t1", None, true)).unwrap();
        assert!(s.get_sandbox("t1", "a").unwrap().is_some());
        assert!(s.get_sandbox("t2", "a").unwrap().is_none());
        assert_eq!(s.list_sandboxes("t2").unwrap().len(), 0);
        assert_eq!(
            s.list_sandboxes("t1").unwrap()[0].runtime,
            Some(serde_json::json!({"pid": 1}))
        );
    }

    #[test]
    fn counts_by_template_are_the_tenants_rows_in_the_states_asked() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        let states = [SandboxState::Ready, SandboxState::Suspended];
        for (id, tenant, template, state) in [
            ("a", "t1", "web", SandboxState::Ready),
            ("b", "t1", "web", SandboxState::Suspended),
            ("c", "t1", "gpu", SandboxState::Ready),
            ("d", "t1", "gpu", SandboxState::Finished),
            ("e", "t1", "cli", SandboxState::Expired),
            ("f", "t2", "web", SandboxState::Ready),
        ] {
            let mut r = row(id, tenant, None, true);
            r.template = template.into();
            r.state = state;
            s.insert_sandbox(&r).unwrap();
        }
        let want = |pairs: &[(&str, u64)]| {
            pairs
                .iter()
                .map(|(t, n)| (t.to_string(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            s.count_by_template("t1", &states).unwrap(),
            want(&[("web", 2), ("gpu", 1)])
        );
        assert_eq!(
            s.count_by_template("t2", &states).unwrap(),
            want(&[("web", 1)])
        );
        assert!(s.count_by_template("t3", &states).unwrap().is_empty());
        // The same numbers as decoding every row and filtering.
        let decoded = s
            .all_sandboxes()
            .unwrap()
            .into_iter()
            .filter(|r| r.tenant == "t1" && states.contains(&r.state))
            .count() as u64;
        let counted: u64 = s.count_by_template("t1", &states).unwrap().values().sum();
        assert_eq!(counted, decoded);
    }

    #[test]
    fn a_ports_check_reads_the_shim_from_the_runtime_handle_as_launches_record_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        let launched = crate::local::runtime::Launched {
            shim_pid: 4242,
            start_time: 987_654_321,
            socket_dir: "/run/x".into(),
        };
        let mut a = row("a", "t", None, true);
        a.runtime = Some(serde_json::to_value(&launched).unwrap());
        a.last_activity = 77;
        s.insert_sandbox(&a).unwrap();
        let mut b = row("b", "t", None, true);
        b.runtime = None;
        b.state = SandboxState::Suspended;
        s.insert_sandbox(&b).unwrap();
        assert_eq!(
            s.activity_of("t", "a").unwrap(),
            Some(Activity {
                state: SandboxState::Ready,
                last_activity: 77,
                shim: Some(Shim {
                    pid: 4242,
                    start_time: 987_654_321
                }),
            })
        );
        assert_eq!(
            s.activity_of("t", "b").unwrap().map(|a| (a.state, a.shim)),
            Some((SandboxState::Suspended, None))
        );
        assert_eq!(
            s.activity_of("other", "a").unwrap(),
            None,
            "another tenant's"
        );
        s.insert_sandbox(&row("warm", "t", Some("p"), false))
            .unwrap();
        assert_eq!(
            s.activity_of("t", "warm").unwrap(),
            None,
            "an unclaimed pool member"
        );
    }

    #[test]
    fn the_generation_moves_with_every_change_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        let mut seen = s.generation();
        let mut moved = |s: &Store, what: &str| {
            let now = s.generation();
            assert_ne!(now, seen, "{what} must move the generation");
            seen = now;
        };
        s.insert_sandbox(&row("a", "t", None, true)).unwrap();
        moved(&s, "an insert");
        s.set_state("a", SandboxState::Paused).unwrap();
        moved(&s, "a state change");
        s.touch("a", 50).unwrap();
        moved(&s, "the activity stamp");
        s.delete_sandbox("a").unwrap();
        moved(&s, "a delete");
        let quiet = s.generation();
        assert!(s.get_sandbox("t", "a").unwrap().is_none());
        assert!(s.activity_of("t", "a").unwrap().is_none());
        s.touch("gone", 60).unwrap();
        assert_eq!(s.generation(), quiet, "reads and no-op writes leave it");
    }

    /// The hot statements are parsed once, not again whenever a parameter
    /// is bound (what SQLite does to a plan that may depend on a value,
    /// unless the planner's stability guarantee is on).
    #[test]
    fn the_claim_and_the_pool_members_are_not_reprepared_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        for (i, pool) in ["p", "p", "q"].into_iter().enumerate() {
            s.insert_sandbox(&row(&format!("w{i}"), "t", Some(pool), false))
                .unwrap();
        }
        let labels = BTreeMap::new();
        for (n, pool) in ["p", "q", "p"].into_iter().enumerate() {
            let claim = Claim {
                tenant: "t",
                pool,
                labels: &labels,
                shutdown_at: None,
                idle_timeout_seconds: None,
                now: 10 + n as i64,
                idle_action: IdleAction::Delete,
                auto_resume: false,
            };
            assert!(s.claim_warm(&claim).unwrap().is_some());
            s.pool_members("t", pool).unwrap();
        }
        let conn = s.conn.lock().unwrap();
        let members = format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
             WHERE tenant = ?1 AND pool = ?2 AND claimed = 0 ORDER BY created_at, id"
        );
        let stmt = conn.prepare_cached(&members).unwrap();
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "pool_members was parsed again"
        );
    }

    #[test]
    fn a_warm_sandbox_is_claimed_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        s.insert_sandbox(&row("w1", "t", Some("p"), false)).unwrap();
        let labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let claim = Claim {
            tenant: "t",
            pool: "p",
            labels: &labels,
            shutdown_at: Some(99),
            idle_timeout_seconds: Some(5),
            now: 10,
            idle_action: IdleAction::Pause,
            auto_resume: true,
        };
        let got = s.claim_warm(&claim).unwrap().unwrap();
        assert_eq!(got.id, "w1");
        assert!(got.claimed);
        assert_eq!(got.labels, labels);
        assert_eq!(got.shutdown_at, Some(99));
        assert_eq!(
            (got.idle_action, got.auto_resume),
            (IdleAction::Pause, true)
        );
        assert_eq!(
            s.get_any("w1")
                .unwrap()
                .map(|r| (r.idle_action, r.auto_resume)),
            Some((IdleAction::Pause, true))
        );
        assert!(s.claim_warm(&claim).unwrap().is_none());
        assert!(s.pool_members("t", "p").unwrap().is_empty());
    }

    #[test]
    fn survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let s = Store::open(&path).unwrap();
            s.insert_sandbox(&row("a", "t", None, true)).unwrap();
            s.put_template(
                "t",
                "py",
                &Template {
                    memory_mb: Some(64),
                    ..Default::default()
                },
            )
            .unwrap();
        }
        let s = Store::open(&path).unwrap();
        assert!(s.get_sandbox("t", "a").unwrap().is_some());
        assert_eq!(
            s.get_template("t", "py").unwrap().unwrap().memory_mb,
            Some(64)
        );
    }

    fn snap(id: &str, tenant: &str, sandbox: &str, size: Option<u64>) -> SnapshotRow {
        SnapshotRow {
            id: id.into(),
            tenant: tenant.into(),
            sandbox_id: sandbox.into(),
            created_at: 1,
            size_bytes: size,
        }
    }

    #[test]
    fn snapshot_sizes_deletion_and_forks() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("db")).unwrap();
        s.insert_snapshot(&snap("s1", "t", "a", Some(4096)))
            .unwrap();
        s.insert_snapshot(&snap("s2", "t", "a", Some(1 << 20)))
            .unwrap();
        s.insert_snapshot(&snap("s3", "u", "b", Some(7))).unwrap();
        s.insert_snapshot(&snap("s4", "t", "a", None)).unwrap();
        assert_eq!(
            s.get_snapshot("t", "s1").unwrap().unwrap().size_bytes,
            Some(4096)
        );
        assert_eq!(s.snapshot_bytes("t").unwrap(), 4096 + (1 << 20));
        assert_eq!(s.snapshot_bytes("nobody").unwrap(), 0);
        // Another tenant's snapshot is not there to delete.
        assert!(!s.delete_snapshot("t", "s3").unwrap());
        assert!(s.get_snapshot("u", "s3").unwrap().is_some());
        assert!(s.delete_snapshot("t", "s1").unwrap());
        assert!(!s.delete_snapshot("t", "s1").unwrap());
        assert_eq!(s.snapshot_bytes("t").unwrap(), 1 << 20);

        let mut fork = row("f", "t", None, true);
        fork.forked_from = Some("s2".into());
        s.insert_sandbox(&fork).unwrap();
        assert_eq!(s.forks_of("s2").unwrap(), vec!["f".to_string()]);
        assert!(s.forks_of("s4").unwrap().is_empty());
    }

    #[test]
    fn a_database_from_before_snapshot_sizes_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE snapshots (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, \
                 sandbox_id TEXT NOT NULL, created_at INTEGER NOT NULL);
                 INSERT INTO snapshots VALUES ('old', 't', 'a', 5);",
            )
            .unwrap();
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(
            s.get_snapshot("t", "old").unwrap().unwrap().size_bytes,
            None
        );
        s.insert_snapshot(&snap("new", "t", "a", Some(10))).unwrap();
        assert_eq!(s.snapshot_bytes("t").unwrap(), 10);
        drop(s);
        // Opening again finds the column and adds nothing.
        Store::open(&path).unwrap();
    }
}
