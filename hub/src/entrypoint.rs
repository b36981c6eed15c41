//! Whether a sandbox's entrypoint is running, or how it ended: sandboxd's
//! record of its child (exit code, signal), joined on the local backend with
//! what only the hub can see, the cgroup's OOM-kill counter (on Kubernetes
//! the count is the container's, out of the hub's reach: an OOM kill there
//! reads as `Error`, signal 9). The sandbox can lie about the first (it is
//! its own sandboxd), so nothing here decides anything for other sandboxes or
//! the hub: it only answers the owner's GET.

use std::time::Duration;

use sandboxd::entrypoint::{EntrypointRecord, ENTRYPOINT_ROUTE};
use sandhub_api::hub::{EntrypointState, EntrypointStatus};
use sandhub_client::sandboxd::SandboxdClient;

use crate::backend::rfc3339;

/// The record is a few hundred bytes; a sandboxd sending more is not heard.
const MAX_RECORD_BYTES: usize = 16 << 10;
/// An answer for a GET: a sandboxd that hangs leaves the field out.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
const SIGKILL: i32 = 9;

/// Asks sandboxd for its entrypoint record; None when it has none, or does
/// not answer sanely in time (the field is then left out, never an error).
pub async fn ask(client: &SandboxdClient) -> Option<EntrypointRecord> {
    answer(client).await.flatten()
}

/// sandboxd's answer: `None` when it gave none sanely in time,
/// `Some(None)` when it says it runs no entrypoint.
pub async fn answer(client: &SandboxdClient) -> Option<Option<EntrypointRecord>> {
    client
        .get_json_bounded::<Option<EntrypointRecord>>(
            ENTRYPOINT_ROUTE,
            MAX_RECORD_BYTES,
            ASK_TIMEOUT,
        )
        .await
}

/// `entrypoint_exited`'s details for `record`: the GET's words (`state`,
/// `exit_code`, `signal`, `started_at`, `finished_at`, `running_seconds`,
/// and a start error's bounded `message`), clamped as [`status`] clamps.
pub fn exit_details(record: &EntrypointRecord, oom_kills: u64, now_ms: i64) -> serde_json::Value {
    serde_json::to_value(status(record, oom_kills, now_ms)).unwrap_or_default()
}

/// The API's view of `record`, at `now_ms`, given the cgroup's OOM kills.
pub fn status(record: &EntrypointRecord, oom_kills: u64, now_ms: i64) -> EntrypointStatus {
    let started = record.started_at_unix_ms.max(0);
    let ended = record.ended_at_unix_ms.map(|e| e.max(started));
    let until = ended.unwrap_or(now_ms).max(started);
    let state = if record.start_error.is_some() {
        EntrypointState::StartError
    } else if ended.is_none() {
        EntrypointState::Running
    } else if oom_kills > 0
        && (record.signal == Some(SIGKILL) || record.exit_code == Some(128 + SIGKILL))
    {
        // Killed by SIGKILL (or a shell reporting its child's), in a cgroup
        // whose OOM killer has struck: the kernel's kill, not a user's.
        EntrypointState::OomKilled
    } else if record.exit_code == Some(0) {
        EntrypointState::Completed
    } else {
        EntrypointState::Error
    };
    EntrypointStatus {
        state,
        started_at: rfc3339(started),
        running_seconds: until.saturating_sub(started) as f64 / 1000.0,
        finished_at: ended.map(rfc3339),
        exit_code: record.exit_code,
        signal: record.signal,
        message: record.start_error.as_ref().map(|m| {
            let mut m = m.clone();
            m.truncate(m.floor_char_boundary(1024));
            m
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ended: Option<i64>, code: Option<i32>, signal: Option<i32>) -> EntrypointRecord {
        EntrypointRecord {
            started_at_unix_ms: 1_000,
            pid: Some(7),
            ended_at_unix_ms: ended,
            exit_code: code,
            signal,
            start_error: None,
        }
    }

    #[test]
    fn running_counts_until_now() {
        let s = status(&record(None, None, None), 0, 3_500);
        assert_eq!(s.state, EntrypointState::Running);
        assert_eq!(s.running_seconds, 2.5);
        assert_eq!(s.finished_at, None);
    }

    #[test]
    fn exits_are_completed_or_error() {
        let ok = status(&record(Some(1_200), Some(0), None), 0, 9_000);
        assert_eq!(
            (ok.state, ok.running_seconds),
            (EntrypointState::Completed, 0.2)
        );
        let bad = status(&record(Some(1_200), Some(3), None), 0, 9_000);
        assert_eq!(
            (bad.state, bad.exit_code),
            (EntrypointState::Error, Some(3))
        );
        // A SIGKILL with no OOM kill in the cgroup is someone's kill.
        let killed = status(&record(Some(1_200), None, Some(9)), 0, 9_000);
        assert_eq!(killed.state, EntrypointState::Error);
    }

    #[test]
    fn oom_needs_the_kernel_counter_and_a_kill() {
        let by_signal = status(&record(Some(1_200), None, Some(9)), 1, 9_000);
        assert_eq!(by_signal.state, EntrypointState::OomKilled);
        let by_shell = status(&record(Some(1_200), Some(137), None), 2, 9_000);
        assert_eq!(by_shell.state, EntrypointState::OomKilled);
        // An exit of its own after some other process was OOM-killed.
        let own_exit = status(&record(Some(1_200), Some(1), None), 1, 9_000);
        assert_eq!(own_exit.state, EntrypointState::Error);
    }

    #[test]
    fn a_start_error_carries_its_message_bounded() {
        let mut r = record(Some(1_000), None, None);
        r.start_error = Some("é".repeat(2_000));
        let s = status(&r, 0, 5_000);
        assert_eq!(s.state, EntrypointState::StartError);
        assert!(s.message.unwrap().len() <= 1024);
    }

    #[test]
    fn lying_clocks_give_no_negative_durations() {
        let mut r = record(Some(10), Some(0), None);
        r.started_at_unix_ms = -5;
        assert_eq!(status(&r, 0, 0).running_seconds, 0.01);
        let r = record(Some(500), Some(0), None); // ended before it started
        assert_eq!(status(&r, 0, 0).running_seconds, 0.0);
    }
}
