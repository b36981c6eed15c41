//! Warm pools of the local backend: each pass applies [`plan::pool_plan`]
//! to every pool, starting members in the background and removing extras.

use std::{collections::BTreeMap, sync::Arc};

use sandhub_api::hub::{Launch, SandboxState};
use sandhub_client::Result;

use super::{
    hub::Hub,
    plan::{self, PoolPlan},
    store::{PoolRow, SandboxRow},
};
use crate::backend::{new_id, now_ms};

impl Hub {
    /// One pass of every pool: start missing members, remove extra ones.
    pub async fn refill_pools(self: &Arc<Self>) -> Result<()> {
        for pool in self.store.list_pools(None)? {
            let members = self.store.pool_members(&pool.tenant, &pool.name)?;
            let key = (pool.tenant.clone(), pool.name.clone());
            let starting = *self.launching.lock().unwrap().get(&key).unwrap_or(&0);
            match plan::pool_plan(pool.replicas, &members, starting) {
                PoolPlan::Start(n) => {
                    for _ in 0..n {
                        self.start_pool_member(&pool, &key);
                    }
                }
                PoolPlan::Remove(victims) => {
                    for m in victims {
                        let _ = self.remove(m).await;
                    }
                }
                PoolPlan::Keep => {}
            }
        }
        Ok(())
    }

    /// Launches one member in the background, counted as starting until
    /// it is stored (or failed), then wakes the refiller.
    fn start_pool_member(self: &Arc<Self>, pool: &PoolRow, key: &(String, String)) {
        *self
            .launching
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default() += 1;
        let hub = self.clone();
        let (pool, key) = (pool.clone(), key.clone());
        tokio::spawn(async move {
            if let Err(e) = hub.add_pool_member(&pool).await {
                tracing::warn!(pool = %pool.name, error = %e, "starting a warm sandbox");
            }
            if let Some(n) = hub.launching.lock().unwrap().get_mut(&key) {
                *n = n.saturating_sub(1);
            }
            hub.pools_changed.notify_one();
        });
    }

    async fn add_pool_member(&self, pool: &PoolRow) -> Result<()> {
        let now = now_ms();
        let row = SandboxRow {
            id: new_id("sb"),
            tenant: pool.tenant.clone(),
            template: pool.template.clone(),
            state: SandboxState::Pending,
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            launch: Launch::Warm,
            created_at: now,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: now,
            pool: Some(pool.name.clone()),
            claimed: false,
            forked_from: None,
            runtime: None,
        };
        self.create_cold(row).await.map(|_| ())
    }
}
