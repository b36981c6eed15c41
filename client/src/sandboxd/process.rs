//! Processes over sandboxd's `process.v1` gRPC service.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, StatusCode};
use prost::Message;
use sandhub_api::{
    error::Code,
    hub::{ExecRequest, ExecResult},
    proto::process::v1::{self as pb, start_response::Event},
    sandboxd::{EXECUTE_ROUTE, EXECUTE_TIMED_OUT_HEADER},
};
use tokio::time::Instant;
use tonic::Streaming;

use super::{body_bytes, full, SandboxdClient};
use crate::{
    Error, ProcessEvent, ProcessEvents, PtySize, Result, Signal, StartProcess, StdinInput,
};

/// A 404 that says the route is missing, not what the command named: our
/// own older builds' JSON (`no route for ...`), or Go's mux's text
/// (upstream's sandboxd).
fn is_missing_route(message: &str) -> bool {
    message.starts_with("no route for ") || message.ends_with("404 page not found")
}

/// Unary execs one client runs over REST at once. Each holds an HTTP/1.1
/// connection (and a descriptor at each end) until its command ends; past
/// this many, the rest share gRPC's one multiplexed connection, so a burst
/// of long commands cannot grow the connections without bound.
pub const MAX_REST_EXECS: usize = 16;

/// One of `limit` places, given back on drop.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    fn take(count: &'a AtomicUsize, limit: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The exit code of a command its timeout killed (that of coreutils
/// `timeout`, and of sandboxd's own timed runs).
pub const TIMED_OUT_EXIT_CODE: i32 = 124;

/// After the timeout's SIGKILL, how long output already in flight may
/// still arrive before the result is returned without the exit event.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// stdin goes out in pieces well under sandboxd's 64 MiB message limit,
/// and small enough that output keeps flowing between them.
const STDIN_CHUNK: usize = 256 * 1024;

impl SandboxdClient {
    /// Runs a command to completion. Without stdin this is one REST
    /// request (`EXECUTE_ROUTE`; sandboxd kills the group at the timeout),
    /// or, where sandboxd has no such route, one gRPC `Execute` without a
    /// timeout. Otherwise the process is started, fed, and (at the
    /// deadline) its group killed, keeping the output read so far.
    pub async fn exec(&self, request: ExecRequest) -> Result<ExecResult> {
        let timeout = request.timeout_seconds.map(timeout_of).transpose()?;
        let config = config(request.command.argv(), request.env, request.cwd);
        if request.stdin.is_empty() {
            let unary = pb::ExecuteRequest {
                config: Some(config),
            };
            if let Some(done) = self.execute_over_rest(&unary, timeout).await? {
                return Ok(done);
            }
            if timeout.is_none() {
                let done = self.process().execute(unary).await?.into_inner();
                return Ok(result_of(done, false));
            }
            let config = unary.config.unwrap_or_default();
            return self.run_started(config, Bytes::new(), timeout).await;
        }
        self.run_started(config, Bytes::from(request.stdin), timeout)
            .await
    }

    /// `Execute` over REST ([`EXECUTE_ROUTE`]): one HTTP/1.1 request on a
    /// pooled connection. `None` when this sandboxd has no such route (an
    /// older build, or upstream's), which is remembered: the caller then
    /// uses gRPC, now and from then on.
    async fn execute_over_rest(
        &self,
        request: &pb::ExecuteRequest,
        timeout: Option<Duration>,
    ) -> Result<Option<ExecResult>> {
        if !self.rest_execute.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let Some(_slot) = Slot::take(&self.rest_executing, MAX_REST_EXECS) else {
            return Ok(None);
        };
        let body = full(request.encode_to_vec());
        let route = match timeout {
            // Whole milliseconds, rounded up: never shorter than asked.
            Some(t) => format!(
                "{EXECUTE_ROUTE}?timeout_ms={}",
                t.as_nanos().div_ceil(1_000_000)
            ),
            None => EXECUTE_ROUTE.to_string(),
        };
        // The call is `Execute` whatever carries it: its span is named so.
        let span_name = Some("/process.v1.ProcessService/Execute");
        let response = self.send_any(Method::POST, &route, body, span_name).await?;
        let status = response.status();
        let timed_out = response
            .headers()
            .get(EXECUTE_TIMED_OUT_HEADER)
            .is_some_and(|v| v == "true");
        let body = body_bytes(response).await?;
        if status.is_success() {
            return match pb::ExecuteResponse::decode(body) {
                Ok(done) => Ok(Some(result_of(done, timed_out))),
                Err(e) => Err(Error::internal(format!(
                    "sandboxd's answer is not an ExecuteResponse: {e}"
                ))),
            };
        }
        let error = Error::from_http(status.as_u16(), &body);
        if status == StatusCode::NOT_FOUND && is_missing_route(&error.message) {
            tracing::debug!("this sandboxd has no REST execute route; using gRPC");
            self.rest_execute.store(false, Ordering::Relaxed);
            return Ok(None);
        }
        Err(error)
    }

    /// Starts a process; the stream begins with `Started` and ends after
    /// `Exited`. Dropping the stream kills the process group (sandboxd ties
    /// a started process to its stream).
    pub async fn start(&self, request: StartProcess) -> Result<ProcessEvents> {
        let StartProcess {
            command,
            env,
            cwd,
            pty,
            stdin_closed,
        } = request;
        let close_stdin = stdin_closed && pty.is_none();
        let start = pb::StartRequest {
            config: Some(config(command, env, cwd)),
            pty: pty.map(|p| pb::Pty {
                cols: p.cols.into(),
                rows: p.rows.into(),
            }),
        };
        let stream = self.process().start(start).await?.into_inner();
        let mut events: ProcessEvents = Box::pin(stream.filter_map(|item| {
            futures::future::ready(match item {
                Ok(response) => response.event.map(|e| Ok(event_of(e))),
                Err(status) => Some(Err(status.into())),
            })
        }));
        if !close_stdin {
            return Ok(events);
        }
        // `process.v1` (upstream's contract) has no such field: the EOF
        // follows `init`, as a caller would send it, but without holding
        // the stream back for its round trip. A process that is gone by
        // then needs no EOF; a broken connection shows on the stream.
        let first = events.next().await;
        if let Some(Ok(ProcessEvent::Started { pid })) = &first {
            let (client, pid) = (self.clone(), *pid);
            tokio::spawn(async move {
                let _ = client.write_stdin(pid, StdinInput::Eof).await;
            });
        }
        Ok(Box::pin(futures::stream::iter(first).chain(events)))
    }

    pub async fn write_stdin(&self, pid: i32, input: StdinInput) -> Result<()> {
        let payload = match input {
            StdinInput::Data(data) => pb::write_stdin_request::Payload::Input(data),
            StdinInput::Eof => pb::write_stdin_request::Payload::Eof(()),
        };
        self.process()
            .write_stdin(pb::WriteStdinRequest {
                process_id: pid,
                payload: Some(payload),
            })
            .await?;
        Ok(())
    }

    /// Signals the process's whole group.
    pub async fn signal(&self, pid: i32, signal: Signal) -> Result<()> {
        let signal = match signal {
            Signal::Sigint => pb::Signal::Sigint,
            Signal::Sigterm => pb::Signal::Sigterm,
            Signal::Sigkill => pb::Signal::Sigkill,
        };
        self.process()
            .send_signal(pb::SendSignalRequest {
                process_id: pid,
                signal: signal.into(),
            })
            .await?;
        Ok(())
    }

    /// Resizes the terminal of a process started with a PTY
    /// (FAILED_PRECONDITION for one without).
    pub async fn resize(&self, pid: i32, size: PtySize) -> Result<()> {
        self.process()
            .resize_tty(pb::ResizeTtyRequest {
                process_id: pid,
                cols: size.cols.into(),
                rows: size.rows.into(),
            })
            .await?;
        Ok(())
    }

    /// `exec` with stdin or a timeout: Start, feed stdin while collecting.
    async fn run_started(
        &self,
        config: pb::ProcessConfig,
        stdin: Bytes,
        timeout: Option<Duration>,
    ) -> Result<ExecResult> {
        let start = pb::StartRequest {
            config: Some(config),
            pty: None,
        };
        let mut events = self.process().start(start).await?.into_inner();
        let pid = match events.message().await? {
            Some(pb::StartResponse {
                event: Some(Event::Init(init)),
            }) => init.process_id,
            _ => {
                return Err(Error::internal(
                    "sandboxd's Start stream did not begin with init",
                ))
            }
        };
        // Checked even so: a deadline past the clock's end must be an
        // error, never a panic in the middle of a request.
        let deadline = timeout
            .map(|t| {
                Instant::now()
                    .checked_add(t)
                    .ok_or_else(|| Error::invalid("timeout_seconds is too large"))
            })
            .transpose()?;
        // Fed concurrently: a process that writes much before reading its
        // input would otherwise block on output nobody reads.
        let feed = self.feed(pid, stdin);
        let collect = self.collect(&mut events, pid, deadline);
        tokio::pin!(feed, collect);
        let mut fed = false;
        loop {
            tokio::select! {
                result = &mut feed, if !fed => {
                    result?;
                    fed = true;
                }
                result = &mut collect => return result,
            }
        }
    }

    /// Writes all of `data`, then EOF. A process that exited or closed its
    /// stdin without reading everything is not an error, as with a pipe.
    async fn feed(&self, pid: i32, data: Bytes) -> Result<()> {
        let gone = |e: &Error| matches!(e.code, Code::NotFound | Code::FailedPrecondition);
        let mut rest = data;
        while !rest.is_empty() {
            let chunk = rest.split_to(rest.len().min(STDIN_CHUNK));
            match self.write_stdin(pid, StdinInput::Data(chunk)).await {
                Err(e) if gone(&e) => return Ok(()),
                other => other?,
            }
        }
        match self.write_stdin(pid, StdinInput::Eof).await {
            Err(e) if gone(&e) => Ok(()),
            other => other,
        }
    }

    /// Reads output to the exit event, or to the deadline: then the group
    /// gets SIGKILL, and the result is exit code 124 with what arrived.
    async fn collect(
        &self,
        events: &mut Streaming<pb::StartResponse>,
        pid: i32,
        deadline: Option<Instant>,
    ) -> Result<ExecResult> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut wake = deadline;
        let mut timed_out = false;
        loop {
            let sleep = async move {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let message = tokio::select! {
                message = events.message() => message,
                () = sleep => {
                    if timed_out {
                        break;
                    }
                    timed_out = true;
                    match self.signal(pid, Signal::Sigkill).await {
                        Ok(()) => {}
                        Err(e) if e.code == Code::NotFound => {}
                        Err(e) => return Err(e),
                    }
                    wake = Some(Instant::now() + KILL_GRACE);
                    continue;
                }
            };
            match message {
                Ok(Some(response)) => match response.event {
                    Some(Event::Stdout(data)) => stdout.extend_from_slice(&data),
                    Some(Event::Stderr(data)) => stderr.extend_from_slice(&data),
                    Some(Event::Exit(exit)) if !timed_out => {
                        return Ok(ExecResult {
                            exit_code: exit.exit_code,
                            stdout: lossy(&stdout),
                            stderr: lossy(&stderr),
                            timed_out: false,
                        })
                    }
                    Some(Event::Exit(_)) => break,
                    Some(Event::Init(_)) | None => {}
                },
                // After the kill, the end of the stream in any form is the
                // end of the output.
                Ok(None) | Err(_) if timed_out => break,
                Ok(None) => {
                    return Err(Error::unavailable(
                        "sandboxd ended the process stream before the exit event",
                    ))
                }
                Err(status) => return Err(status.into()),
            }
        }
        Ok(ExecResult {
            exit_code: TIMED_OUT_EXIT_CODE,
            stdout: lossy(&stdout),
            stderr: lossy(&stderr),
            timed_out: true,
        })
    }
}

pub(super) fn config(
    command: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    cwd: String,
) -> pb::ProcessConfig {
    pb::ProcessConfig {
        command,
        env_vars: env.into_iter().collect(),
        cwd: (!cwd.is_empty()).then_some(cwd),
    }
}

/// The range every front door checks too ([`sandhub_api::limits`]): a
/// timeout past the clock's end would overflow the deadline below.
fn timeout_of(seconds: f64) -> Result<Duration> {
    Ok(sandhub_api::limits::timeout("timeout_seconds", seconds)?)
}

fn result_of(done: pb::ExecuteResponse, timed_out: bool) -> ExecResult {
    ExecResult {
        exit_code: done.exit_code,
        stdout: lossy(&done.stdout),
        stderr: lossy(&done.stderr),
        timed_out,
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn event_of(event: Event) -> ProcessEvent {
    match event {
        Event::Init(init) => ProcessEvent::Started {
            pid: init.process_id,
        },
        Event::Stdout(data) => ProcessEvent::Stdout { data: data.into() },
        Event::Stderr(data) => ProcessEvent::Stderr { data: data.into() },
        Event::Exit(exit) => ProcessEvent::Exited {
            exit_code: exit.exit_code,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_must_be_in_range() {
        assert_eq!(timeout_of(1.5).unwrap(), Duration::from_millis(1500));
        // 1e19 s fits a Duration but no Instant: it must be refused here.
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e19,
            1.8e19,
            1e300,
            4e7,
            u64::MAX as f64,
        ] {
            assert_eq!(timeout_of(bad).unwrap_err().code, Code::InvalidArgument);
        }
    }
}
