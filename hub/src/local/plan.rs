//! The local backend's decisions, made purely: what the reaper does with a
//! sandbox, and what a pool needs. They read rows and facts the caller
//! passes in (as closures, so a fact the verdict does not need is never
//! probed) and touch nothing; `lifecycle.rs` and `pools.rs` carry them out.
//! Unit-tested below without root, a backend or a store.

use std::cmp::Reverse;

use sandhub_api::hub::{IdleAction, SandboxState};

use super::store::SandboxRow;

/// How long a Finished sandbox's row and files are kept (for `get` and a
/// post-mortem look) before the reaper removes them.
pub const FINISHED_TTL_MS: i64 = 3600 * 1000;

/// The reaper's verdict on one claimed sandbox that is not Finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Past its `shutdown_at`: remove it.
    Expire,
    /// Ready (or Paused), idle past its timeout and running nothing: do
    /// its `idle_action` (by default, remove it).
    Idle,
    /// Ready on record but its processes are gone: mark it Finished.
    Dead,
    /// Ready and running a process: that is activity, restart its idle clock.
    Touch,
    /// Nothing to do this pass.
    Keep,
}

impl Verdict {
    /// Whether the sandbox reached its end of life (is to be removed).
    pub fn ends_life(self) -> bool {
        matches!(self, Verdict::Expire | Verdict::Idle)
    }
}

/// Judges `row` at `now`. `busy`: whether a workload process runs;
/// `alive`: whether the sandbox still runs at all.
pub fn verdict(
    row: &SandboxRow,
    now: i64,
    busy: impl Fn() -> bool,
    alive: impl FnOnce() -> bool,
) -> Verdict {
    if row.shutdown_at.is_some_and(|t| t <= now) {
        return Verdict::Expire;
    }
    let ready = row.state == SandboxState::Ready;
    let idle_due = row
        .idle_timeout_seconds
        .map(|s| i64::try_from(s).unwrap_or(i64::MAX).saturating_mul(1000))
        .is_some_and(|ms| row.last_activity.saturating_add(ms) <= now);
    if ready && idle_due && !busy() {
        return Verdict::Idle;
    }
    // Being paused is no activity, and its frozen processes run nothing:
    // its idle clock runs on. Pausing it again would change nothing.
    if row.state == SandboxState::Paused && idle_due && row.idle_action != IdleAction::Pause {
        return Verdict::Idle;
    }
    if !ready {
        Verdict::Keep
    } else if !alive() {
        Verdict::Dead
    } else if busy() {
        Verdict::Touch
    } else {
        Verdict::Keep
    }
}

/// Whether a Finished sandbox has been kept its [`FINISHED_TTL_MS`] (its
/// last activity is when it finished).
pub fn finished_is_due(row: &SandboxRow, now: i64) -> bool {
    row.last_activity.saturating_add(FINISHED_TTL_MS) <= now
}

/// What one warm pool needs this pass.
#[derive(Debug, PartialEq)]
pub enum PoolPlan<'a> {
    /// Start this many members.
    Start(u32),
    /// Remove these members (the pool shrank).
    Remove(Vec<&'a SandboxRow>),
    /// The pool is as asked.
    Keep,
}

/// How long a pool waits before its next warm start after `failures`
/// starts in a row failed: 0.5 s, doubling, at most 30 s. A template that
/// cannot start would otherwise be retried as fast as it fails (about 15
/// starts a second, each a cgroup, namespaces and a disk layer).
pub fn start_backoff(failures: u32) -> std::time::Duration {
    const FIRST_MS: u64 = 500;
    const MAX_MS: u64 = 30_000;
    if failures == 0 {
        return std::time::Duration::ZERO;
    }
    let ms = FIRST_MS.saturating_mul(1u64 << (failures - 1).min(16));
    std::time::Duration::from_millis(ms.min(MAX_MS))
}

/// The plan for a pool of `replicas` with `members` stored and `starting`
/// being launched (not stored yet, so never counted twice). Extra members
/// go not-ready first, then the newest: the ready, older ones are the ones
/// a claim would take.
pub fn pool_plan(replicas: u32, members: &[SandboxRow], starting: u32) -> PoolPlan<'_> {
    let stored = members.len() as u32;
    let have = stored.saturating_add(starting);
    if have < replicas {
        return PoolPlan::Start(replicas - have);
    }
    if stored <= replicas {
        return PoolPlan::Keep;
    }
    let mut victims: Vec<&SandboxRow> = members.iter().collect();
    victims.sort_by_key(|m| (m.state == SandboxState::Ready, Reverse(m.created_at)));
    victims.truncate((stored - replicas) as usize);
    PoolPlan::Remove(victims)
}

#[cfg(test)]
mod tests {
    #[test]
    fn failed_warm_starts_back_off_from_half_a_second_to_thirty() {
        use std::time::Duration;
        let waits: Vec<Duration> = (0..9).map(start_backoff).collect();
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(start_backoff(u32::MAX), Duration::from_secs(30));
    }

    use std::{cell::Cell, collections::BTreeMap};

    use sandhub_api::hub::Launch;

    use super::*;

    const NOW: i64 = 1_000_000;

    fn row(id: &str, state: SandboxState) -> SandboxRow {
        SandboxRow {
            id: id.into(),
            tenant: "t".into(),
            template: "default".into(),
            state,
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            launch: Launch::Cold,
            created_at: 0,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: NOW,
            pool: None,
            claimed: true,
            forked_from: None,
            runtime: None,
            idle_action: sandhub_api::hub::IdleAction::Delete,
            auto_resume: false,
        }
    }

    fn judge(row: &SandboxRow, busy: bool, alive: bool) -> Verdict {
        verdict(row, NOW, || busy, || alive)
    }

    #[test]
    fn a_deadline_reached_expires_whatever_the_state() {
        for state in [
            SandboxState::Ready,
            SandboxState::Paused,
            SandboxState::Suspended,
            SandboxState::Pending,
        ] {
            let r = SandboxRow {
                shutdown_at: Some(NOW),
                ..row("a", state)
            };
            assert_eq!(judge(&r, true, true), Verdict::Expire, "{state:?}");
            assert!(Verdict::Expire.ends_life());
        }
        let later = SandboxRow {
            shutdown_at: Some(NOW + 1),
            ..row("a", SandboxState::Ready)
        };
        assert_eq!(judge(&later, false, true), Verdict::Keep);
    }

    #[test]
    fn idle_needs_ready_the_timeout_passed_and_nothing_running() {
        let idle = SandboxRow {
            idle_timeout_seconds: Some(10),
            last_activity: NOW - 10_000,
            ..row("a", SandboxState::Ready)
        };
        assert_eq!(judge(&idle, false, true), Verdict::Idle);
        // A running process is activity: the clock restarts instead.
        assert_eq!(judge(&idle, true, true), Verdict::Touch);
        let recent = SandboxRow {
            last_activity: NOW - 9_999,
            ..idle.clone()
        };
        assert_eq!(judge(&recent, false, true), Verdict::Keep);
        // Suspended: no idle clock runs.
        let suspended = SandboxRow {
            state: SandboxState::Suspended,
            ..idle.clone()
        };
        assert_eq!(judge(&suspended, false, false), Verdict::Keep);
        // Paused: its clock runs on, and its frozen processes are no
        // activity; unless pausing is what idleness does (done already).
        let paused = SandboxRow {
            state: SandboxState::Paused,
            ..idle.clone()
        };
        assert_eq!(judge(&paused, true, true), Verdict::Idle);
        for action in [IdleAction::Suspend, IdleAction::Delete] {
            let r = SandboxRow {
                idle_action: action,
                ..paused.clone()
            };
            assert_eq!(judge(&r, true, true), Verdict::Idle, "{action:?}");
        }
        let napping = SandboxRow {
            idle_action: IdleAction::Pause,
            ..paused.clone()
        };
        assert_eq!(judge(&napping, true, true), Verdict::Keep);
        let recent = SandboxRow {
            last_activity: NOW - 9_999,
            ..paused
        };
        assert_eq!(judge(&recent, false, true), Verdict::Keep);
    }

    #[test]
    fn a_ready_sandbox_without_processes_is_dead_and_others_are_not_probed() {
        assert_eq!(
            judge(&row("a", SandboxState::Ready), false, false),
            Verdict::Dead
        );
        assert_eq!(
            judge(&row("a", SandboxState::Ready), true, true),
            Verdict::Touch
        );
        assert_eq!(
            judge(&row("a", SandboxState::Ready), false, true),
            Verdict::Keep
        );
        // Not Ready: neither fact is asked for (a paused sandbox's
        // processes are frozen, not dead).
        for state in [SandboxState::Suspended, SandboxState::Paused] {
            let probed = Cell::new(false);
            let v = verdict(
                &row("a", state),
                NOW,
                || {
                    probed.set(true);
                    true
                },
                || {
                    probed.set(true);
                    false
                },
            );
            assert_eq!(v, Verdict::Keep, "{state:?}");
            assert!(!probed.get(), "{state:?}");
        }
    }

    #[test]
    fn huge_timeouts_do_not_overflow() {
        let r = SandboxRow {
            idle_timeout_seconds: Some(u64::MAX),
            ..row("a", SandboxState::Ready)
        };
        assert_eq!(judge(&r, false, true), Verdict::Keep);
    }

    #[test]
    fn finished_rows_are_kept_an_hour() {
        let r = SandboxRow {
            last_activity: NOW - FINISHED_TTL_MS + 1,
            ..row("a", SandboxState::Finished)
        };
        assert!(!finished_is_due(&r, NOW));
        assert!(finished_is_due(&r, NOW + 1));
    }

    fn members(spec: &[(&str, SandboxState, i64)]) -> Vec<SandboxRow> {
        spec.iter()
            .map(|(id, state, created_at)| SandboxRow {
                created_at: *created_at,
                claimed: false,
                ..row(id, *state)
            })
            .collect()
    }

    #[test]
    fn a_pool_short_of_members_starts_the_missing_ones_counting_those_starting() {
        let m = members(&[("a", SandboxState::Ready, 1)]);
        assert_eq!(pool_plan(3, &m, 0), PoolPlan::Start(2));
        assert_eq!(pool_plan(3, &m, 1), PoolPlan::Start(1));
        assert_eq!(pool_plan(3, &m, 2), PoolPlan::Keep);
        assert_eq!(pool_plan(0, &[], 0), PoolPlan::Keep);
    }

    #[test]
    fn a_shrunk_pool_removes_not_ready_members_first_then_the_newest() {
        use SandboxState::{Pending, Ready};
        let m = members(&[
            ("old", Ready, 1),
            ("new", Ready, 3),
            ("starting", Pending, 2),
            ("mid", Ready, 2),
        ]);
        let ids = |plan: PoolPlan<'_>| match plan {
            PoolPlan::Remove(v) => v.into_iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(ids(pool_plan(2, &m, 0)), ["starting", "new"]);
        assert_eq!(ids(pool_plan(0, &m, 0)), ["starting", "new", "mid", "old"]);
        // Members still launching are not removed: they are not stored yet.
        assert_eq!(ids(pool_plan(3, &m, 5)), ["starting"]);
    }
}
