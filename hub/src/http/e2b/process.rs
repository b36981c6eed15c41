//! Size: one envd service; its calls, pumps and registry share the watcher and byte bounds.
//!
//! envd's `process.Process` service. `Start` and `Connect` are server
//! streams of `ProcessEvent`s (`start` first, then base64 `data`, then
//! `end`); `List`, `SendInput`, `SendSignal`, `CloseStdin` and `Update`
//! are unary.
//!
//! A started process outlives the call that started it (E2B's background
//! commands, and a caller whose deadline passed): a pump task reads its
//! events until it exits and hands them to the starting call (with
//! backpressure) and to any `Connect`ed watchers (live output only, as
//! envd does). The registry holds what `List` and `Connect` need, per
//! tenant and sandbox, and forgets a process when it exits.
//!
//! What a caller can make the hub hold is bounded: each stream's queue is
//! a byte budget ([`super::outbox`]); a watcher that falls behind its
//! budget is cut off with `resource_exhausted`; watchers are capped per
//! process and per tenant; and deleting a sandbox ends its pumps and
//! empties every queue of theirs, stalled readers included.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use sandhub_api::error::Code;
use sandhub_api::hub::SandboxState;
use sandhub_client::{
    Error, KeptProcess, ProcessEvent, ProcessEvents, PtySize, Result, Signal, StartProcess,
    StdinInput,
};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{
    connect,
    outbox::{self, Writer},
    paths::Place,
};
use crate::backend::TenantView;

/// Bytes of enveloped frames queued for the starting call before the pump
/// waits for it to read.
pub const PRIMARY_BUDGET: usize = 1 << 20;
/// Bytes of enveloped frames a `Connect`ed watcher may fall behind before
/// it is cut off with `resource_exhausted`.
pub const WATCHER_BUDGET: usize = 1 << 20;
/// `Connect` streams open on one process at once.
pub const MAX_WATCHERS_PER_PROCESS: usize = 8;
/// `Connect` streams one tenant has open at once, over all its sandboxes.
/// A watcher counts until its HTTP response is dropped, so a stalled
/// reader that was cut off still counts while its connection stays open.
pub const MAX_WATCHERS_PER_TENANT: usize = 64;
/// The scope under which processes started through this API are kept
/// (Kubernetes: sandboxd's `keep.v1` label), so that every hub replica
/// finds the same ones. A sandbox belongs to one tenant, so one label
/// serves every caller of the sandbox, as envd's `List` does.
pub(crate) const KEPT_LABEL: &str = "e2b";
/// How often a pump held back by a starting call that stopped reading
/// checks that its sandbox still exists (a sandbox deleted by another
/// front door is not announced to this facade).
const GONE_POLL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct ProcessConfig {
    #[serde(default)]
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PtyRequest {
    #[serde(default)]
    size: Option<PtySizeJson>,
}

#[derive(Debug, Deserialize)]
struct PtySizeJson {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<PtyRequest>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct Selector {
    #[serde(default)]
    pid: Option<i64>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Selected {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: Option<String>,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    pty: Option<PtyRequest>,
}

#[derive(Debug, Deserialize)]
struct Input {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// The unary methods that act on one process.
enum Op {
    SendSignal,
    SendInput,
    CloseStdin,
    Update,
}

struct Tracked {
    config: ProcessConfig,
    tag: Option<String>,
    watchers: Arc<Watchers>,
}

/// The `Connect`ed watchers of one process, fed by its pump.
#[derive(Default)]
struct Watchers {
    state: Mutex<WatchersState>,
}

#[derive(Default)]
struct WatchersState {
    writers: Vec<Writer>,
    /// Watchers whose stream still exists (fed, cut off, or ending).
    live: usize,
    /// The pump has ended: no new watcher.
    closed: bool,
}

impl Watchers {
    fn state(&self) -> MutexGuard<'_, WatchersState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `frame` to every watcher; one that fell behind is cut off
    /// (by its outbox) and dropped from the list.
    fn offer(&self, frame: &Bytes) {
        self.state().writers.retain(|w| w.offer(frame.clone()));
    }

    /// Ends every watcher's stream and takes no more.
    fn close(&self, end: &End) {
        let writers = {
            let mut state = self.state();
            state.closed = true;
            std::mem::take(&mut state.writers)
        };
        for w in writers {
            end.apply(&w);
        }
    }
}

/// How a pump ended, told to each of its streams.
enum End {
    /// The process exited (its `end` event was queued).
    Exited,
    /// Its event stream failed: queued frames first, then the error.
    Failed(Error),
    /// Its sandbox is gone: queued frames are dropped, then the error.
    Deleted(Error),
}

impl End {
    fn apply(&self, w: &Writer) {
        match self {
            End::Exited => w.finish(None),
            End::Failed(e) => w.finish(Some(e.clone())),
            End::Deleted(e) => w.abort(e.clone()),
        }
    }
}

type Key = (String, String);

/// One sandbox's processes, and the token that ends their pumps.
#[derive(Default)]
struct SandboxProcesses {
    cancel: CancellationToken,
    procs: BTreeMap<i32, Tracked>,
}

/// The processes started through this API that still run.
#[derive(Default)]
pub struct Registry {
    running: Mutex<HashMap<Key, SandboxProcesses>>,
    /// Live watchers per tenant.
    watching: Mutex<HashMap<String, usize>>,
}

/// One watcher's place under the caps, given back when its stream is
/// dropped (the client read it to the end, or its connection went away).
struct Slot {
    registry: Arc<Registry>,
    tenant: String,
    watchers: Arc<Watchers>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.watchers.state().live -= 1;
        let mut watching = self.registry.watching();
        if let Some(n) = watching.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                watching.remove(&self.tenant);
            }
        }
    }
}

impl Registry {
    fn running(&self) -> MutexGuard<'_, HashMap<Key, SandboxProcesses>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn watching(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.watching.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new watcher of `watchers` for `tenant`, within both caps.
    fn watch(
        self: &Arc<Self>,
        tenant: &str,
        pid: i32,
        watchers: &Arc<Watchers>,
    ) -> Result<(Slot, outbox::Reader)> {
        let mut watching = self.watching();
        let of_tenant = watching.get(tenant).copied().unwrap_or(0);
        if of_tenant >= MAX_WATCHERS_PER_TENANT {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!("{of_tenant} process streams are open; the limit is {MAX_WATCHERS_PER_TENANT} per tenant"),
            ));
        }
        let mut state = watchers.state();
        if state.closed {
            return Err(Error::new(
                Code::NotFound,
                format!("process {pid} not found"),
            ));
        }
        if state.live >= MAX_WATCHERS_PER_PROCESS {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "process {pid} has {} streams open; the limit is {MAX_WATCHERS_PER_PROCESS}",
                    state.live
                ),
            ));
        }
        let (writer, reader) = outbox::outbox(WATCHER_BUDGET);
        state.writers.push(writer);
        state.live += 1;
        *watching.entry(tenant.to_string()).or_default() += 1;
        let slot = Slot {
            registry: self.clone(),
            tenant: tenant.to_string(),
            watchers: watchers.clone(),
        };
        Ok((slot, reader))
    }

    fn pid_of(&self, key: &Key, selector: &Selector) -> Result<i32> {
        if let Some(pid) = selector.pid {
            return i32::try_from(pid)
                .map_err(|_| Error::new(Code::InvalidArgument, format!("bad pid {pid}")));
        }
        let tag = selector
            .tag
            .as_deref()
            .ok_or_else(|| Error::new(Code::InvalidArgument, "select a process by pid or tag"))?;
        let running = self.running();
        running
            .get(key)
            .and_then(|sandbox| {
                sandbox
                    .procs
                    .iter()
                    .find(|(_, t)| t.tag.as_deref() == Some(tag))
                    .map(|(pid, _)| *pid)
            })
            .ok_or_else(|| Error::new(Code::NotFound, format!("no process tagged {tag}")))
    }

    fn forget(&self, key: &Key, pid: i32) {
        let mut running = self.running();
        if let Some(sandbox) = running.get_mut(key) {
            sandbox.procs.remove(&pid);
            if sandbox.procs.is_empty() {
                running.remove(key);
            }
        }
    }

    /// Forgets every process of a sandbox that was deleted, and ends their
    /// pumps: each empties its streams' queues and ends them with an error.
    pub fn forget_sandbox(&self, tenant: &str, id: &str) {
        let gone = self.running().remove(&(tenant.to_string(), id.to_string()));
        if let Some(sandbox) = gone {
            sandbox.cancel.cancel();
        }
    }

    /// Tracks a started process; the token that ends its pump.
    fn track(&self, key: Key, pid: i32, tracked: Tracked) -> CancellationToken {
        let mut running = self.running();
        let sandbox = running.entry(key).or_default();
        sandbox.procs.insert(pid, tracked);
        sandbox.cancel.clone()
    }

    /// Tracks a process this replica did not start (it was found kept in
    /// the sandbox); `None` when another call tracked it meanwhile.
    fn adopt(&self, key: Key, pid: i32, tracked: Tracked) -> Option<CancellationToken> {
        let mut running = self.running();
        let sandbox = running.entry(key).or_default();
        if sandbox.procs.contains_key(&pid) {
            return None;
        }
        sandbox.procs.insert(pid, tracked);
        Some(sandbox.cancel.clone())
    }

    /// The watchers of a running process.
    fn watchers_of(&self, key: &Key, pid: i32) -> Result<Arc<Watchers>> {
        self.running()
            .get(key)
            .and_then(|sandbox| sandbox.procs.get(&pid))
            .map(|t| t.watchers.clone())
            .ok_or_else(|| Error::new(Code::NotFound, format!("process {pid} not found")))
    }
}

fn deleted(id: &str) -> Error {
    Error::new(Code::NotFound, format!("the sandbox {id} was deleted"))
}

/// Returns once the sandbox is gone (deleted, finished or expired).
async fn sandbox_gone(api: &dyn TenantView, id: &str) {
    loop {
        tokio::time::sleep(GONE_POLL).await;
        match api.get(id).await {
            Err(e) if e.code == Code::NotFound => return,
            Ok(sb) if matches!(sb.state, SandboxState::Finished | SandboxState::Expired) => return,
            _ => {}
        }
    }
}

/// One output or exit event as the enveloped frame streams carry. A
/// terminal's output is envd's `pty` data (stdout and stderr are one
/// stream there): E2B's `pty` handles read only that.
fn frame_of(event: ProcessEvent, pty: bool) -> Option<(Bytes, bool)> {
    let message = match event {
        ProcessEvent::Stdout { data } if pty => data_event("pty", &data),
        ProcessEvent::Stdout { data } => data_event("stdout", &data),
        ProcessEvent::Stderr { data } => data_event("stderr", &data),
        ProcessEvent::Exited { exit_code } => {
            return Some((connect::envelope(&end_event(exit_code)), true))
        }
        ProcessEvent::Started { .. } => return None,
    };
    Some((connect::envelope(&message), false))
}

/// What a pump feeds, and what ends it.
struct Pump {
    api: Arc<dyn TenantView>,
    id: String,
    primary: Option<Writer>,
    watchers: Arc<Watchers>,
    cancel: CancellationToken,
    /// The process runs on a terminal.
    pty: bool,
}

impl Pump {
    /// Reads the process's events until it exits (or fails, or its sandbox
    /// goes), feeding the starting call and the watchers; then ends them all.
    async fn run(&mut self, mut events: impl Stream<Item = Result<ProcessEvent>> + Unpin) -> End {
        loop {
            let event = tokio::select! {
                _ = self.cancel.cancelled() => return End::Deleted(deleted(&self.id)),
                event = events.next() => event,
            };
            let (frame, last) = match event {
                Some(Ok(event)) => match frame_of(event, self.pty) {
                    Some(f) => f,
                    None => continue,
                },
                Some(Err(e)) => return End::Failed(e),
                None => {
                    return End::Failed(Error::new(
                        Code::Unavailable,
                        "the process's stream ended without its exit",
                    ))
                }
            };
            self.watchers.offer(&frame);
            if let Some(end) = self.feed_primary(frame).await {
                return end;
            }
            if last {
                return End::Exited;
            }
        }
    }

    /// Hands `frame` to the starting call, waiting while it reads. A call
    /// that went away stops being fed; the process runs on (E2B's
    /// background commands). `Some` when the sandbox went meanwhile.
    async fn feed_primary(&mut self, frame: Bytes) -> Option<End> {
        let primary = self.primary.as_ref()?;
        tokio::select! {
            fed = primary.push(frame) => {
                if !fed {
                    self.primary = None;
                }
                None
            }
            _ = self.cancel.cancelled() => Some(End::Deleted(deleted(&self.id))),
            _ = sandbox_gone(self.api.as_ref(), &self.id) => Some(End::Deleted(deleted(&self.id))),
        }
    }

    /// Runs the pump, then ends every stream and forgets the process.
    async fn run_to_end(
        mut self,
        events: impl Stream<Item = Result<ProcessEvent>> + Unpin,
        registry: Arc<Registry>,
        key: Key,
        pid: i32,
    ) {
        let end = self.run(events).await;
        registry.forget(&key, pid);
        if let Some(primary) = self.primary.take() {
            end.apply(&primary);
        }
        self.watchers.close(&end);
    }
}

fn start_event(pid: i32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

fn end_event(exit_code: i32) -> Value {
    json!({"event": {"end": {
        "exitCode": exit_code,
        "exited": true,
        "status": format!("exit status {exit_code}"),
    }}})
}

fn data_event(stream: &str, data: &[u8]) -> Value {
    json!({"event": {"data": {stream: B64.encode(data)}}})
}

fn keepalive_event() -> Value {
    json!({"event": {"keepalive": {}}})
}

/// The argv, env and directory `config` asks for.
fn start_process(config: &ProcessConfig, pty: Option<PtySize>) -> Result<StartProcess> {
    if config.cmd.is_empty() {
        return Err(Error::new(Code::InvalidArgument, "process.cmd is empty"));
    }
    let argv = std::iter::once(config.cmd.clone()).chain(config.args.iter().cloned());
    let (command, cwd) = match config.cwd.as_deref().map(Place::parse) {
        None => (argv.collect(), String::new()),
        Some(place @ Place::Workspace(_)) => (argv.collect(), place.absolute()),
        // sandboxd starts processes in the workspace only; a directory
        // beyond it is entered by the process itself, as the sandbox's
        // user, by a shell that then execs the command.
        Some(Place::Elsewhere(dir)) => (
            [
                "/bin/sh",
                "-c",
                "cd -- \"$1\" && shift && exec \"$@\"",
                "sh",
                &dir,
            ]
            .map(String::from)
            .into_iter()
            .chain(argv)
            .collect(),
            String::new(),
        ),
    };
    Ok(StartProcess {
        command,
        env: config.envs.clone(),
        cwd,
        pty,
        stdin_closed: false,
    })
}

/// What `List` shows of a process kept in the sandbox: the argv split back
/// into `cmd` and `args`.
fn config_of(kept: &KeptProcess) -> ProcessConfig {
    let mut argv = kept.command.iter().cloned();
    ProcessConfig {
        cmd: argv.next().unwrap_or_default(),
        args: argv.collect(),
        envs: kept.env.clone(),
        cwd: Some(kept.cwd.clone()).filter(|c| !c.is_empty()),
    }
}

fn tag_of(kept: &KeptProcess) -> Option<String> {
    Some(kept.tag.clone()).filter(|t| !t.is_empty())
}

fn pty_size(pty: Option<&PtyRequest>) -> Option<PtySize> {
    pty.and_then(|p| p.size.as_ref()).map(|s| PtySize {
        cols: s.cols.max(1),
        rows: s.rows.max(1),
    })
}

/// Frames for one stream: its first message, then the pump's enveloped
/// frames, keepalives while idle, a deadline, then the end-of-stream frame.
fn frames(
    first: Value,
    rest: impl Stream<Item = std::result::Result<Bytes, Error>> + Send + 'static,
    keepalive: Option<Duration>,
    deadline: Option<Duration>,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let deadline = deadline.map(|d| tokio::time::Instant::now() + d);
    async_stream::stream! {
        yield connect::envelope(&first);
        let mut rest = std::pin::pin!(rest);
        let idle = keepalive.unwrap_or(Duration::from_secs(3600 * 24 * 365));
        loop {
            let until_deadline = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                next = rest.next() => match next {
                    Some(Ok(frame)) => yield frame,
                    Some(Err(e)) => {
                        yield connect::end_of_stream(Some(&e));
                        return;
                    }
                    None => break,
                },
                _ = tokio::time::sleep(idle) => yield connect::envelope(&keepalive_event()),
                _ = until_deadline => {
                    let e = Error::new(Code::DeadlineExceeded, "the call's deadline (connect-timeout-ms) passed");
                    yield connect::end_of_stream(Some(&e));
                    return;
                }
            }
        }
        yield connect::end_of_stream(None);
    }
}

pub struct Call<'a> {
    pub api: &'a Arc<dyn TenantView>,
    pub registry: &'a Arc<Registry>,
    pub tenant: &'a str,
    pub id: &'a str,
    pub keepalive: Option<Duration>,
    pub deadline: Option<Duration>,
}

impl Call<'_> {
    fn key(&self) -> Key {
        (self.tenant.to_string(), self.id.to_string())
    }

    /// `Start`: the stream's frames, or the error to end it with at once.
    pub async fn start(&self, body: Value) -> Result<impl Stream<Item = Bytes> + Send + 'static> {
        let req: StartRequest = serde_json::from_value(body)
            .map_err(|e| Error::new(Code::InvalidArgument, format!("bad StartRequest: {e}")))?;
        let mut spec = start_process(&req.process, pty_size(req.pty.as_ref()))?;
        // E2B's commands run with stdin closed unless asked for; a terminal
        // is always open for input (an EOF there would be a ^D typed into
        // the shell).
        spec.stdin_closed = spec.pty.is_none() && !req.stdin.unwrap_or(false);
        let pty = spec.pty.is_some();
        let tag = req.tag.as_deref().unwrap_or("");
        let mut events = self.api.start_kept(self.id, spec, KEPT_LABEL, tag).await?;
        let pid = match events.next().await {
            Some(Ok(ProcessEvent::Started { pid })) => pid,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(Error::internal(
                    "the process stream did not start with its pid",
                ))
            }
        };
        let (primary, primary_reader) = outbox::outbox(PRIMARY_BUDGET);
        let watchers = Arc::new(Watchers::default());
        let key = self.key();
        let cancel = self.registry.track(
            key.clone(),
            pid,
            Tracked {
                config: req.process.clone(),
                tag: req.tag.clone(),
                watchers: watchers.clone(),
            },
        );
        let pump = Pump {
            api: self.api.clone(),
            id: self.id.to_string(),
            primary: Some(primary),
            watchers,
            cancel,
            pty,
        };
        tokio::spawn(pump.run_to_end(events, self.registry.clone(), key, pid));
        Ok(frames(
            start_event(pid),
            primary_reader.into_stream(),
            self.keepalive,
            self.deadline,
        ))
    }

    /// `Connect`: live events of a running process, from now on. The
    /// stream ends after the process's `end` event. A process another
    /// replica started (or one that was restarted) is found kept in the
    /// sandbox: it is adopted, and its retained output comes first.
    pub async fn connect(&self, body: Value) -> Result<impl Stream<Item = Bytes> + Send + 'static> {
        let req: Selected = serde_json::from_value(body)
            .map_err(|e| Error::new(Code::InvalidArgument, format!("bad ConnectRequest: {e}")))?;
        let key = self.key();
        let pid = self.pid_of(&req.process).await?;
        let (watchers, pump) = match self.registry.watchers_of(&key, pid) {
            Ok(w) => (w, None),
            Err(e) => match self.adopt(pid).await? {
                Some(adopted) => adopted,
                None => return Err(e),
            },
        };
        let (slot, reader) = self.registry.watch(self.tenant, pid, &watchers)?;
        // The watcher is in place before the adopted pump feeds it, so it
        // sees the retained output from its first byte.
        if let Some((pump, events)) = pump {
            tokio::spawn(pump.run_to_end(events, self.registry.clone(), key, pid));
        }
        // The slot lives as long as the stream: dropping the response
        // gives its place under the caps back.
        let live = reader.into_stream().map(move |item| {
            let _ = &slot;
            item
        });
        Ok(frames(
            start_event(pid),
            live,
            self.keepalive,
            self.deadline,
        ))
    }

    /// Tracks kept process `pid` of this sandbox with a pump of its own
    /// (its replayed tail, then its live output); `None` where the backend
    /// keeps no processes, or none under that pid still runs.
    async fn adopt(
        &self,
        pid: i32,
    ) -> Result<Option<(Arc<Watchers>, Option<(Pump, ProcessEvents)>)>> {
        let Some(kept) = self.api.list_kept(self.id, KEPT_LABEL).await? else {
            return Ok(None);
        };
        let Some(found) = kept.iter().find(|k| k.pid == pid && k.exit_code.is_none()) else {
            return Ok(None);
        };
        let Some(events) = self.api.attach_kept(self.id, pid, KEPT_LABEL).await? else {
            return Ok(None);
        };
        let watchers = Arc::new(Watchers::default());
        let tracked = Tracked {
            config: config_of(found),
            tag: tag_of(found),
            watchers: watchers.clone(),
        };
        let Some(cancel) = self.registry.adopt(self.key(), pid, tracked) else {
            // Another call adopted it first: share its pump.
            return Ok(Some((self.registry.watchers_of(&self.key(), pid)?, None)));
        };
        let pump = Pump {
            api: self.api.clone(),
            id: self.id.to_string(),
            primary: None,
            watchers: watchers.clone(),
            cancel,
            pty: found.pty,
        };
        Ok(Some((watchers, Some((pump, events)))))
    }

    /// The pid a selector names: a pid as it is; a tag among the processes
    /// this replica tracks, else among those kept in the sandbox.
    async fn pid_of(&self, selector: &Selector) -> Result<i32> {
        let local = self.registry.pid_of(&self.key(), selector);
        let (Err(e), Some(tag)) = (&local, selector.tag.as_deref()) else {
            return local;
        };
        if e.code != Code::NotFound {
            return local;
        }
        let kept = self.api.list_kept(self.id, KEPT_LABEL).await?;
        kept.unwrap_or_default()
            .iter()
            .find(|k| k.exit_code.is_none() && k.tag == tag)
            .map(|k| k.pid)
            .ok_or_else(|| Error::new(Code::NotFound, format!("no process tagged {tag}")))
    }

    /// `List`: the running processes this replica tracks, and those kept
    /// in the sandbox (started through any replica).
    async fn list(&self) -> Result<Value> {
        let mut all: BTreeMap<i32, (ProcessConfig, Option<String>)> = BTreeMap::new();
        if let Some(kept) = self.api.list_kept(self.id, KEPT_LABEL).await? {
            for k in kept.iter().filter(|k| k.exit_code.is_none()) {
                all.insert(k.pid, (config_of(k), tag_of(k)));
            }
        }
        if let Some(sandbox) = self.registry.running().get(&self.key()) {
            for (pid, t) in &sandbox.procs {
                all.insert(*pid, (t.config.clone(), t.tag.clone()));
            }
        }
        let processes: Vec<Value> = all
            .into_iter()
            .map(|(pid, (config, tag))| {
                let mut v = json!({"config": config, "pid": pid});
                if let Some(tag) = tag {
                    v["tag"] = json!(tag);
                }
                v
            })
            .collect();
        Ok(json!({"processes": processes}))
    }

    /// A unary method's answer.
    pub async fn unary(&self, method: &str, body: Value) -> Result<Value> {
        if method == "List" {
            return self.list().await;
        }
        // The method first: an unknown one is unimplemented whatever its body.
        let op = match method {
            "SendSignal" => Op::SendSignal,
            "SendInput" => Op::SendInput,
            "CloseStdin" => Op::CloseStdin,
            "Update" => Op::Update,
            _ => {
                return Err(Error::new(
                    Code::Unimplemented,
                    format!("process.Process/{method} is not served"),
                ))
            }
        };
        let req: Selected = serde_json::from_value(body)
            .map_err(|e| Error::new(Code::InvalidArgument, format!("bad {method} request: {e}")))?;
        let pid = self.pid_of(&req.process).await?;
        match op {
            Op::SendSignal => {
                let signal = match req.signal.as_deref() {
                    Some("SIGNAL_SIGKILL") | Some("9") => Signal::Sigkill,
                    Some("SIGNAL_SIGTERM") | Some("15") => Signal::Sigterm,
                    other => {
                        return Err(Error::new(
                            Code::InvalidArgument,
                            format!("signal {other:?}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
                        ))
                    }
                };
                self.api.signal(self.id, pid, signal).await?;
            }
            Op::SendInput => {
                let input = req.input.unwrap_or(Input {
                    stdin: None,
                    pty: None,
                });
                let data = input.stdin.or(input.pty).unwrap_or_default();
                let bytes = B64.decode(data.as_bytes()).map_err(|e| {
                    Error::new(Code::InvalidArgument, format!("input is not base64: {e}"))
                })?;
                self.api
                    .write_stdin(self.id, pid, StdinInput::Data(Bytes::from(bytes)))
                    .await?;
            }
            Op::CloseStdin => self.api.write_stdin(self.id, pid, StdinInput::Eof).await?,
            Op::Update => {
                if let Some(size) = pty_size(req.pty.as_ref()) {
                    self.api.resize(self.id, pid, size).await?;
                }
            }
        }
        Ok(json!({}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_speak_envd_json() {
        assert_eq!(start_event(7), json!({"event": {"start": {"pid": 7}}}));
        assert_eq!(
            data_event("stdout", b"hi"),
            json!({"event": {"data": {"stdout": "aGk="}}})
        );
        assert_eq!(end_event(3)["event"]["end"]["exitCode"], 3);
        assert_eq!(end_event(3)["event"]["end"]["status"], "exit status 3");
    }

    #[test]
    fn watchers_are_capped_per_process_and_per_tenant_and_given_back_when_dropped() {
        let registry = Arc::new(Registry::default());
        let processes: Vec<Arc<Watchers>> = (0..MAX_WATCHERS_PER_TENANT / MAX_WATCHERS_PER_PROCESS
            + 1)
            .map(|_| Arc::default())
            .collect();
        let (full, spare) = processes.split_at(processes.len() - 1);
        let mut held = Vec::new();
        for watchers in full {
            for _ in 0..MAX_WATCHERS_PER_PROCESS {
                held.push(registry.watch("alice", 1, watchers).unwrap());
            }
        }
        let refused = registry.watch("alice", 1, &full[0]).err().unwrap();
        assert_eq!(refused.code, Code::ResourceExhausted);
        let refused = registry.watch("alice", 1, &spare[0]).err().unwrap();
        assert!(refused.message.contains("per tenant"), "{refused}");
        // Another tenant's count is its own.
        let bobs = registry.watch("bob", 1, &spare[0]).unwrap();
        drop(bobs);
        // A watcher given back makes room, in its process and its tenant.
        held.pop();
        let last = full.last().unwrap();
        held.push(registry.watch("alice", 1, last).unwrap());
        drop(held);
        assert!(registry.watching().is_empty());
        assert!(processes.iter().all(|w| w.state().live == 0));
    }

    #[tokio::test]
    async fn a_closed_process_takes_no_watcher_and_ends_the_ones_it_had() {
        let registry = Arc::new(Registry::default());
        let watchers = Arc::new(Watchers::default());
        let (_slot, reader) = registry.watch("alice", 7, &watchers).unwrap();
        watchers.offer(&connect::envelope(&data_event("stdout", b"x")));
        watchers.close(&End::Deleted(deleted("sb")));
        let got: Vec<_> = reader.into_stream().collect().await;
        assert_eq!(got.len(), 1, "queued output is dropped on deletion");
        assert_eq!(got[0].as_ref().unwrap_err().code, Code::NotFound);
        let again = registry.watch("alice", 7, &watchers).err().unwrap();
        assert_eq!(again.code, Code::NotFound);
    }

    #[test]
    fn forgetting_a_sandbox_cancels_its_pumps() {
        let registry = Registry::default();
        let key: Key = ("alice".into(), "sb".into());
        let tracked = || Tracked {
            config: ProcessConfig::default(),
            tag: None,
            watchers: Arc::default(),
        };
        let cancel = registry.track(key.clone(), 1, tracked());
        let other = registry.track(("alice".into(), "other".into()), 1, tracked());
        registry.forget_sandbox("alice", "sb");
        assert!(cancel.is_cancelled());
        assert!(!other.is_cancelled());
        assert!(registry.watchers_of(&key, 1).is_err());
    }

    #[test]
    fn a_start_request_becomes_argv_env_and_cwd() {
        let config: ProcessConfig = serde_json::from_value(json!({
            "cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/workspace/sub"
        }))
        .unwrap();
        let p = start_process(&config, None).unwrap();
        assert_eq!(p.command, ["/bin/bash", "-l", "-c", "echo hi"]);
        assert_eq!(p.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(p.cwd, "/workspace/sub");
        let relative = ProcessConfig {
            cwd: Some("sub".into()),
            ..config.clone()
        };
        assert_eq!(
            start_process(&relative, None).unwrap().cwd,
            "/workspace/sub"
        );
        let empty = ProcessConfig::default();
        assert_eq!(
            start_process(&empty, None).unwrap_err().code,
            Code::InvalidArgument
        );
    }
}
