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
"#;

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
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
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
