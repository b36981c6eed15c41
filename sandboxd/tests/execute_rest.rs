//! `POST /v1/_sandhub/execute`: `Execute` over HTTP/1.1, against the real
//! sandboxd binary: protobuf in and out, the JSON errors, the token, the
//! body's bound, and the same process accounting as gRPC's.

mod common;

use std::time::Duration;

use common::Daemon;
use prost::Message;
use reqwest::{header, Client, StatusCode};
use sandhub_api::{
    proto::process::v1 as pb,
    sandboxd::{
        EXECUTE_ROUTE, EXECUTE_TIMED_OUT_HEADER, MAX_EXECUTE_REQUEST, PROTOBUF_CONTENT_TYPE,
    },
};

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn request(argv: &[&str]) -> Vec<u8> {
    pb::ExecuteRequest {
        config: Some(pb::ProcessConfig {
            command: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

async fn post(d: &Daemon, body: Vec<u8>, token: Option<&str>) -> reqwest::Response {
    let mut call = client()
        .post(d.rest(EXECUTE_ROUTE))
        .header(header::CONTENT_TYPE, PROTOBUF_CONTENT_TYPE)
        .body(body);
    if let Some(token) = token {
        call = call.bearer_auth(token);
    }
    call.send().await.unwrap()
}

async fn error_code(response: reqwest::Response, status: StatusCode) -> String {
    assert_eq!(response.status(), status);
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    body["code"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_command_runs_and_answers_in_protobuf() {
    let d = Daemon::start(&[]);
    let response = post(
        &d,
        request(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
        None,
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        PROTOBUF_CONTENT_TYPE
    );
    let done = pb::ExecuteResponse::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(done.exit_code, 3);
    assert_eq!(&done.stdout[..], b"out\n");
    assert_eq!(&done.stderr[..], b"err\n");

    // Counted as gRPC's Execute is: one process started.
    let metrics = client()
        .get(d.rest("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("sandboxd_exec_total 1\n"), "{metrics}");
}

#[tokio::test]
async fn bad_requests_get_json_errors_with_upstreams_code_words() {
    let d = Daemon::start(&[]);
    let garbage = post(&d, b"\xff\xff\xff not protobuf".to_vec(), None).await;
    assert_eq!(
        error_code(garbage, StatusCode::BAD_REQUEST).await,
        "INVALID_ARGUMENT"
    );
    let empty = post(&d, request(&[]), None).await;
    assert_eq!(
        error_code(empty, StatusCode::BAD_REQUEST).await,
        "INVALID_ARGUMENT"
    );
    // A missing executable is the command's NOT_FOUND, told apart from a
    // missing route by its message.
    let missing = post(&d, request(&["/no/such/program"]), None).await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["code"], "NOT_FOUND");
    assert!(
        !body["message"]
            .as_str()
            .unwrap()
            .starts_with("no route for "),
        "{body}"
    );
    let get = client().get(d.rest(EXECUTE_ROUTE)).send().await.unwrap();
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_body_over_the_bound_is_refused_unread() {
    let d = Daemon::start(&[]);
    let response = post(&d, vec![0u8; MAX_EXECUTE_REQUEST + 1], None).await;
    assert_eq!(
        error_code(response, StatusCode::PAYLOAD_TOO_LARGE).await,
        "RESOURCE_EXHAUSTED"
    );
}

#[tokio::test]
async fn the_route_needs_the_token() {
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret").unwrap();
    let d = Daemon::start(&["--auth-token-file", token.path().to_str().unwrap()]);
    for presented in [None, Some("wrong")] {
        let refused = post(&d, request(&["true"]), presented).await;
        assert_eq!(
            error_code(refused, StatusCode::UNAUTHORIZED).await,
            "UNAUTHENTICATED"
        );
    }
    let ok = post(&d, request(&["true"]), Some("s3cret")).await;
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_timeout_kills_the_group_and_says_so() {
    let d = Daemon::start(&[]);
    let response = client()
        .post(format!("{}?timeout_ms=300", d.rest(EXECUTE_ROUTE)))
        .body(request(&["sh", "-c", "echo started; exec sleep 30"]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[EXECUTE_TIMED_OUT_HEADER], "true");
    let done = pb::ExecuteResponse::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(done.exit_code, 124);
    assert_eq!(&done.stdout[..], b"started\n");

    let quick = client()
        .post(format!("{}?timeout_ms=10000", d.rest(EXECUTE_ROUTE)))
        .body(request(&["true"]))
        .send()
        .await
        .unwrap();
    assert_eq!(quick.headers()[EXECUTE_TIMED_OUT_HEADER], "false");
    for bad in ["-1", "soon", "0"] {
        let refused = client()
            .post(format!("{}?timeout_ms={bad}", d.rest(EXECUTE_ROUTE)))
            .body(request(&["true"]))
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_code(refused, StatusCode::BAD_REQUEST).await,
            "INVALID_ARGUMENT",
            "{bad}"
        );
    }
}

/// A caller that hangs up mid-command takes its process group with it, as
/// a cancelled gRPC call does.
#[test]
fn a_caller_that_hangs_up_kills_the_command() {
    use std::io::Write;
    let d = Daemon::start(&[]);
    let body = request(&["sh", "-c", "echo $$ > pid; exec sleep 30"]);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", d.rest_port)).unwrap();
    write!(
        conn,
        "POST {EXECUTE_ROUTE} HTTP/1.1\r\nHost: sandboxd\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    conn.write_all(&body).unwrap();
    let pid_file = d.root_path().join("pid");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                break pid;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(conn);
    let gone = |pid: u32| match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} outlived its caller"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
