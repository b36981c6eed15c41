//! `keep.v1.KeptProcessService` (Sandhub's extension): processes that
//! outlive their `Start` stream, listed and attached to by label, with
//! bounded tails and counts. Real tonic clients against the real sandboxd
//! binary on loopback. (That `process.v1` Start still kills on stream close
//! is `process_grpc::dropped_start_stream_kills_the_process`.)

mod common;

use std::{
    future::Future,
    time::{Duration, Instant},
};

use sandhub_api::proto::{
    keep::v1::{
        self as kpb, attach_response::Event, kept_process_service_client::KeptProcessServiceClient,
    },
    process::v1::{self as pb, process_service_client::ProcessServiceClient},
};
use tonic::{transport::Channel, Code, Streaming};

const WAIT: Duration = Duration::from_secs(15);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("operation did not finish in time")
}

async fn client(d: &common::Daemon) -> KeptProcessServiceClient<Channel> {
    within(KeptProcessServiceClient::connect(d.grpc_url()))
        .await
        .expect("connecting to sandboxd")
}

fn request(argv: &[&str], label: &str) -> kpb::StartRequest {
    kpb::StartRequest {
        start: Some(pb::StartRequest {
            config: Some(pb::ProcessConfig {
                command: argv.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            pty: None,
        }),
        label: label.into(),
        tag: String::new(),
        stdin_closed: false,
    }
}

async fn start(
    c: &mut KeptProcessServiceClient<Channel>,
    argv: &[&str],
    label: &str,
) -> (Streaming<kpb::AttachResponse>, i32) {
    let mut stream = within(c.start(request(argv, label)))
        .await
        .expect("Start")
        .into_inner();
    match next(&mut stream).await {
        Some(Event::Init(init)) => (stream, init.process_id),
        other => panic!("first event is not init: {other:?}"),
    }
}

async fn attach(
    c: &mut KeptProcessServiceClient<Channel>,
    pid: i32,
    label: &str,
) -> Result<Streaming<kpb::AttachResponse>, tonic::Status> {
    within(c.attach(kpb::AttachRequest {
        process_id: pid,
        label: label.into(),
    }))
    .await
    .map(|r| r.into_inner())
}

async fn next(stream: &mut Streaming<kpb::AttachResponse>) -> Option<Event> {
    within(stream.message())
        .await
        .expect("stream failed")
        .map(|m| m.event.expect("event set"))
}

/// What a reader saw from after init to the end of the stream.
#[derive(Default, Debug)]
struct Seen {
    pid: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped: u64,
    exit: Option<i32>,
}

async fn read_to_end(stream: &mut Streaming<kpb::AttachResponse>) -> Seen {
    let mut seen = Seen::default();
    while let Some(ev) = next(stream).await {
        match ev {
            Event::Init(i) => seen.pid = Some(i.process_id),
            Event::Stdout(b) => seen.stdout.extend_from_slice(&b),
            Event::Stderr(b) => seen.stderr.extend_from_slice(&b),
            Event::Dropped(d) => seen.dropped += d.bytes,
            Event::Exit(e) => seen.exit = Some(e.exit_code),
        }
    }
    seen
}

async fn list(c: &mut KeptProcessServiceClient<Channel>, label: &str) -> Vec<kpb::KeptProcess> {
    within(c.list(kpb::ListRequest {
        label: label.into(),
    }))
    .await
    .expect("List")
    .into_inner()
    .processes
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_kept_process_outlives_its_stream_and_replays_to_a_later_reader() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    // Prints, then waits for a line on stdin: it can only finish if it
    // survived the stream's end and a pid call still reaches it.
    let script = "echo before; echo err >&2; read line; echo \"got $line\"; exit 7";
    let (stream, pid) = start(&mut c, &["/bin/sh", "-c", script], "tenant-a").await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        common::pid_alive(pid),
        "the kept process died with its stream"
    );

    let listed = list(&mut c, "tenant-a").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].process_id, pid);
    assert_eq!(listed[0].exit_code, None);
    assert_eq!(listed[0].config.as_ref().unwrap().command[0], "/bin/sh");

    // A reader attached while it runs gets the tail, then live output.
    let mut live = attach(&mut c, pid, "tenant-a").await.expect("Attach");
    let mut p = within(ProcessServiceClient::connect(d.grpc_url()))
        .await
        .unwrap();
    within(p.write_stdin(pb::WriteStdinRequest {
        process_id: pid,
        payload: Some(pb::write_stdin_request::Payload::Input("hello\n".into())),
    }))
    .await
    .expect("stdin reaches a kept process");
    let seen = read_to_end(&mut live).await;
    assert_eq!(seen.pid, Some(pid));
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "before\ngot hello\n");
    assert_eq!(String::from_utf8_lossy(&seen.stderr), "err\n");
    assert_eq!((seen.dropped, seen.exit), (0, Some(7)));

    // After the exit: still listed with its code, and replayable whole.
    let listed = list(&mut c, "tenant-a").await;
    assert_eq!(listed[0].exit_code, Some(7));
    let again = read_to_end(&mut attach(&mut c, pid, "tenant-a").await.unwrap()).await;
    assert_eq!(again.stdout, seen.stdout);
    assert_eq!(again.exit, Some(7));
}

#[tokio::test]
async fn labels_scope_list_and_attach() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let (_s, pid) = start(&mut c, &["sleep", "30"], "session-1").await;
    assert!(list(&mut c, "session-2").await.is_empty());
    assert!(list(&mut c, "").await.is_empty());
    assert_eq!(list(&mut c, "session-1").await.len(), 1);
    let other = attach(&mut c, pid, "session-2").await;
    assert_eq!(
        other.expect_err("another label attached").code(),
        Code::NotFound
    );
    let unknown = attach(&mut c, 999_999, "session-1").await;
    assert_eq!(unknown.expect_err("unknown pid").code(), Code::NotFound);
    // An ordinary Start's process is not kept, so not attachable.
    let mut p = within(ProcessServiceClient::connect(d.grpc_url()))
        .await
        .unwrap();
    let mut plain = within(p.start(pb::StartRequest {
        config: Some(pb::ProcessConfig {
            command: vec!["sleep".into(), "30".into()],
            ..Default::default()
        }),
        pty: None,
    }))
    .await
    .unwrap()
    .into_inner();
    let plain_pid = match within(plain.message()).await.unwrap().unwrap().event {
        Some(pb::start_response::Event::Init(i)) => i.process_id,
        other => panic!("{other:?}"),
    };
    let code = attach(&mut c, plain_pid, "")
        .await
        .expect_err("plain attached")
        .code();
    assert_eq!(code, Code::NotFound);
    let long = "x".repeat(257);
    let status = within(c.start(request(&["true"], &long)))
        .await
        .expect_err("long label");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = within(c.list(kpb::ListRequest {
        label: long.clone(),
    }))
    .await
    .expect_err("long label");
    assert_eq!(status.code(), Code::InvalidArgument);
    let mut tagged = request(&["true"], "session-1");
    tagged.tag = long;
    let status = within(c.start(tagged)).await.expect_err("long tag");
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn list_shows_the_starters_tag() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let mut tagged = request(&["sleep", "30"], "e2b");
    tagged.tag = "dev-server".into();
    let mut stream = within(c.start(tagged)).await.unwrap().into_inner();
    let pid = match next(&mut stream).await {
        Some(Event::Init(i)) => i.process_id,
        other => panic!("{other:?}"),
    };
    let (_s, untagged) = start(&mut c, &["sleep", "30"], "e2b").await;
    let listed = list(&mut c, "e2b").await;
    let tag_of = |p: i32| {
        listed
            .iter()
            .find(|k| k.process_id == p)
            .map(|k| k.tag.clone())
    };
    assert_eq!(tag_of(pid).as_deref(), Some("dev-server"));
    assert_eq!(tag_of(untagged).as_deref(), Some(""));
}

#[tokio::test]
async fn the_tail_keeps_the_newest_mebibyte_and_says_how_much_it_dropped() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let total: u64 = 3 << 20;
    // 3 MiB nobody reads while it is written: the process must not block.
    let script = format!("head -c {total} /dev/zero | tr '\\0' a; printf END");
    let (stream, pid) = start(&mut c, &["/bin/sh", "-c", &script], "t").await;
    drop(stream);
    eventually("the writer finishes unread", || !common::pid_alive(pid)).await;
    let seen = read_to_end(&mut attach(&mut c, pid, "t").await.unwrap()).await;
    assert_eq!(seen.exit, Some(0));
    assert!(
        seen.stdout.ends_with(b"aaaEND"),
        "the newest bytes are kept"
    );
    assert!(
        seen.stdout.len() <= 1 << 20,
        "{} bytes held",
        seen.stdout.len()
    );
    assert!(
        seen.stdout.len() > 1 << 19,
        "{} bytes held",
        seen.stdout.len()
    );
    assert_eq!(seen.dropped + seen.stdout.len() as u64, total + 3);
}

#[tokio::test]
async fn kept_processes_are_bounded_in_number() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    let mut held = Vec::new();
    for _ in 0..32 {
        held.push(start(&mut c, &["sleep", "30"], "n").await);
    }
    let refused = within(c.start(request(&["sleep", "30"], "n")))
        .await
        .expect_err("a 33rd kept process started");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    // One exiting makes room again.
    let mut p = within(ProcessServiceClient::connect(d.grpc_url()))
        .await
        .unwrap();
    let (_, victim) = &held[0];
    within(p.send_signal(pb::SendSignalRequest {
        process_id: *victim,
        signal: pb::Signal::Sigkill as i32,
    }))
    .await
    .unwrap();
    let victim = *victim;
    eventually("the killed one is reaped", || !common::pid_alive(victim)).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let listed = list(&mut c, "n").await;
        if listed
            .iter()
            .any(|p| p.process_id == victim && p.exit_code == Some(137))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the exit was not recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_s, _) = start(&mut c, &["sleep", "30"], "n").await;
    // 33 records held (one exited) is more than 32: the exited one went.
    let listed = list(&mut c, "n").await;
    assert_eq!(listed.len(), 32);
    assert!(listed.iter().all(|p| p.exit_code.is_none()));
}

#[tokio::test]
async fn stdin_closed_at_start_reads_eof_and_takes_no_more_input() {
    let d = common::Daemon::start(&[]);
    let mut c = client(&d).await;
    // `cat` finishes only when its stdin ends: with the pipe open it would
    // wait until the test timed out.
    let mut closed = request(&["/bin/sh", "-c", "cat; echo done"], "s");
    closed.stdin_closed = true;
    let mut stream = within(c.start(closed)).await.expect("Start").into_inner();
    let seen = read_to_end(&mut stream).await;
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "done\n");
    assert_eq!(seen.exit, Some(0));
    let pid = seen.pid.expect("init came first");

    // Input to it is refused as to any process whose stdin was closed.
    let (_held, pid_open) = start(&mut c, &["sleep", "30"], "s").await;
    let mut closed = request(&["sleep", "30"], "s");
    closed.stdin_closed = true;
    let mut stream = within(c.start(closed)).await.expect("Start").into_inner();
    let Some(Event::Init(init)) = next(&mut stream).await else {
        panic!("no init")
    };
    let mut p = within(ProcessServiceClient::connect(d.grpc_url()))
        .await
        .unwrap();
    let write = |pid| pb::WriteStdinRequest {
        process_id: pid,
        payload: Some(pb::write_stdin_request::Payload::Input("x\n".into())),
    };
    let refused = within(p.write_stdin(write(init.process_id)))
        .await
        .expect_err("stdin of a process started with it closed took input");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    within(p.write_stdin(write(pid_open)))
        .await
        .expect("a process started without the flag keeps its stdin");
    assert_ne!(pid, init.process_id);
}
