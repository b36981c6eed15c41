//! `entrypoint_exited` on the local backend: sandboxd inside the sandbox
//! records its entrypoint's end, and only answers when asked, so the hub
//! asks each Ready sandbox that runs one every [`EVERY`] and tells each
//! exit once.
//!
//! A sandbox started without an entrypoint is never asked (its handle says
//! so); one started before handles said is asked once per time it becomes
//! Ready (its sandboxd says it has none), so the cost is one small GET per
//! sandbox with an entrypoint per [`EVERY`], at most [`CONCURRENT`] at
//! once, each bounded by `entrypoint::ask`'s size and time limits. An exit
//! is one run's (its `started_at`): a reset that restarts the entrypoint
//! makes a new run, whose exit is told again. What a hub remembers is in
//! memory: after a restart, an exit that happened while it was down is
//! not told (it may have been told before the restart), one after is.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use sandboxd::entrypoint::EntrypointRecord;
use sandhub_api::hub::SandboxState;

use super::{hub::Hub, runtime_adapter::LocalBackend};
use crate::{backend::now_ms, events::EventType};

/// How often a sandbox with an entrypoint is asked.
pub const EVERY: Duration = Duration::from_secs(2);
/// Sandboxes asked at once.
const CONCURRENT: usize = 16;

/// What the hub knows of one Ready sandbox's entrypoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Its sandboxd runs none: not asked again while it stays Ready.
    Nothing,
    /// It runs one; the run whose exit was told (or skipped), if any.
    Runs { told: Option<i64> },
}

/// Whether `record`'s exit is to be told, given what was `before` and when
/// this hub started; and what is known after.
pub fn decide(before: Option<Seen>, record: &EntrypointRecord, hub_start_ms: i64) -> (bool, Seen) {
    let run = record.started_at_unix_ms;
    let told = match before {
        Some(Seen::Runs { told }) => told,
        _ => None,
    };
    if !record.ended() || told == Some(run) {
        return (false, Seen::Runs { told });
    }
    // First seen by this hub already ended, before the hub started: the
    // last hub may have told it; never twice.
    let ended_at = record.ended_at_unix_ms.unwrap_or(run);
    let tell = before.is_some() || ended_at >= hub_start_ms;
    (tell, Seen::Runs { told: Some(run) })
}

impl Hub {
    /// Starts the asking (see the module docs).
    pub(super) fn spawn_entrypoint_watch(self: &Arc<Self>) {
        let hub = self.clone();
        let hub_start = now_ms();
        tokio::spawn(async move {
            let mut seen: HashMap<String, Seen> = HashMap::new();
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                hub.entrypoint_pass(&mut seen, hub_start).await;
            }
        });
    }

    async fn entrypoint_pass(&self, seen: &mut HashMap<String, Seen>, hub_start: i64) {
        let rows = match self.store.all_sandboxes() {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "listing sandboxes for their entrypoints");
                return;
            }
        };
        // Forgotten when not Ready (suspended, deleted): asked afresh after.
        // A paused sandbox is not asked (its sandboxd is frozen) but kept:
        // its run goes on after `resume`, and an exit told before the
        // pause must not be told again.
        let kept: HashSet<String> = rows
            .iter()
            .filter(|r| matches!(r.state, SandboxState::Ready | SandboxState::Paused))
            .map(|r| r.id.clone())
            .collect();
        seen.retain(|id, _| kept.contains(id));
        let ready: Vec<_> = rows
            .into_iter()
            .filter(|r| r.state == SandboxState::Ready && r.claimed)
            .filter(LocalBackend::runs_entrypoint)
            .collect();
        let ask = ready
            .into_iter()
            .filter(|r| seen.get(&r.id) != Some(&Seen::Nothing));
        let answers: Vec<_> = futures::stream::iter(ask)
            .map(|row| async move {
                let answer = match self.client(&row) {
                    Ok(c) => crate::entrypoint::answer(&c).await,
                    Err(_) => None,
                };
                (row, answer)
            })
            .buffer_unordered(CONCURRENT)
            .collect()
            .await;
        for (row, answer) in answers {
            let record = match answer {
                // No sane answer now: asked again next time.
                None => continue,
                Some(None) => {
                    seen.insert(row.id.clone(), Seen::Nothing);
                    continue;
                }
                Some(Some(r)) => r,
            };
            let (tell, now) = decide(seen.get(&row.id).copied(), &record, hub_start);
            seen.insert(row.id.clone(), now);
            if tell {
                let oom_kills = self.backend.oom_kills(&row).unwrap_or(0);
                let mut e = self.sandbox_event(&row, EventType::EntrypointExited);
                e.details = crate::entrypoint::exit_details(&record, oom_kills, now_ms());
                self.emit(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(started: i64, ended: Option<i64>) -> EntrypointRecord {
        EntrypointRecord {
            started_at_unix_ms: started,
            pid: Some(1),
            ended_at_unix_ms: ended,
            exit_code: ended.map(|_| 3),
            signal: None,
            start_error: None,
        }
    }

    #[test]
    fn each_runs_exit_is_told_once() {
        let (tell, s) = decide(None, &run(100, None), 50);
        assert!(!tell);
        let (tell, s) = decide(Some(s), &run(100, None), 50);
        assert!(!tell);
        let (tell, s) = decide(Some(s), &run(100, Some(200)), 50);
        assert!(tell, "it ended");
        let (tell, s) = decide(Some(s), &run(100, Some(200)), 50);
        assert!(!tell, "not twice");
        // A reset started it again: a new run, a new exit.
        let (tell, s) = decide(Some(s), &run(300, None), 50);
        assert!(!tell);
        let (tell, _) = decide(Some(s), &run(300, Some(400)), 50);
        assert!(tell);
    }

    #[test]
    fn after_a_hub_restart_only_exits_after_its_start_are_told() {
        assert!(
            !decide(None, &run(100, Some(200)), 500).0,
            "may have been told"
        );
        assert!(decide(None, &run(100, Some(600)), 500).0, "ended since");
        // Already known to have an entrypoint running: told, whatever the clock says.
        let known = Some(Seen::Runs { told: None });
        assert!(decide(known, &run(100, Some(200)), 500).0);
        // A start that failed has ended too.
        let mut failed = run(700, None);
        failed.start_error = Some("no such file".into());
        assert!(decide(None, &failed, 500).0);
    }
}
