//! Tenants' secret values (`PUT /v1/secrets/{name}`): write-only through
//! the API. The values are read only by the local backend when it starts
//! a sandbox's egress gateway, never by a route. They are stored as the
//! rest of the hub's state is (the state dir is root's); the threat model
//! is the sandbox, which never sees this file.

use rusqlite::{params, OptionalExtension};
use sandhub_client::Result;

use super::Store;

/// Created by `Store::open` on every database (a table only ever added).
pub(super) const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS secrets (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);
"#;

impl Store {
    /// Sets a tenant's value; `false` when it is new and the tenant holds
    /// `max` already.
    pub fn put_secret(
        &self,
        tenant: &str,
        name: &str,
        value: &str,
        now: i64,
        max: usize,
    ) -> Result<bool> {
        self.with(|c| {
            let exists = c
                .query_row(
                    "SELECT 1 FROM secrets WHERE tenant = ?1 AND name = ?2",
                    params![tenant, name],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if !exists {
                let n: i64 = c.query_row(
                    "SELECT COUNT(*) FROM secrets WHERE tenant = ?1",
                    params![tenant],
                    |r| r.get(0),
                )?;
                if n as usize >= max {
                    return Ok(false);
                }
            }
            c.execute(
                "INSERT INTO secrets (tenant, name, value, updated_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (tenant, name) DO UPDATE SET value = ?3, updated_at = ?4",
                params![tenant, name, value, now],
            )?;
            Ok(true)
        })
    }

    /// A tenant's names and when each was set (never the values).
    pub fn list_secrets(&self, tenant: &str) -> Result<Vec<(String, i64)>> {
        self.with(|c| {
            let mut s = c.prepare_cached(
                "SELECT name, updated_at FROM secrets WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = s.query_map(params![tenant], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }

    /// The value, for the gateway only.
    pub fn secret_value(&self, tenant: &str, name: &str) -> Result<Option<String>> {
        self.with(|c| {
            c.query_row(
                "SELECT value FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Whether there was one to delete.
    pub fn delete_secret(&self, tenant: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )
            .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_per_tenant_bounded_and_listed_without_values() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("state.db")).unwrap();
        assert!(s.put_secret("alice", "K", "v1", 1, 2).unwrap());
        assert!(s.put_secret("alice", "K", "v2", 2, 2).unwrap()); // replace
        assert!(s.put_secret("alice", "L", "v", 3, 2).unwrap());
        assert!(!s.put_secret("alice", "M", "v", 4, 2).unwrap()); // full
        assert_eq!(
            s.list_secrets("alice").unwrap(),
            vec![("K".into(), 2), ("L".into(), 3)]
        );
        assert_eq!(s.secret_value("alice", "K").unwrap().as_deref(), Some("v2"));
        assert_eq!(s.secret_value("bob", "K").unwrap(), None);
        assert!(s.list_secrets("bob").unwrap().is_empty());
        assert!(!s.delete_secret("bob", "K").unwrap());
        assert!(s.delete_secret("alice", "K").unwrap());
        assert_eq!(s.secret_value("alice", "K").unwrap(), None);
    }
}
