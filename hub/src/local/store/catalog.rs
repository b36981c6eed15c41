//! Templates and pools in the state store: each a named JSON spec or row
//! per tenant.

use rusqlite::{params, OptionalExtension, Row};
use sandhub_api::hub::Template;
use sandhub_client::{Error, Result};

use super::{json, PoolRow, Store};

impl Store {
    pub fn put_template(&self, tenant: &str, name: &str, t: &Template) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO templates (tenant, name, spec) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (tenant, name) DO UPDATE SET spec = excluded.spec",
                params![tenant, name, json(t)],
            )
            .map(|_| ())
        })
    }

    pub fn get_template(&self, tenant: &str, name: &str) -> Result<Option<Template>> {
        let spec: Option<String> = self.with(|c| {
            c.query_row(
                "SELECT spec FROM templates WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |r| r.get(0),
            )
            .optional()
        })?;
        spec.map(|s| {
            serde_json::from_str(&s)
                .map_err(|e| Error::internal(format!("stored template {name}: {e}")))
        })
        .transpose()
    }

    pub fn list_templates(&self, tenant: &str) -> Result<Vec<(String, Template)>> {
        let rows: Vec<(String, String)> = self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT name, spec FROM templates WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = stmt.query_map(params![tenant], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })?;
        Ok(rows
            .into_iter()
            .filter_map(|(n, s)| serde_json::from_str(&s).ok().map(|t| (n, t)))
            .collect())
    }

    /// `(tenant, image)` of every template naming an image: what the
    /// image store must keep.
    pub fn template_images(&self) -> Result<Vec<(String, String)>> {
        let specs: Vec<(String, String)> = self.with(|c| {
            let mut stmt = c.prepare_cached("SELECT tenant, spec FROM templates")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })?;
        Ok(specs
            .into_iter()
            .filter_map(|(tenant, s)| {
                let image = serde_json::from_str::<Template>(&s).ok()?.image?;
                Some((tenant, image))
            })
            .collect())
    }

    pub fn delete_template(&self, tenant: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM templates WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )
            .map(|n| n > 0)
        })
    }

    pub fn put_pool(&self, p: &PoolRow) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT INTO pools (tenant, name, template, replicas) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (tenant, name) DO UPDATE SET template = excluded.template, \
                 replicas = excluded.replicas",
                params![p.tenant, p.name, p.template, p.replicas],
            )
            .map(|_| ())
        })
    }

    pub fn get_pool(&self, tenant: &str, name: &str) -> Result<Option<PoolRow>> {
        self.with(|c| {
            c.query_row(
                "SELECT tenant, name, template, replicas FROM pools WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                pool_from_row,
            )
            .optional()
        })
    }

    pub fn list_pools(&self, tenant: Option<&str>) -> Result<Vec<PoolRow>> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT tenant, name, template, replicas FROM pools \
                 WHERE ?1 IS NULL OR tenant = ?1 ORDER BY tenant, name",
            )?;
            let rows = stmt.query_map(params![tenant], pool_from_row)?;
            rows.collect()
        })
    }

    pub fn delete_pool(&self, tenant: &str, name: &str) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "DELETE FROM pools WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )
            .map(|n| n > 0)
        })
    }
}

fn pool_from_row(r: &Row<'_>) -> rusqlite::Result<PoolRow> {
    Ok(PoolRow {
        tenant: r.get(0)?,
        name: r.get(1)?,
        template: r.get(2)?,
        replicas: r.get::<_, i64>(3)? as u32,
    })
}
