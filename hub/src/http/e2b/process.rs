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

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use sandhub_api::error::Code;
use sandhub_client::{Error, ProcessEvent, PtySize, Result, Signal, StartProcess, StdinInput};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use super::{connect, paths::Place};
use crate::backend::TenantView;

/// Output chunks buffered for the starting call before the pump waits.
const PRIMARY_BUFFER: usize = 64;
/// Output chunks a `Connect`ed watcher may fall behind before it is cut off.
const WATCHER_BUFFER: usize = 1024;

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
    watchers: broadcast::Sender<Value>,
}

type Key = (String, String);

/// The processes started through this API that still run.
#[derive(Default)]
pub struct Registry {
    running: Mutex<HashMap<Key, BTreeMap<i32, Tracked>>>,
}

impl Registry {
    fn pid_of(&self, key: &Key, selector: &Selector) -> Result<i32> {
        if let Some(pid) = selector.pid {
            return i32::try_from(pid)
                .map_err(|_| Error::new(Code::InvalidArgument, format!("bad pid {pid}")));
        }
        let tag = selector
            .tag
            .as_deref()
            .ok_or_else(|| Error::new(Code::InvalidArgument, "select a process by pid or tag"))?;
        let running = self.running.lock().unwrap();
        running
            .get(key)
            .and_then(|procs| {
                procs
                    .iter()
                    .find(|(_, t)| t.tag.as_deref() == Some(tag))
                    .map(|(pid, _)| *pid)
            })
            .ok_or_else(|| Error::new(Code::NotFound, format!("no process tagged {tag}")))
    }

    fn forget(&self, key: &Key, pid: i32) {
        let mut running = self.running.lock().unwrap();
        if let Some(procs) = running.get_mut(key) {
            procs.remove(&pid);
            if procs.is_empty() {
                running.remove(key);
            }
        }
    }

    /// Forgets every process of a sandbox that was deleted.
    pub fn forget_sandbox(&self, tenant: &str, id: &str) {
        self.running
            .lock()
            .unwrap()
            .remove(&(tenant.to_string(), id.to_string()));
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
    })
}

fn pty_size(pty: Option<&PtyRequest>) -> Option<PtySize> {
    pty.and_then(|p| p.size.as_ref()).map(|s| PtySize {
        cols: s.cols.max(1),
        rows: s.rows.max(1),
    })
}

/// Frames for one stream: its messages, keepalives while idle, a deadline,
/// then the end-of-stream frame.
fn frames(
    first: Value,
    rest: impl Stream<Item = std::result::Result<Value, Error>> + Send + 'static,
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
                    Some(Ok(message)) => yield connect::envelope(&message),
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
        let spec = start_process(&req.process, pty_size(req.pty.as_ref()))?;
        let mut events = self.api.start(self.id, spec).await?;
        let pid = match events.next().await {
            Some(Ok(ProcessEvent::Started { pid })) => pid,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(Error::internal(
                    "the process stream did not start with its pid",
                ))
            }
        };
        if !req.stdin.unwrap_or(false) {
            // E2B's commands run with stdin closed unless asked for.
            let _ = self.api.write_stdin(self.id, pid, StdinInput::Eof).await;
        }
        let (primary_tx, primary_rx) =
            mpsc::channel::<std::result::Result<Value, Error>>(PRIMARY_BUFFER);
        let (watchers, _) = broadcast::channel(WATCHER_BUFFER);
        let key = self.key();
        self.registry
            .running
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .insert(
                pid,
                Tracked {
                    config: req.process.clone(),
                    tag: req.tag.clone(),
                    watchers: watchers.clone(),
                },
            );
        let registry = self.registry.clone();
        tokio::spawn(async move {
            let mut primary = Some(primary_tx);
            while let Some(event) = events.next().await {
                let (message, last) = match event {
                    Ok(ProcessEvent::Stdout { data }) => (Ok(data_event("stdout", &data)), false),
                    Ok(ProcessEvent::Stderr { data }) => (Ok(data_event("stderr", &data)), false),
                    Ok(ProcessEvent::Exited { exit_code }) => (Ok(end_event(exit_code)), true),
                    Ok(ProcessEvent::Started { .. }) => continue,
                    Err(e) => (Err(e), true),
                };
                if let Ok(m) = &message {
                    let _ = watchers.send(m.clone());
                }
                // A starting call that went away stops being fed; the
                // process runs on (E2B's background commands).
                if let Some(tx) = &primary {
                    if tx.send(message).await.is_err() {
                        primary = None;
                    }
                }
                if last {
                    break;
                }
            }
            registry.forget(&key, pid);
        });
        Ok(frames(
            start_event(pid),
            tokio_stream::wrappers::ReceiverStream::new(primary_rx),
            self.keepalive,
            self.deadline,
        ))
    }

    /// `Connect`: live events of a running process.
    pub fn connect(&self, body: Value) -> Result<impl Stream<Item = Bytes> + Send + 'static> {
        let req: Selected = serde_json::from_value(body)
            .map_err(|e| Error::new(Code::InvalidArgument, format!("bad ConnectRequest: {e}")))?;
        let key = self.key();
        let pid = self.registry.pid_of(&key, &req.process)?;
        let receiver = {
            let running = self.registry.running.lock().unwrap();
            running
                .get(&key)
                .and_then(|p| p.get(&pid))
                .map(|t| t.watchers.subscribe())
                .ok_or_else(|| Error::new(Code::NotFound, format!("process {pid} not found")))?
        };
        let live = tokio_stream::wrappers::BroadcastStream::new(receiver).map(|r| {
            r.map_err(|lag| {
                Error::new(
                    Code::ResourceExhausted,
                    format!("watcher fell behind: {lag}"),
                )
            })
        });
        // The stream ends after the `end` event.
        let until_end = live.scan(false, |ended, m| {
            let stop = *ended;
            if let Ok(v) = &m {
                *ended = v["event"].get("end").is_some();
            }
            futures::future::ready((!stop).then_some(m))
        });
        Ok(frames(
            start_event(pid),
            until_end,
            self.keepalive,
            self.deadline,
        ))
    }

    /// A unary method's answer.
    pub async fn unary(&self, method: &str, body: Value) -> Result<Value> {
        if method == "List" {
            let running = self.registry.running.lock().unwrap();
            let processes: Vec<Value> = running
                .get(&self.key())
                .map(|procs| {
                    procs
                        .iter()
                        .map(|(pid, t)| {
                            let mut v = json!({"config": t.config, "pid": pid});
                            if let Some(tag) = &t.tag {
                                v["tag"] = json!(tag);
                            }
                            v
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Ok(json!({"processes": processes}));
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
        let pid = self.registry.pid_of(&self.key(), &req.process)?;
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
