//! Which environments exist: the ones in use, in memory, each behind its
//! own lock, and all of them in a store (the local backend's SQLite, or
//! ConfigMaps on Kubernetes), so that after a hub restart an env is loaded
//! again on its first call. A store other replicas write too is `shared`:
//! then the env's state is re-read at the start of every call, so any
//! replica can step any env.

use std::{collections::HashMap, sync::Arc, time::Duration};

use sandhub_api::{
    error::Code,
    gym::{CreateEnv, EnvCreated, ResetResult, Space, StepResult, DEFAULT_ACTION_MAX_LENGTH},
};
use sandhub_client::{Error, Result};
use tokio::sync::OwnedMutexGuard;

use super::env::Env;
use crate::{
    backend::{new_id, now_ms, Backend, EnvStore, TenantView},
    changes::Changes,
};

struct Slot {
    /// Outside the lock: backend is checked without waiting for a step.
    tenant: String,
    env: Arc<tokio::sync::Mutex<Env>>,
}

/// The environments of one hub.
#[derive(Default)]
pub struct Gym {
    /// An async lock: it is held across a store read (see `slot`).
    envs: tokio::sync::Mutex<HashMap<String, Arc<Slot>>>,
    /// None: envs live only in this process's memory (tests).
    store: Option<Arc<dyn EnvStore>>,
    /// Per tenant, the permits of env creates running to their end.
    creates: Changes,
}

/// A new environment on its way to its creator. Dropped untaken (the
/// creator hung up before it learnt the env's id), it closes the env with
/// its sandbox: nobody else knows that id.
struct Unclaimed {
    created: Option<EnvCreated>,
    gym: Arc<Gym>,
    api: Arc<dyn TenantView>,
}

impl Unclaimed {
    fn take(mut self) -> Option<EnvCreated> {
        self.created.take()
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(created) = self.created.take() else {
            return;
        };
        // Without a runtime the hub is going down; the idle sweep of the
        // next start ends the env.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (gym, api) = (self.gym.clone(), self.api.clone());
        runtime.spawn(async move {
            let id = created.env_id;
            tracing::info!(env = %id, tenant = %api.tenant(),
                "the creator of a gym environment hung up before it learnt its id; closing it");
            if let Err(e) = gym.close_by_id(api.as_ref(), &id).await {
                tracing::warn!(env = %id, error = %e, "closing an environment nobody took");
            }
        });
    }
}

fn not_found(id: &str) -> Error {
    Error::not_found(format!("environment {id} not found"))
}

impl Gym {
    /// Envs that survive a hub restart.
    pub fn persistent(store: Arc<dyn EnvStore>) -> Self {
        Gym {
            envs: tokio::sync::Mutex::default(),
            store: Some(store),
            creates: Changes::default(),
        }
    }

    /// Creates an environment and its first sandbox. The env is recorded
    /// before the caller learns its id.
    ///
    /// It runs to its end whoever hangs up (`crate::changes`, under permits
    /// of its own: the sandbox's create takes one of the backend's), so no
    /// sandbox is left that no env knows of. A caller that goes while the
    /// sandbox starts (seconds on Kubernetes) never learns the env's id, so
    /// nobody can use that env: it is closed with its sandbox as soon as it
    /// is made ([`Unclaimed`]), not left to the idle sweep.
    pub async fn create(
        self: &Arc<Self>,
        api: Arc<dyn TenantView>,
        spec: CreateEnv,
    ) -> Result<EnvCreated> {
        let gym = self.clone();
        let tenant = api.tenant().to_string();
        let (hand, taken) = tokio::sync::oneshot::channel();
        self.creates
            .to_the_end(&tenant, async move {
                let created = gym.create_now(api.as_ref(), spec).await?;
                // Refused when the caller is gone: the env comes back, and
                // is dropped (closed) here.
                let _ = hand.send(Unclaimed {
                    created: Some(created),
                    gym,
                    api,
                });
                Ok(())
            })
            .await?;
        // No await between the create's end and this one, which is ready:
        // a caller that got this far takes the env.
        taken
            .await
            .ok()
            .and_then(Unclaimed::take)
            .ok_or_else(|| Error::internal("the environment's create ended without an answer"))
    }

    async fn create_now(&self, api: &dyn TenantView, spec: CreateEnv) -> Result<EnvCreated> {
        let mut env = Env::new(new_id("env"), api.tenant().to_string(), spec)?;
        env.sandbox_idle_timeout = self
            .store
            .as_ref()
            .is_some_and(|s| s.sandbox_idle_timeouts());
        env.prepare(api).await?;
        if let Some(store) = &self.store {
            if let Err(e) = store.insert(&env.row(now_ms())).await {
                env.close(api).await;
                return Err(e);
            }
        }
        let created = EnvCreated {
            env_id: env.id.clone(),
            observation_space: Space {
                kind: "text".into(),
                max_length: env.observation_max(),
            },
            action_space: Space {
                kind: "text".into(),
                max_length: DEFAULT_ACTION_MAX_LENGTH,
            },
        };
        let slot = Arc::new(Slot {
            tenant: env.tenant.clone(),
            env: Arc::new(tokio::sync::Mutex::new(env)),
        });
        self.envs.lock().await.insert(created.env_id.clone(), slot);
        Ok(created)
    }

    /// The caller's environment, loaded from the store when this hub has
    /// not seen it yet. Another tenant's is simply not found.
    async fn slot(&self, tenant: &str, id: &str) -> Result<Arc<Slot>> {
        // Held across the store read, so that a close (which deletes the
        // row before it drops the slot) can never race a load into leaving
        // a stale slot behind.
        let mut envs = self.envs.lock().await;
        if let Some(slot) = envs.get(id) {
            return if slot.tenant == tenant {
                Ok(slot.clone())
            } else {
                Err(not_found(id))
            };
        }
        let Some(store) = &self.store else {
            return Err(not_found(id));
        };
        let row = store.get(tenant, id).await?.ok_or_else(|| not_found(id))?;
        let mut env = Env::restore(row)?;
        env.sandbox_idle_timeout = store.sandbox_idle_timeouts();
        tracing::info!(env = %id, tenant = %tenant, "gym environment loaded from the store");
        let slot = Arc::new(Slot {
            tenant: tenant.to_string(),
            env: Arc::new(tokio::sync::Mutex::new(env)),
        });
        envs.insert(id.to_string(), slot.clone());
        Ok(slot)
    }

    /// The tenant's open environments held by this process, by id. Each
    /// is read under its lock, so a step in progress is waited for.
    pub async fn list(&self, tenant: &str) -> Vec<super::EnvSummary> {
        let slots: Vec<Arc<Slot>> = self
            .envs
            .lock()
            .await
            .values()
            .filter(|s| s.tenant == tenant)
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            let env = slot.env.lock().await;
            if !env.closed {
                out.push(env.summary());
            }
        }
        out.sort_by(|a, b| a.env_id.cmp(&b.env_id));
        out
    }

    /// The caller's open environment, locked for one call.
    pub async fn lock(&self, tenant: &str, id: &str) -> Result<OwnedMutexGuard<Env>> {
        let slot = self.slot(tenant, id).await?;
        let mut env = slot.env.clone().lock_owned().await;
        if env.closed {
            return Err(not_found(id));
        }
        if let Some(store) = self.store.as_ref().filter(|s| s.shared()) {
            // Another replica may have stepped or closed it since this one
            // last did: its record, not this memory, is the env.
            match store.get(tenant, id).await? {
                Some(row) => env.refresh(row),
                None => {
                    env.closed = true;
                    self.envs.lock().await.remove(id);
                    return Err(not_found(id));
                }
            }
        }
        Ok(env)
    }

    /// One action in the caller's environment, recorded.
    pub async fn step(&self, api: &dyn TenantView, id: &str, action: String) -> Result<StepResult> {
        let mut env = self.lock(api.tenant(), id).await?;
        let result = env.step(api, action).await;
        self.save(&env).await?;
        result
    }

    /// A new episode in the caller's environment, recorded.
    pub async fn reset(
        &self,
        api: &dyn TenantView,
        id: &str,
        seed: Option<u64>,
    ) -> Result<ResetResult> {
        let mut env = self.lock(api.tenant(), id).await?;
        let result = env.reset(api, seed).await;
        self.save(&env).await?;
        result
    }

    /// Records the episode state after a call. Every call saves, failed ones
    /// too: what a call changed before failing (a new sandbox) must stick.
    pub async fn save(&self, env: &Env) -> Result<()> {
        match &self.store {
            Some(store) if !env.closed => store.save(&env.id, env.episode(), now_ms()).await,
            _ => Ok(()),
        }
    }

    /// Deletes an environment's sandbox and record; later calls are NOT_FOUND.
    pub async fn close(&self, api: &dyn TenantView, env: &mut Env) -> Result<()> {
        env.close(api).await;
        if let Some(store) = &self.store {
            store.delete(&env.id).await?;
        }
        self.envs.lock().await.remove(&env.id);
        Ok(())
    }

    /// Closes the caller's environment `id`, with its sandbox.
    pub async fn close_by_id(&self, api: &dyn TenantView, id: &str) -> Result<()> {
        let mut env = self.lock(api.tenant(), id).await?;
        self.close(api, &mut env).await
    }

    /// Closes every environment unused for its idle timeout at `now`, with
    /// its sandbox, whether or not the sandbox still runs something (a
    /// server an agent left behind keeps a sandbox busy, never an env).
    pub async fn sweep(&self, backend: &dyn Backend, now: i64) -> Result<()> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        for (id, tenant) in store.idle(now).await? {
            let slot = match self.slot(&tenant, &id).await {
                Ok(slot) => slot,
                Err(e) if e.code == Code::Internal => {
                    // Unreadable: it can never be used again either.
                    tracing::warn!(env = %id, error = %e, "deleting an idle env that cannot be loaded");
                    store.delete(&id).await?;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(env = %id, error = %e, "idle env went away");
                    continue;
                }
            };
            // A call in progress is use; that env is not idle.
            let Ok(mut env) = slot.env.clone().try_lock_owned() else {
                continue;
            };
            if env.closed {
                continue;
            }
            // Judged on its row as it is now: a call may have ended since.
            let still_idle = store.get(&tenant, &id).await?.is_some_and(|row| {
                row.last_used + (row.idle_timeout_seconds as i64).saturating_mul(1000) <= now
            });
            if !still_idle {
                continue;
            }
            tracing::info!(env = %id, tenant = %tenant, "gym environment idle for its timeout; closing it");
            let api = backend.tenant(&tenant);
            self.close(api.as_ref(), &mut env).await?;
        }
        Ok(())
    }

    /// Sweeps idle environments every `every`, until the process ends.
    pub fn spawn_sweeper(self: &Arc<Self>, backend: Arc<dyn Backend>, every: Duration) {
        let gym = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = gym.sweep(backend.as_ref(), now_ms()).await {
                    tracing::warn!(error = %e, "sweeping idle gym environments");
                }
            }
        });
    }
}
