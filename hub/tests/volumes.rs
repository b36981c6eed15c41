//! Named volumes on the local backend (issue #32 §1): `/v1/volumes`
//! against a real `sandhub serve`, whose volumes are btrfs subvolumes with
//! qgroup limits on its disk-quota volume (root, loop devices and
//! mkfs.btrfs, as `disk_quota.rs`).
//!
//! The volume files API and snapshots are `volume_files.rs`'s; these
//! tests cover the volumes themselves: the API, its checks,
//! tenant isolation, the tenant cap, and that a `kill -9` of the hub loses
//! nothing and leaves nothing behind.

mod common;

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde_json::{json, Value};

use common::{error_body, HubOptions, TestHub, ALICE_KEY, BOB_KEY};

/// 32 hex digits of the SHA-256 of the tenant's name, as the hub names a
/// tenant's directory of volumes.
fn tenant_dir(tenant: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(tenant.as_bytes())[..16])
}

/// Where the hub keeps `tenant`'s volume `name` on the host.
fn volume_path(hub: &TestHub, tenant: &str, name: &str) -> PathBuf {
    hub.sandboxes_dir()
        .parent()
        .unwrap()
        .join("volumes")
        .join(tenant_dir(tenant))
        .join(name)
}

/// Whether `path` is a subvolume's root (btrfs gives each the inode 256).
fn is_subvolume(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && m.ino() == 256)
}

struct Api<'a> {
    hub: &'a TestHub,
    key: &'a str,
}

impl Api<'_> {
    fn url(&self, path: &str) -> String {
        format!("{}/v1/volumes{path}", self.hub.url())
    }

    /// `method` on `/v1/volumes{path}` as this tenant, with `body` as JSON.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut req = self
            .hub
            .http()
            .request(method, self.url(path))
            .bearer_auth(self.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send().await.unwrap()
    }

    async fn post(&self, body: Value) -> reqwest::Response {
        self.call(reqwest::Method::POST, "", Some(body)).await
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn delete(&self, path: &str) -> reqwest::Response {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    async fn create(&self, name: &str, size_mb: u64) -> Value {
        let r = self.post(json!({"name": name, "size_mb": size_mb})).await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "{body}");
        body
    }

    async fn names(&self) -> Vec<String> {
        let r = self.get("").await;
        assert_eq!(r.status().as_u16(), 200);
        let body: Value = r.json().await.unwrap();
        body["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    }
}

fn keys_hub() -> HubOptions {
    HubOptions {
        api_keys: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn volumes_are_made_listed_checked_and_deleted_per_tenant() {
    let hub = TestHub::start(keys_hub()).await;
    let alice = Api {
        hub: &hub,
        key: ALICE_KEY,
    };
    let bob = Api {
        hub: &hub,
        key: BOB_KEY,
    };

    let v = alice
        .post(json!({"name": "data", "size_mb": 64, "labels": {"team": "ml"}}))
        .await;
    assert_eq!(v.status().as_u16(), 201);
    let v: Value = v.json().await.unwrap();
    assert_eq!(v["name"], "data");
    assert_eq!(v["size_mb"], 64);
    assert_eq!(v["labels"]["team"], "ml");
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'), "{v}");
    let on_disk = volume_path(&hub, "alice", "data");
    assert!(
        is_subvolume(&on_disk),
        "{} is no subvolume",
        on_disk.display()
    );
    // Only root looks inside the hub's side of a volume.
    let mode = std::fs::metadata(on_disk.parent().unwrap()).unwrap().mode();
    assert_eq!(mode & 0o777, 0o700);

    let got: Value = alice.get("/data").await.json().await.unwrap();
    assert_eq!(got, v);
    assert_eq!(alice.names().await, ["data"]);

    // The same name again: 409.
    error_body(
        alice.post(json!({"name": "data", "size_mb": 1})).await,
        409,
        "CONFLICT",
    )
    .await;

    // Bad input: 400 naming what is wrong, never a 500.
    let e = error_body(
        alice
            .post(json!({"name": "x", "size_mb": 1, "sise": 2}))
            .await,
        400,
        "INVALID_ARGUMENT",
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains("sise"), "{e}");
    for bad in [
        json!({"name": "Data", "size_mb": 1}),
        json!({"name": "../x", "size_mb": 1}),
        json!({"name": "", "size_mb": 1}),
        json!({"name": "x", "size_mb": 0}),
        json!({"name": "x", "size_mb": (1u64 << 20) + 1}),
        json!({"name": "x", "size_mb": -1}),
        json!({"name": "x"}),
        json!({"name": "x", "size_mb": 1, "labels": {"kubernetes.io/x": "y"}}),
    ] {
        let r = alice.post(bad.clone()).await;
        assert_eq!(
            r.status().as_u16(),
            400,
            "{bad}: {}",
            r.text().await.unwrap()
        );
    }
    error_body(alice.get("/Not_A_Name").await, 400, "INVALID_ARGUMENT").await;
    assert_eq!(alice.names().await, ["data"]);

    // Another tenant: the name is unknown, not forbidden, and free.
    error_body(bob.get("/data").await, 404, "NOT_FOUND").await;
    error_body(bob.delete("/data").await, 404, "NOT_FOUND").await;
    assert!(bob.names().await.is_empty());
    bob.create("data", 8).await;
    assert!(is_subvolume(&volume_path(&hub, "bob", "data")));
    assert!(
        is_subvolume(&on_disk),
        "bob's create touched alice's volume"
    );

    // Delete: gone from the API and from the disk, the other tenant's
    // volume of the same name untouched.
    assert_eq!(alice.delete("/data").await.status().as_u16(), 204);
    error_body(alice.get("/data").await, 404, "NOT_FOUND").await;
    error_body(alice.delete("/data").await, 404, "NOT_FOUND").await;
    assert!(!on_disk.exists());
    assert_eq!(bob.names().await, ["data"]);
    assert!(is_subvolume(&volume_path(&hub, "bob", "data")));

    // A new volume of a deleted one's name starts empty.
    std::fs::write(volume_path(&hub, "bob", "data").join("old"), "x").unwrap();
    assert_eq!(bob.delete("/data").await.status().as_u16(), 204);
    bob.create("data", 8).await;
    let fresh = volume_path(&hub, "bob", "data");
    assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0);
}

#[tokio::test]
async fn the_tenant_cap_bounds_the_sum_of_sizes() {
    let hub = TestHub::start(HubOptions {
        extra_args: &["--tenant-max-volume-mb", "100"],
        ..keys_hub()
    })
    .await;
    let alice = Api {
        hub: &hub,
        key: ALICE_KEY,
    };
    let bob = Api {
        hub: &hub,
        key: BOB_KEY,
    };
    alice.create("a", 60).await;
    let e = error_body(
        alice.post(json!({"name": "b", "size_mb": 41})).await,
        429,
        "RESOURCE_EXHAUSTED",
    )
    .await;
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("--tenant-max-volume-mb") && msg.contains("60"),
        "{e}"
    );
    assert!(!volume_path(&hub, "alice", "b").exists());
    alice.create("b", 40).await;
    // Each tenant has its own cap.
    bob.create("a", 100).await;
    // Deleting gives the room back.
    assert_eq!(alice.delete("/a").await.status().as_u16(), 204);
    alice.create("c", 60).await;
    assert_eq!(alice.names().await, ["b", "c"]);

    // Each volume's size is a hard limit (binding root as well): filling
    // `b` past its 40 MiB fails with EDQUOT, and `c` still takes writes.
    let err = fill(&volume_path(&hub, "alice", "b").join("big"), 48).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    fill(&volume_path(&hub, "alice", "c").join("small"), 4).unwrap();
}

/// Writes `mb` MiB to `path`, synced.
fn fill(path: &Path, mb: usize) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..mb {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

#[tokio::test]
async fn a_killed_hub_keeps_volumes_and_their_files_and_reconciles_the_disk() {
    let mut hub = TestHub::start(keys_hub()).await;
    let alice = Api {
        hub: &hub,
        key: ALICE_KEY,
    };
    alice.create("keep", 16).await;
    alice.create("emptied", 16).await;
    let keep = volume_path(&hub, "alice", "keep");
    std::fs::write(keep.join("notes.txt"), "still here").unwrap();
    let tenant_dir_path = keep.parent().unwrap().to_path_buf();

    hub.kill9();
    // While the hub is down: a subvolume with no row (as a hub killed
    // between a delete's two steps leaves), and a row whose subvolume is
    // gone (killed between a create's two steps).
    let btrfs = |args: &[&str]| {
        let out = std::process::Command::new("btrfs")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "btrfs {args:?}: {out:?}");
    };
    let orphan = tenant_dir_path.join("orphan");
    btrfs(&["subvolume", "create", orphan.to_str().unwrap()]);
    let emptied = tenant_dir_path.join("emptied");
    btrfs(&["subvolume", "delete", emptied.to_str().unwrap()]);

    hub.restart().await;
    let alice = Api {
        hub: &hub,
        key: ALICE_KEY,
    };
    assert_eq!(alice.names().await, ["emptied", "keep"]);
    assert_eq!(
        std::fs::read_to_string(keep.join("notes.txt")).unwrap(),
        "still here"
    );
    assert!(
        !orphan.exists(),
        "a subvolume without a row survived the start"
    );
    assert!(
        is_subvolume(&emptied),
        "a row's subvolume was not made again"
    );
    let got: Value = alice.get("/keep").await.json().await.unwrap();
    assert_eq!(got["size_mb"], 16);
}

/// `sandhub volume ...` against the hub, as alice; its stdout.
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
async fn the_cli_creates_lists_and_removes_volumes() {
    let hub = TestHub::start(keys_hub()).await;
    let (ok, out, err) = cli(
        &hub,
        &["create", "data", "--size-mb", "8", "--label", "team=ml"],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "data");
    let (ok, out, err) = cli(&hub, &["ls"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("NAME"), "{out}");
    assert!(out.contains("data") && out.contains("team=ml"), "{out}");
    let (ok, out, _) = cli(&hub, &["get", "data", "--output", "json"]);
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["size_mb"], 8);
    let (ok, _, err) = cli(&hub, &["create", "data", "--size-mb", "8"]);
    assert!(!ok && err.contains("exists"), "{err}");
    let (ok, out, err) = cli(&hub, &["rm", "data"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "data");
    let (ok, _, err) = cli(&hub, &["get", "data"]);
    assert!(!ok && err.contains("NOT_FOUND"), "{err}");
}

/// A link met by `O_NOFOLLOW | O_DIRECTORY` (ENOTDIR) or on the way by
/// `RESOLVE_NO_SYMLINKS` (ELOOP); the errors carry the open's context.
fn refused_link(e: &std::io::Error) -> bool {
    let text = e.to_string();
    [libc::ENOTDIR, libc::ELOOP]
        .iter()
        .any(|n| text.contains(&format!("(os error {n})")))
}

/// The disk side alone (`DiskQuotas`'s volume calls) on a quota volume of
/// the test's own: every step is an fd opened beneath the root without
/// following links or crossing mounts, so a link or a mount where a
/// tenant directory or a volume belongs is refused, never followed.
#[test]
fn the_volume_walk_follows_no_link_and_crosses_no_mount() {
    use sandhub::local::runtime::quota::{plan, DiskQuotas, VolumeOptions, MIB};
    let dir = tempfile::Builder::new()
        .prefix("sandhub-volume-walk-")
        .tempdir()
        .unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let options = VolumeOptions {
        size_mb: Some(512),
        run_dir: dir.path().join("run"),
    };
    let q = DiskQuotas::detect_or_create(&state, &options).expect("making the volume");
    let mount_point = plan::mount_point(&options.run_dir, &state.canonicalize().unwrap());
    struct Detach(PathBuf);
    impl Drop for Detach {
        fn drop(&mut self) {
            common::detach_volume(&self.0);
        }
    }
    let _detach = Detach(mount_point);

    q.create_volume("t1", "data", 8 * MIB, true).unwrap();
    let fd = q.open_volume("t1", "data").unwrap();
    assert_eq!(
        rustix::fs::fstat(&fd).unwrap().st_ino,
        256,
        "a subvolume's root"
    );
    let volumes = q.root().join("volumes");
    assert_eq!(
        q.list_volumes().unwrap(),
        vec![("t1".to_string(), "data".to_string())]
    );

    // A link where a volume belongs (to another tenant's volume, to a host
    // directory): refused, and not listed as a volume to mount.
    std::fs::create_dir(volumes.join("t2")).unwrap();
    std::os::unix::fs::symlink(volumes.join("t1/data"), volumes.join("t2/data")).unwrap();
    std::os::unix::fs::symlink("/etc", volumes.join("t2/etc")).unwrap();
    for name in ["data", "etc"] {
        let e = q.open_volume("t2", name).unwrap_err();
        assert!(refused_link(&e), "t2/{name}: {e}");
    }
    // A link where a tenant's directory belongs.
    std::os::unix::fs::symlink(volumes.join("t1"), volumes.join("t3")).unwrap();
    let e = q.open_volume("t3", "data").unwrap_err();
    assert!(refused_link(&e), "t3: {e}");
    // A plain directory where a volume belongs: not a subvolume, refused.
    std::fs::create_dir(volumes.join("t1/plain")).unwrap();
    let e = q.open_volume("t1", "plain").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    // A mount where a volume belongs (a tmpfs over t1/other): refused.
    let over = volumes.join("t1/other");
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
    let e = q.open_volume("t1", "other").unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("(os error {})", libc::EXDEV)),
        "mount: {e}"
    );
    // SAFETY: umount2 of the tmpfs this test mounted.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    // Names that are not one component never reach the kernel.
    for bad in ["..", "../t1", "a/b", ""] {
        assert!(q.open_volume("t1", bad).is_err(), "{bad:?}");
        assert!(q.release_volume("t1", bad).is_err(), "{bad:?}");
    }
    // The volume itself is untouched by all of it; releasing it removes it.
    assert!(is_subvolume(&volumes.join("t1/data")));
    q.release_volume("t1", "data").unwrap();
    assert!(!volumes.join("t1/data").exists());
    q.release_volume("t1", "data").unwrap(); // gone is fine
    let _ = q.detach();
}
