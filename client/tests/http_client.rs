//! `HubClient` against a stub hub: an axum server in this file that
//! answers the hub's routes with canned bodies and records every request,
//! so the tests can check what went on the wire (method, raw path, query,
//! auth, body) and how answers, errors and streams are decoded. The real
//! hub's integration tests run through `HubClient` as well.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Json, Router,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{
        Command, CreateSandbox, ExecRequest, ExecResult, ForkRequest, Launch, NamedTemplate, Pool,
        PoolList, PoolSpec, Sandbox, SandboxList, SandboxState, Snapshot, Template, TemplateList,
    },
    sandboxd::{DirectoryListing, EntryType, FileEntry},
};
use sandhub_client::{
    http::HubClient, ByteStream, Error, ProcessEvent, PtySize, Sandboxes, Signal, StartProcess,
    StdinInput, WatchKind, WriteOptions,
};
use tokio::sync::{mpsc, Notify};

const KEY: &str = "key-1";
const ID: &str = "sb-1";
const WAIT: Duration = Duration::from_secs(10);

/// One request as the stub saw it. `path` is the raw, still-encoded path.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: Option<String>,
    auth: Option<String>,
    content_type: Option<String>,
    accept: Option<String>,
    chunked: bool,
    body: Vec<u8>,
}

#[derive(Default)]
struct Hub {
    seen: Mutex<Vec<Seen>>,
    /// The download waits on this after its first chunk.
    download_gate: Notify,
    /// Fired when an upload's first chunk arrived.
    upload_started: Notify,
    /// Fired when stdin was written; the process stream then exits.
    stdin_written: Notify,
}

impl Hub {
    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("no request")
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn stub() -> (HubClient, Arc<Hub>) {
    let hub = Arc::new(Hub::default());
    let app = Router::new().fallback(handle).with_state(hub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = HubClient::new(format!("http://{addr}/"), Some(KEY.into())).unwrap();
    (client, hub)
}

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("did not finish in time")
}

fn sandbox(id: &str, labels: BTreeMap<String, String>) -> Sandbox {
    Sandbox {
        id: id.into(),
        template: "default".into(),
        state: SandboxState::Ready,
        labels,
        launch: Launch::Cold,
        created_at: "2026-01-01T00:00:00Z".into(),
        shutdown_at: None,
        idle_timeout_seconds: None,
        idle_action: None,
        auto_resume: false,
        pool: None,
        forked_from: None,
        entrypoint: None,
        egress: None,
        network: None,
        usage: None,
    }
}

fn error(code: Code, message: &str) -> Response {
    let status = StatusCode::from_u16(code.http_status()).unwrap();
    (status, Json(ErrorBody::new(code, message))).into_response()
}

fn header_of(req: &Request, name: header::HeaderName) -> Option<String> {
    req.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

/// A body sent in the given pieces, each its own write.
fn pieces(parts: Vec<&'static str>) -> Body {
    Body::from_stream(futures::stream::iter(
        parts
            .into_iter()
            .map(|p| Ok::<_, std::io::Error>(Bytes::from_static(p.as_bytes()))),
    ))
}

/// A body fed by a task, so the stub can pause mid-stream.
fn channel_body() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    (tx, Body::from_stream(stream))
}

async fn handle(State(hub): State<Arc<Hub>>, req: Request) -> Response {
    let mut seen = Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        query: req.uri().query().map(str::to_string),
        auth: header_of(&req, header::AUTHORIZATION),
        content_type: header_of(&req, header::CONTENT_TYPE),
        accept: header_of(&req, header::ACCEPT),
        chunked: header_of(&req, header::TRANSFER_ENCODING).as_deref() == Some("chunked"),
        body: Vec::new(),
    };
    if seen.auth.as_deref() != Some(&format!("Bearer {KEY}")) {
        hub.seen.lock().unwrap().push(seen);
        return error(Code::Unauthenticated, "missing or wrong API key");
    }
    let mut body = req.into_body().into_data_stream();
    // Uploads are read piece by piece, to prove they arrive as a stream.
    if seen.method == "PUT" && seen.path.contains("/files/gated") {
        let first = body.next().await.unwrap().unwrap();
        hub.upload_started.notify_one();
        seen.body.extend_from_slice(&first);
    }
    while let Some(chunk) = body.next().await {
        seen.body.extend_from_slice(&chunk.unwrap());
    }
    hub.seen.lock().unwrap().push(seen.clone());
    route(&hub, &seen).await
}

async fn route(hub: &Arc<Hub>, seen: &Seen) -> Response {
    let segments: Vec<&str> = seen.path.trim_start_matches('/').split('/').collect();
    let json_body =
        |seen: &Seen| -> serde_json::Value { serde_json::from_slice(&seen.body).unwrap() };
    match (seen.method.as_str(), segments.as_slice()) {
        ("POST", ["v1", "sandboxes"]) => {
            let req: CreateSandbox = serde_json::from_slice(&seen.body).unwrap();
            (StatusCode::CREATED, Json(sandbox(ID, req.labels))).into_response()
        }
        ("GET", ["v1", "sandboxes"]) => Json(SandboxList {
            sandboxes: vec![
                sandbox(ID, BTreeMap::new()),
                sandbox("sb-2", BTreeMap::new()),
            ],
        })
        .into_response(),
        (_, ["v1", "sandboxes", "proxy-fail", ..]) => {
            (StatusCode::BAD_GATEWAY, "upstream went away").into_response()
        }
        (_, ["v1", "sandboxes", "garbled", ..]) => (StatusCode::OK, "{not json").into_response(),
        (_, ["v1", "sandboxes", id, ..]) if *id != ID => {
            error(Code::NotFound, &format!("sandbox {id} not found"))
        }
        ("GET", ["v1", "sandboxes", _]) => Json(sandbox(ID, BTreeMap::new())).into_response(),
        ("DELETE", ["v1", "sandboxes", _]) => StatusCode::NO_CONTENT.into_response(),
        ("POST", ["v1", "sandboxes", _, "exec"]) => {
            let req: ExecRequest = serde_json::from_slice(&seen.body).unwrap();
            Json(ExecResult {
                exit_code: 7,
                stdout: req.command.argv().join(" "),
                stderr: req.stdin,
                timed_out: false,
            })
            .into_response()
        }
        ("POST", ["v1", "sandboxes", _, "processes"]) => process_stream(hub, json_body(seen)),
        ("POST", ["v1", "sandboxes", _, "processes", "42", "stdin"]) => {
            hub.stdin_written.notify_one();
            StatusCode::NO_CONTENT.into_response()
        }
        ("POST", ["v1", "sandboxes", _, "processes", "42", "signal" | "resize"]) => {
            StatusCode::NO_CONTENT.into_response()
        }
        ("POST", ["v1", "sandboxes", _, "processes", _, _]) => {
            error(Code::NotFound, "no such process")
        }
        (_, ["v1", "sandboxes", _, "files", rest @ ..]) => files(hub, seen, &rest.join("/")),
        ("GET", ["v1", "sandboxes", _, "watch"]) => watch_stream(seen),
        ("POST", ["v1", "sandboxes", _, "suspend"]) => {
            let mut s = sandbox(ID, BTreeMap::new());
            s.state = SandboxState::Suspended;
            Json(s).into_response()
        }
        ("POST", ["v1", "sandboxes", _, "pause"]) => {
            let mut s = sandbox(ID, BTreeMap::new());
            s.state = SandboxState::Paused;
            Json(s).into_response()
        }
        ("POST", ["v1", "sandboxes", _, "resume" | "reset"]) => {
            Json(sandbox(ID, BTreeMap::new())).into_response()
        }
        ("POST", ["v1", "sandboxes", _, "snapshots"]) => (
            StatusCode::CREATED,
            Json(Snapshot {
                id: "snap-1".into(),
                sandbox_id: ID.into(),
                created_at: "2026-01-01T00:00:01Z".into(),
                size_bytes: Some(4096),
            }),
        )
            .into_response(),
        ("DELETE", ["v1", "sandboxes", _, "snapshots", _]) => {
            StatusCode::NO_CONTENT.into_response()
        }
        ("POST", ["v1", "sandboxes", _, "fork"]) => {
            let req: ForkRequest = serde_json::from_slice(&seen.body).unwrap();
            let mut s = sandbox("sb-fork", req.labels);
            s.forked_from = req.snapshot;
            (StatusCode::CREATED, Json(s)).into_response()
        }
        ("PUT", ["v1", "templates", name]) => {
            let template: Template = serde_json::from_slice(&seen.body).unwrap();
            Json(NamedTemplate {
                name: name.to_string(),
                template,
            })
            .into_response()
        }
        ("GET", ["v1", "templates", "missing"]) => error(Code::NotFound, "no template missing"),
        ("GET", ["v1", "templates", name]) => Json(NamedTemplate {
            name: name.to_string(),
            template: Template::default(),
        })
        .into_response(),
        ("GET", ["v1", "templates"]) => Json(TemplateList {
            templates: vec![NamedTemplate {
                name: "default".into(),
                template: Template::default(),
            }],
        })
        .into_response(),
        ("PUT", ["v1", "pools", name]) => {
            let spec: PoolSpec = serde_json::from_slice(&seen.body).unwrap();
            Json(pool(name, spec.replicas)).into_response()
        }
        ("GET", ["v1", "pools", name]) => Json(pool(name, 2)).into_response(),
        ("GET", ["v1", "pools"]) => Json(PoolList {
            pools: vec![pool("warm", 2)],
        })
        .into_response(),
        ("DELETE", ["v1", "templates" | "pools", _]) => StatusCode::NO_CONTENT.into_response(),
        _ => error(Code::NotFound, &format!("no route for {}", seen.path)),
    }
}

fn pool(name: &str, replicas: u32) -> Pool {
    Pool {
        name: name.into(),
        template: "default".into(),
        replicas,
        ready: replicas,
        total: replicas,
        last_error: None,
    }
}

/// NDJSON, with lines split across writes. `cat` waits for stdin before
/// exiting; `fail` ends with an error line; `truncate` ends without exit.
fn process_stream(hub: &Arc<Hub>, request: serde_json::Value) -> Response {
    let program = request["command"][0].as_str().unwrap_or("").to_string();
    let (tx, body) = channel_body();
    let hub = hub.clone();
    tokio::spawn(async move {
        let send = |s: &'static str| tx.send(Bytes::from_static(s.as_bytes()));
        send("{\"type\":\"started\",").await.unwrap();
        send("\"pid\":42}\n{\"type\":\"stdout\",\"data\":\"aGVs")
            .await
            .unwrap();
        send("bG8=\"}\r\n\n{\"type\":\"stderr\",\"data\":\"AP8=\"}\n")
            .await
            .unwrap();
        match program.as_str() {
            "cat" => {
                hub.stdin_written.notified().await;
                send("{\"type\":\"exited\",\"exit_code\":0}").await.unwrap();
            }
            "fail" => {
                send("{\"code\":\"UNAVAILABLE\",\"message\":\"sandbox lost\"}\n")
                    .await
                    .unwrap();
            }
            _ => {}
        }
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

fn watch_stream(seen: &Seen) -> Response {
    if seen.query.as_deref() == Some("path=full&recursive=false") {
        let body = pieces(vec![
            "event: error\ndata: {\"code\":\"RESOURCE_EXHAUSTED\",",
            "\"message\":\"too many watches\"}\n\n",
        ]);
        return ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    }
    let body = pieces(vec![
        ": connected\n\n",
        "data: [{\"type\":\"CREATE\",\"path\":\"/src/a.rs\",\"is_dir\":false,",
        "\"timestamp_ms\":1}]\n\ndata: [{\"type\":\"RENAME\",\"path\":\"/src/b\",",
        "\"old_path\":\"/src/b\",\"is_dir\":true,\"timestamp_ms\":2},\r\n",
        "data: {\"type\":\"WRITE\",\"path\":\"/src/c\",\"is_dir\":false,\"timestamp_ms\":3}]\r\n\r\n",
    ]);
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

fn entry(name: &str, kind: EntryType) -> FileEntry {
    FileEntry {
        name: name.into(),
        size: if kind == EntryType::File { 5 } else { 0 },
        kind,
        modified_at: "2026-01-01T00:00:00Z".into(),
        mode: "0644".into(),
    }
}

/// A tiny tree: `dir x/`, `dir x/q?a.txt`, `top.txt`, and `gated` files.
fn files(hub: &Arc<Hub>, seen: &Seen, rest: &str) -> Response {
    let listing = |path: &str, entries: Vec<FileEntry>| {
        Json(DirectoryListing {
            path: path.into(),
            entries,
        })
        .into_response()
    };
    let is_dir = seen.query.as_deref() == Some("type=directory");
    match (seen.method.as_str(), rest) {
        ("GET", "") if is_dir => listing(
            "/",
            vec![
                entry("dir x", EntryType::Directory),
                entry("top.txt", EntryType::File),
            ],
        ),
        ("GET", "dir%20x") if is_dir => listing("/dir x", vec![entry("q?a.txt", EntryType::File)]),
        ("HEAD", "" | "dir%20x" | "dir%20x/q%3Fa.txt" | "top.txt") => {
            StatusCode::OK.into_response()
        }
        ("GET", "gated.bin") => {
            let (tx, body) = channel_body();
            let hub = hub.clone();
            tokio::spawn(async move {
                tx.send(Bytes::from_static(b"first,")).await.unwrap();
                hub.download_gate.notified().await;
                tx.send(Bytes::from_static(b"second")).await.unwrap();
            });
            body.into_response()
        }
        ("PUT" | "DELETE", _) => StatusCode::NO_CONTENT.into_response(),
        // HEAD answers carry no body; the status is all a client gets.
        ("HEAD", _) => StatusCode::NOT_FOUND.into_response(),
        _ => error(Code::NotFound, &format!("/{rest}: no such file")),
    }
}

async fn next(events: &mut sandhub_client::ProcessEvents) -> ProcessEvent {
    within(events.next()).await.unwrap().unwrap()
}

fn code<T: std::fmt::Debug>(r: Result<T, Error>) -> Code {
    r.expect_err("expected an error").code
}

#[tokio::test]
async fn sandboxes_crud_against_stub_hub() {
    let (c, hub) = stub().await;
    let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
    let created = c
        .create(CreateSandbox {
            template: Some("py".into()),
            labels: labels.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((created.id.as_str(), &created.labels), (ID, &labels));
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/v1/sandboxes")
    );
    assert_eq!(seen.auth.as_deref(), Some("Bearer key-1"));
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&seen.body).unwrap(),
        serde_json::json!({"template": "py", "labels": {"app": "web"}})
    );

    assert_eq!(c.get(ID).await.unwrap().id, ID);
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1");

    assert_eq!(c.list(&BTreeMap::new()).await.unwrap().len(), 2);
    assert_eq!(hub.last().query, None);
    let filter = BTreeMap::from([
        ("app".to_string(), "web".to_string()),
        ("team/x".to_string(), "a b".to_string()),
    ]);
    c.list(&filter).await.unwrap();
    assert_eq!(
        hub.last().query.as_deref(),
        Some("labels=app=web,team%2Fx=a%20b")
    );

    c.delete(ID).await.unwrap();
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("DELETE", "/v1/sandboxes/sb-1")
    );
}

#[tokio::test]
async fn errors_decode_against_stub_hub() {
    let (c, hub) = stub().await;
    let e = c.get("nope").await.unwrap_err();
    assert_eq!(e, Error::new(Code::NotFound, "sandbox nope not found"));
    // Ids are path segments: nothing in one can reach another route.
    assert_eq!(code(c.get("a/b?c").await), Code::NotFound);
    assert_eq!(hub.last().path, "/v1/sandboxes/a%2Fb%3Fc");

    let e = c.get("proxy-fail").await.unwrap_err();
    assert_eq!(e.code, Code::Unavailable);
    assert!(e.message.contains("upstream went away"), "{e}");
    assert_eq!(code(c.get("garbled").await), Code::Internal);

    let anonymous = HubClient::new(c.base_url(), None).unwrap();
    assert_eq!(code(anonymous.get(ID).await), Code::Unauthenticated);
    assert_eq!(hub.last().auth, None);

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let gone = HubClient::new(format!("http://127.0.0.1:{port}"), None).unwrap();
    assert_eq!(code(gone.get(ID).await), Code::Unavailable);
    assert_eq!(code(gone.list_templates().await), Code::Unavailable);
}

#[tokio::test]
async fn exec_and_process_control_against_stub_hub() {
    let (c, hub) = stub().await;
    let r = c
        .exec(
            ID,
            ExecRequest {
                command: Command::Shell("echo hi".into()),
                env: BTreeMap::from([("K".to_string(), "V".to_string())]),
                cwd: "src".into(),
                timeout_seconds: Some(5.0),
                stdin: "input".into(),
                container: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 7);
    assert_eq!(r.stdout, "/bin/sh -c echo hi");
    assert_eq!(r.stderr, "input");
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/exec");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&seen.body).unwrap(),
        serde_json::json!({"command": "echo hi", "env": {"K": "V"}, "cwd": "src",
                           "timeout_seconds": 5.0, "stdin": "input"})
    );

    let mut events = c
        .start(
            ID,
            StartProcess {
                command: vec!["cat".into()],
                pty: Some(PtySize { cols: 80, rows: 24 }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/processes");
    assert_eq!(seen.accept.as_deref(), Some("application/x-ndjson"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&seen.body).unwrap(),
        serde_json::json!({"command": ["cat"], "pty": {"cols": 80, "rows": 24}})
    );
    assert_eq!(next(&mut events).await, ProcessEvent::Started { pid: 42 });
    assert_eq!(
        next(&mut events).await,
        ProcessEvent::Stdout {
            data: b"hello".to_vec()
        }
    );
    assert_eq!(
        next(&mut events).await,
        ProcessEvent::Stderr { data: vec![0, 255] }
    );
    // The stream is live: the exit only comes after this write.
    c.write_stdin(ID, 42, StdinInput::Data(Bytes::from_static(b"\x00raw\xff")))
        .await
        .unwrap();
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/processes/42/stdin");
    assert_eq!(seen.query, None);
    assert_eq!(seen.body, b"\x00raw\xff");
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(
        next(&mut events).await,
        ProcessEvent::Exited { exit_code: 0 }
    );
    assert!(within(events.next()).await.is_none());

    // Large writes go out in pieces the hub accepts, in order.
    let before = hub.all().len();
    let big: Vec<u8> = (0..=255u8).cycle().take(1_300_000).collect();
    c.write_stdin(ID, 42, StdinInput::Data(Bytes::from(big.clone())))
        .await
        .unwrap();
    let pieces: Vec<Seen> = hub.all()[before..].to_vec();
    assert_eq!(pieces.len(), 3);
    assert!(pieces.iter().all(|p| p.body.len() <= 512 * 1024));
    let joined: Vec<u8> = pieces.iter().flat_map(|p| p.body.clone()).collect();
    assert_eq!(joined, big);

    c.write_stdin(ID, 42, StdinInput::Eof).await.unwrap();
    let seen = hub.last();
    assert_eq!(seen.query.as_deref(), Some("eof=true"));
    assert!(seen.body.is_empty());

    c.signal(ID, 42, Signal::Sigterm).await.unwrap();
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/processes/42/signal");
    assert_eq!(seen.body, br#"{"signal":"SIGTERM"}"#);
    c.resize(
        ID,
        42,
        PtySize {
            cols: 120,
            rows: 40,
        },
    )
    .await
    .unwrap();
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/processes/42/resize");
    assert_eq!(seen.body, br#"{"cols":120,"rows":40}"#);
    assert_eq!(code(c.signal(ID, 7, Signal::Sigkill).await), Code::NotFound);
}

#[tokio::test]
async fn process_stream_failures_against_stub_hub() {
    let (c, _hub) = stub().await;
    let start = |program: &str| {
        c.start(
            ID,
            StartProcess {
                command: vec![program.into()],
                ..Default::default()
            },
        )
    };
    let events: Vec<_> = within(start("fail").await.unwrap().collect()).await;
    assert_eq!(events.len(), 4);
    assert_eq!(
        events[3].as_ref().unwrap_err(),
        &Error::new(Code::Unavailable, "sandbox lost")
    );
    let events: Vec<_> = within(start("truncate").await.unwrap().collect()).await;
    assert_eq!(events.len(), 4);
    assert_eq!(events[3].as_ref().unwrap_err().code, Code::Unavailable);
    assert_eq!(
        code(c.start("missing", StartProcess::default()).await.map(drop)),
        Code::NotFound
    );
}

#[tokio::test]
async fn files_against_stub_hub() {
    let (c, hub) = stub().await;

    // Downloads stream: the first chunk arrives before the rest exists.
    let mut stream = c.read_file(ID, "gated.bin").await.unwrap();
    assert_eq!(within(stream.next()).await.unwrap().unwrap(), "first,");
    hub.download_gate.notify_one();
    let rest: Vec<Bytes> = within(stream.try_collect()).await.unwrap();
    assert_eq!(rest.concat(), b"second");
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1/files/gated.bin");
    assert_eq!(hub.last().query.as_deref(), Some("type=file"));

    // Uploads stream too: the second chunk is made only after the stub
    // has received the first, so a buffering client would hang here.
    let gate = hub.clone();
    let upload: ByteStream = Box::pin(
        futures::stream::iter([Ok(Bytes::from_static(b"one,"))]).chain(futures::stream::once(
            async move {
                gate.upload_started.notified().await;
                Ok(Bytes::from_static(b"two"))
            },
        )),
    );
    let options = WriteOptions {
        append: true,
        mode: Some(0o600),
    };
    within(c.write_file(ID, "gated/out.txt", upload, options))
        .await
        .unwrap();
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("PUT", "/v1/sandboxes/sb-1/files/gated/out.txt")
    );
    assert_eq!(seen.query.as_deref(), Some("append=true&mode=0600"));
    assert_eq!(seen.body, b"one,two");
    assert!(seen.chunked);
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/octet-stream")
    );

    sandhub_client::write_bytes(&c, ID, "/dir x/q?a.txt", "abc", WriteOptions::default())
        .await
        .unwrap();
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/files/dir%20x/q%3Fa.txt");
    assert_eq!(seen.query, None);

    let root = c.list_files(ID, "/").await.unwrap();
    assert_eq!(root.entries.len(), 2);
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/files/");
    assert_eq!(seen.query.as_deref(), Some("type=directory"));
    assert_eq!(code(c.list_files(ID, "nope").await), Code::NotFound);

    let before = hub.all().len();
    let found = c.stat(ID, "dir x/q?a.txt").await.unwrap().unwrap();
    assert_eq!(
        (found.name.as_str(), found.kind),
        ("q?a.txt", EntryType::File)
    );
    let calls: Vec<_> = hub.all()[before..]
        .iter()
        .map(|s| {
            format!(
                "{} {}?{}",
                s.method,
                s.path,
                s.query.clone().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            "HEAD /v1/sandboxes/sb-1/files/dir%20x/q%3Fa.txt?",
            "GET /v1/sandboxes/sb-1/files/dir%20x?type=directory"
        ]
    );
    let dir = c.stat(ID, "dir x").await.unwrap().unwrap();
    assert_eq!(dir.kind, EntryType::Directory);
    let root = c.stat(ID, "").await.unwrap().unwrap();
    assert_eq!((root.name.as_str(), root.kind), ("/", EntryType::Directory));
    assert_eq!(c.stat(ID, "dir x/missing").await.unwrap(), None);
    // A bodiless 404 must not turn a missing sandbox into a missing file.
    assert_eq!(code(c.stat("other", "top.txt").await), Code::NotFound);

    c.delete_file(ID, "dir x", true).await.unwrap();
    let seen = hub.last();
    assert_eq!(
        (
            seen.method.as_str(),
            seen.path.as_str(),
            seen.query.as_deref()
        ),
        (
            "DELETE",
            "/v1/sandboxes/sb-1/files/dir%20x",
            Some("recursive=true")
        )
    );
    c.delete_file(ID, "top.txt", false).await.unwrap();
    assert_eq!(hub.last().query, None);
    assert_eq!(
        code(c.read_file(ID, "missing").await.map(drop)),
        Code::NotFound
    );
}

#[tokio::test]
async fn watch_sse_against_stub_hub() {
    let (c, hub) = stub().await;
    let batches: Vec<_> = within(c.watch(ID, "src/main", true).await.unwrap().collect()).await;
    let seen = hub.last();
    assert_eq!(seen.path, "/v1/sandboxes/sb-1/watch");
    assert_eq!(
        seen.query.as_deref(),
        Some("path=src%2Fmain&recursive=true")
    );
    assert_eq!(seen.accept.as_deref(), Some("text/event-stream"));
    assert_eq!(batches.len(), 2);
    let first = batches[0].as_ref().unwrap();
    assert_eq!(
        (first[0].kind, first[0].path.as_str()),
        (WatchKind::Create, "/src/a.rs")
    );
    let second = batches[1].as_ref().unwrap();
    assert_eq!(second.len(), 2);
    assert_eq!(
        (second[0].kind, second[0].old_path.as_str()),
        (WatchKind::Rename, "/src/b")
    );
    assert!(second[0].is_dir);
    assert_eq!(second[1].kind, WatchKind::Write);

    let batches: Vec<_> = within(c.watch(ID, "full", false).await.unwrap().collect()).await;
    assert_eq!(batches.len(), 1);
    assert_eq!(
        batches[0].as_ref().unwrap_err(),
        &Error::new(Code::ResourceExhausted, "too many watches")
    );
    assert_eq!(
        code(c.watch("other", "", true).await.map(drop)),
        Code::NotFound
    );
}

#[tokio::test]
async fn lifecycle_templates_pools_against_stub_hub() {
    let (c, hub) = stub().await;
    assert_eq!(c.suspend(ID).await.unwrap().state, SandboxState::Suspended);
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1/suspend");
    c.resume(ID).await.unwrap();
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1/resume");
    assert_eq!(c.pause(ID).await.unwrap().state, SandboxState::Paused);
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1/pause");
    c.reset(ID).await.unwrap();
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1/reset");
    assert_eq!(c.snapshot(ID).await.unwrap().id, "snap-1");
    assert_eq!(hub.last().path, "/v1/sandboxes/sb-1/snapshots");
    let fork = c
        .fork(
            ID,
            ForkRequest {
                snapshot: Some("snap-1".into()),
                labels: BTreeMap::from([("k".to_string(), "v".to_string())]),
            },
        )
        .await
        .unwrap();
    assert_eq!(fork.forked_from.as_deref(), Some("snap-1"));
    assert_eq!(
        hub.last().body,
        br#"{"snapshot":"snap-1","labels":{"k":"v"}}"#
    );
    for seen in hub.all() {
        assert_eq!(seen.method, "POST");
    }
    c.delete_snapshot(ID, "snap-1").await.unwrap();
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("DELETE", "/v1/sandboxes/sb-1/snapshots/snap-1")
    );

    let template = Template {
        memory_mb: Some(512),
        ..Default::default()
    };
    let named = c.put_template("py", template.clone()).await.unwrap();
    assert_eq!((named.name.as_str(), &named.template), ("py", &template));
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("PUT", "/v1/templates/py")
    );
    assert_eq!(c.get_template("py").await.unwrap().name, "py");
    assert_eq!(code(c.get_template("missing").await), Code::NotFound);
    assert_eq!(c.list_templates().await.unwrap()[0].name, "default");
    c.delete_template("py").await.unwrap();
    assert_eq!(hub.last().method, "DELETE");

    let pool = c
        .put_pool(
            "warm",
            PoolSpec {
                template: "py".into(),
                replicas: 3,
            },
        )
        .await
        .unwrap();
    assert_eq!(pool.replicas, 3);
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("PUT", "/v1/pools/warm")
    );
    assert_eq!(seen.body, br#"{"template":"py","replicas":3}"#);
    assert_eq!(c.get_pool("warm").await.unwrap().name, "warm");
    assert_eq!(c.list_pools().await.unwrap().len(), 1);
    c.delete_pool("warm").await.unwrap();
    let seen = hub.last();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("DELETE", "/v1/pools/warm")
    );
}
