//! Background processes a session started, and their unread output.
//!
//! MCP is request/response, so a dev server or a test suite cannot stream
//! to the model. Instead a task per process drains its event stream into
//! bounded buffers, and `read_process_output` returns what arrived since
//! the previous read. The table belongs to one session and goes with it:
//! dropping it aborts the drains (the processes themselves live on in the
//! sandbox until it is deleted or expires).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use futures::StreamExt;
use sandhub_client::{ProcessEvent, ProcessEvents};
use tokio::{sync::watch, task::AbortHandle};

use crate::{
    errors::ToolError,
    output::{OutputBuffer, Taken},
};

/// One started process, shared by its drain task and the tools.
#[derive(Debug)]
pub struct Proc {
    pub pid: i32,
    state: Mutex<ProcState>,
    /// Bumped on every change, so a reader can wait for new output.
    changed: watch::Sender<u64>,
}

#[derive(Debug)]
struct ProcState {
    stdout: OutputBuffer,
    stderr: OutputBuffer,
    running: bool,
    exit_code: Option<i32>,
    /// Why the event stream ended without an exit code (sandbox gone,
    /// connection lost).
    error: Option<String>,
}

/// What one `read` returns.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReadOut {
    pub stdout: Taken,
    pub stderr: Taken,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

impl Proc {
    fn new(pid: i32, buffer_bytes: usize) -> Self {
        Proc {
            pid,
            state: Mutex::new(ProcState {
                stdout: OutputBuffer::new(buffer_bytes),
                stderr: OutputBuffer::new(buffer_bytes),
                running: true,
                exit_code: None,
                error: None,
            }),
            changed: watch::Sender::new(0),
        }
    }

    /// A panic elsewhere while holding the lock leaves plain data behind;
    /// the buffers are still usable, so keep serving them.
    fn state(&self) -> MutexGuard<'_, ProcState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn apply(&self, event: ProcessEvent) {
        {
            let mut st = self.state();
            match event {
                ProcessEvent::Started { .. } => return,
                ProcessEvent::Stdout { data } => st.stdout.push(&data),
                ProcessEvent::Stderr { data } => st.stderr.push(&data),
                ProcessEvent::Exited { exit_code } => {
                    st.exit_code = Some(exit_code);
                    st.running = false;
                }
            }
        }
        self.changed.send_modify(|g| *g += 1);
    }

    fn finish(&self, error: Option<String>) {
        {
            let mut st = self.state();
            if st.running {
                st.running = false;
                if st.exit_code.is_none() {
                    st.error = error.or_else(|| Some("output stream ended".into()));
                }
            }
        }
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn running(&self) -> bool {
        self.state().running
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.state().exit_code
    }

    /// Output since the previous read, up to `max` bytes per stream; waits
    /// up to `wait` for something new when there is nothing yet.
    pub async fn read(&self, wait: Duration, max: usize) -> ReadOut {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            {
                let st = self.state();
                if st.stdout.has_unread() || st.stderr.has_unread() || !st.running {
                    break;
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                // Timed out, or the process entry is being torn down.
                _ => break,
            }
        }
        let mut st = self.state();
        let finished = !st.running;
        ReadOut {
            stdout: st.stdout.take(max, finished),
            stderr: st.stderr.take(max, finished),
            running: st.running,
            exit_code: st.exit_code,
            error: st.error.clone(),
        }
    }

    /// Waits up to `wait` for the process to end; its exit code if it did.
    pub async fn wait_exit(&self, wait: Duration) -> Option<i32> {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if !self.running() {
                return self.exit_code();
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }
}

/// Feeds a process's events into its buffers until the stream ends.
async fn drain(proc: Arc<Proc>, mut events: ProcessEvents) {
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => proc.apply(event),
            Err(e) => return proc.finish(Some(e.to_string())),
        }
    }
    proc.finish(None);
}

struct Entry {
    proc: Arc<Proc>,
    drain: AbortHandle,
    /// Insertion order: finished processes make room oldest first.
    seq: u64,
}

/// A session's processes by sandbox and pid. A process's id is `p<pid>`
/// (the pid inside its sandbox): any replica of the hub that serves the
/// session can find a process from its id alone, where the backend keeps
/// processes past the replica that started them (see `adopt`).
pub struct ProcessTable {
    entries: BTreeMap<(String, i32), Entry>,
    next_seq: u64,
    max_processes: usize,
    buffer_bytes: usize,
}

impl ProcessTable {
    pub fn new(max_processes: usize, buffer_bytes: usize) -> Self {
        ProcessTable {
            entries: BTreeMap::new(),
            next_seq: 0,
            max_processes: max_processes.max(1),
            buffer_bytes,
        }
    }

    /// Registers a started process (its `Started` event already consumed)
    /// and starts draining it. Finished processes make room, oldest first;
    /// with every slot running, the caller must kill one first. A finished
    /// entry under the same pid (the pid was reused) is replaced.
    pub fn insert(
        &mut self,
        sandbox: &str,
        pid: i32,
        events: ProcessEvents,
    ) -> Result<(String, Arc<Proc>), ToolError> {
        let key = (sandbox.to_string(), pid);
        self.remove_key(&key);
        if self.entries.len() >= self.max_processes {
            let finished = self
                .entries
                .iter()
                .filter(|(_, e)| !e.proc.running())
                .min_by_key(|(_, e)| e.seq)
                .map(|(k, _)| k.clone());
            match finished {
                Some(k) => self.remove_key(&k),
                None => {
                    return Err(ToolError::new(format!(
                        "this session already runs {} processes; kill_process one you no \
                         longer need, then retry",
                        self.max_processes
                    )))
                }
            }
        }
        let proc = Arc::new(Proc::new(pid, self.buffer_bytes));
        let drain = tokio::spawn(drain(proc.clone(), events)).abort_handle();
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            key,
            Entry {
                proc: proc.clone(),
                drain,
                seq,
            },
        );
        Ok((process_id(pid), proc))
    }

    /// The process `id` if it was started in `sandbox`.
    pub fn get(&self, sandbox: &str, id: &str) -> Result<Arc<Proc>, ToolError> {
        parse_id(id)
            .and_then(|pid| self.entries.get(&(sandbox.to_string(), pid)))
            .map(|e| e.proc.clone())
            .ok_or_else(|| not_found(sandbox, id))
    }

    /// Forgets every process of a deleted sandbox.
    pub fn remove_sandbox(&mut self, sandbox: &str) {
        let keys: Vec<(String, i32)> = self
            .entries
            .keys()
            .filter(|(sb, _)| sb == sandbox)
            .cloned()
            .collect();
        for k in keys {
            self.remove_key(&k);
        }
    }

    fn remove_key(&mut self, key: &(String, i32)) {
        if let Some(e) = self.entries.remove(key) {
            e.drain.abort();
        }
    }
}

impl Drop for ProcessTable {
    fn drop(&mut self) {
        for e in self.entries.values() {
            e.drain.abort();
        }
    }
}

/// The id a tool shows for the process `pid`.
pub fn process_id(pid: i32) -> String {
    format!("p{pid}")
}

/// The pid an id names; `None` for anything but `p<pid>`.
pub fn parse_id(id: &str) -> Option<i32> {
    id.trim()
        .strip_prefix('p')?
        .parse()
        .ok()
        .filter(|pid| *pid > 0)
}

pub fn not_found(sandbox: &str, id: &str) -> ToolError {
    ToolError::new(format!(
        "process {id} not found in sandbox {sandbox}; use the process_id that start_process \
         returned (processes finished long ago may have been forgotten)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use sandhub_client::Error;

    fn events(items: Vec<Result<ProcessEvent, Error>>) -> ProcessEvents {
        Box::pin(stream::iter(items))
    }

    fn out(data: &str) -> Result<ProcessEvent, Error> {
        Ok(ProcessEvent::Stdout {
            data: data.as_bytes().to_vec(),
        })
    }

    #[tokio::test]
    async fn output_and_exit_code_are_collected() {
        let mut table = ProcessTable::new(4, 1024);
        let (id, proc) = table
            .insert(
                "sb-1",
                42,
                events(vec![
                    out("hello "),
                    Ok(ProcessEvent::Stderr {
                        data: b"warn".to_vec(),
                    }),
                    out("world"),
                    Ok(ProcessEvent::Exited { exit_code: 3 }),
                ]),
            )
            .unwrap();
        assert_eq!(id, "p42");
        assert_eq!(proc.wait_exit(Duration::from_secs(5)).await, Some(3));
        let r = proc.read(Duration::ZERO, 1024).await;
        assert_eq!(r.stdout.text, "hello world");
        assert_eq!(r.stderr.text, "warn");
        assert!(!r.running);
        assert_eq!(r.exit_code, Some(3));
        // Nothing new: an immediate, empty answer.
        let r = proc.read(Duration::from_secs(5), 1024).await;
        assert_eq!(r.stdout.text, "");
    }

    #[tokio::test]
    async fn a_read_waits_for_new_output_within_its_bound() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stream = tokio_stream_from(rx);
        let mut table = ProcessTable::new(4, 1024);
        let (_, proc) = table.insert("sb-1", 7, stream).unwrap();
        // Nothing arrives: the read returns at its deadline.
        let r = proc.read(Duration::from_millis(50), 1024).await;
        assert!(r.running);
        assert_eq!(r.stdout.text, "");
        let reader = {
            let proc = proc.clone();
            tokio::spawn(async move { proc.read(Duration::from_secs(10), 1024).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(out("late")).unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.stdout.text, "late");
    }

    #[tokio::test]
    async fn a_broken_stream_ends_the_process_with_its_reason() {
        let mut table = ProcessTable::new(4, 1024);
        let (_, proc) = table
            .insert(
                "sb-1",
                1,
                events(vec![out("x"), Err(Error::unavailable("sandbox went away"))]),
            )
            .unwrap();
        let r = proc.read(Duration::from_secs(5), 1024).await;
        let r = if r.running {
            proc.read(Duration::from_secs(5), 1024).await
        } else {
            r
        };
        assert!(!r.running);
        assert_eq!(r.exit_code, None);
        assert!(r.error.unwrap().contains("sandbox went away"));
    }

    #[tokio::test]
    async fn ids_are_scoped_to_their_sandbox_and_finished_ones_make_room() {
        let mut table = ProcessTable::new(2, 1024);
        let (a, pa) = table
            .insert(
                "sb-1",
                1,
                events(vec![Ok(ProcessEvent::Exited { exit_code: 0 })]),
            )
            .unwrap();
        pa.wait_exit(Duration::from_secs(5)).await;
        assert!(table.get("sb-1", &a).is_ok());
        assert!(table.get("sb-2", &a).is_err());
        assert!(table.get("sb-1", "p99").is_err());
        assert!(table.get("sb-1", "bogus").is_err());
        let (_tx1, rx1) = tokio::sync::mpsc::unbounded_channel();
        let (_tx2, rx2) = tokio::sync::mpsc::unbounded_channel();
        table.insert("sb-1", 2, tokio_stream_from(rx1)).unwrap();
        // The finished one was evicted to make room.
        table.insert("sb-1", 3, tokio_stream_from(rx2)).unwrap();
        assert!(table.get("sb-1", &a).is_err());
        // Two running processes: no room left.
        let (_tx3, rx3) = tokio::sync::mpsc::unbounded_channel();
        let e = table.insert("sb-1", 4, tokio_stream_from(rx3)).unwrap_err();
        assert!(e.message().contains("kill_process"));
        // A pid reused after its process finished names the new one.
        table.remove_sandbox("sb-1");
        assert!(table.get("sb-1", "p2").is_err());
        let (_tx4, rx4) = tokio::sync::mpsc::unbounded_channel();
        let (id, _) = table.insert("sb-2", 2, tokio_stream_from(rx4)).unwrap();
        assert_eq!(id, "p2");
        assert!(table.get("sb-2", "p2").unwrap().running());
        assert!(table.get("sb-1", "p2").is_err());
        assert!(table.get("sb-2", "p-2").is_err());
    }

    fn tokio_stream_from(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<Result<ProcessEvent, Error>>,
    ) -> ProcessEvents {
        Box::pin(stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
