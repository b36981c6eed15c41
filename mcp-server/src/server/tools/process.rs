//! Long-running processes: start one, read its output as it comes, write
//! to its stdin, signal it.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::StreamExt;
use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use sandhub_api::hub::Command;
use sandhub_client::{ProcessEvent, Sandboxes, Signal, StartProcess, StdinInput};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::wait;
use crate::{
    errors::{ToolError, ToolResult},
    output::Taken,
    process::{parse_id, Proc},
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

/// How long the hub may take to report that a process started.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_READ_WAIT: f64 = 30.0;
/// How long kill_process waits to report the exit code.
const KILL_WAIT: Duration = Duration::from_secs(5);
const STDIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StartProcessParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// A shell command line, run with /bin/sh -c, e.g. "python -m http.server 8000" or
    /// "pytest -x 2>&1".
    pub command: String,
    /// Working directory relative to /workspace. Default /workspace.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for the process.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StartProcessResult {
    /// Names the process in read_process_output, send_process_input and kill_process.
    pub process_id: String,
    /// The process's pid inside the sandbox.
    pub pid: i32,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProcessRef {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The process_id that start_process returned.
    pub process_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadProcessOutputParams {
    #[serde(flatten)]
    pub process: ProcessRef,
    /// When there is no new output yet, wait up to this many seconds for some (or for the
    /// process to exit). Default 0 (answer at once), at most 30.
    #[serde(default)]
    pub wait_seconds: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReadProcessOutputResult {
    /// Standard output since the previous read.
    pub stdout: String,
    /// Standard error since the previous read.
    pub stderr: String,
    /// True while the process runs.
    pub running: bool,
    /// The exit status, once the process has exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// True when output was lost because it was not read fast enough (the oldest goes first).
    pub truncated: bool,
    /// True when more output is already waiting: read again.
    pub more: bool,
    /// What was lost, what is waiting, or why output stopped, when any of that applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendProcessInputParams {
    #[serde(flatten)]
    pub process: ProcessRef,
    /// Text to write to the process's stdin. Include "\n" to end a line.
    #[serde(default)]
    pub input: String,
    /// Close stdin after writing (the process then reads end-of-file). Default false.
    #[serde(default)]
    pub eof: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SendProcessInputResult {
    pub bytes_written: u64,
    /// True when stdin was closed.
    pub eof: bool,
}

/// The signals kill_process can send.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum KillSignal {
    /// Ask the process to stop (it may clean up first).
    #[default]
    #[serde(alias = "TERM", alias = "sigterm")]
    Sigterm,
    /// Like Ctrl-C.
    #[serde(alias = "INT", alias = "sigint")]
    Sigint,
    /// Stop it at once; it cannot refuse.
    #[serde(alias = "KILL", alias = "sigkill")]
    Sigkill,
}

impl KillSignal {
    fn name(self) -> &'static str {
        match self {
            KillSignal::Sigterm => "SIGTERM",
            KillSignal::Sigint => "SIGINT",
            KillSignal::Sigkill => "SIGKILL",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct KillProcessParams {
    #[serde(flatten)]
    pub process: ProcessRef,
    /// SIGTERM (default), SIGINT or SIGKILL. The signal goes to the process's whole group.
    #[serde(default)]
    pub signal: Option<KillSignal>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct KillProcessResult {
    /// The signal that was sent.
    pub signal: String,
    /// True when the process exited within a few seconds of the signal.
    pub exited: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

#[tool_router(router = process_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Start a long-running shell command in a sandbox (a server, a watcher, a \
        test suite) without waiting for it; returns a process_id. Read its output with \
        read_process_output, write to its stdin with send_process_input, stop it with \
        kill_process.",
        annotations(
            title = "Start process",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    pub async fn start_process(
        &self,
        Parameters(p): Parameters<StartProcessParams>,
        hub: Hub,
    ) -> Result<Json<StartProcessResult>, ToolError> {
        let cwd = match p.cwd.as_deref() {
            Some(c) => crate::paths::workspace_path(c)?,
            None => String::new(),
        };
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let request = StartProcess {
            command: Command::Shell(p.command).argv(),
            env: p.env.unwrap_or_default(),
            cwd,
            pty: None,
            stdin_closed: false,
        };
        let started = tokio::time::timeout(START_TIMEOUT, async {
            let mut events = sb
                .start_kept(&id, request, &self.kept_label(), "")
                .await
                .map_err(|e| self.gone_or(&id, e))?;
            match events.next().await {
                Some(Ok(ProcessEvent::Started { pid })) => Ok((pid, events)),
                Some(Err(e)) => Err(self.gone_or(&id, e)),
                _ => Err(ToolError::new(
                    "the process did not report that it started; check the command with \
                     execute_command first",
                )),
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(ToolError::timed_out(
                "starting the process",
                START_TIMEOUT.as_secs_f64(),
            ))
        })?;
        let (pid, events) = started;
        let (process_id, _) = self.session.processes().insert(&id, pid, events)?;
        Ok(Json(StartProcessResult { process_id, pid }))
    }

    #[tool(
        description = "Read what a process started with start_process printed since the \
        previous read, and whether it still runs (with its exit_code once it has exited). \
        With wait_seconds, waits up to that long for new output when there is none yet.",
        annotations(
            title = "Read process output",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    pub async fn read_process_output(
        &self,
        Parameters(p): Parameters<ReadProcessOutputParams>,
        hub: Hub,
    ) -> Result<Json<ReadProcessOutputResult>, ToolError> {
        let wait = wait("wait_seconds", p.wait_seconds, 0.0, MAX_READ_WAIT)?;
        let proc = self.process(hub, &p.process).await?;
        let out = proc.read(wait, self.options.max_output_bytes).await;
        let mut notes = Vec::new();
        lost(
            "stdout",
            &out.stdout,
            self.options.process_buffer_bytes,
            &mut notes,
        );
        lost(
            "stderr",
            &out.stderr,
            self.options.process_buffer_bytes,
            &mut notes,
        );
        let more = out.stdout.remaining > 0 || out.stderr.remaining > 0;
        if more {
            notes.push("more output is waiting; call read_process_output again".into());
        }
        if let Some(error) = &out.error {
            notes.push(format!("output stopped without an exit code: {error}"));
        }
        Ok(Json(ReadProcessOutputResult {
            stdout: out.stdout.text,
            stderr: out.stderr.text,
            running: out.running,
            exit_code: out.exit_code,
            truncated: out.stdout.dropped > 0 || out.stderr.dropped > 0,
            more,
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        }))
    }

    #[tool(
        description = "Write text to the stdin of a process started with start_process \
        (include \"\\n\" to end a line); eof=true then closes its stdin.",
        annotations(
            title = "Send process input",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    pub async fn send_process_input(
        &self,
        Parameters(p): Parameters<SendProcessInputParams>,
        hub: Hub,
    ) -> Result<Json<SendProcessInputResult>, ToolError> {
        let (sb, id) = self.owned(hub, &p.process.sandbox_claim_name).await?;
        let proc = self.find(sb.as_ref(), &id, &p.process.process_id).await?;
        if !proc.running() {
            return Err(exited(&p.process.process_id, &proc));
        }
        let what = format!("writing to process {}", p.process.process_id);
        let bytes_written = p.input.len() as u64;
        tokio::time::timeout(STDIN_TIMEOUT, async {
            if !p.input.is_empty() {
                let data = StdinInput::Data(Bytes::from(p.input.into_bytes()));
                sb.write_stdin(&id, proc.pid, data)
                    .await
                    .map_err(|e| ToolError::hub(&what, e))?;
            }
            if p.eof {
                sb.write_stdin(&id, proc.pid, StdinInput::Eof)
                    .await
                    .map_err(|e| ToolError::hub(&what, e))?;
            }
            Ok(())
        })
        .await
        .unwrap_or_else(|_| Err(ToolError::timed_out(&what, STDIN_TIMEOUT.as_secs_f64())))?;
        Ok(Json(SendProcessInputResult {
            bytes_written,
            eof: p.eof,
        }))
    }

    #[tool(
        description = "Send a signal to a process started with start_process (SIGTERM by \
        default; SIGINT is Ctrl-C; SIGKILL cannot be refused) and report whether it exited.",
        annotations(
            title = "Kill process",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn kill_process(
        &self,
        Parameters(p): Parameters<KillProcessParams>,
        hub: Hub,
    ) -> Result<Json<KillProcessResult>, ToolError> {
        let (sb, id) = self.owned(hub, &p.process.sandbox_claim_name).await?;
        let proc = self.find(sb.as_ref(), &id, &p.process.process_id).await?;
        let signal = p.signal.unwrap_or_default();
        // A pid outlives its process only as a number another process may
        // get next: never signal one that has exited.
        if proc.running() {
            let sig = match signal {
                KillSignal::Sigterm => Signal::Sigterm,
                KillSignal::Sigint => Signal::Sigint,
                KillSignal::Sigkill => Signal::Sigkill,
            };
            let what = format!("signalling process {}", p.process.process_id);
            match tokio::time::timeout(STDIN_TIMEOUT, sb.signal(&id, proc.pid, sig)).await {
                Ok(Ok(())) => {}
                // It exited between our look and the signal: that is the goal.
                Ok(Err(_)) if !proc.running() => {}
                Ok(Err(e)) => return Err(ToolError::hub(&what, e)),
                Err(_) => return Err(ToolError::timed_out(&what, STDIN_TIMEOUT.as_secs_f64())),
            }
        }
        let exit_code = proc.wait_exit(KILL_WAIT).await;
        Ok(Json(KillProcessResult {
            signal: signal.name().to_string(),
            exited: !proc.running(),
            exit_code,
        }))
    }
}

impl<P: SandboxesProvider> SandhubMcp<P> {
    async fn process(&self, hub: Hub, r: &ProcessRef) -> ToolResult<Arc<Proc>> {
        let (sb, id) = self.owned(hub, &r.sandbox_claim_name).await?;
        self.find(sb.as_ref(), &id, &r.process_id).await
    }

    /// Under which label this session's processes are kept in their
    /// sandboxes, where the backend keeps them past the replica that
    /// started them.
    fn kept_label(&self) -> String {
        format!("mcp/{}", self.session.id())
    }

    /// Process `process_id` of sandbox `id`: from this session's table, or,
    /// when another replica of the hub started it (or this one restarted),
    /// found kept in the sandbox and adopted. An adopted process's output
    /// starts again at what the sandbox retained (its last MiB), since
    /// which part of it the earlier replica handed out is not known here.
    async fn find(&self, sb: &dyn Sandboxes, id: &str, process_id: &str) -> ToolResult<Arc<Proc>> {
        let missing = match self.session.processes().get(id, process_id) {
            Ok(proc) => return Ok(proc),
            Err(e) => e,
        };
        let Some(pid) = parse_id(process_id) else {
            return Err(missing);
        };
        let attached = tokio::time::timeout(START_TIMEOUT, async {
            let mut events = sb.attach_kept(id, pid, &self.kept_label()).await.ok()??;
            match events.next().await {
                Some(Ok(ProcessEvent::Started { .. })) => Some(events),
                _ => None,
            }
        })
        .await;
        let Ok(Some(events)) = attached else {
            return Err(missing);
        };
        let mut table = self.session.processes();
        // A concurrent call may have adopted it meanwhile: keep that one.
        if let Ok(proc) = table.get(id, process_id) {
            return Ok(proc);
        }
        Ok(table.insert(id, pid, events)?.1)
    }
}

fn exited(process_id: &str, proc: &Proc) -> ToolError {
    match proc.exit_code() {
        Some(code) => ToolError::new(format!(
            "process {process_id} has already exited with code {code}; start it again with \
             start_process"
        )),
        None => ToolError::new(format!(
            "process {process_id} is no longer running; read_process_output says why"
        )),
    }
}

fn lost(name: &str, taken: &Taken, buffer: usize, notes: &mut Vec<String>) {
    if taken.dropped > 0 {
        notes.push(format!(
            "{} bytes of {name} were dropped because more than {buffer} bytes piled up unread; \
             read more often, or redirect the output to a file",
            taken.dropped
        ));
    }
}
