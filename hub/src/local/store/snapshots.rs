//! Snapshots in the state store: which tenant keeps which layer of which
//! sandbox, its size, and the forks that stand on it.

use rusqlite::{params, OptionalExtension, Row};
use sandhub_client::Result;

use super::{SnapshotRow, Store, SNAPSHOT_COLUMNS};

impl Store {
    pub fn insert_snapshot(&self, s: &SnapshotRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO snapshots (id, tenant, sandbox_id, created_at, size_bytes) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    s.id,
                    s.tenant,
                    s.sandbox_id,
                    s.created_at,
                    s.size_bytes.map(|b| b.min(i64::MAX as u64) as i64)
                ],
            )
            .map(|_| ())
        })
    }

    pub fn get_snapshot(&self, tenant: &str, id: &str) -> Result<Option<SnapshotRow>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE id = ?1 AND tenant = ?2"),
                params![id, tenant],
                snapshot_from_row,
            )
            .optional()
        })
    }

    pub fn list_snapshots(&self, tenant: &str, sandbox_id: &str) -> Result<Vec<SnapshotRow>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {SNAPSHOT_COLUMNS} FROM snapshots \
                 WHERE tenant = ?1 AND sandbox_id = ?2 ORDER BY created_at, id"
            ))?;
            let rows = stmt.query_map(params![tenant, sandbox_id], snapshot_from_row)?;
            rows.collect()
        })
    }

    /// Deletes a tenant's snapshot row; false when there was none.
    pub fn delete_snapshot(&self, tenant: &str, id: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM snapshots WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
            )
            .map(|n| n > 0)
        })
    }

    /// Sandboxes (any state, any tenant) whose workspace sits on snapshot `id`.
    pub fn forks_of(&self, snapshot_id: &str) -> Result<Vec<String>> {
        self.with(|c| {
            let mut stmt =
                c.prepare_cached("SELECT id FROM sandboxes WHERE forked_from = ?1 ORDER BY id")?;
            let rows = stmt.query_map(params![snapshot_id], |r| r.get(0))?;
            rows.collect()
        })
    }

    /// Bytes a tenant's snapshots take (what counts toward its disk use).
    pub fn snapshot_bytes(&self, tenant: &str) -> Result<u64> {
        self.with(|c| {
            c.query_row(
                "SELECT COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE tenant = ?1",
                params![tenant],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.max(0) as u64)
        })
    }
}

fn snapshot_from_row(r: &Row<'_>) -> rusqlite::Result<SnapshotRow> {
    Ok(SnapshotRow {
        id: r.get(0)?,
        tenant: r.get(1)?,
        sandbox_id: r.get(2)?,
        created_at: r.get(3)?,
        size_bytes: r.get::<_, Option<i64>>(4)?.map(|n| n.max(0) as u64),
    })
}
