//! Lifecycle of the local backend's sandboxes: the per-sandbox locks that
//! keep a change and the reaper apart, recovery after a restart, and the
//! reaper, which applies [`plan::verdict`] to each sandbox.

use std::{sync::Arc, time::Duration};

use sandhub_api::{
    error::Code,
    hub::{IdleAction, SandboxState},
};
use sandhub_client::{Error, Result};

use super::{
    hub::Hub,
    plan::{self, Verdict},
    store::{found, SandboxRow},
};
use crate::{
    backend::now_ms,
    events::{DeleteReason, EventType},
};

impl Hub {
    /// The lifecycle lock of a sandbox that exists (unknown ids get none,
    /// so made-up ids leave nothing behind).
    pub(super) async fn lock_existing(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        found(self.store.get_sandbox(tenant, id)?, "sandbox", id)?;
        Ok(self.lifecycle(id).lock_owned().await)
    }

    pub(super) fn lifecycle(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.lifecycle
            .lock()
            .unwrap()
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// After a restart: keep what still runs, mark what died. A paused
    /// sandbox (frozen, not dead) stays Paused; the row follows its
    /// cgroup where a hub died between freezing or thawing and recording.
    pub async fn recover(&self) -> Result<()> {
        for mut row in self.store.all_sandboxes()? {
            if !matches!(
                row.state,
                SandboxState::Ready | SandboxState::Pending | SandboxState::Paused
            ) {
                continue;
            }
            if row.runtime.is_some() && self.backend.is_alive(&row) {
                let frozen = self.backend.is_frozen(&row);
                let truth = match (row.state, frozen) {
                    (SandboxState::Ready, true) => Some(SandboxState::Paused),
                    (SandboxState::Paused, false) => Some(SandboxState::Ready),
                    _ => None,
                };
                if let Some(state) = truth {
                    tracing::info!(id = %row.id, state = state.as_str(), "the sandbox's cgroup says otherwise than its row; recording what it is");
                    self.store.set_state(&row.id, state)?;
                    row.state = state;
                }
                tracing::info!(id = %row.id, state = row.state.as_str(), "re-attached to running sandbox");
                // Its TUN device went with the old hub: offline until this.
                let names = super::egress::Recorded::of_row(&row)
                    .map(|r| r.secrets)
                    .unwrap_or_default();
                let values = self.secret_values(&row.tenant, names.iter().map(|s| s.name.as_str()));
                let attached = match values {
                    Ok(v) => self.backend.reattach(&row, &v).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = attached {
                    tracing::warn!(id = %row.id, error = %e, "the egress gateway could not be re-attached; the sandbox stays offline");
                }
                continue;
            }
            // Stopped even without a recorded runtime: a hub killed mid-launch
            // leaves a sandbox whose processes it never learnt of (the
            // backend sweeps by id).
            tracing::warn!(id = %row.id, "sandbox died or was never finished while the hub was away");
            if let Err(e) = self.backend.stop(&row).await {
                tracing::warn!(id = %row.id, error = %e, "stopping the remains of a sandbox");
            }
            if row.claimed {
                self.finish(&row.id, now_ms())?;
                self.emit(
                    self.sandbox_event(&row, EventType::Finished)
                        .detail("reason", "hub_recovery"),
                );
            } else {
                // A dead warm member is worth nothing; the refiller replaces it.
                let _ = self.remove(&row).await;
            }
        }
        Ok(())
    }

    /// One pass of the lifecycle: deadlines, idle timeouts, dead sandboxes,
    /// and Finished ones (which must have no process left, and go after
    /// [`plan::FINISHED_TTL_MS`]).
    pub async fn reap(&self) -> Result<()> {
        let now = now_ms();
        for row in self.store.all_sandboxes()? {
            if row.state == SandboxState::Finished {
                self.reap_finished(&row, now).await;
                continue;
            }
            if !row.claimed {
                continue;
            }
            // A sandbox in the middle of a change is judged on a later pass,
            // and on its row as it is now, not as the listing read it.
            let Ok(_guard) = self.lifecycle(&row.id).try_lock_owned() else {
                continue;
            };
            let Some(row) = self.store.get_any(&row.id)? else {
                continue;
            };
            let verdict = plan::verdict(
                &row,
                now,
                || self.backend.busy(&row),
                || self.backend.is_alive(&row),
            );
            match verdict {
                Verdict::Idle if row.idle_action != IdleAction::Delete => {
                    let mut row = row;
                    let (done, kind) = if row.idle_action == IdleAction::Pause {
                        (self.pause_locked(&mut row).await, EventType::Paused)
                    } else {
                        (self.suspend_locked(&mut row).await, EventType::Suspended)
                    };
                    match done {
                        Ok(()) => {
                            tracing::info!(id = %row.id, action = row.idle_action.as_str(), "sandbox idle past its timeout");
                            self.emit(
                                self.sandbox_event(&row, kind)
                                    .detail("reason", "idle_timeout"),
                            );
                        }
                        Err(e) => {
                            tracing::warn!(id = %row.id, error = %e, action = row.idle_action.as_str(), "the idle action failed")
                        }
                    }
                }
                Verdict::Expire | Verdict::Idle => {
                    tracing::info!(id = %row.id, ?verdict, "sandbox reached its end of life");
                    match self.remove(&row).await {
                        Ok(()) => {
                            self.lifecycle.lock().unwrap().remove(&row.id);
                            self.emit(self.sandbox_event(&row, EventType::Deleted).reason(
                                if verdict == Verdict::Idle {
                                    DeleteReason::IdleTimeout
                                } else {
                                    DeleteReason::Deadline
                                },
                            ));
                        }
                        Err(e) => {
                            tracing::warn!(id = %row.id, error = %e, "removing an expired sandbox")
                        }
                    }
                }
                Verdict::Dead => {
                    tracing::warn!(id = %row.id, "sandbox died");
                    self.forget_handles(&row.id);
                    let _ = self.backend.stop(&row).await;
                    self.forget_handles(&row.id);
                    self.finish(&row.id, now)?;
                    self.emit(
                        self.sandbox_event(&row, EventType::Finished)
                            .detail("reason", "died"),
                    );
                }
                // A running process is activity: an idle clock restarts.
                Verdict::Touch => {
                    let _ = self.store.touch(&row.id, now);
                }
                Verdict::Keep => {}
            }
        }
        Ok(())
    }

    /// Stops a Ready sandbox's processes and keeps its files (Suspended).
    /// The caller holds its lifecycle lock and tells the event.
    pub(super) async fn suspend_locked(&self, row: &mut SandboxRow) -> Result<()> {
        self.forget_handles(&row.id);
        let stopped = self.backend.stop(row).await;
        self.forget_handles(&row.id);
        stopped?;
        row.state = SandboxState::Suspended;
        self.store
            .set_runtime(&row.id, SandboxState::Suspended, row.runtime.as_ref())
    }

    /// Freezes a Ready sandbox's processes in place (Paused). The caller
    /// holds its lifecycle lock and tells the event.
    pub(super) async fn pause_locked(&self, row: &mut SandboxRow) -> Result<()> {
        // Its connection to sandboxd would only stall while frozen.
        self.forget_handles(&row.id);
        self.backend.freeze(row).await?;
        row.state = SandboxState::Paused;
        self.store.set_state(&row.id, SandboxState::Paused)
    }

    /// Runs a Suspended sandbox again on its files, or thaws a Paused
    /// one; either is activity. The caller holds its lifecycle lock and
    /// tells the event.
    pub(super) async fn resume_locked(&self, row: &mut SandboxRow) -> Result<()> {
        match row.state {
            SandboxState::Suspended => self.start(row).await?,
            SandboxState::Paused => {
                self.backend.thaw(row).await?;
                row.state = SandboxState::Ready;
                self.store.set_state(&row.id, SandboxState::Ready)?;
            }
            state => {
                return Err(Error::new(
                    Code::FailedPrecondition,
                    format!(
                        "sandbox {} is {}, not Suspended or Paused",
                        row.id,
                        state.as_str()
                    ),
                ));
            }
        }
        let _ = self.store.touch(&row.id, now_ms());
        Ok(())
    }

    /// For a call that needs sandbox `id` running and found it not Ready:
    /// a Paused or Suspended sandbox with `auto_resume` is resumed, and
    /// the answer says whether the call may go on. Exactly once however
    /// many calls come at once: they queue on the sandbox's lifecycle
    /// lock, the first resumes it, the rest find it Ready.
    pub(super) async fn wake(&self, tenant: &str, id: &str) -> Result<bool> {
        let asleep = |r: &SandboxRow| {
            r.auto_resume && matches!(r.state, SandboxState::Paused | SandboxState::Suspended)
        };
        match self.store.get_sandbox(tenant, id)? {
            Some(row) if asleep(&row) => {}
            // Another call woke it between this one's check and now: the
            // check is worth asking again (it failed on a state now gone).
            Some(row) if row.state == SandboxState::Ready => return Ok(true),
            _ => return Ok(false),
        }
        let _guard = self.lifecycle(id).lock_owned().await;
        let Some(mut row) = self.store.get_sandbox(tenant, id)? else {
            return Ok(false);
        };
        if row.state == SandboxState::Ready {
            // Another call woke it while this one waited.
            return Ok(true);
        }
        if !asleep(&row) {
            return Ok(false);
        }
        let was = row.state;
        self.resume_locked(&mut row).await?;
        tracing::info!(%id, from = was.as_str(), "auto-resumed for a call that needs it");
        self.emit(
            self.sandbox_event(&row, EventType::Resumed)
                .detail("reason", "auto_resume"),
        );
        Ok(true)
    }

    /// Marks a sandbox Finished; its finishing time is its last activity.
    pub(super) fn finish(&self, id: &str, now: i64) -> Result<()> {
        self.store.set_state(id, SandboxState::Finished)?;
        self.store.touch(id, now)
    }

    /// A Finished sandbox has no process: any found is killed (a stop that
    /// failed earlier). After its time to live it is removed.
    pub(super) async fn reap_finished(&self, row: &SandboxRow, now: i64) {
        let Ok(_guard) = self.lifecycle(&row.id).try_lock_owned() else {
            return;
        };
        if self.backend.has_processes(row) {
            tracing::warn!(id = %row.id, "a Finished sandbox still had processes; stopping them");
            if let Err(e) = self.backend.stop(row).await {
                tracing::warn!(id = %row.id, error = %e, "stopping a Finished sandbox");
            }
        }
        if plan::finished_is_due(row, now) {
            tracing::info!(id = %row.id, "removing a Finished sandbox past its time to live");
            if self.remove(row).await.is_ok() {
                self.lifecycle.lock().unwrap().remove(&row.id);
                if row.claimed {
                    self.emit(
                        self.sandbox_event(row, EventType::Deleted)
                            .reason(DeleteReason::Reaped),
                    );
                }
            }
        }
    }

    /// Runs the refiller, the reaper and the webhook deliverer until the
    /// process ends.
    pub fn spawn_background(self: &Arc<Self>, reap_every: Duration) {
        self.webhooks.spawn_deliverer();
        self.spawn_entrypoint_watch();
        let hub = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = hub.refill_pools().await {
                    tracing::warn!(error = %e, "refilling pools");
                }
                tokio::select! {
                    _ = hub.pools_changed.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        });
        let hub = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(reap_every);
            loop {
                tick.tick().await;
                if let Err(e) = hub.reap().await {
                    tracing::warn!(error = %e, "reaping sandboxes");
                }
            }
        });
        // The sampler's alerts become events (`oom_killed`,
        // `disk_quota_exceeded`) of the sandbox's tenant, and are logged.
        if let Some(mut alerts) = self.usage_alerts() {
            let hub = self.clone();
            tokio::spawn(async move {
                use crate::events::{EventType, NewEvent};
                use crate::usage::UsageAlert;
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    let (id, kind, details) = match alerts.recv().await {
                        Ok(UsageAlert::OomKilled {
                            sandbox,
                            oom_kills,
                            new_kills,
                        }) => {
                            tracing::warn!(%sandbox, oom_kills, new_kills,
                                "usage alert: oom_killed (the kernel killed a process for memory)");
                            (
                                sandbox,
                                EventType::OomKilled,
                                [("oom_kills", oom_kills), ("new_kills", new_kills)],
                            )
                        }
                        Ok(UsageAlert::DiskQuotaReached {
                            sandbox,
                            used_bytes,
                            limit_bytes,
                        }) => {
                            tracing::warn!(%sandbox, used_bytes, limit_bytes,
                                "usage alert: disk_quota_exceeded");
                            (
                                sandbox,
                                EventType::DiskQuotaExceeded,
                                [("used_bytes", used_bytes), ("limit_bytes", limit_bytes)],
                            )
                        }
                        Err(RecvError::Lagged(n)) => {
                            tracing::warn!(
                                missed = n,
                                "usage alerts dropped (the event feed fell behind)"
                            );
                            continue;
                        }
                        Err(RecvError::Closed) => return,
                    };
                    // The alert names a sandbox only; its row says whose it is.
                    // One deleted meanwhile has nobody left to tell.
                    let Ok(Some(row)) = hub.store.get_any(&id) else {
                        continue;
                    };
                    let mut event = NewEvent::sandbox(&row.tenant, kind, &id, &row.labels);
                    for (k, v) in details {
                        event = event.detail(k, v);
                    }
                    hub.emit(event);
                }
            });
        }
    }
}
