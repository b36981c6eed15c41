//! How the hub opens its SQLite files: one setting for the store, the
//! event log and the webhook outbox, which share a file on the local
//! backend (each from a connection of its own).
//!
//! - WAL, with `synchronous=NORMAL`: a commit survives the hub's crash
//!   (only power loss can take the last ones), and readers never wait
//!   for the writer.
//! - A busy handler that waits in short steps. WAL still lets one writer
//!   in at a time, so a connection that wants to write while another
//!   commits waits. SQLite's own handler (`busy_timeout`) sleeps 1 ms at
//!   its first step, and the store writes from the HTTP event loop's
//!   threads: every request that met the event writer's commit (about
//!   100 µs) lost a millisecond (docs/benchmarks.md, issue #34 §0).
//! - Checkpoints off the event loop ([`checkpoint_late`]). SQLite copies
//!   the WAL back into the file, and `fsync`s it, in whichever commit
//!   finds the WAL past a threshold. The event log's writer thread commits
//!   after nearly every change and keeps SQLite's 1000 pages; the
//!   connections that write from the event loop wait for ten times that,
//!   so they pay only if the event writer stops.

use std::{path::Path, time::Duration};

use rusqlite::Connection;

/// How long a write waits for another connection's before it fails with
/// `SQLITE_BUSY`.
pub const BUSY_WAIT: Duration = Duration::from_secs(5);
/// The first wait; each next one doubles, up to [`BUSY_STEP_MAX`].
const BUSY_STEP_FIRST: Duration = Duration::from_micros(20);
const BUSY_STEP_MAX: Duration = Duration::from_millis(5);

/// Opens (or creates) `path` in WAL mode with the hub's busy handler.
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    let mut c = Connection::open(path)?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.busy_handler(Some(busy))?;
    Ok(c)
}

/// WAL pages past which a [`checkpoint_late`] connection checkpoints
/// itself: 40 MiB of 4 KiB pages, which bounds the WAL should no other
/// connection commit.
pub const BACKSTOP_PAGES: u32 = 10_000;

/// Leaves the WAL's automatic checkpoint to other connections until the
/// WAL holds [`BACKSTOP_PAGES`]: for a connection that writes from the
/// HTTP event loop's threads.
pub fn checkpoint_late(c: &Connection) -> rusqlite::Result<()> {
    c.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)
}

/// SQLite's busy callback: sleeps this attempt's step and tries again, or
/// gives up (false) once [`BUSY_WAIT`] has gone by in steps.
fn busy(attempt: i32) -> bool {
    match busy_step(u32::try_from(attempt).unwrap_or(0)) {
        Some(step) => {
            std::thread::sleep(step);
            true
        }
        None => false,
    }
}

/// The wait before retry `attempt` (0 first), or None once the waits
/// before it add up to [`BUSY_WAIT`].
fn busy_step(attempt: u32) -> Option<Duration> {
    let step = |n: u32| {
        BUSY_STEP_FIRST
            .saturating_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .min(BUSY_STEP_MAX)
    };
    let mut waited = Duration::ZERO;
    for n in 0..attempt {
        waited += step(n);
        if waited >= BUSY_WAIT {
            return None;
        }
    }
    Some(step(attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_steps_start_short_double_and_stop_after_the_wait() {
        assert_eq!(busy_step(0), Some(Duration::from_micros(20)));
        assert_eq!(busy_step(1), Some(Duration::from_micros(40)));
        assert_eq!(busy_step(8), Some(BUSY_STEP_MAX));
        assert_eq!(busy_step(40), Some(BUSY_STEP_MAX));
        let steps: Vec<Duration> = (0..).map_while(busy_step).collect();
        let total: Duration = steps.iter().sum();
        assert!(
            total >= BUSY_WAIT && total <= BUSY_WAIT + BUSY_STEP_MAX,
            "{total:?} over {} steps",
            steps.len()
        );
    }

    /// A write that meets another connection's open write transaction
    /// waits for it, then goes through.
    #[test]
    fn a_write_waits_for_another_connections_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let holder = open(&path).unwrap();
        holder.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (path2, started) = (path.clone(), std::time::Instant::now());
        let writer = std::thread::spawn(move || {
            let c = open(&path2).unwrap();
            c.execute("INSERT INTO t VALUES (1)", [])
                .map(|_| started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        holder
            .execute_batch("INSERT INTO t VALUES (0); COMMIT")
            .unwrap();
        let waited = writer.join().unwrap().unwrap();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        let n: i64 = holder
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    /// Frames in the WAL file, from its size: 32 bytes of header, then 24
    /// bytes and a page per frame. The file is reused from its start after
    /// a checkpoint, so past SQLite's 1000 pages it grows only while no
    /// connection checkpoints.
    fn wal_frames(db: &Path) -> u64 {
        let wal = db.with_extension("db-wal");
        (std::fs::metadata(wal).unwrap().len().saturating_sub(32)) / (24 + 4096)
    }

    /// A connection set to checkpoint late lets the WAL grow past
    /// SQLite's 1000 pages; one with the default checkpoints at them.
    #[test]
    fn a_late_connection_leaves_the_checkpoint_to_others() {
        for late in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.db");
            let c = open(&path).unwrap();
            if late {
                checkpoint_late(&c).unwrap();
            }
            c.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
            // A page of its own per row: each commit adds a frame or more.
            for _ in 0..1500 {
                c.execute("INSERT INTO t VALUES (zeroblob(3000))", [])
                    .unwrap();
            }
            let frames = wal_frames(&path);
            if late {
                assert!(frames > 1200, "{frames} frames");
            } else {
                assert!(frames < 1100, "{frames} frames");
            }
        }
    }
}
