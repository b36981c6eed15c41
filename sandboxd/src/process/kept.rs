//! Kept processes (`keep.v1`, a Sandhub extension): started processes that
//! outlive their `Start` stream. Their output goes to a bounded tail
//! ([`Kept`]) instead of one client, and any number of readers replay it and
//! follow it ([`follow`]); the process itself never waits for a reader, so a
//! slow or absent one costs the oldest output, never the process's progress.
//!
//! Bounds, since the sandbox's own code decides how much a process writes
//! and how many it starts: each tail holds at most [`TAIL_BYTES`], counting
//! a small cost per chunk (the oldest chunks go first; a reader that missed
//! some is told how many bytes, in a `dropped` event); at most [`MAX_KEPT`] kept processes may run at once
//! (they also count against `--max-processes`); an exited one stays
//! listable for [`LINGER`], and only while fewer than [`MAX_KEPT`] records
//! exist, the oldest exited going first.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use bytes::Bytes;
use sandhub_api::proto::{keep::v1 as kpb, process::v1 as pb};
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::error::{Error, Result};

/// Output bytes a kept process's tail holds.
pub const TAIL_BYTES: usize = 1 << 20;

/// Kept processes that may run at once, and records (running or exited)
/// the table holds when it can drop exited ones.
pub const MAX_KEPT: usize = 32;

/// How long an exited kept process stays listable and attachable.
pub const LINGER: Duration = Duration::from_secs(300);

/// Longest label, and longest tag, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;

/// Chunks a reader takes per lock of a tail.
const BATCH: usize = 16;

/// What a held chunk costs beyond its bytes (its `Bytes` and queue slot),
/// counted against [`TAIL_BYTES`] too: a process writing one byte at a time
/// must not make a mebibyte of output cost fifty in bookkeeping.
const CHUNK_COST: usize = 64;

pub(crate) type AttachEvent = std::result::Result<kpb::AttachResponse, Status>;

/// The kept processes of one daemon, by pid.
#[derive(Default)]
pub(crate) struct KeptTable {
    procs: Mutex<HashMap<i32, Arc<Kept>>>,
}

impl KeptTable {
    /// Checks there is room for one more running kept process, making room
    /// among exited ones first. Concurrent starts may pass together; those
    /// are few, as each holds a `--max-processes` slot.
    pub(crate) fn admit(&self) -> Result<()> {
        let mut procs = self.lock();
        prune(&mut procs);
        let running = procs.values().filter(|k| k.exit_code().is_none()).count();
        if running >= MAX_KEPT {
            return Err(Error::ResourceExhausted(format!(
                "too many kept processes: {MAX_KEPT} are running, the most a sandbox keeps; \
                 wait for one to exit or kill one"
            )));
        }
        Ok(())
    }

    /// Records a kept process just spawned. A record under the same pid is
    /// an exited process whose pid was reused: it is replaced.
    pub(crate) fn insert(&self, kept: Arc<Kept>) {
        let mut procs = self.lock();
        procs.insert(kept.pid, kept);
        prune(&mut procs);
    }

    /// The kept process `pid` if it carries `label`.
    pub(crate) fn get(&self, pid: i32, label: &str) -> Result<Arc<Kept>> {
        let mut procs = self.lock();
        prune(&mut procs);
        procs
            .get(&pid)
            .filter(|k| k.label == label)
            .cloned()
            // The same answer for "no such pid" and "another label's": a
            // label must not be probed through the error.
            .ok_or_else(|| Error::NotFound(format!("kept process {pid} not found")))
    }

    /// Kept processes carrying `label`, by pid.
    pub(crate) fn list(&self, label: &str) -> Vec<kpb::KeptProcess> {
        let mut procs = self.lock();
        prune(&mut procs);
        let mut out: Vec<_> = procs
            .values()
            .filter(|k| k.label == label)
            .map(|k| kpb::KeptProcess {
                process_id: k.pid,
                config: Some(k.config.clone()),
                pty: k.pty,
                exit_code: k.exit_code(),
                tag: k.tag.clone(),
            })
            .collect();
        out.sort_by_key(|p| p.process_id);
        out
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<i32, Arc<Kept>>> {
        // Every critical section leaves the map consistent.
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Drops exited records past [`LINGER`], then the oldest exited ones while
/// more than [`MAX_KEPT`] records exist. Running ones always stay: they are
/// bounded by [`KeptTable::admit`].
fn prune(procs: &mut HashMap<i32, Arc<Kept>>) {
    procs.retain(|_, k| k.exited_at().is_none_or(|at| at.elapsed() < LINGER));
    while procs.len() > MAX_KEPT {
        let oldest = procs
            .values()
            .filter_map(|k| Some((k.exited_at()?, k.pid)))
            .min();
        match oldest {
            Some((_, pid)) => procs.remove(&pid),
            None => break,
        };
    }
}

/// Validates a label or a tag (`what`) from a request.
pub(crate) fn label(what: &str, raw: String) -> Result<String> {
    if raw.len() > MAX_LABEL_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{what} is {} bytes; at most {MAX_LABEL_BYTES} are allowed",
            raw.len()
        )));
    }
    Ok(raw)
}

/// One kept process: what it runs, under which label, and its output tail.
pub(crate) struct Kept {
    pub(crate) pid: i32,
    label: String,
    tag: String,
    config: pb::ProcessConfig,
    pty: bool,
    tail: Mutex<Tail>,
    /// Bumped on every change of `tail`; readers wait on it.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Tail {
    /// Output held, oldest first; `chunks[i]` has sequence number `first + i`.
    chunks: VecDeque<Chunk>,
    /// Sequence number of `chunks[0]`.
    first: u64,
    /// Bytes in `chunks`, plus [`CHUNK_COST`] each.
    held: usize,
    /// Output bytes ever written, so byte offset of the next chunk.
    written: u64,
    exit: Option<(i32, Instant)>,
}

#[derive(Clone)]
struct Chunk {
    /// Byte offset of `data` in the process's whole output.
    offset: u64,
    stderr: bool,
    data: Bytes,
}

impl Kept {
    pub(crate) fn new(
        pid: i32,
        (label, tag): (String, String),
        config: pb::ProcessConfig,
        pty: bool,
    ) -> Self {
        Kept {
            pid,
            label,
            tag,
            config,
            pty,
            tail: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }

    /// Appends output, dropping the oldest chunks beyond [`TAIL_BYTES`].
    pub(crate) fn push(&self, stderr: bool, data: Bytes) {
        {
            let mut tail = self.lock();
            let offset = tail.written;
            tail.written += data.len() as u64;
            tail.held += data.len() + CHUNK_COST;
            tail.chunks.push_back(Chunk {
                offset,
                stderr,
                data,
            });
            while tail.held > TAIL_BYTES {
                let Some(old) = tail.chunks.pop_front() else {
                    break;
                };
                tail.held -= old.data.len() + CHUNK_COST;
                tail.first += 1;
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Records the exit; readers report it after the output.
    pub(crate) fn exited(&self, code: i32) {
        self.lock().exit = Some((code, Instant::now()));
        self.changed.send_modify(|n| *n += 1);
    }

    fn exit_code(&self) -> Option<i32> {
        self.lock().exit.map(|(code, _)| code)
    }

    fn exited_at(&self) -> Option<Instant> {
        self.lock().exit.map(|(_, at)| at)
    }

    fn lock(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn send(e: kpb::attach_response::Event) -> AttachEvent {
    Ok(kpb::AttachResponse { event: Some(e) })
}

/// Streams a kept process to one reader: init, the tail from its oldest
/// byte held, live output, the exit. Ends when the reader goes away.
pub(crate) async fn follow(kept: Arc<Kept>, tx: mpsc::Sender<AttachEvent>) {
    use kpb::attach_response::Event as E;
    let init = E::Init(pb::InitEvent {
        process_id: kept.pid,
    });
    if tx.send(send(init)).await.is_err() {
        return;
    }
    let mut changes = kept.changed.subscribe();
    let mut next_seq = 0u64;
    let mut pos = 0u64;
    loop {
        // Marked seen before the read: a change after it wakes the wait.
        changes.borrow_and_update();
        let (dropped, batch, exit) = {
            let tail = kept.lock();
            let mut dropped = 0;
            if next_seq < tail.first {
                let first_offset = tail.chunks.front().map_or(tail.written, |c| c.offset);
                dropped = first_offset - pos;
                next_seq = tail.first;
                pos = first_offset;
            }
            let skip = (next_seq - tail.first) as usize;
            let batch: Vec<Chunk> = tail.chunks.iter().skip(skip).take(BATCH).cloned().collect();
            let drained = skip + batch.len() == tail.chunks.len();
            (dropped, batch, tail.exit.filter(|_| drained))
        };
        if dropped > 0
            && tx
                .send(send(E::Dropped(kpb::Dropped { bytes: dropped })))
                .await
                .is_err()
        {
            return;
        }
        let more = !batch.is_empty();
        for chunk in batch {
            next_seq += 1;
            pos = chunk.offset + chunk.data.len() as u64;
            let ev = if chunk.stderr {
                E::Stderr(chunk.data)
            } else {
                E::Stdout(chunk.data)
            };
            if tx.send(send(ev)).await.is_err() {
                return;
            }
        }
        if more {
            continue;
        }
        if let Some((exit_code, _)) = exit {
            let _ = tx.send(send(E::Exit(pb::ExitEvent { exit_code }))).await;
            return;
        }
        tokio::select! {
            // The sender lives in `kept`, which this task holds.
            _ = changes.changed() => {}
            () = tx.closed() => return,
        }
    }
}
