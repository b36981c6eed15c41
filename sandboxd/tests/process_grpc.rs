//! `process.v1.ProcessService` over a real tonic client against the real
//! sandboxd binary on loopback.

mod common;

use std::{
    collections::HashMap,
    future::Future,
    time::{Duration, Instant},
};

use bytes::Bytes;
use sandhub_api::proto::process::v1::{
    self as pb, process_service_client::ProcessServiceClient, start_response::Event,
    write_stdin_request::Payload,
};
use tonic::{transport::Channel, Code, Request, Streaming};

const WAIT: Duration = Duration::from_secs(10);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("operation did not finish in time")
}

async fn client(d: &common::Daemon) -> ProcessServiceClient<Channel> {
    within(ProcessServiceClient::connect(d.grpc_url()))
        .await
        .expect("connecting to sandboxd")
}

fn config(argv: &[&str]) -> pb::ProcessConfig {
    pb::ProcessConfig {
        command: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

async fn execute(
    c: &mut ProcessServiceClient<Channel>,
    config: pb::ProcessConfig,
) -> Result<pb::ExecuteResponse, tonic::Status> {
    within(c.execute(pb::ExecuteRequest {
        config: Some(config),
    }))
    .await
    .map(|r| r.into_inner())
}

async fn start(
    c: &mut ProcessServiceClient<Channel>,
    config: pb::ProcessConfig,
    pty: Option<pb::Pty>,
) -> (Streaming<pb::StartResponse>, i32) {
    let mut stream = within(c.start(pb::StartRequest {
        config: Some(config),
        pty,
    }))
    .await
    .expect("Start")
    .into_inner();
    match next_event(&mut stream).await {
        Some(Event::Init(init)) => (stream, init.process_id),
        other => panic!("first event is not init: {other:?}"),
    }
}

async fn next_event(stream: &mut Streaming<pb::StartResponse>) -> Option<Event> {
    within(stream.message())
        .await
        .expect("stream failed")
        .map(|m| m.event.expect("event set"))
}

#[derive(Default, Debug)]
struct Rest {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    chunks: Vec<usize>,
    exit: Option<i32>,
}

/// Everything after `init`, until the stream ends; exit must come last.
async fn rest(stream: &mut Streaming<pb::StartResponse>) -> Rest {
    let mut out = Rest::default();
    while let Some(ev) = next_event(stream).await {
        assert!(out.exit.is_none(), "event after exit: {ev:?}");
        match ev {
            Event::Init(_) => panic!("second init"),
            Event::Stdout(b) => {
                out.chunks.push(b.len());
                out.stdout.extend_from_slice(&b);
            }
            Event::Stderr(b) => {
                out.chunks.push(b.len());
                out.stderr.extend_from_slice(&b);
            }
            Event::Exit(e) => out.exit = Some(e.exit_code),
        }
    }
    out
}

async fn read_until(stream: &mut Streaming<pb::StartResponse>, seen: &mut Vec<u8>, needle: &str) {
    while !String::from_utf8_lossy(seen).contains(needle) {
        match next_event(stream).await {
            Some(Event::Stdout(b)) => seen.extend_from_slice(&b),
            other => panic!(
                "waiting for {needle:?} in {:?}, got {other:?}",
                String::from_utf8_lossy(seen)
            ),
        }
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    r.expect_err("call succeeded").code()
}

/// True while a live (not zombie) process has exactly this command line.
fn running(cmdline: &[&str]) -> bool {
    let mut want = Vec::new();
    for arg in cmdline {
        want.extend_from_slice(arg.as_bytes());
        want.push(0);
    }
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `sleep` argument no other test uses, so /proc can tell ours apart.
fn unique_sleep(tag: u32) -> String {
    format!("{}.{:06}{tag}", 40 + tag, std::process::id())
}

fn signal(pid: i32, signal: pb::Signal) -> pb::SendSignalRequest {
    pb::SendSignalRequest {
        process_id: pid,
        signal: signal as i32,
    }
}

fn stdin(pid: i32, payload: Payload) -> pb::WriteStdinRequest {
    pb::WriteStdinRequest {
        process_id: pid,
        payload: Some(payload),
    }
}

#[tokio::test]
async fn execute_echo_with_env_and_cwd() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    std::fs::create_dir_all(d.root_path().join("work/sub")).unwrap();
    let host_root = d.root_path().canonicalize().unwrap();
    let mut cfg = config(&[
        "sh",
        "-c",
        "printf '%s|%s|%s' \"$GREETING\" \"$PATH\" \"$(pwd)\"",
    ]);
    cfg.env_vars = HashMap::from([("GREETING".to_string(), "hi there".to_string())]);
    cfg.cwd = Some("/work/sub".into());
    let r = execute(&mut c, cfg).await.unwrap();
    // PATH comes from the daemon's own environment, which it inherited from us.
    let want = format!(
        "hi there|{}|{}",
        std::env::var("PATH").unwrap(),
        host_root.join("work/sub").display()
    );
    assert_eq!(String::from_utf8_lossy(&r.stdout), want);
    assert_eq!(r.exit_code, 0);
    assert!(r.stderr.is_empty());

    let r = execute(&mut c, config(&["echo", "a", "$(no shell)"]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "a $(no shell)\n".as_bytes());
}

#[tokio::test]
async fn execute_exit_codes_and_stderr() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let r = execute(
        &mut c,
        config(&["sh", "-c", "echo out; echo oops >&2; exit 42"]),
    )
    .await
    .unwrap();
    assert_eq!(r.exit_code, 42);
    assert_eq!(r.stdout, "out\n".as_bytes());
    assert_eq!(r.stderr, "oops\n".as_bytes());
    let r = execute(&mut c, config(&["sh", "-c", "kill -TERM $$"]))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 128 + 15);
    let r = execute(&mut c, config(&["true"])).await.unwrap();
    assert_eq!(r.exit_code, 0);
}

#[tokio::test]
async fn errors_map_to_grpc_codes() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    std::os::unix::fs::symlink("/etc", d.root_path().join("etc-link")).unwrap();
    for cwd in ["..", "/../etc", "etc-link", "etc-link/ssl"] {
        let mut cfg = config(&["pwd"]);
        cfg.cwd = Some(cwd.into());
        assert_eq!(
            code(execute(&mut c, cfg.clone()).await),
            Code::PermissionDenied,
            "Execute cwd {cwd}"
        );
        let r = within(c.start(pb::StartRequest {
            config: Some(cfg),
            pty: None,
        }))
        .await
        .map(|_| ());
        assert_eq!(code(r), Code::PermissionDenied, "Start cwd {cwd}");
    }
    let mut cfg = config(&["pwd"]);
    cfg.cwd = Some("missing".into());
    assert_eq!(code(execute(&mut c, cfg).await), Code::NotFound);
    assert_eq!(
        code(execute(&mut c, config(&["no-such-binary-anywhere"])).await),
        Code::NotFound
    );
    assert_eq!(
        code(execute(&mut c, config(&[])).await),
        Code::InvalidArgument
    );
    let r = within(c.start(pb::StartRequest::default()))
        .await
        .map(|_| ());
    assert_eq!(code(r), Code::InvalidArgument);
}

#[tokio::test]
async fn start_streams_in_order_in_chunks_no_larger_than_the_flag() {
    let d = common::Daemon::start(&["--stream-chunk-size", "1500"]);
    let mut c = client(&d).await;
    let (mut s, pid) = start(
        &mut c,
        config(&["sh", "-c", "seq 1 40000; seq 1 9000 >&2; printf tail"]),
        None,
    )
    .await;
    assert!(pid > 1);
    let r = rest(&mut s).await;
    let seq = |n: usize| (1..=n).map(|i| format!("{i}\n")).collect::<String>();
    assert_eq!(String::from_utf8(r.stdout).unwrap(), seq(40000) + "tail");
    assert_eq!(String::from_utf8(r.stderr).unwrap(), seq(9000));
    assert_eq!(r.exit, Some(0));
    assert!(r.chunks.len() > 100, "{} chunks", r.chunks.len());
    assert!(
        r.chunks.iter().all(|&n| n > 0 && n <= 1500),
        "chunk over 1500: {:?}",
        r.chunks.iter().max()
    );
}

#[tokio::test]
async fn stdin_write_and_eof_then_write_after_eof_fails() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let (mut s, pid) = start(&mut c, config(&["cat"]), None).await;
    within(c.write_stdin(stdin(
        pid,
        Payload::Input(Bytes::from_static(b"line one\n")),
    )))
    .await
    .unwrap();
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "line one\n").await;
    within(c.write_stdin(stdin(pid, Payload::Input(Bytes::from_static(b"two")))))
        .await
        .unwrap();
    within(c.write_stdin(stdin(pid, Payload::Eof(()))))
        .await
        .unwrap();
    let r = rest(&mut s).await;
    seen.extend_from_slice(&r.stdout);
    assert_eq!(seen, b"line one\ntwo");
    assert_eq!(r.exit, Some(0));

    // Still running after its stdin closed.
    let (mut s, pid) = start(
        &mut c,
        config(&["sh", "-c", "cat; echo eof; sleep 100"]),
        None,
    )
    .await;
    within(c.write_stdin(stdin(pid, Payload::Eof(()))))
        .await
        .unwrap();
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "eof").await;
    let r = within(c.write_stdin(stdin(pid, Payload::Input(Bytes::from_static(b"x"))))).await;
    assert_eq!(code(r), Code::FailedPrecondition);
    within(c.send_signal(signal(pid, pb::Signal::Sigkill)))
        .await
        .unwrap();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 9));
}

#[tokio::test]
async fn sigterm_kills_the_process_and_its_children() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let (mut s, pid) = start(
        &mut c,
        config(&["sh", "-c", "sleep 100 & echo $!; wait"]),
        None,
    )
    .await;
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "\n").await;
    let child: i32 = String::from_utf8_lossy(&seen).trim().parse().unwrap();
    assert!(common::pid_alive(child));
    within(c.send_signal(signal(pid, pb::Signal::Sigterm)))
        .await
        .unwrap();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 15));
    eventually("the background sleep dies too", || {
        !common::pid_alive(child)
    })
    .await;
    // Gone from the table once exited.
    let r = within(c.send_signal(signal(pid, pb::Signal::Sigterm))).await;
    assert_eq!(code(r), Code::NotFound);
}

#[tokio::test]
async fn bad_signals_and_unknown_pids() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let (mut s, pid) = start(&mut c, config(&["sleep", "100"]), None).await;
    for sig in [0, 1, 3, 42] {
        let r = within(c.send_signal(pb::SendSignalRequest {
            process_id: pid,
            signal: sig,
        }))
        .await;
        assert_eq!(code(r), Code::InvalidArgument, "signal {sig}");
    }
    let r = within(c.resize_tty(pb::ResizeTtyRequest {
        process_id: pid,
        cols: 80,
        rows: 24,
    }))
    .await;
    assert_eq!(code(r), Code::FailedPrecondition, "resize without a PTY");

    let unknown = std::process::id() as i32;
    let r = within(c.write_stdin(stdin(unknown, Payload::Input(Bytes::from_static(b"x"))))).await;
    assert_eq!(code(r), Code::NotFound);
    let r = within(c.send_signal(signal(unknown, pb::Signal::Sigterm))).await;
    assert_eq!(code(r), Code::NotFound);
    let r = within(c.resize_tty(pb::ResizeTtyRequest {
        process_id: unknown,
        cols: 80,
        rows: 24,
    }))
    .await;
    assert_eq!(code(r), Code::NotFound);

    within(c.send_signal(signal(pid, pb::Signal::Sigint)))
        .await
        .unwrap();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 2));
}

#[tokio::test]
async fn pty_tty_size_and_resize() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let (mut s, pid) = start(
        &mut c,
        config(&[
            "sh",
            "-c",
            "tty; stty size; echo ready; read -r x; stty size",
        ]),
        Some(pb::Pty {
            cols: 100,
            rows: 40,
        }),
    )
    .await;
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "ready").await;
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(text.starts_with("/dev/pts/"), "tty printed {text:?}");
    assert!(
        text.contains("\r\n40 100\r\n"),
        "stty size printed {text:?}"
    );
    within(c.resize_tty(pb::ResizeTtyRequest {
        process_id: pid,
        cols: 120,
        rows: 50,
    }))
    .await
    .unwrap();
    within(c.write_stdin(stdin(pid, Payload::Input(Bytes::from_static(b"\n")))))
        .await
        .unwrap();
    let r = rest(&mut s).await;
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(text.ends_with("50 120\r\n"), "after resize: {text:?}");
    assert_eq!(r.exit, Some(0));
}

#[tokio::test]
async fn pty_eof_ends_cat() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let (mut s, pid) = start(
        &mut c,
        config(&["cat"]),
        Some(pb::Pty { cols: 80, rows: 24 }),
    )
    .await;
    within(c.write_stdin(stdin(pid, Payload::Input(Bytes::from_static(b"abc\n")))))
        .await
        .unwrap();
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "abc\r\nabc\r\n").await;
    within(c.write_stdin(stdin(pid, Payload::Eof(()))))
        .await
        .unwrap();
    assert_eq!(rest(&mut s).await.exit, Some(0));
}

#[tokio::test]
async fn execute_client_deadline_kills_the_process() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let arg = unique_sleep(1);
    let mut req = Request::new(pb::ExecuteRequest {
        config: Some(config(&["sleep", &arg])),
    });
    req.set_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let r = within(c.execute(req)).await;
    let elapsed = started.elapsed();
    let code = code(r);
    assert!(
        matches!(code, Code::DeadlineExceeded | Code::Cancelled),
        "got {code:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    eventually("the sleep is killed", || !running(&["sleep", &arg])).await;
}

#[tokio::test]
async fn dropped_start_stream_kills_the_process() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let arg = unique_sleep(2);
    let (s, _) = start(&mut c, config(&["sleep", &arg]), None).await;
    eventually("the sleep runs", || running(&["sleep", &arg])).await;
    drop(s);
    eventually("the sleep is killed", || !running(&["sleep", &arg])).await;
}

#[tokio::test]
async fn shutdown_kills_processes_that_outlive_the_timeout() {
    let mut d = common::Daemon::start(&["--shutdown-timeout", "300ms"]);
    let mut c = client(&d).await;
    let arg = unique_sleep(3);
    let (_s, _) = start(&mut c, config(&["sleep", &arg]), None).await;
    eventually("the sleep runs", || running(&["sleep", &arg])).await;
    let status = tokio::task::spawn_blocking(move || {
        let status = d.terminate();
        (d, status)
    });
    let (_d, status) = within(status).await.unwrap();
    assert!(status.success(), "sandboxd exited with {status}");
    eventually("the sleep is killed", || !running(&["sleep", &arg])).await;
}
