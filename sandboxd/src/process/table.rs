//! The running processes of one daemon: what shutdown waits for and kills,
//! and how `WriteStdin` / `SendSignal` / `ResizeTTY` find a started process.
//! Kept processes (`keep.v1`) are in it like any other, and also in its
//! [`KeptTable`], which holds their output tails.

use std::{
    collections::HashMap,
    ops::Deref,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use rustix::process::Signal;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore, SemaphorePermit};

use super::{kept::KeptTable, signal_group, Control};
use crate::{
    error::{Error, Result},
    Daemon,
};

/// Every running process by pid (which is also its process group id).
pub struct ProcessTable {
    procs: Mutex<HashMap<i32, Entry>>,
    next_seq: AtomicU64,
    /// Live registrations. A count rather than the map's length, because a
    /// pid can be reused while an older registration of it still drains its
    /// output; shutdown must wait for both.
    running: watch::Sender<usize>,
    /// One permit per process that may run (`--max-processes`), taken before
    /// the spawn and given back when its registration ends.
    slots: Arc<Semaphore>,
    limit: usize,
    /// One permit per `WriteStdin` in flight. A write to a process that does
    /// not read blocks until it does; each such call holds an HTTP/2 stream,
    /// so they are bounded too.
    writers: Semaphore,
    /// Processes that outlive their `Start` stream, and their output.
    pub(crate) kept: KeptTable,
}

/// Most `WriteStdin` calls in flight at once, across all processes.
pub const MAX_STDIN_WRITERS: usize = 64;

struct Entry {
    /// Tells a registration apart from a later one that reused its pid, so
    /// the older one leaving never removes the newer.
    seq: u64,
    /// `None` for processes run to completion (`Execute`, `run`): they
    /// count as running but cannot be addressed by pid.
    control: Option<Arc<Control>>,
}

/// The right to spawn one process, held by its [`Registration`]. Dropped
/// unused (the spawn failed), it frees the place at once.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl ProcessTable {
    /// A table that lets at most `limit` processes run at once.
    pub fn new(limit: usize) -> Self {
        ProcessTable {
            procs: Mutex::default(),
            next_seq: AtomicU64::new(0),
            running: watch::channel(0).0,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            writers: Semaphore::new(MAX_STDIN_WRITERS),
            kept: KeptTable::default(),
        }
    }

    /// The most processes that may run at once (`--max-processes`).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// `WriteStdin` calls in flight now.
    pub fn stdin_writes(&self) -> usize {
        MAX_STDIN_WRITERS - self.writers.available_permits()
    }

    /// A place for one `WriteStdin` in flight, or a refusal at once.
    pub(crate) fn writing(&self) -> Result<SemaphorePermit<'_>> {
        self.writers.try_acquire().map_err(|_| {
            Error::ResourceExhausted(format!(
                "too many stdin writes in flight (at most {MAX_STDIN_WRITERS}); \
                 a process that does not read its input blocks them"
            ))
        })
    }

    /// Takes a place for one more process, or refuses at once when
    /// `--max-processes` run already: a client must never wait silently.
    pub(crate) fn reserve(&self) -> Result<Slot> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map(|permit| Slot { _permit: permit })
            .map_err(|_| {
                Error::ResourceExhausted(format!(
                    "too many processes: {} are running, the most this sandbox allows \
                     (sandboxd --max-processes); wait for one to exit or kill one",
                    self.limit
                ))
            })
    }

    /// Processes running now (started through any API).
    pub fn active(&self) -> usize {
        *self.running.borrow()
    }

    /// Waits until no process runs, or `timeout` passes; true if idle.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let mut rx = self.running.subscribe();
        // The sender lives as long as `self`, so `wait_for` cannot fail.
        let idle = tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0)).await;
        idle.is_ok()
    }

    /// SIGKILLs the process group of every running process.
    pub fn kill_all(&self) {
        for &pgid in self.lock().keys() {
            if let Err(e) = signal_group(pgid, Signal::KILL) {
                tracing::warn!(pgid, error = %e, "killing process group");
            }
        }
    }

    /// The controls of a process started through `Start`, while it runs.
    pub(crate) fn lookup(&self, pid: i32) -> Option<Arc<Control>> {
        self.lock().get(&pid).and_then(|e| e.control.clone())
    }

    fn insert(&self, pid: i32, control: Option<Arc<Control>>) -> u64 {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(pid, Entry { seq, control });
        self.running.send_modify(|n| *n += 1);
        seq
    }

    fn remove(&self, pid: i32, seq: u64) {
        {
            let mut procs = self.lock();
            if procs.get(&pid).is_some_and(|e| e.seq == seq) {
                procs.remove(&pid);
            }
        }
        self.running.send_modify(|n| *n -= 1);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, Entry>> {
        // The map stays consistent even if a holder panicked: every critical
        // section is a single insert, remove or read.
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A process's place in the table and in the metrics, held from spawn until
/// its output is drained and it has been reaped. Generic over how the daemon
/// is held so that both borrowed (`run`) and owned (`Start`'s task) callers
/// can use it.
///
/// It also holds the process's [`Slot`]: the place frees when the process
/// has been reaped and its output drained (bounded by `EXECUTE_WAIT_DELAY`),
/// before its client is told of the exit, so a client that saw the exit
/// can start the next process at once.
pub(crate) struct Registration<D: Deref<Target = Daemon>> {
    daemon: D,
    pid: i32,
    seq: u64,
    started: Instant,
    exited: bool,
    _slot: Slot,
}

impl<D: Deref<Target = Daemon>> Registration<D> {
    pub(crate) fn new(
        daemon: D,
        slot: Slot,
        pid: i32,
        started: Instant,
        control: Option<Arc<Control>>,
    ) -> Self {
        daemon.metrics.exec_total.inc();
        daemon.metrics.active_processes.inc();
        let seq = daemon.processes.insert(pid, control);
        Registration {
            daemon,
            pid,
            seq,
            started,
            exited: false,
            _slot: slot,
        }
    }

    /// Records the run time once the process has been reaped.
    pub(crate) fn exited(&mut self) {
        if !std::mem::replace(&mut self.exited, true) {
            self.daemon
                .metrics
                .exec_seconds
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}

impl<D: Deref<Target = Daemon>> Drop for Registration<D> {
    fn drop(&mut self) {
        self.exited();
        self.daemon.metrics.active_processes.dec();
        self.daemon.processes.remove(self.pid, self.seq);
    }
}
