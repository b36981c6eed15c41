//! `--max-processes` against the real sandboxd binary: the process after
//! the limit is refused at once with RESOURCE_EXHAUSTED on every API that
//! spawns, a place frees when its process is reaped, and one HTTP/2
//! connection carries more processes than its old fixed stream limit (1024)
//! instead of stalling the next call silently.

mod common;

use std::{
    future::Future,
    time::{Duration, Instant},
};

use sandhub_api::proto::process::v1::{
    self as pb, process_service_client::ProcessServiceClient, start_response::Event,
};
use tonic::{transport::Channel, Code, Streaming};

/// Upper bound of every wait: a call that hangs fails the test here.
const WAIT: Duration = Duration::from_secs(20);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("the call hung instead of answering")
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

/// `cat` with its stdin held open by the daemon runs until killed, and ends
/// by itself (EOF) if the daemon dies: a test that fails leaves nothing.
fn idle() -> pb::StartRequest {
    pb::StartRequest {
        config: Some(config(&["cat"])),
        pty: None,
    }
}

async fn try_start(
    c: &mut ProcessServiceClient<Channel>,
) -> Result<(Streaming<pb::StartResponse>, i32), tonic::Status> {
    let mut stream = within(c.start(idle())).await?.into_inner();
    match within(stream.message()).await? {
        Some(pb::StartResponse {
            event: Some(Event::Init(init)),
        }) => Ok((stream, init.process_id)),
        other => panic!("first event is not init: {other:?}"),
    }
}

/// Reads a started process's stream to its exit code.
async fn exit_of(stream: &mut Streaming<pb::StartResponse>) -> i32 {
    loop {
        match within(stream.message()).await.expect("stream failed") {
            Some(pb::StartResponse {
                event: Some(Event::Exit(e)),
            }) => return e.exit_code,
            Some(_) => {}
            None => panic!("stream ended without an exit event"),
        }
    }
}

/// `sandboxd_active_processes` from `/metrics`.
async fn active_processes(d: &common::Daemon) -> u64 {
    let text = within(reqwest::get(d.rest("/metrics")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("sandboxd_active_processes "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the active_processes gauge")
}

fn assert_over_limit(st: &tonic::Status, limit: usize) {
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert!(
        st.message().contains(&limit.to_string()) && st.message().contains("--max-processes"),
        "the message names the limit: {st:?}"
    );
}

async fn kill(c: &mut ProcessServiceClient<Channel>, pid: i32) {
    within(c.send_signal(pb::SendSignalRequest {
        process_id: pid,
        signal: pb::Signal::Sigkill as i32,
    }))
    .await
    .expect("SendSignal");
}

#[tokio::test]
async fn the_process_after_the_limit_is_refused_at_once_and_a_reaped_one_frees_its_place() {
    let d = common::Daemon::start(&["--max-processes", "3"]);
    let mut c = client(&d).await;
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(try_start(&mut c).await.expect("a start under the limit"));
    }

    // Every API that spawns refuses the fourth, and refusals hold no place.
    for _ in 0..3 {
        let st = try_start(&mut c).await.expect_err("a start over the limit");
        assert_over_limit(&st, 3);
        let st = within(c.execute(pb::ExecuteRequest {
            config: Some(config(&["true"])),
        }))
        .await
        .expect_err("an execute over the limit");
        assert_over_limit(&st, 3);
    }
    let r = within(
        reqwest::Client::new()
            .post(d.legacy("/execute"))
            .json(&serde_json::json!({"command": "true"}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "RESOURCE_EXHAUSTED", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--max-processes"),
        "{body}"
    );

    // Killed and reaped: once its client has seen the exit, the place is free.
    let (mut stream, pid) = running.remove(0);
    kill(&mut c, pid).await;
    assert_eq!(exit_of(&mut stream).await, 128 + 9);
    running.push(try_start(&mut c).await.expect("a start after a kill"));

    // The same for a run-to-completion call, and for the legacy API.
    let (mut stream, pid) = running.remove(0);
    kill(&mut c, pid).await;
    exit_of(&mut stream).await;
    let done = within(c.execute(pb::ExecuteRequest {
        config: Some(config(&["echo", "room"])),
    }))
    .await
    .expect("an execute with a free place")
    .into_inner();
    assert_eq!(done.stdout, b"room\n"[..]);
    let r = within(
        reqwest::Client::new()
            .post(d.legacy("/execute"))
            .json(&serde_json::json!({"command": "echo legacy"}))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["stdout"], "legacy\n", "{body}");
}

#[tokio::test]
async fn an_execute_in_flight_holds_a_place_until_it_is_cancelled() {
    let d = common::Daemon::start(&["--max-processes", "1"]);
    let mut c = client(&d).await;
    let mut busy = c.clone();
    let execute = tokio::spawn(async move {
        busy.execute(pb::ExecuteRequest {
            config: Some(config(&["sleep", "120"])),
        })
        .await
    });
    // The execute holds the only place once its process runs.
    let deadline = Instant::now() + WAIT;
    while active_processes(&d).await != 1 {
        assert!(Instant::now() < deadline, "the execute never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = try_start(&mut c).await.expect_err("a start over the limit");
    assert_over_limit(&refused, 1);
    // A cancelled call kills its process, which frees the place.
    execute.abort();
    let deadline = Instant::now() + WAIT;
    let (mut stream, pid) = loop {
        match try_start(&mut c).await {
            Ok(started) => break started,
            Err(st) => assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}"),
        }
        assert!(Instant::now() < deadline, "the place never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    kill(&mut c, pid).await;
    exit_of(&mut stream).await;
}

/// Before the stream limit was derived from `--max-processes`, the 1025th
/// process of one connection waited forever for a free HTTP/2 stream.
#[tokio::test]
async fn one_connection_runs_more_processes_than_the_old_stream_limit() {
    const N: usize = 1100;
    let d = common::Daemon::start(&["--max-processes", &N.to_string()]);
    // One tonic channel is one HTTP/2 connection.
    let mut c = client(&d).await;
    let mut running = Vec::with_capacity(N);
    for i in 0..N {
        match try_start(&mut c).await {
            Ok(started) => running.push(started),
            Err(st) => panic!("start {i} of {N}: {st:?}"),
        }
    }
    let st = try_start(&mut c).await.expect_err("a start over the limit");
    assert_over_limit(&st, N);
    // Dropping a stream kills its process; the daemon's exit ends the rest.
    drop(running);
}
