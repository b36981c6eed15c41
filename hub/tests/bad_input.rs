//! Hostile input on every front door (issue #12, rows 7, 8, 13, 14, 15):
//! durations past any clock, bodies that are not JSON objects, bodies as
//! `curl -d` sends them, uploads over the operator's cap, and an MCP
//! session id used with another tenant's key. Each answer must be a clean
//! JSON `{code, message}` (or a clean MCP tool error), never a panic or a
//! dropped connection, and nothing may be left behind.

mod common;

use std::io::{Read, Write};

use sandhub_api::hub::SandboxState;
use sandhub_client::Sandboxes;
use serde_json::{json, Value};

use common::{
    error_body,
    mcp::{text, McpClient},
    HubOptions, TestHub, ALICE_KEY, BOB_KEY, WAIT,
};

/// One HTTP/1.1 exchange with the bytes exactly as given: the answer's
/// status and body. A reset after the answer arrived is not an error here
/// (a server may close a connection whose body it refused to read).
fn raw_http(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if !out.is_empty() => {
                eprintln!("raw_http: read ended with {e}");
                break;
            }
            Err(e) => panic!("no answer: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A body of a chunked answer, de-chunked (good enough for one small JSON).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_string();
        };
        if n == 0 {
            break;
        }
        out.push_str(&after[..n.min(after.len())]);
        rest = after.get(n + 2..).unwrap_or("");
    }
    out
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body)
        .or_else(|_| serde_json::from_str(&dechunk(body)))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The request `curl -s -XPOST URL -d 'BODY'` sends, byte for byte.
fn curl_d(port: u16, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\
         Content-Length: {}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

// ------------------------------------------------------------------ row 8

/// JSON literals for an `f64` seconds field, none of them acceptable. The
/// ones that parse as numbers must be refused with the range.
const BAD_SECONDS: &[Literal] = &[
    ("-1", true),
    ("0", true),
    ("1e19", true),
    ("18446744073709551615", true),
    ("1.8446744073709552e19", true),
    ("1e308", true),
    ("86400.5", true),
    // Not JSON at all, or out of f64's range: refused as bad JSON.
    ("NaN", false),
    ("Infinity", false),
    ("-Infinity", false),
    ("1e400", false),
];

/// A JSON literal, and whether it parses as a number the field's type holds
/// (then the refusal must name the range).
type Literal = (&'static str, bool);

/// One route taking a duration: path, body with `V` for the value, the
/// values to send, and the range the refusal names.
type Case<'a> = (&'a str, String, &'static [Literal], &'static str);

/// JSON literals for a `u64` seconds field, none of them acceptable.
const BAD_LIFETIMES: &[Literal] = &[
    ("0", true),
    ("18446744073709551615", true),
    ("31536001", true),
    // Not a u64: refused by the JSON reader.
    ("-1", false),
    ("1e19", false),
    ("NaN", false),
    ("1e400", false),
];

#[tokio::test]
async fn durations_out_of_range_are_400_on_every_rest_and_gym_route() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let http = hub.http();
    let url = hub.url();
    let sb = c
        .create(Default::default())
        .await
        .expect("creating a sandbox");

    // (route, body with `V` for the value, which list of values, range text)
    let exec = format!("/v1/sandboxes/{}/exec", sb.id);
    let cases: Vec<Case> = vec![
        (
            "/v1/sandboxes",
            r#"{"shutdown_after_seconds": V}"#.into(),
            BAD_LIFETIMES,
            "between 1 and 31536000",
        ),
        (
            "/v1/sandboxes",
            r#"{"idle_timeout_seconds": V}"#.into(),
            BAD_LIFETIMES,
            "between 1 and 31536000",
        ),
        (
            &exec,
            r#"{"command": "true", "timeout_seconds": V}"#.into(),
            BAD_SECONDS,
            "between 0.001 and 86400",
        ),
        (
            "/gym/v1/envs",
            r#"{"step_timeout_seconds": V}"#.into(),
            BAD_SECONDS,
            "between 0.001 and 86400",
        ),
        (
            "/gym/v1/envs",
            r#"{"reward": [{"kind": "command", "command": "true", "timeout_seconds": V}]}"#.into(),
            BAD_SECONDS,
            "between 0.001 and 86400",
        ),
        (
            "/gym/v1/envs",
            r#"{"termination": [{"kind": "command", "command": "true", "timeout_seconds": V}]}"#
                .into(),
            BAD_SECONDS,
            "between 0.001 and 86400",
        ),
    ];
    for (path, template, values, range) in cases {
        for (value, in_json) in values {
            let body = template.replace('V', value);
            let r = http
                .post(format!("{url}{path}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap_or_else(|e| panic!("POST {path} {body}: no answer ({e})"));
            let err = error_body(r, 400, "INVALID_ARGUMENT").await;
            if *in_json {
                let message = err["message"].as_str().unwrap();
                assert!(message.contains(range), "POST {path} {body}: {err}");
            }
        }
    }

    // Nothing was created on the way, and the hub still serves.
    let all = c.list(&Default::default()).await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    let ok = c
        .exec(
            &sb.id,
            sandhub_api::hub::ExecRequest {
                command: sandhub_api::hub::Command::Shell("echo fine".into()),
                env: Default::default(),
                cwd: String::new(),
                timeout_seconds: Some(86_400.0),
                stdin: String::new(),
                container: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(ok.stdout, "fine\n");
}

#[tokio::test]
async fn mcp_tools_refuse_out_of_range_durations() {
    let hub = TestHub::start(HubOptions::default()).await;
    let mut mcp = McpClient::connect(&hub.url(), None).await;
    let created = mcp.call_ok("create_sandbox", json!({})).await;
    let name = created["sandbox_claim_name"].as_str().unwrap().to_string();
    let started = mcp
        .call_ok(
            "start_process",
            json!({"sandbox_claim_name": name, "command": "sleep 60"}),
        )
        .await;
    let pid = started["process_id"].as_str().unwrap().to_string();

    let sb = json!({"sandbox_claim_name": name});
    let with = |extra: Value| {
        let mut args = sb.clone();
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };
    // (tool, the other arguments, the duration field)
    let seconds_fields: Vec<(&str, Value, &str)> = vec![
        ("create_sandbox", json!({}), "sandbox_ready_timeout"),
        (
            "execute_command",
            with(json!({"command": "true"})),
            "timeout",
        ),
        (
            "upload_file",
            with(json!({"path": "a.txt", "content": "x"})),
            "timeout",
        ),
        ("download_file", with(json!({"path": "a.txt"})), "timeout"),
        ("list_files", with(json!({"path": ""})), "timeout"),
        ("file_exists", with(json!({"path": "a.txt"})), "timeout"),
        (
            "watch_directory",
            with(json!({"path": ""})),
            "timeout_seconds",
        ),
        (
            "read_process_output",
            with(json!({"process_id": pid})),
            "wait_seconds",
        ),
    ];
    let bad_seconds = [
        json!(-1),
        json!(-0.5),
        json!(1e19),
        json!(u64::MAX),
        json!(1e308),
        json!(f64::MAX),
    ];
    for (tool, args, field) in &seconds_fields {
        for bad in &bad_seconds {
            let mut call = args.clone();
            call[*field] = bad.clone();
            let result = mcp.call(tool, call.clone()).await;
            assert_eq!(result["isError"], true, "{tool}({call}): {result}");
            let t = text(&result);
            assert!(t.contains("INVALID_ARGUMENT"), "{tool}({call}): {t}");
            assert!(t.contains(field), "{tool}({call}): {t}");
        }
    }
    for bad in [json!(-1), json!(0), json!(1e19), json!(u64::MAX)] {
        let call = json!({"shutdown_after_seconds": bad});
        let result = mcp.call("create_sandbox", call.clone()).await;
        assert_eq!(result["isError"], true, "create_sandbox({call}): {result}");
        assert!(
            text(&result).contains("INVALID_ARGUMENT"),
            "create_sandbox({call}): {result}"
        );
    }
    // Values no JSON can carry are the JSON-RPC reader's to refuse: a
    // clean client error, and the session goes on.
    for literal in ["NaN", "Infinity", "1e400"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":900,"method":"tools/call","params":{{"name":"execute_command","arguments":{{"sandbox_claim_name":"{name}","command":"true","timeout":{literal}}}}}}}"#
        );
        let a = mcp.post_raw(body).await;
        let refused = (400..500).contains(&a.status)
            || a.message(900).is_some_and(|m| m.get("error").is_some());
        assert!(refused, "{literal}: HTTP {} {}", a.status, a.body);
    }

    // Only the one sandbox exists, and it still works.
    let listed = mcp.call_ok("list_sandboxes", json!({})).await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 1, "{listed}");
    let ran = mcp
        .call_ok(
            "execute_command",
            json!({"sandbox_claim_name": name, "command": "echo fine", "timeout": 3600}),
        )
        .await;
    assert_eq!(ran["stdout"], "fine\n");
}

// ------------------------------------------------------------------ row 14

#[tokio::test]
async fn json_bodies_must_be_objects() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let http = hub.http();
    let url = hub.url();
    let sb = c.create(Default::default()).await.unwrap();
    let id = &sb.id;

    let routes: Vec<(reqwest::Method, String)> = vec![
        (reqwest::Method::POST, "/v1/sandboxes".into()),
        (reqwest::Method::POST, format!("/v1/sandboxes/{id}/exec")),
        (
            reqwest::Method::POST,
            format!("/v1/sandboxes/{id}/processes"),
        ),
        (reqwest::Method::POST, format!("/v1/sandboxes/{id}/fork")),
        (
            reqwest::Method::POST,
            format!("/v1/sandboxes/{id}/processes/1/signal"),
        ),
        (reqwest::Method::PUT, "/v1/templates/arrays".into()),
        (reqwest::Method::PUT, "/v1/pools/arrays".into()),
        (reqwest::Method::POST, "/gym/v1/envs".into()),
        (reqwest::Method::POST, "/gym/v1/envs/env-nope/reset".into()),
        (reqwest::Method::POST, "/gym/v1/step".into()),
    ];
    for (method, path) in &routes {
        for body in ["[]", "[{}]", "null", "\"{}\"", "1", "true"] {
            let r = http
                .request(method.clone(), format!("{url}{path}"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let err = error_body(r, 400, "INVALID_ARGUMENT").await;
            assert!(
                err["message"]
                    .as_str()
                    .unwrap()
                    .contains("must be a JSON object"),
                "{method} {path} {body}: {err}"
            );
        }
    }
    // A required body may not be empty either; an optional one may.
    let r = http
        .post(format!("{url}/v1/sandboxes"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    error_body(r, 400, "INVALID_ARGUMENT").await;

    // Nothing was created by any of it.
    let all = c.list(&Default::default()).await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(c.get_template("arrays").await.is_err());
    assert!(c.get_pool("arrays").await.is_err());
}

// ------------------------------------------------------------------ row 15

#[tokio::test]
async fn curl_d_bodies_are_read_as_json() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let port = hub.port;

    // The README's line, exactly as curl sends it.
    let (status, body) = raw_http(
        port,
        &curl_d(port, "/v1/sandboxes", r#"{"labels":{"team":"ml"}}"#),
    );
    assert_eq!(status, 201, "{body}");
    let created = json_of(&body);
    assert_eq!(created["labels"]["team"], "ml", "{created}");
    assert_eq!(created["state"], "Ready", "{created}");
    let id = created["id"].as_str().unwrap().to_string();

    let (status, body) = raw_http(
        port,
        &curl_d(
            port,
            &format!("/v1/sandboxes/{id}/exec"),
            r#"{"command":"uname -s"}"#,
        ),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body)["stdout"], "Linux\n");

    // No content type at all, and text/plain: JSON too.
    let exec_with = |content_type: Option<&str>| {
        let body = r#"{"command":"echo ok"}"#;
        let ct = content_type
            .map(|t| format!("Content-Type: {t}\r\n"))
            .unwrap_or_default();
        format!(
            "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\n{ct}Content-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    for ct in [
        None,
        Some("text/plain"),
        Some("application/json; charset=utf-8"),
    ] {
        let (status, body) = raw_http(port, exec_with(ct).as_bytes());
        assert_eq!(status, 200, "{ct:?}: {body}");
        assert_eq!(json_of(&body)["stdout"], "ok\n", "{ct:?}");
    }

    // A type that says the body is something else: 415, as JSON.
    let (status, body) = raw_http(port, exec_with(Some("application/xml")).as_bytes());
    assert_eq!(status, 415, "{body}");
    assert_eq!(json_of(&body)["code"], "INVALID_ARGUMENT", "{body}");

    // A web page may not use curl's type to skip the browser's preflight.
    let from_page = curl_d(port, "/v1/sandboxes", "{}");
    let from_page = String::from_utf8(from_page).unwrap().replacen(
        "Accept: */*\r\n",
        "Accept: */*\r\nOrigin: https://evil.example\r\n",
        1,
    );
    let (status, body) = raw_http(port, from_page.as_bytes());
    assert_eq!(status, 415, "{body}");
    assert_eq!(json_of(&body)["code"], "INVALID_ARGUMENT", "{body}");

    // Bad JSON under curl's type: the JSON error, never axum's plain text.
    let (status, body) = raw_http(port, &curl_d(port, "/v1/sandboxes", "{labels: x}"));
    assert_eq!(status, 400, "{body}");
    let err = json_of(&body);
    assert_eq!(err["code"], "INVALID_ARGUMENT", "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("not valid JSON"),
        "{err}"
    );

    assert_eq!(c.list(&Default::default()).await.unwrap().len(), 1);
}

// ------------------------------------------------------------------ row 7

const CAP: usize = 1024;

#[tokio::test]
async fn uploads_over_the_cap_get_413_and_leave_nothing_behind() {
    let hub = TestHub::start(HubOptions {
        extra_args: &["--max-upload-bytes", "1024"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let http = hub.http();
    let url = hub.url();
    let port = hub.port;
    let sb = c.create(Default::default()).await.unwrap();
    assert_eq!(sb.state, SandboxState::Ready);
    let file = |name: &str| format!("/v1/sandboxes/{}/files/{name}", sb.id);

    // At the cap: written.
    let r = http
        .put(format!("{url}{}", file("exact.bin")))
        .body(vec![b'x'; CAP])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let got = http
        .get(format!("{url}{}", file("exact.bin")))
        .send()
        .await
        .unwrap();
    assert_eq!(got.bytes().await.unwrap().len(), CAP);

    // A Content-Length over the cap: refused before any of the body is read
    // (none is sent).
    let (status, body) = raw_http(
        port,
        format!(
            "PUT {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            file("declared.bin"),
            CAP + 1
        )
        .as_bytes(),
    );
    assert_eq!(status, 413, "{body}");
    let err = json_of(&body);
    assert_eq!(err["code"], "PAYLOAD_TOO_LARGE", "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("1024 bytes"),
        "{err}"
    );
    // A gigabyte, declared: the same, at once.
    let (status, _) = raw_http(
        port,
        format!(
            "PUT {} HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n",
            file("declared.bin")
        )
        .as_bytes(),
    );
    assert_eq!(status, 413);

    // Chunked bodies over the cap: cut off, 413, and the target is left as
    // it was (absent, or its old content).
    let r = http
        .put(format!("{url}{}", file("kept.txt")))
        .body("old")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    for name in ["chunked.bin", "kept.txt"] {
        let mut request = format!(
            "PUT {} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            file(name)
        )
        .into_bytes();
        for _ in 0..3 {
            request.extend_from_slice(format!("{:x}\r\n", 1000).as_bytes());
            request.extend_from_slice(&[b'y'; 1000]);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
        let (status, body) = raw_http(port, &request);
        assert_eq!(status, 413, "{name}: {body}");
        assert_eq!(json_of(&body)["code"], "PAYLOAD_TOO_LARGE", "{body}");
    }
    let r = http
        .get(format!("{url}{}", file("chunked.bin")))
        .send()
        .await
        .unwrap();
    error_body(r, 404, "NOT_FOUND").await;
    let r = http
        .get(format!("{url}{}", file("declared.bin")))
        .send()
        .await
        .unwrap();
    error_body(r, 404, "NOT_FOUND").await;
    let kept = http
        .get(format!("{url}{}", file("kept.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(kept.text().await.unwrap(), "old");

    // MCP's upload_file is capped the same way.
    let mut mcp = McpClient::connect(&url, None).await;
    let created = mcp.call_ok("create_sandbox", json!({})).await;
    let name = created["sandbox_claim_name"].as_str().unwrap().to_string();
    let result = mcp
        .call(
            "upload_file",
            json!({"sandbox_claim_name": name, "path": "big.txt", "content": "z".repeat(CAP + 1)}),
        )
        .await;
    assert_eq!(result["isError"], true, "{result}");
    assert!(text(&result).contains("PAYLOAD_TOO_LARGE"), "{result}");
    let exists = mcp
        .call_ok(
            "file_exists",
            json!({"sandbox_claim_name": name, "path": "big.txt"}),
        )
        .await;
    assert_eq!(exists["exists"], false, "{exists}");
    mcp.call_ok(
        "upload_file",
        json!({"sandbox_claim_name": name, "path": "small.txt", "content": "z".repeat(CAP)}),
    )
    .await;

    // No temporary file of an aborted upload survives in either sandbox.
    for id in [sb.id.as_str(), name.as_str()] {
        let listing = c.list_files(id, "").await.unwrap();
        let names: Vec<&str> = listing.entries.iter().map(|e| e.name.as_str()).collect();
        assert!(
            names.iter().all(|n| !n.contains(".tmp")),
            "left behind in {id}: {names:?}"
        );
    }
}

// ------------------------------------------------------------------ row 13

#[tokio::test]
async fn an_mcp_session_answers_only_the_tenant_that_opened_it() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let url = hub.url();
    let mut alice = McpClient::connect(&url, Some(ALICE_KEY)).await;
    let created = alice.call_ok("create_sandbox", json!({})).await;
    let name = created["sandbox_claim_name"].as_str().unwrap().to_string();
    let started = alice
        .call_ok(
            "start_process",
            json!({"sandbox_claim_name": name, "command": "echo alice-secret; sleep 60"}),
        )
        .await;
    let pid = started["process_id"].as_str().unwrap().to_string();

    // Bob, with his own valid key and Alice's session id.
    let mut bob = McpClient::connect(&url, Some(BOB_KEY)).await;
    bob.session = alice.session.clone();
    let read = json!({
        "jsonrpc": "2.0", "id": 77, "method": "tools/call",
        "params": {"name": "read_process_output",
                   "arguments": {"sandbox_claim_name": name, "process_id": pid, "wait_seconds": 5}}
    });
    let a = bob.post(&read).await;
    assert_eq!(a.status, 404, "{}", a.body);
    assert!(!a.body.contains("alice-secret"), "{}", a.body);
    for method in ["tools/list", "resources/list"] {
        let a = bob
            .post(&json!({"jsonrpc": "2.0", "id": 78, "method": method}))
            .await;
        assert_eq!(a.status, 404, "{method}: {}", a.body);
    }
    // Nor may he end it.
    let r = hub
        .http()
        .delete(format!("{url}/mcp"))
        .bearer_auth(BOB_KEY)
        .header("mcp-session-id", alice.session.clone().unwrap())
        .header("mcp-protocol-version", common::mcp::PROTOCOL_VERSION)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // Alice's session is untouched: her output is still unread, and hers.
    let mut out = String::new();
    for _ in 0..12 {
        let r = alice
            .call_ok(
                "read_process_output",
                json!({"sandbox_claim_name": name, "process_id": pid, "wait_seconds": 5}),
            )
            .await;
        out.push_str(r["stdout"].as_str().unwrap_or(""));
        if !out.is_empty() {
            break;
        }
    }
    assert_eq!(out, "alice-secret\n");
}

/// Issue #26 (7): a template `user` that reads like an option
/// (`--root-dir=/`, `-h`) is refused at `PUT` with 400, not at start as
/// 503; and an `exec` whose absolute `cwd` lies outside the workspace says
/// how a cwd is read instead of only "no such directory".
#[tokio::test]
async fn flag_like_users_are_400_and_a_cwd_outside_the_workspace_is_explained() {
    let hub = TestHub::start(HubOptions::default()).await;
    let http = hub.http();
    for user in ["--root-dir=/", "-h", "app:-g"] {
        let r = http
            .put(format!("{}/v1/templates/flaggy", hub.url()))
            .json(&json!({ "user": user }))
            .send()
            .await
            .unwrap();
        let body = error_body(r, 400, "INVALID_ARGUMENT").await;
        assert!(body["message"].as_str().unwrap().contains("user"), "{body}");
    }
    let c = hub.client(None);
    let sb = c.create(Default::default()).await.unwrap();
    let r = http
        .post(format!("{}/v1/sandboxes/{}/exec", hub.url(), sb.id))
        .json(&json!({ "command": "pwd", "cwd": "/tmp" }))
        .send()
        .await
        .unwrap();
    let body = error_body(r, 404, "NOT_FOUND").await;
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("resolved inside /workspace") && message.contains("/workspace/tmp"),
        "{message}"
    );
    // A directory under the workspace, named absolutely, still works.
    let r = http
        .post(format!("{}/v1/sandboxes/{}/exec", hub.url(), sb.id))
        .json(&json!({ "command": "mkdir -p sub && cd sub && pwd" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .post(format!("{}/v1/sandboxes/{}/exec", hub.url(), sb.id))
        .json(&json!({ "command": "pwd", "cwd": "/workspace/sub" }))
        .send()
        .await
        .unwrap();
    let out: Value = r.json().await.unwrap();
    assert_eq!(out["stdout"], "/workspace/sub\n", "{out}");
}
