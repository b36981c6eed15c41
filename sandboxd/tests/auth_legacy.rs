//! Bearer-token auth on every surface, and the legacy python-runtime API.

mod common;

use std::{fs, io::Write, time::Duration};

use common::Daemon;
use reqwest::{Client, StatusCode};
use sandhub_api::proto::process::v1::{
    process_service_client::ProcessServiceClient, ExecuteRequest, ProcessConfig,
};
use serde_json::Value;
use sha2::Digest;

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn token_file(token: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{token}").unwrap();
    f
}

#[tokio::test]
async fn token_file_guards_rest_and_legacy_but_not_health() {
    let tf = token_file("tok-123");
    let d = Daemon::start(&["--auth-token-file", tf.path().to_str().unwrap()]);
    fs::write(d.root_path().join("f"), "data").unwrap();
    let c = client();
    assert_eq!(
        c.get(d.rest("/v1/health")).send().await.unwrap().status(),
        StatusCode::OK
    );
    for url in [
        d.rest("/v1/files/f"),
        d.rest("/v1/metadata"),
        d.rest("/metrics"),
        d.legacy("/download/f"),
    ] {
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{url}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], "UNAUTHENTICATED");
        let r = c.get(&url).bearer_auth("wrong").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{url}");
        let r = c.get(&url).bearer_auth("tok-123").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{url}");
    }
    let r = c
        .post(d.legacy("/execute"))
        .json(&serde_json::json!({"command": "true"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn sha256_token_guards_grpc() {
    let digest = hex::encode(sha2::Sha256::digest(b"grpc-secret"));
    let d = Daemon::start(&["--auth-token-sha256", &digest]);
    let mut grpc = ProcessServiceClient::connect(d.grpc_url()).await.unwrap();
    let req = || ExecuteRequest {
        config: Some(ProcessConfig {
            command: vec!["true".into()],
            ..Default::default()
        }),
    };
    let err = grpc.execute(req()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut bad = tonic::Request::new(req());
    bad.metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_eq!(
        grpc.execute(bad).await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let mut good = tonic::Request::new(req());
    good.metadata_mut()
        .insert("authorization", "Bearer grpc-secret".parse().unwrap());
    let out = grpc.execute(good).await.unwrap().into_inner();
    assert_eq!(out.exit_code, 0);
    let r = client()
        .get(d.rest("/v1/files/"))
        .bearer_auth("grpc-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// Behind a router, `Authorization` holds the router's token; sandboxd's
/// own comes in `X-Sandboxd-Authorization`, on REST and gRPC alike.
#[tokio::test]
async fn routed_token_header_is_accepted_only_with_the_right_token() {
    let tf = token_file("tok-routed");
    let d = Daemon::start(&["--auth-token-file", tf.path().to_str().unwrap()]);
    let c = client();
    let get = |router: &'static str, ours: &'static str| {
        c.get(d.rest("/v1/files/"))
            .header("authorization", router)
            .header("x-sandboxd-authorization", ours)
            .send()
    };
    assert_eq!(
        get("Bearer v1.router.token", "Bearer tok-routed")
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        get("Bearer v1.router.token", "Bearer wrong")
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let mut grpc = ProcessServiceClient::connect(d.grpc_url()).await.unwrap();
    let mut req = tonic::Request::new(ExecuteRequest {
        config: Some(ProcessConfig {
            command: vec!["true".into()],
            ..Default::default()
        }),
    });
    req.metadata_mut().insert(
        "x-sandboxd-authorization",
        "Bearer tok-routed".parse().unwrap(),
    );
    assert_eq!(grpc.execute(req).await.unwrap().into_inner().exit_code, 0);
}

#[tokio::test]
async fn bad_token_flags_refuse_to_start() {
    let root = tempfile::tempdir().unwrap();
    for args in [
        vec!["--auth-token-sha256", "not-hex"],
        vec!["--auth-token-sha256", "abcd"],
        vec!["--auth-token-file", "/nonexistent/token"],
    ] {
        let out = std::process::Command::new(common::binary())
            .args([
                "--listen-host",
                "127.0.0.1",
                "--rest-port",
                "0",
                "--grpc-port",
                "0",
                "--legacy-port",
                "0",
            ])
            .arg("--root-dir")
            .arg(root.path())
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}

#[tokio::test]
async fn legacy_root_and_execute() {
    let d = Daemon::start(&[]);
    let c = client();
    let v: Value = c
        .get(d.legacy("/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v,
        serde_json::json!({"status": "ok", "message": "Sandbox Runtime is active."})
    );

    let v: Value = c
        .post(d.legacy("/execute"))
        .json(&serde_json::json!({"command": "sh -c 'echo out; echo err >&2; exit 3'"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["timed_out"], false);

    // Runs from the root dir, with no shell: `;` is just an argument.
    let v: Value = c
        .post(d.legacy("/execute"))
        .json(&serde_json::json!({"command": "pwd"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["stdout"].as_str().unwrap().trim(),
        d.root_path().canonicalize().unwrap().to_str().unwrap()
    );
    let v: Value = c
        .post(d.legacy("/execute"))
        .json(&serde_json::json!({"command": "echo a; echo b"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["stdout"], "a; echo b\n");
}

#[tokio::test]
async fn legacy_execute_timeout_kills_and_reports_124() {
    let d = Daemon::start(&[]);
    let started = std::time::Instant::now();
    let v: Value = client()
        .post(d.legacy("/execute"))
        .json(&serde_json::json!({"command": "sleep 30", "timeout_seconds": 0.5}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(v["exit_code"], 124);
    assert_eq!(v["timed_out"], true);
}

#[tokio::test]
async fn legacy_execute_failures_are_200_with_exit_1() {
    let d = Daemon::start(&[]);
    let c = client();
    for command in ["no-such-binary-xyz", "echo 'unbalanced", ""] {
        let r = c
            .post(d.legacy("/execute"))
            .json(&serde_json::json!({"command": command}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["exit_code"], 1, "{command}");
        assert!(
            v["stderr"]
                .as_str()
                .unwrap()
                .starts_with("Failed to execute command:"),
            "{v}"
        );
    }
    let r = c
        .post(d.legacy("/execute"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "INVALID_ARGUMENT");
    let huge = serde_json::json!({"command": "x".repeat(2 << 20)});
    let r = c
        .post(d.legacy("/execute"))
        .json(&huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

fn multipart(filename: &str, content: &[u8]) -> (String, Vec<u8>) {
    let mut body = Vec::new();
    body.extend_from_slice(
        format!("--B0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(b"\r\n--B0undary--\r\n");
    ("multipart/form-data; boundary=B0undary".into(), body)
}

#[tokio::test]
async fn legacy_files_upload_download_list_exists() {
    let d = Daemon::start(&[]);
    let c = client();
    let (ct, body) = multipart("dir/sub/up.bin", b"\x00\x01binary");
    let r = c
        .post(d.legacy("/upload"))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["message"], "File 'dir/sub/up.bin' uploaded successfully.");
    assert_eq!(
        fs::read(d.root_path().join("dir/sub/up.bin")).unwrap(),
        b"\x00\x01binary"
    );

    let r = c
        .get(d.legacy("/download/dir%2Fsub%2Fup.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"\x00\x01binary");
    let r = c.get(d.legacy("/download/dir/nope")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.json::<Value>().await.unwrap()["message"],
        "File not found"
    );

    let list: Value = c
        .get(d.legacy("/list/dir%2Fsub"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = list.as_array().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["name"], "up.bin");
    assert_eq!(entries[0]["type"], "file");
    assert_eq!(entries[0]["size"], 8);
    assert!(entries[0]["mod_time"].as_f64().unwrap() > 1.0e9);
    let r = c
        .get(d.legacy("/list/dir%2Fsub%2Fup.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.json::<Value>().await.unwrap()["message"],
        "Path is not a directory"
    );

    let v: Value = c
        .get(d.legacy("/exists/dir%2Fsub%2Fup.bin"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v,
        serde_json::json!({"path": "dir/sub/up.bin", "exists": true})
    );
    let v: Value = c
        .get(d.legacy("/exists/nope"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["exists"], false);
}

#[tokio::test]
async fn legacy_escapes_are_403_access_denied() {
    let d = Daemon::start(&[]);
    std::os::unix::fs::symlink("/etc", d.root_path().join("etc")).unwrap();
    let c = client();
    for url in [
        d.legacy("/download/..%2F..%2Fetc%2Fpasswd"),
        d.legacy("/download/etc%2Fpasswd"),
        d.legacy("/list/..%2F.."),
        d.legacy("/list/etc"),
        d.legacy("/exists/..%2F..%2Fetc%2Fpasswd"),
    ] {
        let r = c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{url}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["message"], "Access denied");
        assert_eq!(v["code"], "PERMISSION_DENIED");
    }
    let (ct, body) = multipart("../../escape.txt", b"x");
    let r = c
        .post(d.legacy("/upload"))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let (ct, body) = multipart("etc/evil", b"x");
    let r = c
        .post(d.legacy("/upload"))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!std::path::Path::new("/etc/evil").exists());
}
