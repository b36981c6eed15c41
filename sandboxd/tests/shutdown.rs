//! SIGTERM: health turns 503, running work may finish within
//! `--shutdown-timeout`, then remaining process groups are killed.

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use sandhub_api::proto::process::v1::{
    process_service_client::ProcessServiceClient, start_response::Event, ProcessConfig,
    StartRequest,
};

async fn start_sleeper(d: &Daemon, script: &str) -> i32 {
    let mut grpc = ProcessServiceClient::connect(d.grpc_url()).await.unwrap();
    let mut stream = grpc
        .start(StartRequest {
            config: Some(ProcessConfig {
                command: vec!["sh".into(), "-c".into(), script.into()],
                ..Default::default()
            }),
            pty: None,
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    let Some(Event::Init(init)) = first.event else {
        panic!("first event was not init: {first:?}")
    };
    // Keep the stream open in the background so the process is not
    // cancelled by the client going away.
    tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} });
    init.process_id
}

#[tokio::test]
async fn sigterm_drains_then_kills_the_process_groups() {
    let mut d = Daemon::start(&["--shutdown-timeout", "1500ms"]);
    // The child of the shell is in the same group and must die too.
    let pid = start_sleeper(&d, "sleep 60 & echo $! > child.pid; wait").await;
    let child_pid_path = d.root_path().join("child.pid");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !child_pid_path.exists() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let child: i32 = std::fs::read_to_string(&child_pid_path)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(common::pid_alive(pid) && common::pid_alive(child));

    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let started = Instant::now();
    // While draining, health says 503 with an UNAVAILABLE body.
    let mut saw_503 = false;
    while started.elapsed() < Duration::from_millis(1200) {
        if let Ok(r) = reqwest::get(d.rest("/v1/health")).await {
            if r.status() == 503 {
                let v: serde_json::Value = r.json().await.unwrap();
                assert_eq!(v["code"], "UNAVAILABLE");
                saw_503 = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(saw_503, "health never answered 503 while draining");
    let status = d.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "did not wait for the timeout: {took:?}"
    );
    let gone = Instant::now() + Duration::from_secs(5);
    while common::pid_alive(child) || common::pid_alive(pid) {
        assert!(Instant::now() < gone, "process group survived shutdown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigterm_lets_short_work_finish() {
    let mut d = Daemon::start(&["--shutdown-timeout", "20s"]);
    start_sleeper(&d, "sleep 0.5; echo done > finished").await;
    let started = Instant::now();
    d.terminate();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the full timeout"
    );
    assert_eq!(
        std::fs::read_to_string(d.root_path().join("finished")).unwrap(),
        "done\n"
    );
}

#[tokio::test]
async fn idle_daemon_stops_promptly() {
    let mut d = Daemon::start(&[]);
    let started = Instant::now();
    let status = d.terminate();
    assert!(status.success());
    assert!(started.elapsed() < Duration::from_secs(3));
}
