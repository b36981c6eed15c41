//! The local backend's event log: a table in the hub's SQLite file, on
//! connections of its own (WAL lets the writer thread commit while the
//! store and the streams read), so storing events never waits on the
//! store's lock and the store's work never waits on events.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use rusqlite::{params, Connection};
use sandhub_client::{Error, Result};

use super::{Event, EventType, NewEvent, Sink};
use crate::backend::rfc3339;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    type TEXT NOT NULL,
    sandbox_id TEXT,
    pool TEXT,
    labels TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_tenant ON events (tenant, id);
CREATE INDEX IF NOT EXISTS events_at ON events (at);
"#;

/// Rows one prune statement deletes at most: the write lock is held for
/// milliseconds, never for one huge delete.
const PRUNE_CHUNK: i64 = 10_000;

/// More rows written with each stored event, in the same transaction: the
/// webhook outbox (`crate::webhooks`), so an event is stored with its
/// deliveries or not at all, and a `kill -9` loses neither.
pub trait AppendHook: Send + Sync + 'static {
    fn stored(&self, tx: &rusqlite::Transaction<'_>, event: &Event) -> rusqlite::Result<()>;
    /// After the batch's commit (wake whoever works on those rows).
    fn committed(&self) {}
}

pub struct SqliteLog {
    writer: Mutex<Connection>,
    reader: Mutex<Connection>,
    hook: Option<Arc<dyn AppendHook>>,
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::internal(format!("event log: {e}"))
}

impl SqliteLog {
    pub fn open(path: &Path, hook: Option<Arc<dyn AppendHook>>) -> Result<SqliteLog> {
        let writer = crate::sqlite::open(path).map_err(db_err)?;
        writer.execute_batch(SCHEMA).map_err(db_err)?;
        let reader = crate::sqlite::open(path).map_err(db_err)?;
        Ok(SqliteLog {
            writer: Mutex::new(writer),
            reader: Mutex::new(reader),
            hook,
        })
    }
}

impl Sink for SqliteLog {
    fn append(&self, batch: Vec<NewEvent>) -> Result<Vec<Event>> {
        let mut conn = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn.transaction().map_err(db_err)?;
        let mut stored = Vec::with_capacity(batch.len());
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (at, tenant, type, sandbox_id, pool, labels, details) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(db_err)?;
            for e in batch {
                insert
                    .execute(params![
                        e.at_ms,
                        e.tenant,
                        e.kind.as_str(),
                        e.sandbox_id,
                        e.pool,
                        serde_json::to_string(&e.labels).unwrap_or_default(),
                        e.details.to_string(),
                    ])
                    .map_err(db_err)?;
                let id = tx.last_insert_rowid() as u64;
                let e = Event::stored(id, e);
                if let Some(hook) = &self.hook {
                    hook.stored(&tx, &e).map_err(db_err)?;
                }
                stored.push(e);
            }
        }
        tx.commit().map_err(db_err)?;
        if let Some(hook) = &self.hook {
            hook.committed();
        }
        Ok(stored)
    }

    fn after(&self, tenant: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        let conn = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, at, type, sandbox_id, pool, labels, details FROM events \
                 WHERE tenant = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            )
            .map_err(db_err)?;
        let rows = stmt
            .query_map(
                params![tenant, after.min(i64::MAX as u64) as i64, limit as i64],
                |r| {
                    let kind: String = r.get(2)?;
                    let labels: String = r.get(5)?;
                    let details: String = r.get(6)?;
                    Ok(Event {
                        id: r.get::<_, i64>(0)? as u64,
                        time: rfc3339(r.get(1)?),
                        // A type this build does not know (a newer hub
                        // wrote it) reads as what it most likely was not:
                        // skipped below rather than misnamed.
                        kind: EventType::parse(&kind).unwrap_or(EventType::Finished),
                        tenant: tenant.to_string(),
                        sandbox_id: r.get(3)?,
                        pool: r.get(4)?,
                        labels: serde_json::from_str(&labels).unwrap_or_default(),
                        details: serde_json::from_str(&details).unwrap_or_default(),
                    })
                    .map(|e| (EventType::parse(&kind).is_some(), e))
                },
            )
            .map_err(db_err)?;
        let mut out = Vec::new();
        for row in rows {
            let (known, e) = row.map_err(db_err)?;
            if known {
                out.push(e);
            }
        }
        Ok(out)
    }

    fn newest(&self) -> Result<u64> {
        let conn = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        conn.query_row("SELECT COALESCE(MAX(id), 0) FROM events", [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|id| id as u64)
        .map_err(db_err)
    }

    fn prune(&self, before_ms: i64, keep: u64) -> Result<u64> {
        let conn = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut pruned = 0u64;
        loop {
            let n = conn
                .prepare_cached(
                    "DELETE FROM events WHERE id IN \
                     (SELECT id FROM events WHERE at < ?1 ORDER BY at LIMIT ?2)",
                )
                .and_then(|mut s| s.execute(params![before_ms, PRUNE_CHUNK]))
                .map_err(db_err)?;
            pruned += n as u64;
            if (n as i64) < PRUNE_CHUNK {
                break;
            }
        }
        // Ids are dense (one writer, no deletes in between but these), so
        // "more than `keep` below the newest" is "beyond the newest `keep`".
        let keep = keep.min(i64::MAX as u64) as i64;
        loop {
            let n = conn
                .prepare_cached(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events \
                     WHERE id <= (SELECT MAX(id) FROM events) - ?1 ORDER BY id LIMIT ?2)",
                )
                .and_then(|mut s| s.execute(params![keep, PRUNE_CHUNK]))
                .map_err(db_err)?;
            pruned += n as u64;
            if (n as i64) < PRUNE_CHUNK {
                break;
            }
        }
        Ok(pruned)
    }
}
