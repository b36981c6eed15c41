//! Named volumes' files with no sandbox running, and their snapshots and
//! clones (issue #32 §1), against a real `sandhub serve` whose volumes
//! are btrfs subvolumes with qgroup limits (root, loop devices and
//! mkfs.btrfs, as `volumes.rs`).
//!
//! Volumes are written by sandboxes, so the heart of this file is links
//! planted inside a volume straight on the host (as a sandbox could make
//! them): the files API refuses every one and reaches nothing outside.

mod common;

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use reqwest::Method;
use serde_json::{json, Value};

use common::{error_body, HubOptions, TestHub, ALICE_KEY, BOB_KEY};

fn tenant_dir(tenant: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(tenant.as_bytes())[..16])
}

/// The quota volume's root, where `volumes/` and `volume-snapshots/` are.
fn quota_root(hub: &TestHub) -> PathBuf {
    hub.sandboxes_dir().parent().unwrap().to_path_buf()
}

fn volume_path(hub: &TestHub, tenant: &str, name: &str) -> PathBuf {
    quota_root(hub)
        .join("volumes")
        .join(tenant_dir(tenant))
        .join(name)
}

fn snapshot_path(hub: &TestHub, tenant: &str, volume: &str, snap: &str) -> PathBuf {
    quota_root(hub)
        .join("volume-snapshots")
        .join(tenant_dir(tenant))
        .join(format!("{volume}@{snap}"))
}

fn is_subvolume(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && m.ino() == 256)
}

struct Api<'a> {
    hub: &'a TestHub,
    key: &'a str,
}

impl Api<'_> {
    /// `method` on `/v1/volumes{path}` (`path` sent as it is, encoded
    /// or not) with a raw body.
    async fn raw(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> reqwest::Response {
        let mut req = self
            .hub
            .http()
            .request(method, format!("{}/v1/volumes{path}", self.hub.url()))
            .bearer_auth(self.key);
        if let Some(body) = body {
            req = req.body(body);
        }
        req.send().await.unwrap()
    }

    async fn json(&self, method: Method, path: &str, body: Value) -> reqwest::Response {
        self.hub
            .http()
            .request(method, format!("{}/v1/volumes{path}", self.hub.url()))
            .bearer_auth(self.key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn create(&self, body: Value) {
        let r = self.json(Method::POST, "", body.clone()).await;
        let status = r.status().as_u16();
        assert_eq!(status, 201, "{body}: {}", r.text().await.unwrap());
    }

    async fn put(&self, vol: &str, path: &str, data: &[u8]) -> reqwest::Response {
        self.raw(
            Method::PUT,
            &format!("/{vol}/files/{path}"),
            Some(data.to_vec()),
        )
        .await
    }

    async fn put_ok(&self, vol: &str, path: &str, data: &[u8]) {
        let r = self.put(vol, path, data).await;
        let status = r.status().as_u16();
        assert_eq!(status, 204, "PUT {vol}:{path}: {}", r.text().await.unwrap());
    }

    async fn get(&self, vol: &str, path: &str) -> reqwest::Response {
        self.raw(Method::GET, &format!("/{vol}/files/{path}"), None)
            .await
    }

    async fn read(&self, vol: &str, path: &str) -> String {
        let r = self.get(vol, path).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "GET {vol}:{path}: {text}");
        text
    }

    async fn delete(&self, vol: &str, path: &str) -> reqwest::Response {
        self.raw(Method::DELETE, &format!("/{vol}/files/{path}"), None)
            .await
    }

    async fn names(&self, vol: &str, dir: &str) -> Vec<String> {
        let r = self.get(vol, &format!("{dir}?type=directory")).await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 200, "{body}");
        body["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    }

    async fn snapshot(&self, vol: &str, snap: &str) -> reqwest::Response {
        self.json(
            Method::POST,
            &format!("/{vol}/snapshots"),
            json!({ "name": snap }),
        )
        .await
    }

    async fn snapshots(&self, vol: &str) -> Vec<String> {
        let r = self
            .raw(Method::GET, &format!("/{vol}/snapshots"), None)
            .await;
        assert_eq!(r.status().as_u16(), 200);
        let body: Value = r.json().await.unwrap();
        body["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    }
}

fn keys_hub() -> HubOptions {
    HubOptions {
        api_keys: true,
        ..Default::default()
    }
}

fn apis(hub: &TestHub) -> (Api<'_>, Api<'_>) {
    (
        Api {
            hub,
            key: ALICE_KEY,
        },
        Api { hub, key: BOB_KEY },
    )
}

#[tokio::test]
async fn volume_files_round_trip_with_no_sandbox() {
    let hub = TestHub::start(keys_hub()).await;
    let (alice, bob) = apis(&hub);
    alice.create(json!({"name": "data", "size_mb": 32})).await;
    let on_disk = volume_path(&hub, "alice", "data");

    // Upload makes the parents; download gives the bytes back.
    alice.put_ok("data", "a/b/c.txt", b"hello volume").await;
    assert_eq!(alice.read("data", "a/b/c.txt").await, "hello volume");
    assert_eq!(alice.read("data", "/a//./b/c.txt").await, "hello volume");
    // What the API made belongs to the sandboxes' root, so a sandbox
    // mounting the volume later may change it.
    let base = sandhub::local::runtime::HOST_ID_BASE;
    for p in ["a", "a/b", "a/b/c.txt"] {
        let m = std::fs::symlink_metadata(on_disk.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (base, base), "{p}");
    }
    assert_eq!(
        std::fs::metadata(on_disk.join("a/b/c.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    assert_eq!(
        std::fs::metadata(on_disk.join("a/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );

    // A listing is the sandbox files API's shape.
    let listing: Value = alice.get("data", "a/b").await.json().await.unwrap();
    assert_eq!(listing["path"], "/a/b");
    assert_eq!(listing["entries"][0]["name"], "c.txt");
    assert_eq!(listing["entries"][0]["type"], "file");
    assert_eq!(listing["entries"][0]["size"], 12);
    assert_eq!(listing["entries"][0]["mode"], "0644");
    assert_eq!(alice.names("data", "").await, ["a"]);
    // `type` insists on a kind.
    error_body(alice.get("data", "a?type=file").await, 409, "CONFLICT").await;
    error_body(
        alice.get("data", "a/b/c.txt?type=directory").await,
        409,
        "CONFLICT",
    )
    .await;
    // HEAD: a file's length, no body.
    let r = alice.raw(Method::HEAD, "/data/files/a/b/c.txt", None).await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-length"], "12");
    let modified = r.headers()["last-modified"].to_str().unwrap().to_string();
    assert!(modified.ends_with(" GMT"), "{modified}");

    // A mode, and a replacement that is whole.
    alice
        .raw(
            Method::PUT,
            "/data/files/run.sh?mode=0750",
            Some(b"#!/bin/sh\n".to_vec()),
        )
        .await;
    let m = std::fs::metadata(on_disk.join("run.sh")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o750);
    alice.put_ok("data", "a/b/c.txt", b"v2").await;
    assert_eq!(alice.read("data", "a/b/c.txt").await, "v2");
    // No temporary file is left beside it.
    assert_eq!(alice.names("data", "a/b").await, ["c.txt"]);

    // An upload whose client goes away halfway leaves nothing behind.
    let url = format!("{}/v1/volumes/data/files/cut.bin", hub.url());
    let http = hub.http();
    let cut = tokio::spawn(async move {
        let first = futures::stream::once(async {
            Ok::<_, std::io::Error>(bytes::Bytes::from(vec![1u8; 1 << 20]))
        });
        let body = futures::StreamExt::chain(first, futures::stream::pending());
        let _ = http
            .put(url)
            .bearer_auth(ALICE_KEY)
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await;
    });
    common::eventually("the upload's temporary file", common::WAIT, || {
        let on_disk = on_disk.clone();
        async move {
            std::fs::read_dir(&on_disk)
                .unwrap()
                .flatten()
                .any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(".sandhub-upload-")
                })
                .then_some(())
        }
    })
    .await;
    cut.abort();
    common::eventually("no temporary file left", common::WAIT, || {
        let on_disk = on_disk.clone();
        async move {
            (!std::fs::read_dir(&on_disk).unwrap().flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".sandhub-upload-")
            }))
            .then_some(())
        }
    })
    .await;
    assert!(!on_disk.join("cut.bin").exists());

    // The Rust client, the same calls.
    let client = hub.client(Some(ALICE_KEY));
    client
        .write_volume_file(
            "data",
            "via/client.bin",
            Box::pin(futures::stream::once(async {
                Ok(bytes::Bytes::from_static(b"\x00\x01binary"))
            })),
            Default::default(),
        )
        .await
        .unwrap();
    let got: Vec<bytes::Bytes> = futures::TryStreamExt::try_collect(
        client
            .read_volume_file("data", "via/client.bin")
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(got.concat(), b"\x00\x01binary");
    let e = client
        .stat_volume_file("data", "via/client.bin")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.size, 8);
    assert!(client
        .stat_volume_file("data", "nope")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        client.stat_volume_file("gone", "x").await.unwrap_err().code,
        sandhub_api::error::Code::NotFound
    );
    let listing = client.list_volume_files("data", "via").await.unwrap();
    assert_eq!(listing.entries.len(), 1);
    client
        .delete_volume_file("data", "via", true)
        .await
        .unwrap();

    // Bad paths: 400, whatever the encoding.
    for bad in ["a%2F..%2Fb", "..%2Fx", "a%00b", &"x/".repeat(2100)] {
        error_body(alice.get("data", bad).await, 400, "INVALID_ARGUMENT").await;
        error_body(alice.put("data", bad, b"x").await, 400, "INVALID_ARGUMENT").await;
    }
    error_body(
        alice.get("data", &"n".repeat(256)).await,
        400,
        "INVALID_ARGUMENT",
    )
    .await;
    error_body(alice.get("data", "missing").await, 404, "NOT_FOUND").await;
    error_body(
        alice
            .raw(
                Method::PUT,
                "/data/files/x?append=true",
                Some(b"x".to_vec()),
            )
            .await,
        400,
        "INVALID_ARGUMENT",
    )
    .await;
    error_body(alice.put("data", "", b"x").await, 400, "INVALID_ARGUMENT").await;
    // A file where a parent should be.
    error_body(alice.put("data", "run.sh/x", b"x").await, 409, "CONFLICT").await;

    // Another tenant: the volume is not there, for every method.
    error_body(bob.get("data", "a/b/c.txt").await, 404, "NOT_FOUND").await;
    error_body(bob.put("data", "x", b"x").await, 404, "NOT_FOUND").await;
    error_body(bob.delete("data", "a/b/c.txt").await, 404, "NOT_FOUND").await;
    assert!(!on_disk.join("x").exists());

    // Delete: a non-empty directory needs recursive; the root never goes.
    error_body(alice.delete("data", "a").await, 409, "CONFLICT").await;
    assert_eq!(alice.delete("data", "a/b/c.txt").await.status(), 204);
    assert_eq!(alice.delete("data", "a/b").await.status(), 204);
    alice.put_ok("data", "a/deep/er/f", b"1").await;
    assert_eq!(alice.delete("data", "a?recursive=true").await.status(), 204);
    error_body(
        alice.delete("data", "?recursive=true").await,
        409,
        "CONFLICT",
    )
    .await;
    error_body(alice.delete("data", "a").await, 404, "NOT_FOUND").await;
    assert_eq!(alice.names("data", "").await, ["run.sh"]);
}

#[tokio::test]
async fn planted_links_are_refused_and_reach_nothing_outside() {
    let hub = TestHub::start(keys_hub()).await;
    let (alice, bob) = apis(&hub);
    alice.create(json!({"name": "data", "size_mb": 16})).await;
    bob.create(json!({"name": "secret", "size_mb": 16})).await;
    bob.put_ok("secret", "key.txt", b"bob's secret").await;
    let vol = volume_path(&hub, "alice", "data");
    let bobs = volume_path(&hub, "bob", "secret");
    let passwd_before = std::fs::read("/etc/passwd").unwrap();

    // As a sandbox could plant them: absolute, `..`, to another tenant's
    // volume, to host files, as the last component and in the middle.
    use std::os::unix::fs::symlink;
    symlink("/etc", vol.join("etc")).unwrap();
    symlink("/etc/passwd", vol.join("passwd")).unwrap();
    symlink("../../..", vol.join("up")).unwrap();
    symlink(&bobs, vol.join("bob")).unwrap();
    symlink(bobs.join("key.txt"), vol.join("bobkey")).unwrap();
    std::fs::create_dir(vol.join("real")).unwrap();
    symlink("/etc", vol.join("real/inner")).unwrap();
    symlink("../../../..", vol.join("real/climb")).unwrap();
    symlink("up", vol.join("chain")).unwrap();

    // Reads: refused (403), never the target's bytes or listing.
    for path in [
        "etc",
        "etc/passwd",
        "passwd",
        "up",
        "up/etc/passwd",
        "bob",
        "bob/key.txt",
        "bobkey",
        "real/inner",
        "real/inner/passwd",
        "real/climb",
        "real/climb/etc/hostname",
        "chain/etc/passwd",
    ] {
        let r = alice.get("data", path).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 403, "GET {path}: {text}");
        assert!(
            !text.contains("root:") && !text.contains("secret"),
            "{path}: {text}"
        );
        let r = alice
            .raw(Method::HEAD, &format!("/data/files/{path}"), None)
            .await;
        assert_eq!(r.status().as_u16(), 403, "HEAD {path}");
    }
    // A mount inside the volume (as the host could make one): not crossed.
    let over = vol.join("mnt");
    std::fs::create_dir(&over).unwrap();
    let target = std::ffi::CString::new(over.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mount(2) with NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    std::fs::write(over.join("on-tmpfs"), "x").unwrap();
    for path in ["mnt", "mnt/on-tmpfs"] {
        let r = alice.get("data", path).await;
        assert_eq!(r.status().as_u16(), 403, "GET {path}");
    }
    let r = alice.put("data", "mnt/new", b"x").await;
    assert_eq!(r.status().as_u16(), 403, "PUT through a mount");
    assert!(!over.join("new").exists());
    // SAFETY: umount2 of the tmpfs this test mounted.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    std::fs::remove_dir(&over).unwrap();

    // Listings leave links out (none is followed to describe it).
    assert_eq!(alice.names("data", "").await, ["real"]);
    assert!(alice.names("data", "real").await.is_empty());

    // Writes through a link in the middle: refused, nothing made outside.
    for path in [
        "etc/sandhub-evil",
        "bob/planted",
        "real/inner/sandhub-evil",
        "up/sandhub-evil",
    ] {
        let r = alice.put("data", path, b"evil").await;
        assert_eq!(r.status().as_u16(), 403, "PUT {path}");
    }
    assert!(!Path::new("/etc/sandhub-evil").exists());
    assert!(!bobs.join("planted").exists());
    // A write to a link's own name replaces the link, never its target.
    alice.put_ok("data", "passwd", b"mine").await;
    assert!(std::fs::symlink_metadata(vol.join("passwd"))
        .unwrap()
        .file_type()
        .is_file());
    alice.put_ok("data", "bobkey", b"mine too").await;
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd_before);
    assert_eq!(
        std::fs::read_to_string(bobs.join("key.txt")).unwrap(),
        "bob's secret"
    );

    // Deletes: a link goes itself; through one, nothing goes.
    for path in ["etc/passwd", "bob/key.txt", "real/inner/hostname"] {
        let r = alice.delete("data", path).await;
        assert_eq!(r.status().as_u16(), 403, "DELETE {path}");
    }
    assert_eq!(alice.delete("data", "etc").await.status(), 204);
    assert!(Path::new("/etc/passwd").exists());
    // A recursive delete walks by fds: the links inside are unlinked,
    // their targets untouched.
    assert_eq!(
        alice.delete("data", "real?recursive=true").await.status(),
        204
    );
    assert!(!vol.join("real").exists());
    assert_eq!(alice.delete("data", "bob").await.status(), 204);
    assert_eq!(
        std::fs::read_to_string(bobs.join("key.txt")).unwrap(),
        "bob's secret"
    );
    assert_eq!(bob.read("secret", "key.txt").await, "bob's secret");
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd_before);
}

#[tokio::test]
async fn a_write_past_the_volume_size_is_507_and_leaves_nothing() {
    let hub = TestHub::start(keys_hub()).await;
    let (alice, _) = apis(&hub);
    alice.create(json!({"name": "small", "size_mb": 8})).await;
    alice.create(json!({"name": "other", "size_mb": 8})).await;
    alice.put_ok("other", "keep.txt", b"intact").await;
    alice.put_ok("small", "old.txt", b"before").await;

    let big = vec![7u8; 16 << 20];
    let e = error_body(
        alice.put("small", "big.bin", &big).await,
        507,
        "RESOURCE_EXHAUSTED",
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("full"), "{e}");
    // The partial file is gone; what was there stays; the other volume
    // is untouched and still takes writes.
    assert_eq!(alice.names("small", "").await, ["old.txt"]);
    let dir = volume_path(&hub, "alice", "small");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(alice.read("small", "old.txt").await, "before");
    assert_eq!(alice.read("other", "keep.txt").await, "intact");
    alice.put_ok("other", "more.bin", &vec![1u8; 2 << 20]).await;
    // The room is given back: a small write fits again.
    alice.put_ok("small", "after.txt", b"fits").await;
}

#[tokio::test]
async fn snapshots_keep_old_data_and_clones_are_independent() {
    let hub = TestHub::start(keys_hub()).await;
    let (alice, bob) = apis(&hub);
    alice.create(json!({"name": "data", "size_mb": 32})).await;
    alice.put_ok("data", "f.txt", b"v1").await;

    let r = alice.snapshot("data", "s1").await;
    assert_eq!(r.status().as_u16(), 201);
    let s: Value = r.json().await.unwrap();
    assert_eq!(
        (s["volume"].as_str(), s["name"].as_str()),
        (Some("data"), Some("s1"))
    );
    assert!(s["created_at"].as_str().unwrap().ends_with('Z'));
    let snap_dir = snapshot_path(&hub, "alice", "data", "s1");
    assert!(is_subvolume(&snap_dir));
    // Read-only on disk, for root too.
    let e = std::fs::write(snap_dir.join("x"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");

    // The volume moves on; the snapshot keeps the old data.
    alice.put_ok("data", "f.txt", b"v2").await;
    assert_eq!(
        std::fs::read_to_string(snap_dir.join("f.txt")).unwrap(),
        "v1"
    );

    // A clone starts with the snapshot's files and its own limit.
    alice
        .create(json!({"name": "copy", "size_mb": 16, "from_snapshot": "data@s1"}))
        .await;
    assert_eq!(alice.read("copy", "f.txt").await, "v1");
    assert!(is_subvolume(&volume_path(&hub, "alice", "copy")));
    // Independent both ways.
    alice.put_ok("copy", "f.txt", b"v3").await;
    alice.put_ok("copy", "new.txt", b"only here").await;
    assert_eq!(alice.read("data", "f.txt").await, "v2");
    error_body(alice.get("data", "new.txt").await, 404, "NOT_FOUND").await;
    alice.put_ok("data", "f.txt", b"v4").await;
    assert_eq!(alice.read("copy", "f.txt").await, "v3");
    // The object form; the snapshot itself never changed.
    alice
        .create(json!({"name": "copy2", "size_mb": 16,
                       "from_snapshot": {"volume": "data", "snapshot": "s1"}}))
        .await;
    assert_eq!(alice.read("copy2", "f.txt").await, "v1");
    // The clone's own limit binds: 16 MiB.
    error_body(
        alice.put("copy2", "big", &vec![0u8; 24 << 20]).await,
        507,
        "RESOURCE_EXHAUSTED",
    )
    .await;

    // Checks: duplicate 409, unknown volume or snapshot 404, bad names 400,
    // and another tenant sees none of it.
    error_body(alice.snapshot("data", "s1").await, 409, "CONFLICT").await;
    error_body(alice.snapshot("nope", "s1").await, 404, "NOT_FOUND").await;
    error_body(
        alice.snapshot("data", "Bad_Name").await,
        400,
        "INVALID_ARGUMENT",
    )
    .await;
    error_body(
        alice
            .json(
                Method::POST,
                "",
                json!({"name": "c3", "size_mb": 8, "from_snapshot": "data@nope"}),
            )
            .await,
        404,
        "NOT_FOUND",
    )
    .await;
    error_body(
        alice
            .json(
                Method::POST,
                "",
                json!({"name": "c3", "size_mb": 8, "from_snapshot": "no-at-sign"}),
            )
            .await,
        400,
        "INVALID_ARGUMENT",
    )
    .await;
    error_body(
        bob.raw(Method::GET, "/data/snapshots", None).await,
        404,
        "NOT_FOUND",
    )
    .await;
    error_body(bob.snapshot("data", "mine").await, 404, "NOT_FOUND").await;
    bob.create(json!({"name": "data", "size_mb": 8})).await;
    error_body(
        bob.json(
            Method::POST,
            "",
            json!({"name": "steal", "size_mb": 8, "from_snapshot": "data@s1"}),
        )
        .await,
        404,
        "NOT_FOUND",
    )
    .await;
    assert!(bob.snapshots("data").await.is_empty());

    // A volume with snapshots is not deleted; its snapshots go first.
    assert_eq!(alice.snapshots("data").await, ["s1"]);
    error_body(
        alice.raw(Method::DELETE, "/data", None).await,
        409,
        "CONFLICT",
    )
    .await;
    assert_eq!(
        alice
            .raw(Method::DELETE, "/data/snapshots/s1", None)
            .await
            .status()
            .as_u16(),
        204
    );
    assert!(!snap_dir.exists());
    error_body(
        alice.raw(Method::DELETE, "/data/snapshots/s1", None).await,
        404,
        "NOT_FOUND",
    )
    .await;
    assert_eq!(alice.raw(Method::DELETE, "/data", None).await.status(), 204);
    // Clones outlive their source.
    assert_eq!(alice.read("copy", "f.txt").await, "v3");

    // At most 64 snapshots a volume.
    for i in 0..64 {
        let r = alice.snapshot("copy", &format!("n{i}")).await;
        assert_eq!(r.status().as_u16(), 201, "{i}");
    }
    error_body(
        alice.snapshot("copy", "n64").await,
        429,
        "RESOURCE_EXHAUSTED",
    )
    .await;
    // The Rust client's calls.
    let client = hub.client(Some(ALICE_KEY));
    assert_eq!(
        client.list_volume_snapshots("copy").await.unwrap().len(),
        64
    );
    client.delete_volume_snapshot("copy", "n0").await.unwrap();
    let s = client.create_volume_snapshot("copy", "last").await.unwrap();
    assert_eq!(s.name, "last");
}

#[tokio::test]
async fn a_killed_hub_reconciles_volume_snapshots_and_finishes_clones() {
    let mut hub = TestHub::start(keys_hub()).await;
    let (alice, _) = apis(&hub);
    alice.create(json!({"name": "data", "size_mb": 16})).await;
    alice.put_ok("data", "f.txt", b"snapped").await;
    assert_eq!(alice.snapshot("data", "keep").await.status(), 201);
    assert_eq!(alice.snapshot("data", "lost").await.status(), 201);
    alice.put_ok("data", "f.txt", b"later").await;

    hub.kill9();
    let btrfs = |args: &[&str]| {
        let out = std::process::Command::new("btrfs")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "btrfs {args:?}: {out:?}");
    };
    // A row without its subvolume (dropped at start), and a subvolume
    // without a row (a create killed between its steps: removed).
    let lost = snapshot_path(&hub, "alice", "data", "lost");
    btrfs(&["subvolume", "delete", lost.to_str().unwrap()]);
    let orphan = snapshot_path(&hub, "alice", "data", "orphan");
    let vol = volume_path(&hub, "alice", "data");
    btrfs(&[
        "subvolume",
        "snapshot",
        "-r",
        vol.to_str().unwrap(),
        orphan.to_str().unwrap(),
    ]);
    // A clone killed after its row committed, with a stale subvolume of
    // that name still on disk (a delete of an older `half` killed
    // halfway): the start makes the clone, from the snapshot.
    {
        use sandhub::local::store::{PendingClone, Store, VolumeRow};
        let store = Store::open(&hub.state_dir.join("sandhub.db")).unwrap();
        let row = VolumeRow {
            tenant: "alice".into(),
            name: "half".into(),
            size_mb: 16,
            labels: Default::default(),
            created_at: 1,
        };
        let pending = PendingClone {
            tenant: "alice".into(),
            name: "half".into(),
            snapshot_volume: "data".into(),
            snapshot: "keep".into(),
        };
        store
            .insert_volume_from(&row, u64::MAX, Some(&pending))
            .unwrap()
            .unwrap();
    }
    let half = volume_path(&hub, "alice", "half");
    btrfs(&["subvolume", "create", half.to_str().unwrap()]);
    std::fs::write(half.join("stale.txt"), "old").unwrap();

    hub.restart().await;
    let (alice, _) = apis(&hub);
    assert_eq!(alice.snapshots("data").await, ["keep"]);
    assert!(
        !orphan.exists(),
        "a snapshot without a row survived the start"
    );
    assert!(is_subvolume(&snapshot_path(&hub, "alice", "data", "keep")));
    assert_eq!(alice.read("half", "f.txt").await, "snapped");
    error_body(alice.get("half", "stale.txt").await, 404, "NOT_FOUND").await;
    assert_eq!(alice.read("data", "f.txt").await, "later");
    // Once finished, a clone is a volume like any other: a second start
    // leaves its files alone.
    alice.put_ok("half", "mine.txt", b"kept").await;
    hub.kill9();
    hub.restart().await;
    let (alice, _) = apis(&hub);
    assert_eq!(alice.read("half", "mine.txt").await, "kept");
}

/// `sandhub volume ...` as alice.
fn cli(hub: &TestHub, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(common::EXE)
        .arg("volume")
        .args(args)
        .env("SANDHUB_URL", hub.url())
        .env("SANDHUB_API_KEY", ALICE_KEY)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_copies_files_both_ways_and_snapshots() {
    let hub = TestHub::start(keys_hub()).await;
    let (alice, _) = apis(&hub);
    alice.create(json!({"name": "data", "size_mb": 16})).await;
    let local = hub.dir.path().join("local");
    std::fs::create_dir_all(local.join("tree/sub")).unwrap();
    std::fs::write(local.join("one.txt"), "one").unwrap();
    std::fs::write(local.join("tree/sub/two.txt"), "two").unwrap();

    let l = |p: &str| local.join(p).to_str().unwrap().to_string();
    let (ok, _, err) = cli(&hub, &["cp", &l("one.txt"), "data:/in/one.txt"]);
    assert!(ok, "{err}");
    assert_eq!(alice.read("data", "in/one.txt").await, "one");
    let (ok, _, err) = cli(&hub, &["cp", "-r", &l("tree"), "data:/"]);
    assert!(ok, "{err}");
    assert_eq!(alice.read("data", "tree/sub/two.txt").await, "two");

    let out = hub.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = |p: &str| out.join(p).to_str().unwrap().to_string();
    let (ok, _, err) = cli(&hub, &["cp", "data:/in/one.txt", &o("got.txt")]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(out.join("got.txt")).unwrap(), "one");
    let (ok, _, err) = cli(&hub, &["cp", "-r", "data:/tree", &o("")]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("tree/sub/two.txt")).unwrap(),
        "two"
    );

    let (ok, stdout, err) = cli(&hub, &["snapshot", "data", "s1"]);
    assert!(ok, "{err}");
    assert_eq!(stdout.trim(), "data@s1");
    let (ok, stdout, err) = cli(&hub, &["snapshots", "data"]);
    assert!(ok, "{err}");
    assert!(stdout.contains("data@s1"), "{stdout}");
    let (ok, _, err) = cli(
        &hub,
        &[
            "create",
            "copy",
            "--size-mb",
            "8",
            "--from-snapshot",
            "data@s1",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(alice.read("copy", "in/one.txt").await, "one");
    let (ok, _, err) = cli(&hub, &["rm", "data"]);
    assert!(!ok && err.contains("snapshot"), "{err}");
    let (ok, _, err) = cli(&hub, &["rm-snapshot", "data", "s1"]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&hub, &["rm", "data"]);
    assert!(ok, "{err}");
}
