//! Warm pools of the local backend: each pass applies [`plan::pool_plan`]
//! to every pool, starting members in the background and removing extras.

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use sandhub_api::hub::{Launch, SandboxState};
use sandhub_client::Result;

use super::{
    hub::{Hub, PoolFailure},
    plan::{self, PoolPlan},
    store::{PoolRow, SandboxRow},
};
use crate::{
    backend::{new_id, now_ms},
    events::{EventType, NewEvent},
};

impl Hub {
    /// One pass of every pool: start missing members, remove extra ones.
    pub async fn refill_pools(self: &Arc<Self>) -> Result<()> {
        let pools = self.store.list_pools(None)?;
        // A deleted pool's failures go with it: otherwise pools made and
        // deleted under new names would grow this map without end, and a
        // new pool of an old name would inherit its back-off.
        self.pool_failures
            .lock()
            .unwrap()
            .retain(|(tenant, name), _| {
                pools.iter().any(|p| &p.tenant == tenant && &p.name == name)
            });
        for pool in pools {
            let members = self.store.pool_members(&pool.tenant, &pool.name)?;
            let key = (pool.tenant.clone(), pool.name.clone());
            let starting = *self.launching.lock().unwrap().get(&key).unwrap_or(&0);
            match plan::pool_plan(pool.replicas, &members, starting) {
                PoolPlan::Start(_) if self.backing_off(&key) => {}
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
            match hub.add_pool_member(&pool).await {
                Ok(()) => {
                    hub.pool_failures.lock().unwrap().remove(&key);
                }
                Err(e) => {
                    let mut failures = hub.pool_failures.lock().unwrap();
                    let f = failures.entry(key.clone()).or_insert(PoolFailure {
                        failures: 0,
                        retry_at: Instant::now(),
                        error: String::new(),
                    });
                    f.failures = f.failures.saturating_add(1);
                    let wait = plan::start_backoff(f.failures);
                    f.retry_at = Instant::now() + wait;
                    f.error = e.to_string();
                    tracing::warn!(pool = %pool.name, error = %e, failures = f.failures,
                        retry_in = ?wait, "starting a warm sandbox");
                    hub.emit(
                        NewEvent::pool(&pool.tenant, EventType::PoolStartFailed, Some(&pool.name))
                            .detail("last_error", e.to_string())
                            .detail("failures", f.failures)
                            .detail("retry_in_ms", wait.as_millis() as u64),
                    );
                }
            }
            if let Some(n) = hub.launching.lock().unwrap().get_mut(&key) {
                *n = n.saturating_sub(1);
            }
            hub.pools_changed.notify_one();
        });
    }

    /// Whether the pool's starts failed lately and its back-off still runs.
    fn backing_off(&self, key: &(String, String)) -> bool {
        let failures = self.pool_failures.lock().unwrap();
        failures
            .get(key)
            .is_some_and(|f| f.retry_at > Instant::now())
    }

    /// Why the pool's last warm start failed, while its starts keep failing.
    pub(super) fn pool_error(&self, tenant: &str, name: &str) -> Option<String> {
        let failures = self.pool_failures.lock().unwrap();
        failures
            .get(&(tenant.to_string(), name.to_string()))
            .map(|f| f.error.clone())
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
            idle_action: sandhub_api::hub::IdleAction::Delete,
            auto_resume: false,
        };
        self.create_cold(row).await.map(|_| ())
    }
}
