//! Running commands: one-shot exec, started processes streamed as NDJSON
//! (with stdin, signals and resize) and listed (`process_list`), an
//! interactive PTY over WebSocket whose shell may outlive its socket
//! (`shells`), and directory watches as Server-Sent Events.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::ws::{rejection::WebSocketUpgradeRejection, Message, WebSocket, WebSocketUpgrade},
    http::{header, StatusCode},
    response::{
        sse::{Event, KeepAlive, Sse},
        IntoResponse, Response,
    },
    Extension,
};
use futures::{Stream, StreamExt};
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{ExecRequest, ExecResult, ProcessEventWire, ResizeRequest, SignalRequest},
};
use sandhub_client::{
    http::encode_process_event, ProcessEvent, PtySize, Signal, StartProcess, StdinInput,
};
use serde::{Deserialize, Serialize};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    process_list::{ProcessInfo, ProcessTable, Tracked},
    shells::{Shell, Shells},
};
use crate::http::{Api, ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, AppState};

/// Stdin chunks and exec stdin are capped like other JSON bodies.
const MAX_STDIN_CHUNK: usize = crate::http::MAX_JSON_BODY;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(exec))
        .routes(routes!(start_process, list_processes))
        .routes(routes!(write_stdin))
        .routes(routes!(send_signal))
        .routes(routes!(resize))
        .routes(routes!(watch))
        .routes(routes!(pty))
}

/// Run a command to completion.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "processes", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = ExecResult),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody,
         description = "The command cannot be run (not executable, e.g. a directory)"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 413, body = ErrorBody),
    ))]
async fn exec(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> ApiResult<ApiJson<ExecResult>> {
    // Checked (command, timeout range) in front of every backend: guard.rs.
    Ok(ApiJson(api.exec(&id, req).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct StartBody {
    /// argv, or a shell string run with `/bin/sh -c`.
    command: sandhub_api::hub::Command,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    cwd: String,
    /// Allocate a terminal of this size.
    #[serde(default)]
    pty: Option<ResizeRequest>,
}

/// Start a process and stream its events as NDJSON: `started` (with the
/// pid the calls below take), base64 `stdout`/`stderr` chunks, `exited`.
/// Closing the response kills the process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes", request_body = StartBody,
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, content_type = "application/x-ndjson", body = ProcessEventWire,
         description = "One event per line"),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody,
         description = "The command cannot be run (not executable, e.g. a directory)"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready"),
        (status = 413, body = ErrorBody),
    ))]
async fn start_process(
    Api(api): Api,
    Extension(table): Extension<Arc<ProcessTable>>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<StartBody>,
) -> ApiResult<Response> {
    let argv = body.command.argv();
    let request = StartProcess {
        command: argv.clone(),
        env: body.env,
        cwd: body.cwd,
        pty: body.pty.map(|p| PtySize {
            cols: p.cols,
            rows: p.rows,
        }),
        stdin_closed: false,
    };
    let events = api.start(&id, request).await?;
    // Listed from its start to its exit, or to the end of this response
    // (which kills it): the guard lives in the stream.
    let tenant = api.tenant().to_string();
    let mut tracked: Option<Tracked> = None;
    let lines = events.map(move |ev| {
        match &ev {
            Ok(ProcessEvent::Started { pid }) => {
                tracked = table.started(&tenant, &id, *pid, argv.clone(), "process");
            }
            Ok(ProcessEvent::Exited { exit_code }) => {
                // Listed as exited before the client reads that it did.
                if let Some(mut t) = tracked.take() {
                    t.exited(*exit_code);
                }
            }
            _ => {}
        }
        let line = match ev {
            Ok(ev) => serde_json::to_vec(&encode_process_event(&ev)),
            // A broken stream ends with an error line the client can read.
            Err(e) => serde_json::to_vec(&e.body()),
        };
        let mut line = line.unwrap_or_default();
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// A sandbox's processes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct ProcessList {
    processes: Vec<ProcessInfo>,
}

/// The processes started in a sandbox through this hub (`POST
/// .../processes`, the terminal; on Kubernetes also those the E2B door
/// keeps), running ones first, then the last exited, newest first. The
/// hub's own table: processes a sandbox starts by itself are not listed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody)))]
async fn list_processes(
    Api(api): Api,
    Extension(table): Extension<Arc<ProcessTable>>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<ProcessList>> {
    // Another tenant's sandbox, or none: NOT_FOUND, before anything is read.
    api.get(&id).await?;
    let mut processes = table.list(api.tenant(), &id);
    // What the E2B door keeps in sandboxd (Kubernetes); a sandbox that is
    // not Ready has none to tell.
    if let Ok(Some(kept)) = api.list_kept(&id, crate::http::e2b::KEPT_LABEL).await {
        processes.extend(kept.into_iter().map(|k| ProcessInfo {
            pid: k.pid,
            argv: k.command,
            kind: "e2b".into(),
            tag: Some(k.tag).filter(|t| !t.is_empty()),
            started_at: None,
            running: k.exit_code.is_none(),
            exit_code: k.exit_code,
        }));
        // Stable: running ones first, each part in its order.
        processes.sort_by_key(|p| !p.running);
    }
    Ok(ApiJson(ProcessList { processes }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
// Stated: `ApiQuery` hides the `Query` utoipa would infer it from.
#[into_params(parameter_in = Query)]
struct StdinQuery {
    /// Close stdin after this write (on a terminal: send EOF).
    #[serde(default)]
    eof: bool,
}

/// Write to a started process's stdin (raw body).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path), StdinQuery),
    request_body(content = String, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody), (status = 413, body = ErrorBody)))]
async fn write_stdin(
    Api(api): Api,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    ApiQuery(q): ApiQuery<StdinQuery>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    if body.len() > MAX_STDIN_CHUNK {
        return Err(ApiError::new(
            Code::InvalidArgument,
            "stdin chunk too large",
        ));
    }
    if !body.is_empty() {
        api.write_stdin(&id, pid, StdinInput::Data(body)).await?;
    }
    if q.eof {
        api.write_stdin(&id, pid, StdinInput::Eof).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

fn parse_signal(s: &str) -> ApiResult<Signal> {
    match s.to_ascii_uppercase().trim_start_matches("SIG") {
        "INT" => Ok(Signal::Sigint),
        "TERM" => Ok(Signal::Sigterm),
        "KILL" => Ok(Signal::Sigkill),
        _ => Err(ApiError::new(
            Code::InvalidArgument,
            format!("signal must be SIGINT, SIGTERM or SIGKILL, not {s}"),
        )),
    }
}

/// Signal a started process's whole process group.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path)), request_body = SignalRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody), (status = 413, body = ErrorBody)))]
async fn send_signal(
    Api(api): Api,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    ApiJson(req): ApiJson<SignalRequest>,
) -> ApiResult<StatusCode> {
    api.signal(&id, pid, parse_signal(&req.signal)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resize a started process's terminal.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "processes",
    params(("id" = String, Path), ("pid" = i32, Path)), request_body = ResizeRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 412, body = ErrorBody), (status = 413, body = ErrorBody)))]
async fn resize(
    Api(api): Api,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    ApiJson(req): ApiJson<ResizeRequest>,
) -> ApiResult<StatusCode> {
    api.resize(
        &id,
        pid,
        PtySize {
            cols: req.cols,
            rows: req.rows,
        },
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
// Stated: `ApiQuery` hides the `Query` utoipa would infer it from.
#[into_params(parameter_in = Query)]
struct WatchQuery {
    /// Directory inside the workspace (default: the workspace).
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
}

/// Watch a directory: Server-Sent Events whose data is a JSON array of
/// change events, about every 250 ms while changes happen.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/watch", tag = "files",
    params(("id" = String, Path), WatchQuery),
    responses((status = 200, content_type = "text/event-stream", body = String),
              (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
async fn watch(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WatchQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let events = api.watch(&id, &q.path, q.recursive).await?;
    let stream = events.map(|batch| {
        Ok(match batch {
            Ok(batch) => Event::default()
                .json_data(&batch)
                .unwrap_or_else(|_| Event::default().data("[]")),
            Err(e) => Event::default()
                .event("error")
                .json_data(e.body())
                .unwrap_or_else(|_| Event::default().event("error")),
        })
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
// Stated: `ApiQuery` hides the `Query` utoipa would infer it from.
#[into_params(parameter_in = Query)]
struct PtyQuery {
    /// Program to run (default `/bin/sh`); argv is split on spaces.
    #[serde(default)]
    command: Option<String>,
    #[serde(default = "default_cols")]
    cols: u16,
    #[serde(default = "default_rows")]
    rows: u16,
    /// Keep the shell when the socket drops: the first text frame is then
    /// `{"shell":"<id>"}`, and the shell waits 60 s for a socket that
    /// names it in `shell` (its last 64 KiB of output replayed first)
    /// before it is killed.
    #[serde(default)]
    keep: bool,
    /// Re-attach to this kept shell of the same tenant and sandbox instead
    /// of starting one (`command` is then ignored).
    #[serde(default)]
    shell: Option<String>,
}

fn default_cols() -> u16 {
    80
}

fn default_rows() -> u16 {
    24
}

/// An interactive terminal over WebSocket. Binary frames carry terminal
/// bytes both ways; a text frame `{"cols":C,"rows":R}` resizes; the server
/// ends with a text frame `{"exit_code":N}` and closes. With `keep=true`
/// the shell survives a dropped socket for a while (see `keep`, `shell`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "processes",
    params(("id" = String, Path), PtyQuery),
    responses((status = 101, description = "WebSocket upgrade"),
              (status = 400, body = ErrorBody, description = "Not a WebSocket upgrade request"),
              (status = 403, body = ErrorBody, description = "Cross-origin upgrade"),
              (status = 404, body = ErrorBody,
               description = "No such sandbox, or no kept shell by that id (it ended, or was not claimed in time)"),
              (status = 412, body = ErrorBody)))]
async fn pty(
    Api(api): Api,
    Extension(shells): Extension<Arc<Shells>>,
    Extension(table): Extension<Arc<ProcessTable>>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PtyQuery>,
    headers: axum::http::HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    // A page elsewhere must not open a shell with the hub's open-tenant
    // access (CSWSH), as on every other upgrade.
    if !crate::http::proxy::same_origin(&headers) {
        return Err(ApiError::new(
            Code::PermissionDenied,
            "cross-origin upgrade refused: Origin must match the hub's host",
        ));
    }
    // Checked before anything starts in the sandbox, and answered as JSON.
    let ws = ws.map_err(|r| {
        let mut e = ApiError::new(Code::InvalidArgument, r.body_text());
        e.status = Some(r.status());
        e
    })?;
    if let Some(shell) = q.shell.as_deref() {
        // The sandbox must still be the caller's (and exist) to re-attach.
        api.get(&id).await?;
        let Some(shell) = shells.claim(api.tenant(), &id, shell).await else {
            return Err(ApiError::new(
                Code::NotFound,
                "no kept shell by that id in this sandbox (it ended, or was not claimed in time)",
            ));
        };
        let pty = Pty { api, id, shells };
        return Ok(ws.on_upgrade(move |socket| pty.serve(socket, shell, true)));
    }
    let command: Vec<String> = q
        .command
        .as_deref()
        .unwrap_or("/bin/sh")
        .split_whitespace()
        .map(String::from)
        .collect();
    let mut env = std::collections::BTreeMap::new();
    env.insert("TERM".to_string(), "xterm-256color".to_string());
    let mut events = api
        .start(
            &id,
            StartProcess {
                command: command.clone(),
                env,
                cwd: String::new(),
                pty: Some(PtySize {
                    cols: q.cols,
                    rows: q.rows,
                }),
                stdin_closed: false,
            },
        )
        .await?;
    let pid = match events.next().await {
        Some(Ok(ProcessEvent::Started { pid })) => pid,
        Some(Err(e)) => return Err(e.into()),
        _ => {
            return Err(ApiError::new(
                Code::Internal,
                "the terminal's process did not start",
            ))
        }
    };
    let tracked = table.started(api.tenant(), &id, pid, command, "terminal");
    let shell = Shell::new(pid, events, tracked);
    let pty = Pty { api, id, shells };
    let keep = q.keep;
    Ok(ws.on_upgrade(move |socket| pty.serve(socket, shell, keep)))
}

/// How long a shell that input can no longer reach gets to report its end.
const FINISH_WAIT: Duration = Duration::from_secs(2);

type PtySink = futures::stream::SplitSink<WebSocket, Message>;

/// The shell ended: its exit code is the socket's last frame.
async fn exited(mut tx: PtySink, mut shell: Shell, exit_code: i32) {
    use futures::SinkExt;
    if let Some(mut t) = shell.tracked.take() {
        t.exited(exit_code);
    }
    let end = serde_json::json!({ "exit_code": exit_code }).to_string();
    let _ = tx.send(Message::Text(end.into())).await;
    let _ = tx.close().await;
}

/// One terminal socket's side of a shell.
struct Pty {
    api: Arc<dyn crate::backend::TenantView>,
    id: String,
    shells: Arc<Shells>,
}

impl Pty {
    /// Serves `shell` on `socket` until the shell ends or the socket drops;
    /// then a `keep` shell is detached (kept for a re-attach), any other
    /// killed.
    async fn serve(self, socket: WebSocket, mut shell: Shell, keep: bool) {
        use futures::SinkExt;
        let (mut tx, mut rx) = socket.split();
        let mut hello = Ok(());
        if keep {
            let id = serde_json::json!({ "shell": shell.id }).to_string();
            hello = tx.send(Message::Text(id.into())).await;
            let replay = shell.tail.to_vec();
            if hello.is_ok() && !replay.is_empty() {
                hello = tx.send(Message::Binary(replay.into())).await;
            }
        }
        if hello.is_err() {
            return self.gone(shell, keep).await;
        }
        loop {
            tokio::select! {
                msg = rx.next() => match msg {
                    Some(Ok(Message::Binary(b))) => {
                        if self.api.write_stdin(&self.id, shell.pid, StdinInput::Data(b)).await.is_err() {
                            // Most often the shell has just exited and this
                            // input raced its end (`exit 4` then EOF): its
                            // exit code is on the way, so tell it first.
                            return self.finish(tx, shell).await;
                        }
                    }
                    Some(Ok(Message::Text(t))) => {
                        if let Ok(size) = serde_json::from_str::<ResizeRequest>(&t) {
                            let size = PtySize { cols: size.cols, rows: size.rows };
                            let _ = self.api.resize(&self.id, shell.pid, size).await;
                        }
                    }
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        return self.gone(shell, keep).await;
                    }
                    Some(Ok(_)) => {}
                },
                ev = shell.events.next() => match ev {
                    Some(Ok(ProcessEvent::Stdout { data } | ProcessEvent::Stderr { data })) => {
                        shell.tail.push(&data);
                        if tx.send(Message::Binary(data.into())).await.is_err() {
                            return self.gone(shell, keep).await;
                        }
                    }
                    Some(Ok(ProcessEvent::Exited { exit_code })) => {
                        return exited(tx, shell, exit_code).await;
                    }
                    Some(Ok(ProcessEvent::Started { .. })) => {}
                    Some(Err(e)) => {
                        let body = serde_json::to_string(&e.body()).unwrap_or_default();
                        let _ = tx.send(Message::Text(body.into())).await;
                        return;
                    }
                    None => return,
                },
            }
        }
    }

    /// Input can no longer reach the shell: pass on what it still says
    /// (its exit code, usually) for up to [`FINISH_WAIT`], then end it.
    async fn finish(self, mut tx: PtySink, mut shell: Shell) {
        use futures::SinkExt;
        let wait = tokio::time::sleep(FINISH_WAIT);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                ev = shell.events.next() => match ev {
                    Some(Ok(ProcessEvent::Stdout { data } | ProcessEvent::Stderr { data })) => {
                        if tx.send(Message::Binary(data.into())).await.is_err() {
                            break;
                        }
                    }
                    Some(Ok(ProcessEvent::Exited { exit_code })) => {
                        return exited(tx, shell, exit_code).await;
                    }
                    Some(Ok(ProcessEvent::Started { .. })) => {}
                    Some(Err(_)) | None => break,
                },
                _ = &mut wait => break,
            }
        }
        self.gone(shell, false).await
    }

    /// The socket went away: keep the shell for a re-attach, or kill it
    /// (the terminal's process goes with its client).
    async fn gone(self, shell: Shell, keep: bool) {
        if keep {
            self.shells.detach(self.api, self.id, shell);
        } else {
            let _ = self.api.signal(&self.id, shell.pid, Signal::Sigkill).await;
        }
    }
}
