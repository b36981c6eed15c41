//! REST `/v1/files`, `/v1/health`, `/v1/metadata` and `/metrics` against the
//! real sandboxd binary on loopback.

mod common;

use std::{fs, os::unix::fs::PermissionsExt, time::Duration};

use common::Daemon;
use reqwest::{header, Client, StatusCode};
use serde_json::Value;

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn json(resp: reqwest::Response) -> Value {
    resp.json().await.unwrap()
}

async fn assert_error(resp: reqwest::Response, status: StatusCode, code: &str) -> String {
    assert_eq!(resp.status(), status);
    let body = json(resp).await;
    assert_eq!(body["code"], code, "{body}");
    let message = body["message"].as_str().expect("message is a string");
    assert!(!message.is_empty());
    message.to_string()
}

#[tokio::test]
async fn health_reports_ok_and_uptime() {
    let d = Daemon::start(&[]);
    let body = json(client().get(d.rest("/v1/health")).send().await.unwrap()).await;
    assert_eq!(body["status"], "ok");
    assert!(
        body["uptime_seconds"].is_u64(),
        "upstream sends an integer: {body}"
    );
}

#[tokio::test]
async fn put_then_get_roundtrips_bytes_and_creates_parents() {
    let d = Daemon::start(&[]);
    let c = client();
    let payload: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let r = c
        .put(d.rest("/v1/files/deep/er/bin.dat"))
        .body(payload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        fs::read(d.root_path().join("deep/er/bin.dat")).unwrap(),
        payload
    );
    let got = c
        .get(d.rest("/v1/files/deep/er/bin.dat"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(
        got.headers()[header::CONTENT_TYPE],
        "application/octet-stream"
    );
    assert_eq!(got.bytes().await.unwrap().as_ref(), payload.as_slice());
    let mode = fs::metadata(d.root_path().join("deep/er"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[tokio::test]
async fn sdk_single_segment_percent_encoded_path_names_the_same_file() {
    let d = Daemon::start(&[]);
    let c = client();
    let r = c
        .put(d.rest("/v1/files/src%2Fmain.py"))
        .body("print(1)")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        fs::read_to_string(d.root_path().join("src/main.py")).unwrap(),
        "print(1)"
    );
    let got = c.get(d.rest("/v1/files/src/main.py")).send().await.unwrap();
    assert_eq!(got.text().await.unwrap(), "print(1)");
    let head = c
        .head(d.rest("/v1/files/src%2Fmain.py"))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    assert_eq!(head.headers()[header::CONTENT_LENGTH], "8");
}

#[tokio::test]
async fn put_mode_is_applied_and_validated() {
    let d = Daemon::start(&[]);
    let c = client();
    let r = c
        .put(d.rest("/v1/files/x.sh?mode=0750"))
        .body("#!/bin/sh")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let mode = fs::metadata(d.root_path().join("x.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
    let default = c
        .put(d.rest("/v1/files/y.txt"))
        .body("y")
        .send()
        .await
        .unwrap();
    assert_eq!(default.status(), StatusCode::NO_CONTENT);
    let mode = fs::metadata(d.root_path().join("y.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    for bad in ["644", "0999", "0o644", "abcd"] {
        let r = c
            .put(d.rest(&format!("/v1/files/z.txt?mode={bad}")))
            .body("z")
            .send()
            .await
            .unwrap();
        assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    assert!(!d.root_path().join("z.txt").exists());
}

#[tokio::test]
async fn multipart_put_writes_the_file_part() {
    let d = Daemon::start(&[]);
    let body = "--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nignored\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\nmultipart bytes\r\n--XyZ--\r\n";
    let r = client()
        .put(d.rest("/v1/files/m.txt"))
        .header(header::CONTENT_TYPE, "multipart/form-data; boundary=XyZ")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        fs::read_to_string(d.root_path().join("m.txt")).unwrap(),
        "multipart bytes"
    );

    let no_file = "--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--XyZ--\r\n";
    let r = client()
        .put(d.rest("/v1/files/n.txt"))
        .header(header::CONTENT_TYPE, "multipart/form-data; boundary=XyZ")
        .body(no_file)
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    assert!(!d.root_path().join("n.txt").exists());
}

#[tokio::test]
async fn put_onto_a_directory_is_rejected_and_keeps_it() {
    let d = Daemon::start(&[]);
    fs::create_dir_all(d.root_path().join("dir/keep")).unwrap();
    let r = client()
        .put(d.rest("/v1/files/dir"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    assert!(d.root_path().join("dir/keep").is_dir());
    let r = client()
        .put(d.rest("/v1/files/"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

#[tokio::test]
async fn directory_listing_has_upstream_shape() {
    let d = Daemon::start(&[]);
    fs::create_dir_all(d.root_path().join("d/sub")).unwrap();
    fs::write(d.root_path().join("d/a.txt"), "abc").unwrap();
    let body = json(client().get(d.rest("/v1/files/d")).send().await.unwrap()).await;
    assert_eq!(body["path"], "/d");
    let entries = body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["name"], "a.txt");
    assert_eq!(entries[0]["type"], "file");
    assert_eq!(entries[0]["size"], 3);
    assert_eq!(entries[0]["mode"], "0644");
    let ts = entries[0]["modified_at"].as_str().unwrap();
    assert!(ts.ends_with('Z') && ts.len() == 20, "{ts}");
    assert_eq!(entries[1]["name"], "sub");
    assert_eq!(entries[1]["type"], "directory");

    let root = json(client().get(d.rest("/v1/files/")).send().await.unwrap()).await;
    assert_eq!(root["path"], "/");
}

#[tokio::test]
async fn range_and_conditional_requests() {
    let d = Daemon::start(&[]);
    fs::write(d.root_path().join("r.txt"), "0123456789").unwrap();
    let c = client();
    let r = c
        .get(d.rest("/v1/files/r.txt"))
        .header(header::RANGE, "bytes=2-5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.headers()[header::CONTENT_RANGE], "bytes 2-5/10");
    assert_eq!(r.text().await.unwrap(), "2345");
    let r = c
        .get(d.rest("/v1/files/r.txt"))
        .header(header::RANGE, "bytes=-3")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "789");
    let r = c
        .get(d.rest("/v1/files/r.txt"))
        .header(header::RANGE, "bytes=50-")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers()[header::CONTENT_RANGE], "bytes */10");

    let full = c.get(d.rest("/v1/files/r.txt")).send().await.unwrap();
    let last_modified = full.headers()[header::LAST_MODIFIED]
        .to_str()
        .unwrap()
        .to_string();
    let r = c
        .get(d.rest("/v1/files/r.txt"))
        .header(header::IF_MODIFIED_SINCE, &last_modified)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    let r = c
        .get(d.rest("/v1/files/r.txt"))
        .header(header::IF_MODIFIED_SINCE, "Thu, 01 Jan 1998 00:00:00 GMT")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "0123456789");
}

#[tokio::test]
async fn head_answers_headers_only_and_404_for_missing() {
    let d = Daemon::start(&[]);
    fs::write(d.root_path().join("h.txt"), "hello").unwrap();
    let r = client()
        .head(d.rest("/v1/files/h.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[header::CONTENT_LENGTH], "5");
    assert!(r.headers().contains_key(header::LAST_MODIFIED));
    assert!(r.bytes().await.unwrap().is_empty());
    let r = client()
        .head(d.rest("/v1/files/missing.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = client()
        .get(d.rest("/v1/files/missing.txt"))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::NOT_FOUND, "NOT_FOUND").await;
}

#[tokio::test]
async fn type_query_checks_the_kind() {
    let d = Daemon::start(&[]);
    fs::create_dir(d.root_path().join("dir")).unwrap();
    fs::write(d.root_path().join("f.txt"), "f").unwrap();
    let c = client();
    let ok = c
        .get(d.rest("/v1/files/f.txt?type=file"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.text().await.unwrap(), "f");
    let ok = c
        .get(d.rest("/v1/files/dir?type=directory"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let r = c
        .get(d.rest("/v1/files/f.txt?type=directory"))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::CONFLICT, "CONFLICT").await;
    let r = c
        .get(d.rest("/v1/files/dir?type=file"))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::CONFLICT, "CONFLICT").await;
    let r = c
        .head(d.rest("/v1/files/dir?type=file"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let r = c
        .get(d.rest("/v1/files/f.txt?type=symlink"))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

#[tokio::test]
async fn append_creates_with_mode_then_appends_without_changing_mode() {
    let d = Daemon::start(&[]);
    let c = client();
    let r = c
        .put(d.rest("/v1/files/logs/a.log?append=true&mode=0600"))
        .body("one\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = c
        .put(d.rest("/v1/files/logs/a.log?append=true&mode=0777"))
        .body("two\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let path = d.root_path().join("logs/a.log");
    assert_eq!(fs::read_to_string(&path).unwrap(), "one\ntwo\n");
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let r = c
        .put(d.rest("/v1/files/logs?append=true"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let r = c
        .put(d.rest("/v1/files/l.log?append=maybe"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

#[tokio::test]
async fn delete_files_and_directories() {
    let d = Daemon::start(&[]);
    let root = d.root_path();
    fs::create_dir_all(root.join("full/inner")).unwrap();
    fs::write(root.join("full/inner/x"), "x").unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    fs::write(root.join("f"), "f").unwrap();
    let c = client();
    assert_eq!(
        c.delete(d.rest("/v1/files/f"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    assert!(!root.join("f").exists());
    assert_eq!(
        c.delete(d.rest("/v1/files/empty"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    let r = c.delete(d.rest("/v1/files/full")).send().await.unwrap();
    assert_error(r, StatusCode::CONFLICT, "CONFLICT").await;
    assert!(root.join("full/inner/x").exists());
    let r = c
        .delete(d.rest("/v1/files/full?recursive=yes"))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let r = c
        .delete(d.rest("/v1/files/full?recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(!root.join("full").exists());
    let r = c.delete(d.rest("/v1/files/nope")).send().await.unwrap();
    assert_error(r, StatusCode::NOT_FOUND, "NOT_FOUND").await;
}

#[tokio::test]
async fn deleting_the_root_needs_recursive_and_only_empties_it() {
    let d = Daemon::start(&[]);
    fs::create_dir_all(d.root_path().join("a/b")).unwrap();
    fs::write(d.root_path().join("top"), "t").unwrap();
    let c = client();
    let r = c.delete(d.rest("/v1/files/")).send().await.unwrap();
    assert_error(r, StatusCode::CONFLICT, "CONFLICT").await;
    assert!(d.root_path().join("top").exists());
    let r = c
        .delete(d.rest("/v1/files/?recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(d.root_path().is_dir());
    assert_eq!(fs::read_dir(d.root_path()).unwrap().count(), 0);
}

#[tokio::test]
async fn recursive_delete_never_follows_symlinks_out() {
    let d = Daemon::start(&[]);
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("precious"), "keep").unwrap();
    fs::create_dir(d.root_path().join("dir")).unwrap();
    std::os::unix::fs::symlink(outside.path(), d.root_path().join("dir/link")).unwrap();
    let r = client()
        .delete(d.rest("/v1/files/dir?recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        fs::read_to_string(outside.path().join("precious")).unwrap(),
        "keep"
    );
}

#[tokio::test]
async fn escapes_get_403_and_never_data() {
    let d = Daemon::start(&[]);
    let root = d.root_path();
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    std::os::unix::fs::symlink("../", root.join("up")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("pw")).unwrap();
    fs::create_dir(root.join("ok")).unwrap();
    std::os::unix::fs::symlink("../ok", root.join("ok/self")).unwrap();
    let c = client();
    for path in [
        "/v1/files/..%2F..%2Fetc%2Fpasswd",
        "/v1/files/a%2F..%2F..%2Fetc%2Fpasswd",
        "/v1/files/etc/passwd",
        "/v1/files/etc%2Fpasswd",
        "/v1/files/pw",
        "/v1/files/up/etc/passwd",
        "/v1/files/up",
    ] {
        let r = c.get(d.rest(path)).send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(!text.contains("root:"), "{path} leaked {text}");
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["code"], "PERMISSION_DENIED");
    }
    // Writes through an escaping symlink are refused and create nothing.
    let r = c
        .put(d.rest("/v1/files/etc/evil"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::FORBIDDEN, "PERMISSION_DENIED").await;
    assert!(!std::path::Path::new("/etc/evil").exists());
    let r = c
        .put(d.rest("/v1/files/pw?append=true"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::FORBIDDEN, "PERMISSION_DENIED").await;
    // A symlink that stays inside works.
    fs::write(root.join("ok/f"), "inside").unwrap();
    let r = c.get(d.rest("/v1/files/ok/self/f")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "inside");
    // Listings leave escaping symlinks out instead of describing them.
    let body = json(c.get(d.rest("/v1/files/")).send().await.unwrap()).await;
    let names: Vec<_> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ok"]);
}

#[tokio::test]
async fn symlink_swapped_mid_operation_never_leaks() {
    let d = Daemon::start(&[]);
    let root = d.root_path().to_path_buf();
    fs::create_dir(root.join("real")).unwrap();
    fs::write(root.join("real/passwd"), "inside").unwrap();
    std::os::unix::fs::symlink("real", root.join("flip")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (root, stop) = (root.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut outside = false;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let target = if outside { "/etc" } else { "real" };
                let tmp = root.join("flip.tmp");
                let _ = fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp).unwrap();
                fs::rename(&tmp, root.join("flip")).unwrap();
                outside = !outside;
            }
        })
    };
    let c = client();
    let (mut inside, mut denied) = (0, 0);
    for _ in 0..300 {
        let r = c.get(d.rest("/v1/files/flip/passwd")).send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(!text.contains("root:"), "leaked host file: {text}");
        match status {
            StatusCode::OK => {
                assert_eq!(text, "inside");
                inside += 1;
            }
            StatusCode::FORBIDDEN => denied += 1,
            // The name may be mid-rename.
            StatusCode::NOT_FOUND => {}
            other => panic!("unexpected {other}: {text}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(inside + denied > 0);
}

#[tokio::test]
async fn oversized_upload_gets_413_and_keeps_the_old_file() {
    let d = Daemon::start(&["--max-upload-bytes", "1000"]);
    fs::write(d.root_path().join("keep.txt"), "original").unwrap();
    let c = client();
    let r = c
        .put(d.rest("/v1/files/keep.txt"))
        .body(vec![b'x'; 5000])
        .send()
        .await
        .unwrap();
    // The unread rest of the body makes the connection unusable.
    assert_eq!(r.headers()[reqwest::header::CONNECTION], "close");
    assert_error(r, StatusCode::PAYLOAD_TOO_LARGE, "RESOURCE_EXHAUSTED").await;
    // Without a Content-Length the limit is enforced while streaming.
    let chunks = futures::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 500])));
    let r = c
        .put(d.rest("/v1/files/keep.txt"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::PAYLOAD_TOO_LARGE, "RESOURCE_EXHAUSTED").await;
    assert_eq!(
        fs::read_to_string(d.root_path().join("keep.txt")).unwrap(),
        "original"
    );
    let leftovers: Vec<_> = fs::read_dir(d.root_path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "temp files left behind: {leftovers:?}");
    let r = c
        .put(d.rest("/v1/files/keep.txt"))
        .body(vec![b'z'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn full_disk_gets_507_and_keeps_the_old_file() {
    // A 1 MiB tmpfs as the root makes "disk full" real. Needs root (CI is root).
    let mount = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(mount.path())
        .status()
        .expect("running mount");
    if !status.success() {
        assert!(
            std::env::var("CI").is_err(),
            "mounting a tmpfs failed under CI"
        );
        eprintln!("skipping: cannot mount tmpfs (not root?)");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _guard = Unmount(mount.path().to_path_buf());
    let root = mount.path().join("root");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("keep.txt"), "original").unwrap();
    let dir = tempfile::TempDir::new_in(&root).unwrap();
    fs::write(dir.path().join("keep.txt"), "original").unwrap();
    let d = Daemon::start_in(dir, &[]);
    let r = client()
        .put(d.rest("/v1/files/keep.txt"))
        .body(vec![b'x'; 4 << 20])
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::INSUFFICIENT_STORAGE, "RESOURCE_EXHAUSTED").await;
    assert_eq!(
        fs::read_to_string(d.root_path().join("keep.txt")).unwrap(),
        "original"
    );
    let names: Vec<_> = fs::read_dir(d.root_path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "temp files left behind: {names:?}");
}

#[tokio::test]
async fn metadata_publishes_prefixed_env_but_never_secrets() {
    let root = tempfile::tempdir().unwrap();
    let (rest, grpc) = (common::free_port(), common::free_port());
    let mut child = std::process::Command::new(common::binary())
        .args(["--listen-host", "127.0.0.1", "--legacy-port", "0"])
        .args([
            "--rest-port",
            &rest.to_string(),
            "--grpc-port",
            &grpc.to_string(),
        ])
        .arg("--root-dir")
        .arg(root.path())
        .env("SANDBOX_REGION", "eu")
        .env("SANDBOX_API_KEY", "hunter2")
        .env("SANDBOX_DB_PASSWORD", "hunter2")
        .env("SANDBOX_GITHUB_TOKEN", "hunter2")
        .env("UNRELATED", "x")
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{rest}/v1/metadata");
    let mut body = None;
    for _ in 0..200 {
        if let Ok(r) = client().get(&url).send().await {
            body = Some(r.text().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let body = body.expect("metadata answered");
    assert!(!body.contains("hunter2"), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["env"]["SANDBOX_REGION"], "eu");
    assert!(v["env"].get("UNRELATED").is_none());
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let d = Daemon::start(&[]);
    let r = client().get(d.rest("/v2/nothing")).send().await.unwrap();
    assert_error(r, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    let r = client().post(d.rest("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json(r).await["code"], "INVALID_ARGUMENT");
    let r = client().post(d.rest("/v1/files/x")).send().await.unwrap();
    assert_error(r, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

#[tokio::test]
async fn metrics_count_requests() {
    let d = Daemon::start(&[]);
    let c = client();
    c.get(d.rest("/v1/files/nope")).send().await.unwrap();
    let text = c
        .get(d.rest("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"sandboxd_http_requests_total{method="GET",code="404"} 1"#),
        "{text}"
    );
    assert!(text.contains("sandboxd_active_processes"), "{text}");
    assert!(text.contains("sandboxd_active_watches"), "{text}");
}
