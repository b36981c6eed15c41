//! `process.v1.ProcessService` and `process::run`, called in-process on a
//! real `Daemon` (no listener): every behaviour that does not depend on the
//! transport.

mod common;

use std::{
    collections::HashMap,
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use sandboxd::{
    process::{self, ProcessService, Spec},
    Config, Daemon,
};
use sandhub_api::proto::process::v1::{
    self as pb, process_service_server::ProcessService as _, start_response::Event,
    write_stdin_request::Payload,
};
use tonic::{Code, Request};

const CHUNK: usize = 1024;
/// A bound on a hang, not a speed check: a loaded 2-core machine (a build beside
/// the tests) once took more than 10 s to start `sleep`.
const WAIT: Duration = Duration::from_secs(30);

struct Fixture {
    svc: ProcessService,
    daemon: Arc<Daemon>,
    root: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let config = Config::parse_from([
        "sandboxd".as_ref(),
        "--root-dir".as_ref(),
        root.path().as_os_str(),
        "--stream-chunk-size".as_ref(),
        CHUNK.to_string().as_ref(),
    ]);
    let daemon = Daemon::new(config).unwrap();
    Fixture {
        svc: ProcessService {
            daemon: daemon.clone(),
        },
        daemon,
        root,
    }
}

impl Fixture {
    /// The root as the daemon sees it (canonical: the temp dir may sit
    /// behind a symlink).
    fn host_root(&self) -> std::path::PathBuf {
        self.root.path().canonicalize().unwrap()
    }
}

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("operation did not finish in time")
}

fn config(argv: &[&str]) -> pb::ProcessConfig {
    pb::ProcessConfig {
        command: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

async fn execute(
    svc: &ProcessService,
    config: pb::ProcessConfig,
) -> Result<pb::ExecuteResponse, tonic::Status> {
    within(svc.execute(Request::new(pb::ExecuteRequest {
        config: Some(config),
    })))
    .await
    .map(|r| r.into_inner())
}

type StartStream = <ProcessService as pb::process_service_server::ProcessService>::StartStream;

async fn start(
    svc: &ProcessService,
    config: pb::ProcessConfig,
    pty: Option<pb::Pty>,
) -> (StartStream, i32) {
    let mut stream = within(svc.start(Request::new(pb::StartRequest {
        config: Some(config),
        pty,
    })))
    .await
    .unwrap()
    .into_inner();
    match next_event(&mut stream).await {
        Some(Event::Init(init)) => (stream, init.process_id),
        other => panic!("first event is not init: {other:?}"),
    }
}

async fn next_event(stream: &mut StartStream) -> Option<Event> {
    within(stream.next()).await.map(|r| {
        r.expect("stream item is not an error")
            .event
            .expect("event set")
    })
}

/// Everything after `init`, until the stream ends.
#[derive(Default, Debug)]
struct Rest {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    chunks: Vec<usize>,
    exit: Option<i32>,
}

async fn rest(stream: &mut StartStream) -> Rest {
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

/// Reads stdout events until `needle` appears in everything read so far.
async fn read_until(stream: &mut StartStream, seen: &mut Vec<u8>, needle: &str) {
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
    format!("{}.{:06}{tag}", 30 + tag, std::process::id())
}

#[tokio::test]
async fn execute_runs_argv_with_env_over_daemon_env_in_cwd() {
    let f = fixture();
    std::fs::create_dir_all(f.root.path().join("sub/dir")).unwrap();
    let mut cfg = config(&[
        "sh",
        "-c",
        "printf '%s|%s|%s\\n' \"$FOO\" \"$PATH\" \"$(pwd)\"",
        "ignored",
    ]);
    cfg.env_vars = HashMap::from([("FOO".to_string(), "bar baz".to_string())]);
    cfg.cwd = Some("sub/dir".into());
    let r = execute(&f.svc, cfg).await.unwrap();
    let want = format!(
        "bar baz|{}|{}\n",
        std::env::var("PATH").unwrap(),
        f.host_root().join("sub/dir").display()
    );
    assert_eq!(String::from_utf8_lossy(&r.stdout), want);
    assert_eq!(r.exit_code, 0);
    assert!(r.stderr.is_empty());

    // No shell: metacharacters are plain argv bytes.
    let r = execute(&f.svc, config(&["echo", "$HOME", "a;b", "*"]))
        .await
        .unwrap();
    assert_eq!(r.stdout, "$HOME a;b *\n".as_bytes());

    // Default cwd is the root.
    let r = execute(&f.svc, config(&["pwd"])).await.unwrap();
    assert_eq!(
        r.stdout,
        format!("{}\n", f.host_root().display()).as_bytes()
    );
}

#[tokio::test]
async fn absolute_cwd_is_the_host_path_under_root_or_else_relative_to_root() {
    let f = fixture();
    std::fs::create_dir_all(f.root.path().join("etc")).unwrap();
    std::fs::create_dir_all(f.root.path().join("w")).unwrap();
    let pwd = |cwd: String| {
        let mut c = config(&["pwd"]);
        c.cwd = Some(cwd);
        c
    };
    let host_w = f.host_root().join("w");
    let r = execute(&f.svc, pwd(host_w.display().to_string()))
        .await
        .unwrap();
    assert_eq!(r.stdout, format!("{}\n", host_w.display()).as_bytes());
    // `/etc` names `<root>/etc`, never the host's.
    let r = execute(&f.svc, pwd("/etc".into())).await.unwrap();
    assert_eq!(
        r.stdout,
        format!("{}\n", f.host_root().join("etc").display()).as_bytes()
    );
    let r = execute(&f.svc, pwd("/".into())).await.unwrap();
    assert_eq!(
        r.stdout,
        format!("{}\n", f.host_root().display()).as_bytes()
    );
}

#[tokio::test]
async fn exit_codes_and_signal_deaths_are_reported() {
    let f = fixture();
    let run = |script: &str| execute(&f.svc, config(&["sh", "-c", script]));
    assert_eq!(run("exit 0").await.unwrap().exit_code, 0);
    assert_eq!(run("exit 3").await.unwrap().exit_code, 3);
    assert_eq!(run("exit 255").await.unwrap().exit_code, 255);
    assert_eq!(run("kill -TERM $$").await.unwrap().exit_code, 128 + 15);
    assert_eq!(run("kill -KILL $$").await.unwrap().exit_code, 128 + 9);
    assert_eq!(
        execute(&f.svc, config(&["false"])).await.unwrap().exit_code,
        1
    );
}

#[tokio::test]
async fn stderr_is_captured_apart_from_stdout() {
    let f = fixture();
    let r = execute(
        &f.svc,
        config(&["sh", "-c", "echo out; echo err >&2; exit 7"]),
    )
    .await
    .unwrap();
    assert_eq!(r.stdout, "out\n".as_bytes());
    assert_eq!(r.stderr, "err\n".as_bytes());
    assert_eq!(r.exit_code, 7);
}

#[tokio::test]
async fn execute_has_no_stdin() {
    let f = fixture();
    let r = execute(&f.svc, config(&["cat"])).await.unwrap();
    assert_eq!(r.exit_code, 0);
    assert!(r.stdout.is_empty());
}

#[tokio::test]
async fn cwd_escapes_are_permission_denied() {
    let f = fixture();
    std::fs::create_dir_all(f.root.path().join("a")).unwrap();
    std::os::unix::fs::symlink("/etc", f.root.path().join("etc-link")).unwrap();
    std::os::unix::fs::symlink("../..", f.root.path().join("a/up")).unwrap();
    let escaping = [
        "..".to_string(),
        "a/../..".to_string(),
        "/../etc".to_string(),
        format!("{}/../etc", f.host_root().display()),
        "etc-link".to_string(),
        "a/up".to_string(),
        "a/up/etc".to_string(),
    ];
    for cwd in escaping {
        let mut c = config(&["pwd"]);
        c.cwd = Some(cwd.clone());
        assert_eq!(
            code(execute(&f.svc, c.clone()).await),
            Code::PermissionDenied,
            "Execute cwd {cwd}"
        );
        let r = f
            .svc
            .start(Request::new(pb::StartRequest {
                config: Some(c),
                pty: None,
            }))
            .await
            .map(|_| ());
        assert_eq!(code(r), Code::PermissionDenied, "Start cwd {cwd}");
    }
}

#[tokio::test]
async fn missing_cwd_is_not_found() {
    let f = fixture();
    std::fs::write(f.root.path().join("file"), b"x").unwrap();
    for cwd in ["nope", "nope/deeper", "file"] {
        let mut c = config(&["pwd"]);
        c.cwd = Some(cwd.into());
        assert_eq!(code(execute(&f.svc, c).await), Code::NotFound, "cwd {cwd}");
    }
}

#[tokio::test]
async fn missing_or_unrunnable_executables() {
    let f = fixture();
    assert_eq!(
        code(execute(&f.svc, config(&["definitely-not-a-command-xyz"])).await),
        Code::NotFound
    );
    assert_eq!(
        code(execute(&f.svc, config(&["/nonexistent/bin/tool"])).await),
        Code::NotFound
    );
    // Without any execute bit even root may not exec a file.
    let script = f.root.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let script = script.to_str().unwrap();
    assert_eq!(
        code(execute(&f.svc, config(&[script])).await),
        Code::PermissionDenied
    );
    let r = f
        .svc
        .start(Request::new(pb::StartRequest {
            config: Some(config(&["definitely-not-a-command-xyz"])),
            pty: None,
        }))
        .await
        .map(|_| ());
    assert_eq!(code(r), Code::NotFound);
}

#[tokio::test]
async fn empty_command_is_invalid_argument() {
    let f = fixture();
    assert_eq!(
        code(execute(&f.svc, config(&[])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(execute(&f.svc, config(&[""])).await),
        Code::InvalidArgument
    );
    let r = f
        .svc
        .execute(Request::new(pb::ExecuteRequest { config: None }))
        .await;
    assert_eq!(code(r), Code::InvalidArgument);
    let r = f
        .svc
        .start(Request::new(pb::StartRequest::default()))
        .await
        .map(|_| ());
    assert_eq!(code(r), Code::InvalidArgument);
}

#[tokio::test]
async fn start_streams_init_then_all_output_in_bounded_chunks_then_exit() {
    let f = fixture();
    let (mut s, pid) = start(
        &f.svc,
        config(&["sh", "-c", "seq 1 30000; seq 1 7000 >&2; exit 5"]),
        None,
    )
    .await;
    assert!(pid > 1);
    let r = rest(&mut s).await;
    let seq = |n: usize| (1..=n).map(|i| format!("{i}\n")).collect::<String>();
    assert_eq!(String::from_utf8(r.stdout).unwrap(), seq(30000));
    assert_eq!(String::from_utf8(r.stderr).unwrap(), seq(7000));
    assert_eq!(r.exit, Some(5));
    assert!(
        r.chunks.len() > 100,
        "output was not split: {} chunks",
        r.chunks.len()
    );
    assert!(
        r.chunks.iter().all(|&n| n > 0 && n <= CHUNK),
        "chunk over {CHUNK}: {:?}",
        r.chunks
    );
}

#[tokio::test]
async fn start_tail_output_of_a_quick_exit_is_not_lost() {
    let f = fixture();
    for _ in 0..20 {
        let (mut s, _) = start(
            &f.svc,
            config(&["sh", "-c", "printf tail; printf err >&2"]),
            None,
        )
        .await;
        let r = rest(&mut s).await;
        assert_eq!(r.stdout, b"tail");
        assert_eq!(r.stderr, b"err");
        assert_eq!(r.exit, Some(0));
    }
}

#[tokio::test]
async fn stdin_writes_then_eof_end_cat() {
    let f = fixture();
    let (mut s, pid) = start(&f.svc, config(&["cat"]), None).await;
    let write = |payload| {
        f.svc.write_stdin(Request::new(pb::WriteStdinRequest {
            process_id: pid,
            payload: Some(payload),
        }))
    };
    within(write(Payload::Input(Bytes::from_static(b"hello "))))
        .await
        .unwrap();
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "hello ").await;
    within(write(Payload::Input(Bytes::from_static(b"world\n"))))
        .await
        .unwrap();
    within(write(Payload::Eof(()))).await.unwrap();
    let r = rest(&mut s).await;
    seen.extend_from_slice(&r.stdout);
    assert_eq!(seen, b"hello world\n");
    assert_eq!(r.exit, Some(0));
}

#[tokio::test]
async fn write_after_eof_is_failed_precondition() {
    let f = fixture();
    // Holds its stdout open after stdin closes, so it is still running.
    let (mut s, pid) = start(
        &f.svc,
        config(&["sh", "-c", "cat; echo closed; sleep 100"]),
        None,
    )
    .await;
    let write = |payload| {
        f.svc.write_stdin(Request::new(pb::WriteStdinRequest {
            process_id: pid,
            payload: Some(payload),
        }))
    };
    within(write(Payload::Eof(()))).await.unwrap();
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "closed").await;
    assert_eq!(
        code(within(write(Payload::Input(Bytes::from_static(b"late")))).await),
        Code::FailedPrecondition
    );
    // A second EOF changes nothing and is not an error.
    within(write(Payload::Eof(()))).await.unwrap();
    within(f.svc.send_signal(Request::new(pb::SendSignalRequest {
        process_id: pid,
        signal: pb::Signal::Sigkill as i32,
    })))
    .await
    .unwrap();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 9));
}

/// Each `WriteStdin` blocked on a process that does not read holds an
/// HTTP/2 stream; past the bound, a write is refused instead of queued.
#[tokio::test]
async fn stdin_writes_blocked_by_a_process_that_never_reads_are_bounded() {
    let f = fixture();
    let (mut s, pid) = start(&f.svc, config(&["sleep", "120"]), None).await;
    // Larger than any pipe buffer: the first write blocks, holding the
    // process's stdin; the others wait behind it.
    let big = Bytes::from(vec![b'x'; 1 << 20]);
    let writers: Vec<_> = (0..process::MAX_STDIN_WRITERS)
        .map(|_| {
            let svc = ProcessService {
                daemon: f.daemon.clone(),
            };
            let data = big.clone();
            tokio::spawn(async move {
                svc.write_stdin(Request::new(pb::WriteStdinRequest {
                    process_id: pid,
                    payload: Some(Payload::Input(data)),
                }))
                .await
            })
        })
        .collect();
    within(async {
        while f.daemon.processes.stdin_writes() < process::MAX_STDIN_WRITERS {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let refused = within(f.svc.write_stdin(Request::new(pb::WriteStdinRequest {
        process_id: pid,
        payload: Some(Payload::Input(Bytes::from_static(b"one more"))),
    })))
    .await;
    assert_eq!(code(refused), Code::ResourceExhausted);
    // The reader gone, every blocked write fails and frees its place.
    within(f.svc.send_signal(Request::new(pb::SendSignalRequest {
        process_id: pid,
        signal: pb::Signal::Sigkill as i32,
    })))
    .await
    .unwrap();
    for w in writers {
        let r = within(w).await.unwrap();
        assert!(r.is_err(), "a write to a killed process: {r:?}");
    }
    assert_eq!(f.daemon.processes.stdin_writes(), 0);
    assert_eq!(rest(&mut s).await.exit, Some(128 + 9));
}

#[tokio::test]
async fn sigterm_reaches_the_whole_group() {
    let f = fixture();
    let (mut s, pid) = start(
        &f.svc,
        config(&["sh", "-c", "sleep 100 & echo $!; wait"]),
        None,
    )
    .await;
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "\n").await;
    let child: i32 = String::from_utf8_lossy(&seen).trim().parse().unwrap();
    assert!(common::pid_alive(child));
    within(f.svc.send_signal(Request::new(pb::SendSignalRequest {
        process_id: pid,
        signal: pb::Signal::Sigterm as i32,
    })))
    .await
    .unwrap();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 15));
    eventually("the background sleep dies with its group", || {
        !common::pid_alive(child)
    })
    .await;
}

#[tokio::test]
async fn sigint_and_sigkill_are_delivered() {
    let f = fixture();
    for (sig, want) in [
        (pb::Signal::Sigint, 128 + 2),
        (pb::Signal::Sigkill, 128 + 9),
    ] {
        let (mut s, pid) = start(&f.svc, config(&["sleep", "100"]), None).await;
        within(f.svc.send_signal(Request::new(pb::SendSignalRequest {
            process_id: pid,
            signal: sig as i32,
        })))
        .await
        .unwrap();
        assert_eq!(rest(&mut s).await.exit, Some(want), "{sig:?}");
    }
}

#[tokio::test]
async fn unsupported_signals_are_invalid_argument() {
    let f = fixture();
    let (mut s, pid) = start(&f.svc, config(&["sleep", "100"]), None).await;
    for signal in [0, 1, 3, 19, 99, -1] {
        let r = within(f.svc.send_signal(Request::new(pb::SendSignalRequest {
            process_id: pid,
            signal,
        })))
        .await;
        assert_eq!(code(r), Code::InvalidArgument, "signal {signal}");
    }
    assert!(common::pid_alive(pid));
    f.daemon.processes.kill_all();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 9));
}

#[tokio::test]
async fn unknown_pids_are_not_found() {
    let f = fixture();
    // Our own pid is certainly not a process the daemon started.
    let pid = std::process::id() as i32;
    let r = f
        .svc
        .write_stdin(Request::new(pb::WriteStdinRequest {
            process_id: pid,
            payload: Some(Payload::Input(Bytes::from_static(b"x"))),
        }))
        .await;
    assert_eq!(code(r), Code::NotFound);
    let r = f
        .svc
        .send_signal(Request::new(pb::SendSignalRequest {
            process_id: pid,
            signal: pb::Signal::Sigkill as i32,
        }))
        .await;
    assert_eq!(code(r), Code::NotFound);
    let r = f
        .svc
        .resize_tty(Request::new(pb::ResizeTtyRequest {
            process_id: pid,
            cols: 80,
            rows: 24,
        }))
        .await;
    assert_eq!(code(r), Code::NotFound);
}

#[tokio::test]
async fn exited_processes_leave_the_table() {
    let f = fixture();
    let (mut s, pid) = start(&f.svc, config(&["true"]), None).await;
    assert_eq!(rest(&mut s).await.exit, Some(0));
    let r = f
        .svc
        .send_signal(Request::new(pb::SendSignalRequest {
            process_id: pid,
            signal: pb::Signal::Sigterm as i32,
        }))
        .await;
    assert_eq!(code(r), Code::NotFound);
    assert_eq!(f.daemon.processes.active(), 0);
}

#[tokio::test]
async fn execute_processes_cannot_be_addressed_by_pid() {
    let f = fixture();
    let r = execute(&f.svc, config(&["sh", "-c", "echo $$"]))
        .await
        .unwrap();
    let pid: i32 = String::from_utf8_lossy(&r.stdout).trim().parse().unwrap();
    let r = f
        .svc
        .send_signal(Request::new(pb::SendSignalRequest {
            process_id: pid,
            signal: pb::Signal::Sigterm as i32,
        }))
        .await;
    assert_eq!(code(r), Code::NotFound);
}

#[tokio::test]
async fn pty_is_the_controlling_terminal_with_the_requested_size() {
    let f = fixture();
    let (mut s, pid) = start(
        &f.svc,
        config(&[
            "sh",
            "-c",
            "tty; stty size; echo ready; read -r x; stty size; echo done",
        ]),
        Some(pb::Pty { cols: 91, rows: 27 }),
    )
    .await;
    let mut seen = Vec::new();
    read_until(&mut s, &mut seen, "ready").await;
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(text.starts_with("/dev/pts/"), "tty printed {text:?}");
    // The terminal translates \n to \r\n (ONLCR), as a real one does.
    assert!(text.contains("\r\n27 91\r\n"), "stty size printed {text:?}");
    within(f.svc.resize_tty(Request::new(pb::ResizeTtyRequest {
        process_id: pid,
        cols: 132,
        rows: 43,
    })))
    .await
    .unwrap();
    within(f.svc.write_stdin(Request::new(pb::WriteStdinRequest {
        process_id: pid,
        payload: Some(Payload::Input(Bytes::from_static(b"go\n"))),
    })))
    .await
    .unwrap();
    let r = rest(&mut s).await;
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(text.contains("43 132\r\ndone"), "after resize: {text:?}");
    assert!(r.stderr.is_empty(), "a terminal has one output stream");
    assert_eq!(r.exit, Some(0));
}

#[tokio::test]
async fn pty_eof_types_ctrl_d_and_input_echoes() {
    let f = fixture();
    let (mut s, pid) = start(
        &f.svc,
        config(&["cat"]),
        Some(pb::Pty { cols: 80, rows: 24 }),
    )
    .await;
    let write = |payload| {
        f.svc.write_stdin(Request::new(pb::WriteStdinRequest {
            process_id: pid,
            payload: Some(payload),
        }))
    };
    within(write(Payload::Input(Bytes::from_static(b"ping\n"))))
        .await
        .unwrap();
    let mut seen = Vec::new();
    // Once from the terminal's echo, once from cat.
    read_until(&mut s, &mut seen, "ping\r\nping\r\n").await;
    within(write(Payload::Eof(()))).await.unwrap();
    let r = rest(&mut s).await;
    assert_eq!(
        r.exit,
        Some(0),
        "cat did not see EOF; output {:?}",
        r.stdout
    );
}

#[tokio::test]
async fn resize_without_pty_is_failed_precondition() {
    let f = fixture();
    let (mut s, pid) = start(&f.svc, config(&["sleep", "100"]), None).await;
    let r = f
        .svc
        .resize_tty(Request::new(pb::ResizeTtyRequest {
            process_id: pid,
            cols: 80,
            rows: 24,
        }))
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);
    f.daemon.processes.kill_all();
    assert_eq!(rest(&mut s).await.exit, Some(128 + 9));
}

#[tokio::test]
async fn dropped_execute_kills_the_process_group() {
    let f = fixture();
    let (a, b) = (unique_sleep(1), unique_sleep(2));
    let script = format!("sleep {a} & sleep {b}; wait");
    // Dropping the call is what the server does when the client's
    // deadline passes or it cancels.
    let mut call = Box::pin(f.svc.execute(Request::new(pb::ExecuteRequest {
        config: Some(config(&["sh", "-c", &script])),
    })));
    tokio::select! {
        r = &mut call => panic!("execute finished early: {r:?}"),
        _ = eventually("both sleeps run", || running(&["sleep", &a]) && running(&["sleep", &b])) => {}
    }
    assert_eq!(f.daemon.processes.active(), 1);
    drop(call);
    eventually("both sleeps are killed", || {
        !running(&["sleep", &a]) && !running(&["sleep", &b])
    })
    .await;
    assert_eq!(f.daemon.processes.active(), 0);
}

#[tokio::test]
async fn closed_start_stream_kills_the_process_group() {
    let f = fixture();
    let arg = unique_sleep(3);
    let (s, _) = start(
        &f.svc,
        config(&["sh", "-c", &format!("sleep {arg}; true")]),
        None,
    )
    .await;
    // exec publishes the new command line a moment after spawn returns.
    eventually("the sleep runs", || running(&["sleep", &arg])).await;
    drop(s);
    eventually("the sleep is killed", || !running(&["sleep", &arg])).await;
    eventually("it leaves the table", || f.daemon.processes.active() == 0).await;
}

#[tokio::test]
async fn table_counts_waits_for_idle_and_kills_all() {
    let f = fixture();
    let table = &f.daemon.processes;
    assert_eq!(table.active(), 0);
    assert!(within(table.wait_idle(Duration::from_millis(10))).await);
    let (mut s1, _) = start(&f.svc, config(&["sleep", "100"]), None).await;
    let (mut s2, _) = start(
        &f.svc,
        config(&["sh", "-c", "sleep 100"]),
        Some(pb::Pty { cols: 80, rows: 24 }),
    )
    .await;
    assert_eq!(table.active(), 2);
    assert!(!table.wait_idle(Duration::from_millis(50)).await);
    table.kill_all();
    assert_eq!(rest(&mut s1).await.exit, Some(128 + 9));
    assert_eq!(rest(&mut s2).await.exit, Some(128 + 9));
    assert!(within(table.wait_idle(WAIT)).await);
    assert_eq!(table.active(), 0);
}

#[tokio::test]
async fn metrics_count_spawns_and_running_processes() {
    let f = fixture();
    execute(&f.svc, config(&["true"])).await.unwrap();
    let (mut s, _) = start(&f.svc, config(&["sleep", "100"]), None).await;
    let text = f.daemon.metrics.render();
    assert!(text.contains("sandboxd_exec_total 2"), "{text}");
    assert!(text.contains("sandboxd_active_processes 1"), "{text}");
    f.daemon.processes.kill_all();
    rest(&mut s).await;
    let text = f.daemon.metrics.render();
    assert!(text.contains("sandboxd_active_processes 0"), "{text}");
    assert!(
        text.contains("sandboxd_exec_duration_seconds_count 2"),
        "{text}"
    );
}

fn spec(argv: &[&str]) -> Spec {
    Spec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn run_feeds_stdin_and_collects_output() {
    let f = fixture();
    let mut s = spec(&["sh", "-c", "tr a-z A-Z; echo \"$X\" >&2"]);
    s.stdin = Some(Bytes::from_static(b"hello"));
    s.env.insert("X".into(), "ex".into());
    let done = within(process::run(&f.daemon, s)).await.unwrap();
    assert_eq!(done.stdout, b"HELLO");
    assert_eq!(done.stderr, b"ex\n");
    assert_eq!(done.exit_code, 0);
    assert!(!done.timed_out);
}

#[tokio::test]
async fn run_with_large_stdin_that_is_never_read_finishes() {
    let f = fixture();
    let mut s = spec(&["true"]);
    s.stdin = Some(Bytes::from(vec![b'x'; 1 << 20]));
    let done = within(process::run(&f.daemon, s)).await.unwrap();
    assert_eq!(done.exit_code, 0);
}

#[tokio::test]
async fn run_timeout_kills_the_group_and_keeps_partial_output() {
    let f = fixture();
    let arg = unique_sleep(4);
    let mut s = spec(&["sh", "-c", &format!("echo partial; sleep {arg} & wait")]);
    s.timeout = Some(Duration::from_millis(300));
    let started = Instant::now();
    let done = within(process::run(&f.daemon, s)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(done.timed_out);
    assert_eq!(done.exit_code, 124);
    assert_eq!(done.stdout, b"partial\n");
    eventually("the sleep is killed", || !running(&["sleep", &arg])).await;
}

#[tokio::test]
async fn run_errors_like_execute() {
    let f = fixture();
    let r = process::run(&f.daemon, spec(&[])).await;
    assert!(
        matches!(r, Err(sandboxd::error::Error::InvalidArgument(_))),
        "{r:?}"
    );
    let mut s = spec(&["pwd"]);
    s.cwd = Some("../x".into());
    let r = process::run(&f.daemon, s).await;
    assert!(
        matches!(r, Err(sandboxd::error::Error::PermissionDenied(_))),
        "{r:?}"
    );
    let r = process::run(&f.daemon, spec(&["no-such-tool-xyz"])).await;
    assert!(
        matches!(r, Err(sandboxd::error::Error::NotFound(_))),
        "{r:?}"
    );
}
