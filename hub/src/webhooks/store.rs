//! The webhooks' tables in the hub's SQLite file: the registrations, the
//! outbox (one row per event still to deliver to one webhook, written in
//! the event's own transaction by [`Outbox`]), and the last attempts.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use rusqlite::{params, Connection, OptionalExtension};
use sandhub_client::{Error, Result};
use tokio::sync::Notify;

use crate::events::{AppendHook, Event};

pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS webhooks (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    secret TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS webhook_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    next_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox (next_at);
CREATE INDEX IF NOT EXISTS webhook_outbox_tenant ON webhook_outbox (tenant, name);
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at INTEGER NOT NULL,
    status INTEGER,
    error TEXT,
    duration_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_of ON webhook_deliveries (tenant, name, id);
"#;

/// Attempts kept per webhook for `GET .../deliveries`.
pub const KEPT_ATTEMPTS: i64 = 100;

/// One registration as stored. `events` is empty for "every type".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRow {
    pub tenant: String,
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret: String,
    pub updated_at: i64,
}

/// One event owed to one webhook.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub tenant: String,
    pub name: String,
    pub event_id: u64,
    pub body: String,
    pub attempts: u32,
    pub created_at: i64,
}

/// One attempt, as `GET .../deliveries` lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Attempt {
    pub event_id: u64,
    /// 1 for the first try.
    pub attempt: u32,
    /// RFC 3339.
    pub time: String,
    /// The receiver's HTTP status; absent when none was received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why it failed (refused address, timeout, status); absent on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

fn db_err(e: rusqlite::Error) -> Error {
    Error::internal(format!("webhook store: {e}"))
}

/// `,created,deleted,`: what the outbox's `instr` matches `,type,` in.
fn events_column(events: &[String]) -> String {
    if events.is_empty() {
        "*".into()
    } else {
        format!(",{},", events.join(","))
    }
}

pub struct WebhookStore {
    conn: Mutex<Connection>,
}

impl WebhookStore {
    pub fn open(path: &Path) -> Result<WebhookStore> {
        let c = crate::sqlite::open(path).map_err(db_err)?;
        crate::sqlite::checkpoint_late(&c).map_err(db_err)?;
        c.execute_batch(SCHEMA).map_err(db_err)?;
        Ok(WebhookStore {
            conn: Mutex::new(c),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&c).map_err(db_err)
    }

    /// Inserts or replaces; false when the tenant already has `max` others.
    pub fn put(&self, w: &WebhookRow, max: usize) -> Result<bool> {
        self.with(|c| {
            let others: i64 = c.query_row(
                "SELECT COUNT(*) FROM webhooks WHERE tenant = ?1 AND name != ?2",
                params![w.tenant, w.name],
                |r| r.get(0),
            )?;
            if others as usize >= max {
                return Ok(false);
            }
            c.execute(
                "INSERT INTO webhooks (tenant, name, url, events, secret, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (tenant, name) DO UPDATE SET \
                 url = ?3, events = ?4, secret = ?5, updated_at = ?6",
                params![
                    w.tenant,
                    w.name,
                    w.url,
                    events_column(&w.events),
                    w.secret,
                    w.updated_at
                ],
            )?;
            Ok(true)
        })
    }

    pub fn get(&self, tenant: &str, name: &str) -> Result<Option<WebhookRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT tenant, name, url, events, secret, updated_at FROM webhooks \
                 WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                row,
            )
            .optional()
        })
    }

    pub fn list(&self, tenant: &str) -> Result<Vec<WebhookRow>> {
        self.with(|c| {
            let mut s = c.prepare_cached(
                "SELECT tenant, name, url, events, secret, updated_at FROM webhooks \
                 WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = s.query_map(params![tenant], row)?;
            rows.collect()
        })
    }

    /// Deletes the registration, what it was still owed, and its attempts.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            let n = c.execute(
                "DELETE FROM webhooks WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )?;
            c.execute(
                "DELETE FROM webhook_outbox WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )?;
            c.execute(
                "DELETE FROM webhook_deliveries WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )?;
            Ok(n > 0)
        })
    }

    /// Up to `limit` rows due at `now`, each leased until `lease_until` (a
    /// hub killed mid-delivery retries it after the lease: at least once).
    pub fn take_due(&self, now: i64, limit: usize, lease_until: i64) -> Result<Vec<OutboxRow>> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = c.transaction().map_err(db_err)?;
        let rows = {
            let mut s = tx
                .prepare_cached(
                    "SELECT id, tenant, name, event_id, body, attempts, created_at \
                     FROM webhook_outbox WHERE next_at <= ?1 ORDER BY next_at, id LIMIT ?2",
                )
                .map_err(db_err)?;
            let rows = s
                .query_map(params![now, limit as i64], |r| {
                    Ok(OutboxRow {
                        id: r.get(0)?,
                        tenant: r.get(1)?,
                        name: r.get(2)?,
                        event_id: r.get::<_, i64>(3)? as u64,
                        body: r.get(4)?,
                        attempts: r.get::<_, i64>(5)?.clamp(0, u32::MAX as i64) as u32,
                        created_at: r.get(6)?,
                    })
                })
                .map_err(db_err)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(db_err)?;
            let mut lease = tx
                .prepare_cached("UPDATE webhook_outbox SET next_at = ?2 WHERE id = ?1")
                .map_err(db_err)?;
            for r in &rows {
                lease.execute(params![r.id, lease_until]).map_err(db_err)?;
            }
            rows
        };
        tx.commit().map_err(db_err)?;
        Ok(rows)
    }

    /// When the next row falls due, if any.
    pub fn next_due(&self) -> Result<Option<i64>> {
        self.with(|c| c.query_row("SELECT MIN(next_at) FROM webhook_outbox", [], |r| r.get(0)))
    }

    /// Records an attempt and settles its row: gone when `done` (delivered
    /// or given up), else due again at `retry_at`.
    pub fn settle(
        &self,
        row: &OutboxRow,
        attempt: &Attempt,
        at_ms: i64,
        done: bool,
        retry_at: i64,
    ) -> Result<()> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = c.transaction().map_err(db_err)?;
        if done {
            tx.execute("DELETE FROM webhook_outbox WHERE id = ?1", params![row.id])
        } else {
            tx.execute(
                "UPDATE webhook_outbox SET attempts = ?2, next_at = ?3 WHERE id = ?1",
                params![row.id, attempt.attempt as i64, retry_at],
            )
        }
        .map_err(db_err)?;
        tx.execute(
            "INSERT INTO webhook_deliveries \
             (tenant, name, event_id, attempt, at, status, error, duration_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                row.tenant,
                row.name,
                row.event_id as i64,
                attempt.attempt as i64,
                at_ms,
                attempt.status.map(|s| s as i64),
                attempt.error,
                attempt.duration_ms as i64,
            ],
        )
        .map_err(db_err)?;
        tx.execute(
            "DELETE FROM webhook_deliveries WHERE tenant = ?1 AND name = ?2 AND id <= \
             COALESCE((SELECT id FROM webhook_deliveries WHERE tenant = ?1 AND name = ?2 \
                       ORDER BY id DESC LIMIT 1 OFFSET ?3), 0)",
            params![row.tenant, row.name, KEPT_ATTEMPTS],
        )
        .map_err(db_err)?;
        tx.commit().map_err(db_err)
    }

    /// A webhook's last attempts, newest first.
    pub fn attempts(&self, tenant: &str, name: &str) -> Result<Vec<Attempt>> {
        self.with(|c| {
            let mut s = c.prepare_cached(
                "SELECT event_id, attempt, at, status, error, duration_ms FROM webhook_deliveries \
                 WHERE tenant = ?1 AND name = ?2 ORDER BY id DESC LIMIT ?3",
            )?;
            let rows = s.query_map(params![tenant, name, KEPT_ATTEMPTS], |r| {
                Ok(Attempt {
                    event_id: r.get::<_, i64>(0)? as u64,
                    attempt: r.get::<_, i64>(1)? as u32,
                    time: crate::backend::rfc3339(r.get(2)?),
                    status: r.get::<_, Option<i64>>(3)?.map(|s| s as u16),
                    error: r.get(4)?,
                    duration_ms: r.get::<_, i64>(5)? as u64,
                })
            })?;
            rows.collect()
        })
    }

    /// Rows owed to one webhook (for its GET).
    pub fn pending(&self, tenant: &str, name: &str) -> Result<u64> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM webhook_outbox WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
        })
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WebhookRow> {
    let events: String = r.get(3)?;
    Ok(WebhookRow {
        tenant: r.get(0)?,
        name: r.get(1)?,
        url: r.get(2)?,
        events: if events == "*" {
            Vec::new()
        } else {
            events
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        },
        secret: r.get(4)?,
        updated_at: r.get(5)?,
    })
}

/// The event log's [`AppendHook`]: each stored event becomes one outbox
/// row per webhook of its tenant that takes its type, in the event's own
/// transaction, while the tenant's outbox has room.
pub struct Outbox {
    pub max_per_tenant: u64,
    pub wake: Arc<Notify>,
    /// Rows were written in the batch being committed.
    pub wrote: std::sync::atomic::AtomicBool,
}

impl AppendHook for Outbox {
    fn stored(&self, tx: &rusqlite::Transaction<'_>, e: &Event) -> rusqlite::Result<()> {
        let body = serde_json::to_string(e).unwrap_or_default();
        let now = crate::backend::now_ms();
        let n = tx
            .prepare_cached(
                "INSERT INTO webhook_outbox \
                 (tenant, name, event_id, body, attempts, next_at, created_at) \
                 SELECT tenant, name, ?3, ?4, 0, ?5, ?5 FROM webhooks \
                 WHERE tenant = ?1 AND (events = '*' OR instr(events, ?2) > 0) \
                 AND (SELECT COUNT(*) FROM webhook_outbox WHERE tenant = ?1) < ?6",
            )?
            .execute(params![
                e.tenant,
                format!(",{},", e.kind.as_str()),
                e.id as i64,
                body,
                now,
                self.max_per_tenant.min(i64::MAX as u64) as i64,
            ])?;
        if n > 0 {
            self.wrote.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    fn committed(&self) {
        if self.wrote.swap(false, std::sync::atomic::Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }
}
