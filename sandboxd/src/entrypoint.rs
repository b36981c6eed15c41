//! The entrypoint's life as sandboxd saw it: when it started and how it
//! ended. sandboxd is its parent, so only sandboxd can tell "exited 1 at
//! start" from "still serving"; the hub reads this record (and adds what only
//! it can see, the cgroup's OOM kills) to answer whether a sandbox started.
//! Also how it starts: [`start_entrypoint`].

use std::{
    io,
    path::Path,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::process::spawn::Child;

/// `GET` here answers the current [`EntrypointRecord`], or `null` when the
/// sandbox has no entrypoint. A Sandhub route: upstream has no such thing.
pub const ENTRYPOINT_ROUTE: &str = "/v1/_sandhub/entrypoint";

/// One start of the entrypoint (a workspace reset starts it again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntrypointRecord {
    pub started_at_unix_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_unix_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it could not be started; it never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
}

impl EntrypointRecord {
    pub fn ended(&self) -> bool {
        self.ended_at_unix_ms.is_some() || self.start_error.is_some()
    }
}

/// `GET` here answers the newest bytes of the entrypoint's output
/// (`?tail=N`, default [`LOG_TAIL_DEFAULT`], at most [`LOG_TAIL_MAX`]), or
/// 404 when it has no log.
pub const ENTRYPOINT_LOG_ROUTE: &str = "/v1/_sandhub/entrypoint/log";
pub const LOG_TAIL_DEFAULT: u64 = 64 << 10;
pub const LOG_TAIL_MAX: u64 = 1 << 20;

/// The latest start, tagged with a generation so that the waiter of a
/// start a reset killed cannot overwrite the record of the next one.
#[derive(Debug, Default)]
pub struct Tracker {
    current: Mutex<Option<(u64, EntrypointRecord)>>,
    /// The log the entrypoint writes, as it was opened for it: read back
    /// through this handle, whatever is at the path now.
    log: Mutex<Option<Arc<std::fs::File>>>,
}

impl Tracker {
    /// The log of the latest start (`None`: its output went nowhere).
    pub fn set_log(&self, log: Option<std::fs::File>) {
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = log.map(Arc::new);
    }

    /// The newest `max` bytes (at most [`LOG_TAIL_MAX`]) of the log; `None`
    /// when there is none.
    pub fn log_tail(&self, max: u64) -> Option<std::io::Result<Vec<u8>>> {
        use std::os::unix::fs::FileExt;
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        let read = || {
            let len = log.metadata()?.len();
            let want = max.min(LOG_TAIL_MAX).min(len);
            let mut buf = vec![0; want as usize];
            let mut at = 0;
            while at < buf.len() {
                match log.read_at(&mut buf[at..], len - want + at as u64)? {
                    0 => break, // truncated meanwhile
                    n => at += n,
                }
            }
            buf.truncate(at);
            Ok(buf)
        };
        Some(read())
    }

    /// Records a new start (or a failure to start); returns its generation.
    pub fn started(&self, pid: Result<u32, String>) -> u64 {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let generation = current.as_ref().map_or(1, |(g, _)| g + 1);
        let now = unix_ms(SystemTime::now());
        let (pid, start_error) = match pid {
            Ok(pid) => (Some(pid), None),
            Err(e) => (None, Some(e)),
        };
        *current = Some((
            generation,
            EntrypointRecord {
                started_at_unix_ms: now,
                pid,
                ended_at_unix_ms: start_error.as_ref().map(|_| now),
                exit_code: None,
                signal: None,
                start_error,
            },
        ));
        generation
    }

    /// Records `child`'s start, and reaps it in a task of its own that
    /// records how it ended. Needs a tokio runtime.
    pub(crate) fn watch(self: &Arc<Self>, mut child: Child) {
        let pid = child.id();
        let generation = self.started(Ok(pid as u32));
        let tracker = self.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            tracing::info!(pid, ?status, "the entrypoint ended");
            tracker.ended(generation, status);
        });
    }

    /// Records how start `generation` ended, unless a newer one replaced it.
    pub fn ended(&self, generation: u64, status: std::io::Result<std::process::ExitStatus>) {
        use std::os::unix::process::ExitStatusExt;
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let Some((g, record)) = current.as_mut() else {
            return;
        };
        if *g != generation {
            return;
        }
        record.ended_at_unix_ms = Some(unix_ms(SystemTime::now()));
        match status {
            Ok(s) => {
                record.exit_code = s.code();
                record.signal = s.signal();
            }
            // Waiting failed: it is gone all the same, how is unknown.
            Err(e) => record.start_error = Some(format!("waiting for the entrypoint: {e}")),
        }
    }

    pub fn record(&self) -> Option<EntrypointRecord> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().map(|(_, r)| r.clone())
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Where the entrypoint's output goes, inside the sandbox.
pub const ENTRYPOINT_LOG: &str = "/tmp/sandhub-entrypoint.log";

/// Opens [`ENTRYPOINT_LOG`] to append to and to read back: never through a
/// symlink, and only a regular file (the sandbox's user may have put
/// anything at that path before a reset restarts the entrypoint, and
/// sandboxd serves what it reads back); `None` when it cannot.
fn open_entrypoint_log() -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(ENTRYPOINT_LOG)
        .ok()?;
    log.metadata().ok()?.is_file().then_some(log)
}

/// Starts the `--entrypoint` (a JSON argv) in the background, as `run_as`,
/// in `cwd`, in a process group of its own, output to [`ENTRYPOINT_LOG`];
/// the caller reaps the child. Called at start and after each workspace
/// reset (which kills every workload, this one too). Also answers the log,
/// open, for reading its tail back (`None`: the output went nowhere).
///
/// Started like every other workload (`process::spawn`), so it is one of
/// the children the init reaper leaves to their owner. Needs a tokio
/// runtime (it is reaped through its pidfd).
pub(crate) fn start_entrypoint(
    argv: &[String],
    run_as: Option<&crate::identity::RunAs>,
    cwd: &Path,
    child_setup: Option<crate::ChildSetup>,
) -> io::Result<(Child, Option<std::fs::File>)> {
    use crate::process::spawn::{Command, Lead, Stdio};
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::other("the entrypoint is empty"))?;
    let log = open_entrypoint_log();
    let out = |log: &std::fs::File| log.try_clone().map(|f| Stdio::Fd(f.into()));
    let (stdout, stderr) = match &log {
        Some(f) => (out(f)?, out(f)?),
        None => (Stdio::Null, Stdio::Null),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .stdout(stdout)
        .stderr(stderr)
        .lead(Lead::Group);
    if let Some(user) = run_as {
        cmd.ids(user.uid, user.gid);
        for (k, v) in user.env() {
            cmd.env(k, v);
        }
    }
    if let Some(setup) = child_setup {
        cmd.setup(setup);
    }
    Ok((cmd.spawn()?, log))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn records_exit_code_and_signal() {
        let t = Tracker::default();
        assert_eq!(t.record(), None);
        let g = t.started(Ok(42));
        assert!(!t.record().unwrap().ended());
        t.ended(g, Ok(ExitStatus::from_raw(3 << 8)));
        let r = t.record().unwrap();
        assert_eq!((r.exit_code, r.signal, r.ended()), (Some(3), None, true));
        let g = t.started(Ok(43));
        t.ended(g, Ok(ExitStatus::from_raw(9)));
        let r = t.record().unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    }

    #[test]
    fn a_replaced_start_does_not_overwrite_the_next() {
        let t = Tracker::default();
        let old = t.started(Ok(1));
        let new = t.started(Ok(2));
        t.ended(old, Ok(ExitStatus::from_raw(9)));
        let r = t.record().unwrap();
        assert_eq!((r.pid, r.ended()), (Some(2), false));
        t.ended(new, Ok(ExitStatus::from_raw(0)));
        assert_eq!(t.record().unwrap().exit_code, Some(0));
    }

    #[test]
    fn a_failed_start_has_ended() {
        let t = Tracker::default();
        t.started(Err("no such file".into()));
        let r = t.record().unwrap();
        assert!(r.ended());
        assert_eq!(r.start_error.as_deref(), Some("no such file"));
    }
}
