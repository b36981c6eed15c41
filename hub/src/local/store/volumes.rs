//! Tenants' named volumes (`/v1/volumes`): the row is the truth. A volume
//! exists when its row does; its subvolume on the quota volume is made
//! after the row and removed after it, and the hub puts the disk in line
//! with the rows when it starts (`Hub::reconcile_volumes`), so a `kill -9`
//! between the two steps loses nothing and leaves nothing behind.

use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension};
use sandhub_client::Result;

use super::Store;

/// Created by `Store::open` on every database (a table only ever added).
pub(super) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS volumes (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    size_mb INTEGER NOT NULL,
    labels TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS volume_snapshots (
    tenant TEXT NOT NULL,
    volume TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, volume, name)
);
CREATE TABLE IF NOT EXISTS volume_clones (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    snapshot_volume TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
"#;

/// One volume snapshot's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSnapshotRow {
    pub tenant: String,
    pub volume: String,
    pub name: String,
    pub created_at: i64,
}

/// A volume whose files are still to be copied from a snapshot: written
/// with the volume's row, in one transaction, and removed once the copy
/// is on disk, so a start after a `kill -9` mid-clone makes the copy
/// rather than an empty volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingClone {
    pub tenant: String,
    pub name: String,
    pub snapshot_volume: String,
    pub snapshot: String,
}

/// Why [`Store::insert_volume_snapshot`] added nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotRefused {
    Exists,
    /// The volume has this many snapshots already.
    TooMany(usize),
}

fn snapshot_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VolumeSnapshotRow> {
    Ok(VolumeSnapshotRow {
        tenant: r.get(0)?,
        volume: r.get(1)?,
        name: r.get(2)?,
        created_at: r.get(3)?,
    })
}

/// One volume's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub tenant: String,
    pub name: String,
    pub size_mb: u64,
    pub labels: BTreeMap<String, String>,
    pub created_at: i64,
}

/// Why [`Store::insert_volume`] added nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeRefused {
    /// The tenant has a volume of that name.
    Exists,
    /// The tenant's volumes take this many MiB already; the new one would
    /// go past the cap.
    OverCap { have_mb: u64 },
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VolumeRow> {
    let labels: String = r.get(3)?;
    Ok(VolumeRow {
        tenant: r.get(0)?,
        name: r.get(1)?,
        size_mb: r.get::<_, i64>(2)? as u64,
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        created_at: r.get(4)?,
    })
}

const COLUMNS: &str = "tenant, name, size_mb, labels, created_at";

impl Store {
    /// Adds a volume unless the tenant has one of that name or its volumes
    /// would then add up to more than `cap_mb` (checked and written in one
    /// transaction, so two creates cannot both pass the cap).
    pub fn insert_volume(
        &self,
        v: &VolumeRow,
        cap_mb: u64,
    ) -> Result<std::result::Result<(), VolumeRefused>> {
        self.insert_volume_from(v, cap_mb, None)
    }

    /// [`Store::insert_volume`], and with `clone` its pending copy in the
    /// same transaction.
    pub fn insert_volume_from(
        &self,
        v: &VolumeRow,
        cap_mb: u64,
        clone: Option<&PendingClone>,
    ) -> Result<std::result::Result<(), VolumeRefused>> {
        self.with(|c| {
            let tx = c.check_then_write()?;
            let exists = tx
                .query_row(
                    "SELECT 1 FROM volumes WHERE tenant = ?1 AND name = ?2",
                    params![v.tenant, v.name],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if exists {
                return Ok(Err(VolumeRefused::Exists));
            }
            let have: i64 = tx.query_row(
                "SELECT COALESCE(SUM(size_mb), 0) FROM volumes WHERE tenant = ?1",
                params![v.tenant],
                |r| r.get(0),
            )?;
            let have_mb = have.max(0) as u64;
            if have_mb.saturating_add(v.size_mb) > cap_mb {
                return Ok(Err(VolumeRefused::OverCap { have_mb }));
            }
            tx.execute(
                "INSERT INTO volumes (tenant, name, size_mb, labels, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    v.tenant,
                    v.name,
                    v.size_mb as i64,
                    serde_json::to_string(&v.labels).unwrap_or_else(|_| "{}".into()),
                    v.created_at
                ],
            )?;
            if let Some(p) = clone {
                tx.execute(
                    "INSERT OR REPLACE INTO volume_clones (tenant, name, snapshot_volume, snapshot) \
                     VALUES (?1, ?2, ?3, ?4)",
                    params![p.tenant, p.name, p.snapshot_volume, p.snapshot],
                )?;
            }
            tx.commit()?;
            Ok(Ok(()))
        })
    }

    /// A tenant's volumes, by name.
    pub fn list_volumes(&self, tenant: &str) -> Result<Vec<VolumeRow>> {
        self.with(|c| {
            let mut s = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM volumes WHERE tenant = ?1 ORDER BY name"
            ))?;
            let rows = s.query_map(params![tenant], row)?;
            rows.collect()
        })
    }

    /// Every tenant's volumes (the start-up reconciliation).
    pub fn all_volumes(&self) -> Result<Vec<VolumeRow>> {
        self.with(|c| {
            let mut s = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM volumes ORDER BY tenant, name"
            ))?;
            let rows = s.query_map([], row)?;
            rows.collect()
        })
    }

    pub fn get_volume(&self, tenant: &str, name: &str) -> Result<Option<VolumeRow>> {
        self.with(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM volumes WHERE tenant = ?1 AND name = ?2"),
                params![tenant, name],
                row,
            )
            .optional()
        })
    }

    /// Whether there was one to delete.
    pub fn delete_volume(&self, tenant: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM volumes WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )
            .map(|n| n > 0)
        })
    }
}

impl Store {
    /// Every clone whose copy is not known to be on disk.
    pub fn pending_clones(&self) -> Result<Vec<PendingClone>> {
        self.with(|c| {
            let mut s = c.prepare_cached(
                "SELECT tenant, name, snapshot_volume, snapshot FROM volume_clones \
                 ORDER BY tenant, name",
            )?;
            let rows = s.query_map([], |r| {
                Ok(PendingClone {
                    tenant: r.get(0)?,
                    name: r.get(1)?,
                    snapshot_volume: r.get(2)?,
                    snapshot: r.get(3)?,
                })
            })?;
            rows.collect()
        })
    }

    /// The copy of a clone is on disk (or was given up on).
    pub fn clone_done(&self, tenant: &str, name: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "DELETE FROM volume_clones WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )
            .map(|_| ())
        })
    }

    /// Adds a snapshot's row unless the volume has one of that name or
    /// [`sandhub_api::volumes::MAX_SNAPSHOTS_PER_VOLUME`] already.
    pub fn insert_volume_snapshot(
        &self,
        s: &VolumeSnapshotRow,
        max: usize,
    ) -> Result<std::result::Result<(), SnapshotRefused>> {
        self.with(|c| {
            let tx = c.check_then_write()?;
            let exists = tx
                .query_row(
                    "SELECT 1 FROM volume_snapshots WHERE tenant = ?1 AND volume = ?2 AND name = ?3",
                    params![s.tenant, s.volume, s.name],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if exists {
                return Ok(Err(SnapshotRefused::Exists));
            }
            let have: i64 = tx.query_row(
                "SELECT COUNT(*) FROM volume_snapshots WHERE tenant = ?1 AND volume = ?2",
                params![s.tenant, s.volume],
                |r| r.get(0),
            )?;
            let have = have.max(0) as usize;
            if have >= max {
                return Ok(Err(SnapshotRefused::TooMany(have)));
            }
            tx.execute(
                "INSERT INTO volume_snapshots (tenant, volume, name, created_at) \
                 VALUES (?1, ?2, ?3, ?4)",
                params![s.tenant, s.volume, s.name, s.created_at],
            )?;
            tx.commit()?;
            Ok(Ok(()))
        })
    }

    /// A volume's snapshots, by name.
    pub fn list_volume_snapshots(
        &self,
        tenant: &str,
        volume: &str,
    ) -> Result<Vec<VolumeSnapshotRow>> {
        self.with(|c| {
            let mut s = c.prepare_cached(
                "SELECT tenant, volume, name, created_at FROM volume_snapshots \
                 WHERE tenant = ?1 AND volume = ?2 ORDER BY name",
            )?;
            let rows = s.query_map(params![tenant, volume], snapshot_row)?;
            rows.collect()
        })
    }

    /// Every tenant's volume snapshots (the start-up reconciliation).
    pub fn all_volume_snapshots(&self) -> Result<Vec<VolumeSnapshotRow>> {
        self.with(|c| {
            let mut s = c.prepare_cached(
                "SELECT tenant, volume, name, created_at FROM volume_snapshots \
                 ORDER BY tenant, volume, name",
            )?;
            let rows = s.query_map([], snapshot_row)?;
            rows.collect()
        })
    }

    pub fn get_volume_snapshot(
        &self,
        tenant: &str,
        volume: &str,
        name: &str,
    ) -> Result<Option<VolumeSnapshotRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT tenant, volume, name, created_at FROM volume_snapshots \
                 WHERE tenant = ?1 AND volume = ?2 AND name = ?3",
                params![tenant, volume, name],
                snapshot_row,
            )
            .optional()
        })
    }

    /// Whether there was one to delete.
    pub fn delete_volume_snapshot(&self, tenant: &str, volume: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM volume_snapshots WHERE tenant = ?1 AND volume = ?2 AND name = ?3",
                params![tenant, volume, name],
            )
            .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(tenant: &str, name: &str, size_mb: u64) -> VolumeRow {
        VolumeRow {
            tenant: tenant.into(),
            name: name.into(),
            size_mb,
            labels: [("team".to_string(), "a".to_string())].into(),
            created_at: 7,
        }
    }

    /// Another connection to the file (the event log's, the webhooks')
    /// commits while a check-then-insert runs: the insert waits for it and
    /// succeeds, instead of failing with `database is locked` (seen in CI).
    #[test]
    fn a_check_then_insert_waits_out_another_connections_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let s = Store::open(&path).unwrap();
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute_batch(
                "CREATE TABLE other (n INTEGER); BEGIN IMMEDIATE; INSERT INTO other VALUES (1);",
            )
            .unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            other.execute_batch("COMMIT").unwrap();
        });
        assert_eq!(
            s.insert_volume(&v("alice", "data", 1), 100).unwrap(),
            Ok(())
        );
        writer.join().unwrap();
        assert_eq!(
            s.insert_volume(&v("alice", "data", 1), 100).unwrap(),
            Err(VolumeRefused::Exists)
        );
    }

    #[test]
    fn volumes_are_per_tenant_unique_and_capped() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("state.db")).unwrap();
        assert_eq!(
            s.insert_volume(&v("alice", "data", 60), 100).unwrap(),
            Ok(())
        );
        assert_eq!(
            s.insert_volume(&v("alice", "data", 1), 100).unwrap(),
            Err(VolumeRefused::Exists)
        );
        assert_eq!(
            s.insert_volume(&v("alice", "more", 41), 100).unwrap(),
            Err(VolumeRefused::OverCap { have_mb: 60 })
        );
        assert_eq!(
            s.insert_volume(&v("alice", "more", 40), 100).unwrap(),
            Ok(())
        );
        // Another tenant: its own names and its own cap.
        assert_eq!(
            s.insert_volume(&v("bob", "data", 100), 100).unwrap(),
            Ok(())
        );
        assert_eq!(
            s.get_volume("alice", "data").unwrap(),
            Some(v("alice", "data", 60))
        );
        assert_eq!(s.get_volume("bob", "more").unwrap(), None);
        let names: Vec<String> = s
            .list_volumes("alice")
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["data", "more"]);
        assert_eq!(s.all_volumes().unwrap().len(), 3);
        assert!(!s.delete_volume("bob", "more").unwrap());
        assert!(s.delete_volume("alice", "data").unwrap());
        assert_eq!(s.get_volume("alice", "data").unwrap(), None);
        // Reopened: what was committed is there.
        drop(s);
        let s = Store::open(&dir.path().join("state.db")).unwrap();
        assert_eq!(s.list_volumes("alice").unwrap().len(), 1);
    }
}
