//! The local backend's pool and tenant gauges (`crate::gauges`), from one
//! read of the sandbox table and the pool table per scrape.

use std::collections::{BTreeMap, HashMap};

use sandhub_api::hub::SandboxState;
use sandhub_client::Result;

use super::hub::{counts_against_quota, Hub};
use crate::gauges::{Gauges, PoolGauge, TenantGauge};

impl Hub {
    pub(super) fn pool_and_tenant_gauges(&self) -> Result<Gauges> {
        let rows = self.store.all_sandboxes()?;
        // Pool members by (tenant, pool): ready and starting.
        let mut members: HashMap<(&str, &str), (u64, u64)> = HashMap::new();
        let mut tenants: BTreeMap<String, TenantGauge> = BTreeMap::new();
        // Each tenant's templates' memory limits, looked up once.
        let mut templates: HashMap<&str, HashMap<String, u64>> = HashMap::new();
        for r in &rows {
            if let Some(pool) = r.pool.as_deref().filter(|_| !r.claimed) {
                let m = members.entry((&r.tenant, pool)).or_default();
                match r.state {
                    SandboxState::Ready => m.0 += 1,
                    SandboxState::Pending => m.1 += 1,
                    _ => {}
                }
            }
            // What the quota counts: the same rows `Hub::admit` counts.
            if !counts_against_quota(r.state) {
                continue;
            }
            let mb = self.memory_limit_mb(r, templates.entry(&r.tenant).or_default());
            let t = tenants
                .entry(r.tenant.clone())
                .or_insert_with(|| TenantGauge {
                    tenant: r.tenant.clone(),
                    ..Default::default()
                });
            t.sandboxes += 1;
            t.memory_reserved_bytes = t.memory_reserved_bytes.saturating_add(mb << 20);
        }
        let pools = self
            .store
            .list_pools(None)?
            .into_iter()
            .map(|p| {
                let (ready, starting) = members
                    .get(&(p.tenant.as_str(), p.name.as_str()))
                    .copied()
                    .unwrap_or_default();
                PoolGauge {
                    failing: self.pool_error(&p.tenant, &p.name).is_some(),
                    tenant: p.tenant,
                    pool: p.name,
                    target: u64::from(p.replicas),
                    ready,
                    starting,
                }
            })
            .collect();
        let snapshot_quota = match self
            .max_snapshot_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            b => Some(b),
        };
        for t in tenants.values_mut() {
            t.snapshot_bytes = self.store.snapshot_bytes(&t.tenant)?;
            t.sandboxes_quota = Some(self.policy.tenant_max_sandboxes);
            t.memory_quota_bytes = Some(self.policy.tenant_max_memory_mb.saturating_mul(1 << 20));
            t.snapshot_quota_bytes = snapshot_quota;
        }
        Ok(Gauges {
            pools,
            tenants: tenants.into_values().collect(),
        })
    }
}
