//! `SandboxdClient` against the real sandboxd binary, over a Unix socket
//! directory and over TCP, every method on both.
//!
//! The binary is `<target>/debug/sandboxd` (`cargo build -p sandboxd --bin
//! sandboxd`); without it the tests are skipped, unless `CI=true`.

use std::{
    collections::BTreeMap,
    future::Future,
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sandhub_api::{
    error::Code,
    hub::{Command as Cmd, ExecRequest},
    sandboxd::EntryType,
};
use sandhub_client::{
    sandboxd::{KeptEvent, KeptEvents, SandboxdClient},
    ByteStream, Error, ProcessEvent, ProcessEvents, PtySize, Signal, StartProcess, StdinInput,
    WatchKind, WriteOptions,
};

const WAIT: Duration = Duration::from_secs(20);

fn binary() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug/sandboxd");
    if path.exists() {
        return Some(path);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{} is missing; run `cargo build -p sandboxd --bin sandboxd` first",
            path.display()
        );
    }
    eprintln!(
        "skipping: {} is missing (cargo build -p sandboxd --bin sandboxd)",
        path.display()
    );
    None
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Unix,
    Tcp,
}

struct Daemon {
    child: Child,
    root: tempfile::TempDir,
    _sockets: tempfile::TempDir,
    client: SandboxdClient,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Daemon {
    async fn start(transport: Transport, extra: &[&str]) -> Option<Daemon> {
        let binary = binary()?;
        let root = tempfile::tempdir().unwrap();
        let sockets = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg("--root-dir")
            .arg(root.path())
            .args(["--legacy-port", "0"])
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("SANDBOXD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        let client = match transport {
            Transport::Unix => {
                cmd.arg("--unix-socket").arg(sockets.path());
                SandboxdClient::unix(sockets.path())
            }
            Transport::Tcp => {
                let (rest, grpc) = (free_port(), free_port());
                cmd.args(["--listen-host", "127.0.0.1"])
                    .args(["--rest-port", &rest.to_string()])
                    .args(["--grpc-port", &grpc.to_string()]);
                SandboxdClient::tcp(
                    format!("http://127.0.0.1:{rest}"),
                    format!("http://127.0.0.1:{grpc}"),
                )
                .unwrap()
            }
        };
        let child = cmd.spawn().expect("spawning sandboxd");
        let daemon = Daemon {
            child,
            root,
            _sockets: sockets,
            client,
        };
        daemon.wait_ready().await;
        Some(daemon)
    }

    /// Health answers without a token, so readiness needs none.
    async fn wait_ready(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.client.health().await {
                Ok(h) => {
                    assert_eq!(h.status, "ok");
                    return;
                }
                Err(e) => {
                    assert!(Instant::now() < deadline, "sandboxd never got ready: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("did not finish in time")
}

fn exec(command: Cmd) -> ExecRequest {
    ExecRequest {
        command,
        env: BTreeMap::new(),
        cwd: String::new(),
        timeout_seconds: None,
        stdin: String::new(),
        container: None,
    }
}

fn argv(words: &[&str]) -> Cmd {
    Cmd::Argv(words.iter().map(|s| s.to_string()).collect())
}

fn sh(script: &str) -> Cmd {
    Cmd::Shell(script.to_string())
}

fn chunks(parts: Vec<Vec<u8>>) -> ByteStream {
    Box::pin(futures::stream::iter(
        parts.into_iter().map(|p| Ok(Bytes::from(p))),
    ))
}

async fn write(c: &SandboxdClient, path: &str, data: &[u8], options: WriteOptions) {
    within(c.write_file(path, chunks(vec![data.to_vec()]), options))
        .await
        .unwrap_or_else(|e| panic!("writing {path}: {e}"));
}

async fn read(c: &SandboxdClient, path: &str) -> Result<Vec<u8>, Error> {
    let stream = within(c.read_file(path)).await?;
    let parts: Vec<Bytes> = within(stream.try_collect()).await?;
    Ok(parts.concat())
}

async fn next(events: &mut ProcessEvents) -> ProcessEvent {
    within(events.next())
        .await
        .expect("stream ended early")
        .expect("stream failed")
}

/// Reads events until the output holds `needle`; returns all output so far.
async fn output_until(events: &mut ProcessEvents, needle: &str) -> String {
    let mut out = Vec::new();
    loop {
        match next(events).await {
            ProcessEvent::Stdout { data } | ProcessEvent::Stderr { data } => {
                out.extend_from_slice(&data);
                let text = String::from_utf8_lossy(&out);
                if text.contains(needle) {
                    return text.into_owned();
                }
            }
            other => panic!("waiting for {needle:?}, got {other:?} after {out:?}"),
        }
    }
}

/// Skips output up to the exit event, which must be the last.
async fn exit_code(events: &mut ProcessEvents) -> i32 {
    loop {
        if let ProcessEvent::Exited { exit_code } = next(events).await {
            assert!(within(events.next()).await.is_none(), "events after exit");
            return exit_code;
        }
    }
}

async fn started(events: &mut ProcessEvents) -> i32 {
    match next(events).await {
        ProcessEvent::Started { pid } => pid,
        other => panic!("first event is not Started: {other:?}"),
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, Error>) -> Code {
    r.expect_err("expected an error").code
}

/// One test per transport for each scenario.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn unix() {
                if let Some(d) = Daemon::start(Transport::Unix, &[]).await {
                    super::$name(&d).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tcp() {
                if let Some(d) = Daemon::start(Transport::Tcp, &[]).await {
                    super::$name(&d).await;
                }
            }
        }
    )*};
}

both!(
    exec_runs_commands,
    exec_feeds_stdin_and_times_out,
    start_streams_stdin_signals_and_exit,
    pty_resizes,
    files_round_trip,
    list_and_stat,
    delete_files,
    watch_reports_creates,
    errors_map_to_codes,
    kept_processes_outlive_their_stream,
    stdin_closed_at_start,
    exec_goes_over_rest,
    concurrent_execs_beyond_the_cap_share_grpc,
);

/// At most `MAX_REST_EXECS` unary execs hold REST connections at once; the
/// rest go over gRPC's one multiplexed connection, and all of them finish.
async fn concurrent_execs_beyond_the_cap_share_grpc(d: &Daemon) {
    use sandhub_client::sandboxd::MAX_REST_EXECS;
    let c = &d.client;
    let extra = 4;
    let runs = (0..MAX_REST_EXECS + extra).map(|i| async move {
        let r = within(c.exec(exec(sh(&format!("sleep 1; echo {i}")))))
            .await
            .unwrap();
        assert_eq!((r.exit_code, r.stdout.trim()), (0, i.to_string().as_str()));
    });
    futures::future::join_all(runs).await;
    let text = metrics(c).await;
    assert!(
        text.contains(&format!(
            r#"sandboxd_http_requests_total{{method="POST",code="200"}} {MAX_REST_EXECS}"#
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            r#"sandboxd_grpc_requests_total{{method="/process.v1.ProcessService/Execute",code="Ok"}} {extra}"#
        )),
        "{text}"
    );
}

/// sandboxd's `/metrics` text, through the client's own REST connection.
async fn metrics(c: &SandboxdClient) -> String {
    let response = c
        .forward(
            http::Method::GET,
            "/metrics",
            http::HeaderMap::new(),
            http_body_util::Empty::<Bytes>::new(),
        )
        .await
        .unwrap();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// A unary exec is one REST request (`EXECUTE_ROUTE`), no gRPC call.
async fn exec_goes_over_rest(d: &Daemon) {
    let c = &d.client;
    for _ in 0..3 {
        let r = within(c.exec(exec(argv(&["true"])))).await.unwrap();
        assert_eq!(r.exit_code, 0);
    }
    let text = metrics(c).await;
    assert!(
        text.contains(r#"sandboxd_http_requests_total{method="POST",code="200"} 3"#),
        "{text}"
    );
    assert!(!text.contains("ProcessService/Execute"), "{text}");
}

/// Where sandboxd has no REST execute route (here: its legacy runtime's
/// port, which has none, standing in for an older or upstream sandboxd's
/// REST port), the client says so once and uses gRPC from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_falls_back_to_grpc_where_the_route_is_missing() {
    let Some(binary) = binary() else { return };
    let root = tempfile::tempdir().unwrap();
    let (rest, grpc, legacy) = (free_port(), free_port(), free_port());
    let child = Command::new(binary)
        .arg("--root-dir")
        .arg(root.path())
        .args(["--listen-host", "127.0.0.1"])
        .args(["--rest-port", &rest.to_string()])
        .args(["--grpc-port", &grpc.to_string()])
        .args(["--legacy-port", &legacy.to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let daemon = Daemon {
        child,
        root,
        _sockets: tempfile::tempdir().unwrap(),
        client: SandboxdClient::tcp(
            format!("http://127.0.0.1:{rest}"),
            format!("http://127.0.0.1:{grpc}"),
        )
        .unwrap(),
    };
    daemon.wait_ready().await;
    let routeless = SandboxdClient::tcp(
        format!("http://127.0.0.1:{legacy}"),
        format!("http://127.0.0.1:{grpc}"),
    )
    .unwrap();
    for _ in 0..2 {
        let r = within(routeless.exec(exec(sh("echo via grpc"))))
            .await
            .unwrap();
        assert_eq!((r.exit_code, r.stdout.as_str()), (0, "via grpc\n"));
    }
    // A missing executable stays the command's NOT_FOUND on both paths.
    let missing = within(routeless.exec(exec(argv(&["/no/such/program"])))).await;
    assert_eq!(code(missing), Code::NotFound);
    let missing = within(daemon.client.exec(exec(argv(&["/no/such/program"])))).await;
    assert_eq!(code(missing), Code::NotFound);
    let text = metrics(&daemon.client).await;
    assert!(
        text.contains(
            r#"sandboxd_grpc_requests_total{method="/process.v1.ProcessService/Execute",code="Ok"} 2"#
        ),
        "{text}"
    );
}

/// `stdin_closed` on both starts: `process.v1` (upstream's contract, where
/// the client sends the EOF after `init`) and `keep.v1` (sandboxd closes
/// the pipe itself). `cat` ends only when its stdin does.
async fn stdin_closed_at_start(d: &Daemon) {
    let c = &d.client;
    let request = || StartProcess {
        command: vec!["/bin/sh".into(), "-c".into(), "cat; echo done".into()],
        stdin_closed: true,
        ..Default::default()
    };
    let mut events = within(c.start(request())).await.unwrap();
    started(&mut events).await;
    assert_eq!(output_until(&mut events, "done").await, "done\n");
    assert_eq!(exit_code(&mut events).await, 0);

    let mut kept = within(c.start_kept(request(), "l", "")).await.unwrap();
    let first = within(kept.next()).await.unwrap().unwrap();
    assert!(
        matches!(first, KeptEvent::Process(ProcessEvent::Started { .. })),
        "{first:?}"
    );
    let (out, dropped, exit) = kept_to_end(&mut kept).await;
    assert_eq!(
        (String::from_utf8_lossy(&out).as_ref(), dropped, exit),
        ("done\n", 0, Some(0))
    );
}

/// Output and exit of a kept stream read to its end, after `Started`.
async fn kept_to_end(events: &mut KeptEvents) -> (Vec<u8>, u64, Option<i32>) {
    let (mut out, mut dropped, mut exit) = (Vec::new(), 0, None);
    while let Some(event) = within(events.next()).await {
        match event.expect("stream failed") {
            KeptEvent::Process(ProcessEvent::Stdout { data }) => out.extend_from_slice(&data),
            KeptEvent::Process(ProcessEvent::Exited { exit_code }) => exit = Some(exit_code),
            KeptEvent::Dropped { bytes } => dropped += bytes,
            other => panic!("unexpected {other:?}"),
        }
    }
    (out, dropped, exit)
}

async fn kept_processes_outlive_their_stream(d: &Daemon) {
    let c = &d.client;
    let request = StartProcess {
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo up; read x; echo \"$x\"".into(),
        ],
        env: BTreeMap::new(),
        cwd: String::new(),
        pty: None,
        stdin_closed: false,
    };
    let mut events = within(c.start_kept(request, "scope", "")).await.unwrap();
    let pid = match within(events.next()).await.unwrap().unwrap() {
        KeptEvent::Process(ProcessEvent::Started { pid }) => pid,
        other => panic!("first event is not Started: {other:?}"),
    };
    drop(events);
    let listed = within(c.list_kept("scope")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].pid, listed[0].exit_code), (pid, None));
    assert_eq!(listed[0].command[0], "/bin/sh");
    assert!(within(c.list_kept("other")).await.unwrap().is_empty());
    let other = within(c.attach_kept(pid, "other"))
        .await
        .err()
        .map(|e| e.code);
    assert_eq!(other, Some(Code::NotFound));
    // Alive past its stream: it still reads stdin, and a new reader gets
    // the replayed line, then the live one and the exit.
    let mut attached = within(c.attach_kept(pid, "scope")).await.unwrap();
    assert!(matches!(
        within(attached.next()).await.unwrap().unwrap(),
        KeptEvent::Process(ProcessEvent::Started { pid: p }) if p == pid
    ));
    within(c.write_stdin(pid, StdinInput::Data(Bytes::from_static(b"later\n"))))
        .await
        .unwrap();
    let (out, dropped, exit) = kept_to_end(&mut attached).await;
    assert_eq!(String::from_utf8_lossy(&out), "up\nlater\n");
    assert_eq!((dropped, exit), (0, Some(0)));
    let listed = within(c.list_kept("scope")).await.unwrap();
    assert_eq!(listed[0].exit_code, Some(0));
}

async fn exec_runs_commands(d: &Daemon) {
    let c = &d.client;
    let r = within(c.exec(exec(argv(&["echo", "hi"])))).await.unwrap();
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.timed_out),
        (0, "hi\n", false)
    );

    let r = within(c.exec(exec(sh("echo out; echo err >&2; exit 3"))))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 3);
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");

    let mut req = exec(sh("echo \"$GREETING\"; pwd"));
    req.env.insert("GREETING".into(), "hello there".into());
    std::fs::create_dir(d.root.path().join("sub")).unwrap();
    req.cwd = "sub".into();
    let r = within(c.exec(req)).await.unwrap();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "hello there");
    assert!(lines[1].ends_with("/sub"), "pwd printed {}", lines[1]);

    // Invalid UTF-8 comes back lossily, not as an error.
    let r = within(c.exec(exec(sh("printf 'a\\377b'")))).await.unwrap();
    assert_eq!(r.stdout, "a\u{FFFD}b");
}

async fn exec_feeds_stdin_and_times_out(d: &Daemon) {
    let c = &d.client;
    let mut req = exec(argv(&["cat"]));
    req.stdin = "piped in".into();
    let r = within(c.exec(req)).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "piped in"));

    // Larger than a pipe and than one stdin chunk, while output flows back.
    let big = "x".repeat(3 << 20);
    let mut req = exec(sh("cat; echo done >&2"));
    req.stdin = big.clone();
    let r = within(c.exec(req)).await.unwrap();
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.stdout.len(), big.len());
    assert_eq!(r.stderr, "done\n");

    // Stdin the process never reads is not an error.
    let mut req = exec(sh("exit 0"));
    req.stdin = big;
    assert_eq!(within(c.exec(req)).await.unwrap().exit_code, 0);

    let mut req = exec(sh("echo started; sleep 30; echo never"));
    req.timeout_seconds = Some(0.5);
    let begun = Instant::now();
    let r = within(c.exec(req)).await.unwrap();
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    assert_eq!(r.stdout, "started\n");
    assert!(begun.elapsed() < Duration::from_secs(10));

    let mut req = exec(sh("echo quick; exit 5"));
    req.timeout_seconds = Some(30.0);
    let r = within(c.exec(req)).await.unwrap();
    assert_eq!((r.exit_code, r.timed_out), (5, false));
    assert_eq!(r.stdout, "quick\n");

    let mut req = exec(argv(&["true"]));
    req.timeout_seconds = Some(-1.0);
    assert_eq!(code(c.exec(req).await), Code::InvalidArgument);
}

async fn start_streams_stdin_signals_and_exit(d: &Daemon) {
    let c = &d.client;
    let mut events = within(c.start(StartProcess {
        command: vec!["/bin/sh".into(), "-c".into(), "echo ready >&2; cat".into()],
        ..Default::default()
    }))
    .await
    .unwrap();
    let pid = started(&mut events).await;
    assert_eq!(
        next(&mut events).await,
        ProcessEvent::Stderr {
            data: b"ready\n".to_vec()
        }
    );
    within(c.write_stdin(pid, StdinInput::Data(Bytes::from_static(b"echo me\n"))))
        .await
        .unwrap();
    assert_eq!(output_until(&mut events, "echo me\n").await, "echo me\n");
    within(c.write_stdin(pid, StdinInput::Eof)).await.unwrap();
    assert_eq!(exit_code(&mut events).await, 0);
    // The pid is gone once its exit was seen.
    assert_eq!(code(c.signal(pid, Signal::Sigterm).await), Code::NotFound);

    let mut env = BTreeMap::new();
    env.insert("MARK".to_string(), "m1".to_string());
    std::fs::create_dir(d.root.path().join("work")).unwrap();
    let mut events = within(c.start(StartProcess {
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo $MARK $(pwd); exec sleep 60".into(),
        ],
        env,
        cwd: "work".into(),
        pty: None,
        stdin_closed: false,
    }))
    .await
    .unwrap();
    let pid = started(&mut events).await;
    let out = output_until(&mut events, "\n").await;
    assert!(
        out.starts_with("m1 ") && out.trim_end().ends_with("/work"),
        "{out}"
    );
    within(c.signal(pid, Signal::Sigterm)).await.unwrap();
    assert_eq!(exit_code(&mut events).await, 128 + 15);

    assert_eq!(
        code(c.write_stdin(999_999, StdinInput::Eof).await),
        Code::NotFound
    );
    let missing = c
        .start(StartProcess {
            command: vec!["/no/such/program".into()],
            ..Default::default()
        })
        .await;
    assert_eq!(code(missing.map(|_| ())), Code::NotFound);
}

async fn pty_resizes(d: &Daemon) {
    let c = &d.client;
    let mut events = within(c.start(StartProcess {
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "stty size; echo ready; read -r x; stty size".into(),
        ],
        pty: Some(PtySize { cols: 80, rows: 24 }),
        ..Default::default()
    }))
    .await
    .unwrap();
    let pid = started(&mut events).await;
    let out = output_until(&mut events, "ready").await;
    assert!(out.contains("24 80"), "{out:?}");
    within(c.resize(
        pid,
        PtySize {
            cols: 100,
            rows: 40,
        },
    ))
    .await
    .unwrap();
    within(c.write_stdin(pid, StdinInput::Data(Bytes::from_static(b"go\n"))))
        .await
        .unwrap();
    output_until(&mut events, "40 100").await;
    assert_eq!(exit_code(&mut events).await, 0);

    // A process without a terminal cannot be resized.
    let mut events = within(c.start(StartProcess {
        command: vec!["sleep".into(), "60".into()],
        ..Default::default()
    }))
    .await
    .unwrap();
    let pid = started(&mut events).await;
    assert_eq!(
        code(c.resize(pid, PtySize { cols: 1, rows: 1 }).await),
        Code::FailedPrecondition
    );
    within(c.signal(pid, Signal::Sigkill)).await.unwrap();
    assert_eq!(exit_code(&mut events).await, 128 + 9);
}

async fn files_round_trip(d: &Daemon) {
    let c = &d.client;
    let binary: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let parts: Vec<Vec<u8>> = binary.chunks(70_001).map(<[u8]>::to_vec).collect();
    within(c.write_file("deep/er/data.bin", chunks(parts), WriteOptions::default()))
        .await
        .unwrap();
    assert_eq!(read(c, "deep/er/data.bin").await.unwrap(), binary);
    assert_eq!(
        std::fs::read(d.root.path().join("deep/er/data.bin")).unwrap(),
        binary
    );

    // Names that need encoding.
    let odd = "dir with space/q?a#b%c&d=é.txt";
    write(c, odd, b"odd", WriteOptions::default()).await;
    assert_eq!(read(c, odd).await.unwrap(), b"odd");
    assert!(d.root.path().join(odd).exists());
    assert_eq!(read(c, &format!("/{odd}")).await.unwrap(), b"odd");

    let append = WriteOptions {
        append: true,
        mode: None,
    };
    write(c, "log.txt", b"one\n", append).await;
    write(c, "log.txt", b"two\n", append).await;
    assert_eq!(read(c, "log.txt").await.unwrap(), b"one\ntwo\n");
    write(c, "log.txt", b"new", WriteOptions::default()).await;
    assert_eq!(read(c, "log.txt").await.unwrap(), b"new");

    let private = WriteOptions {
        append: false,
        mode: Some(0o600),
    };
    write(c, "secret.txt", b"s", private).await;
    let entry = c.stat("secret.txt").await.unwrap().unwrap();
    assert_eq!(entry.mode, "0600");

    write(c, "empty", b"", WriteOptions::default()).await;
    assert_eq!(read(c, "empty").await.unwrap(), b"");

    // An upload whose stream fails changes nothing and reports its own error.
    let failing: ByteStream = Box::pin(futures::stream::iter(vec![
        Ok(Bytes::from_static(b"partial")),
        Err(Error::new(Code::Internal, "source broke")),
    ]));
    let err = within(c.write_file("log.txt", failing, WriteOptions::default()))
        .await
        .unwrap_err();
    assert_eq!(err, Error::new(Code::Internal, "source broke"));
    assert_eq!(read(c, "log.txt").await.unwrap(), b"new");

    // A directory is not a file to read.
    assert_eq!(code(read(c, "deep").await), Code::Conflict);
}

async fn list_and_stat(d: &Daemon) {
    let c = &d.client;
    write(c, "a/b/file.txt", b"12345", WriteOptions::default()).await;
    let listing = within(c.list_files("a")).await.unwrap();
    assert_eq!(listing.path, "/a");
    assert_eq!(listing.entries.len(), 1);
    assert_eq!(listing.entries[0].name, "b");
    assert_eq!(listing.entries[0].kind, EntryType::Directory);
    let root = within(c.list_files("")).await.unwrap();
    assert_eq!(root.path, "/");
    assert!(root.entries.iter().any(|e| e.name == "a"));
    assert_eq!(code(c.list_files("a/b/file.txt").await), Code::Conflict);
    assert_eq!(code(c.list_files("nope").await), Code::NotFound);

    let file = c.stat("a/b/file.txt").await.unwrap().unwrap();
    assert_eq!(
        (file.name.as_str(), file.size, file.kind),
        ("file.txt", 5, EntryType::File)
    );
    let dir = c.stat("/a/b/").await.unwrap().unwrap();
    assert_eq!((dir.name.as_str(), dir.kind), ("b", EntryType::Directory));
    let dotted = c.stat("a/./b/../b/file.txt").await.unwrap().unwrap();
    assert_eq!(dotted.name, "file.txt");
    for root in ["", "/", "a/.."] {
        let entry = c.stat(root).await.unwrap().unwrap();
        assert_eq!(entry.kind, EntryType::Directory, "{root:?}");
    }
    assert_eq!(c.stat("a/missing").await.unwrap(), None);
    assert_eq!(c.stat("missing/deeper").await.unwrap(), None);
    assert_eq!(code(c.stat("../outside").await), Code::PermissionDenied);
}

async fn delete_files(d: &Daemon) {
    let c = &d.client;
    write(c, "tree/x/y.txt", b"y", WriteOptions::default()).await;
    write(c, "single.txt", b"s", WriteOptions::default()).await;
    within(c.delete_file("single.txt", false)).await.unwrap();
    assert_eq!(c.stat("single.txt").await.unwrap(), None);
    assert_eq!(code(c.delete_file("tree", false).await), Code::Conflict);
    within(c.delete_file("tree", true)).await.unwrap();
    assert_eq!(c.stat("tree").await.unwrap(), None);
    assert!(!d.root.path().join("tree").exists());
    assert_eq!(code(c.delete_file("tree", true).await), Code::NotFound);
}

async fn watch_reports_creates(d: &Daemon) {
    let c = &d.client;
    write(c, "watched/inner/.keep", b"", WriteOptions::default()).await;
    let mut events = within(c.watch("watched", true)).await.unwrap();
    write(
        c,
        "watched/inner/new.txt",
        b"hello",
        WriteOptions::default(),
    )
    .await;
    loop {
        let batch = within(events.next()).await.expect("watch ended").unwrap();
        if batch
            .iter()
            .any(|e| e.kind == WatchKind::Create && e.path == "/watched/inner/new.txt" && !e.is_dir)
        {
            break;
        }
    }
    assert_eq!(
        code(c.watch("not-there", false).await.map(|_| ())),
        Code::NotFound
    );
}

async fn errors_map_to_codes(d: &Daemon) {
    let c = &d.client;
    assert_eq!(
        code(read(c, "../../etc/passwd").await),
        Code::PermissionDenied
    );
    assert_eq!(code(read(c, "no/such/file").await), Code::NotFound);
    let plain = WriteOptions::default();
    assert_eq!(
        code(
            c.write_file("../x", chunks(vec![b"x".to_vec()]), plain)
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(c.exec(exec(argv(&["/no/such/program"]))).await),
        Code::NotFound
    );
    let mut req = exec(argv(&["true"]));
    req.cwd = "../..".into();
    assert_eq!(code(c.exec(req).await), Code::PermissionDenied);
    assert_eq!(
        code(c.exec(exec(Cmd::Argv(vec![]))).await),
        Code::InvalidArgument
    );
    let setuid = WriteOptions {
        append: false,
        mode: Some(0o4755),
    };
    assert_eq!(
        code(c.write_file("m", chunks(vec![]), setuid).await),
        Code::InvalidArgument
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_over_both_transports() {
    for transport in [Transport::Unix, Transport::Tcp] {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "s3cret-token\n").unwrap();
        let args = ["--auth-token-file", token_file.to_str().unwrap()];
        let Some(d) = Daemon::start(transport, &args).await else {
            return;
        };
        let open = &d.client;
        let authed = d.client.clone().with_token("s3cret-token").unwrap();
        let wrong = d.client.clone().with_token("other").unwrap();

        write(&authed, "f.txt", b"ok", WriteOptions::default()).await;
        assert_eq!(read(&authed, "f.txt").await.unwrap(), b"ok");
        assert!(authed.stat("f.txt").await.unwrap().is_some());
        let r = within(authed.exec(exec(argv(&["echo", "in"]))))
            .await
            .unwrap();
        assert_eq!(r.stdout, "in\n");
        let mut events = within(authed.watch("", false)).await.unwrap();
        write(&authed, "g.txt", b"", WriteOptions::default()).await;
        assert!(within(events.next()).await.unwrap().is_ok());

        for client in [open, &wrong] {
            assert_eq!(
                code(read(client, "f.txt").await),
                Code::Unauthenticated,
                "{transport:?}"
            );
            assert_eq!(code(client.stat("f.txt").await), Code::Unauthenticated);
            assert_eq!(
                code(client.exec(exec(argv(&["true"]))).await),
                Code::Unauthenticated
            );
            let start = client
                .start(StartProcess {
                    command: vec!["true".into()],
                    ..Default::default()
                })
                .await;
            assert_eq!(code(start.map(|_| ())), Code::Unauthenticated);
            assert_eq!(
                code(client.watch("", false).await.map(|_| ())),
                Code::Unauthenticated
            );
        }
        // Probes need no token.
        open.health().await.unwrap();
    }
}

#[tokio::test]
async fn unreachable_sandboxd_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let gone = SandboxdClient::unix(dir.path());
    assert_eq!(code(gone.health().await), Code::Unavailable);
    assert_eq!(
        code(gone.exec(exec(argv(&["true"]))).await),
        Code::Unavailable
    );
    assert_eq!(
        code(gone.read_file("x").await.map(|_| ())),
        Code::Unavailable
    );

    let port = free_port();
    let tcp = SandboxdClient::tcp(
        format!("http://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}"),
    )
    .unwrap();
    assert_eq!(code(tcp.list_files("").await), Code::Unavailable);
    assert_eq!(
        code(tcp.watch("", false).await.map(|_| ())),
        Code::Unavailable
    );
    assert_eq!(
        code(SandboxdClient::tcp("not a url", "http://x:1")),
        Code::InvalidArgument
    );
}

/// The hub tells a dead sandbox from a failed command by this code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxd_gone_mid_stream_is_unavailable() {
    for transport in [Transport::Unix, Transport::Tcp] {
        let Some(mut d) = Daemon::start(transport, &[]).await else {
            return;
        };
        let mut events = within(d.client.start(StartProcess {
            // Outlives the killed daemon only briefly.
            command: vec!["sleep".into(), "2".into()],
            ..Default::default()
        }))
        .await
        .unwrap();
        started(&mut events).await;
        d.child.kill().unwrap();
        d.child.wait().unwrap();
        let failed = within(events.next()).await.expect("an error, not the end");
        assert_eq!(code(failed), Code::Unavailable, "{transport:?}");
        assert_eq!(code(d.client.health().await), Code::Unavailable);
        assert_eq!(
            code(d.client.exec(exec(argv(&["true"]))).await),
            Code::Unavailable
        );
    }
}
