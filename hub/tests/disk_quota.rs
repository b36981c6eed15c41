//! Disk quotas (issue #12 row 6) and snapshot deletion, against the real
//! thing: the quota volume (`sandhub::local::runtime::quota`) on a real loop device,
//! and `sandhub serve` through [`TestHub`]. Needs root, loop devices and
//! mkfs.btrfs (btrfs-progs), as the hub does.
//!
//! The timings printed here (how long a write past the quota takes to
//! fail, what a quota adds to a launch) are measurements, never asserted.

mod common;

use std::{
    io::Write,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    time::Instant,
};

use sandhub::local::runtime::quota::{plan, DiskQuotas, VolumeOptions, MIB};
use sandhub_api::{
    error::Code,
    hub::{CreateSandbox, ForkRequest, Sandbox, Template},
};
use sandhub_client::{http::HubClient, Sandboxes};
use serde_json::{json, Value};
use tempfile::TempDir;

use common::{shell as sh, shell_ok as sh_ok, HubOptions, TestHub, ALICE_KEY, BOB_KEY};

// ------------------------------------------------------------ the volume

/// A quota volume for a throwaway state dir, mounted under the test's own
/// directory and unmounted when dropped (before the directory goes).
struct Volume {
    quotas: Option<DiskQuotas>,
    options: VolumeOptions,
    state: PathBuf,
    dir: TempDir,
}

impl Volume {
    fn new(size_mb: u64) -> Volume {
        let dir = tempfile::Builder::new()
            .prefix("sandhub-quota-test-")
            .tempdir()
            .unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let options = VolumeOptions {
            size_mb: Some(size_mb),
            run_dir: dir.path().join("run"),
        };
        let quotas = DiskQuotas::detect_or_create(&state, &options).expect("making the volume");
        Volume {
            quotas: Some(quotas),
            options,
            state,
            dir,
        }
    }

    fn q(&self) -> &DiskQuotas {
        self.quotas.as_ref().unwrap()
    }

    fn image(&self) -> PathBuf {
        self.state.join("disk.img")
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Some(q) = self.quotas.take() {
            let _ = q.detach();
        }
        // A test that re-detected holds no handle any more: unmount by path.
        let mount_point =
            plan::mount_point(&self.options.run_dir, &self.state.canonicalize().unwrap());
        common::detach_volume(&mount_point);
    }
}

fn mounted_at(path: &Path) -> Option<plan::MountEntry> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    plan::find_mount(&mountinfo, path)
}

/// Loop devices whose backing file is `image`.
fn loop_devices_of(image: &Path) -> usize {
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .ok()
                .and_then(|t| plan::parse_backing_file(&t))
                .is_some_and(|p| p == image)
        })
        .count()
}

/// Writes `mib` MiB of zeros to `path`; the error of the first write that fails.
fn write_mib(path: &Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0u8; MIB as usize];
    for _ in 0..mib {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

fn is_over_quota(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EDQUOT) | Some(libc::ENOSPC))
}

#[test]
fn volume_limits_directories_and_is_found_again() {
    let v = Volume::new(1024);
    let root = v.q().root().to_path_buf();
    let entry = mounted_at(&root).expect("the volume is mounted");
    assert_eq!(entry.fstype, "btrfs");
    assert!(!root.starts_with(&v.state), "mounted inside the state dir");
    // Sparse: the image takes next to nothing of the host yet.
    let image = std::fs::metadata(v.image()).unwrap();
    assert_eq!(image.len(), 1024 * MIB);
    assert!(
        image.blocks() * 512 < 64 * MIB,
        "{} bytes",
        image.blocks() * 512
    );

    let sandboxes = std::fs::File::open(root.join("sandboxes")).unwrap();
    let id = v.q().limit(sandboxes.as_fd(), "a", 16 * MIB).unwrap();
    let a = root.join("sandboxes/a");
    assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o777, 0o700);

    let started = Instant::now();
    let err = write_mib(&a.join("big"), 64).expect_err("a write past the quota must fail");
    eprintln!(
        "MEASURE write past a 16 MiB quota failed after {:?}: {err}",
        started.elapsed()
    );
    assert!(is_over_quota(&err), "{err}");
    assert!(std::fs::metadata(a.join("big")).unwrap().len() <= 16 * MIB);
    // At the limit, the next write fails on its own.
    let mut full = std::fs::OpenOptions::new()
        .append(true)
        .open(a.join("big"))
        .unwrap();
    let started = Instant::now();
    let err = full
        .write_all(&[0u8; 1 << 20])
        .and_then(|()| full.sync_all())
        .expect_err("a write at the limit must fail");
    eprintln!(
        "MEASURE one 1 MiB write at the limit failed after {:?}: {err}",
        started.elapsed()
    );
    assert!(is_over_quota(&err), "{err}");
    drop(full);
    // Deleting gives the quota back at once.
    std::fs::remove_file(a.join("big")).unwrap();
    write_mib(&a.join("again"), 8).expect("writing after deleting");
    v.q().usage(id).unwrap();

    // Limiting again (a resumed sandbox) keeps the directory and its files.
    assert_eq!(v.q().limit(sandboxes.as_fd(), "a", 32 * MIB).unwrap(), id);
    assert!(a.join("again").exists());

    // A hub restart finds the mounted volume: no second mount, no second device.
    let again = DiskQuotas::detect_or_create(&v.state, &v.options).unwrap();
    assert_eq!(again.root(), root);
    assert_eq!(loop_devices_of(&v.image().canonicalize().unwrap()), 1);

    // A hub that stopped cleanly unmounted the volume while something still
    // held it (a running sandbox): the next start mounts the same device.
    let held = std::fs::File::open(a.join("again")).unwrap();
    again.detach().unwrap();
    assert!(mounted_at(&root).is_none());
    let third = DiskQuotas::detect_or_create(&v.state, &v.options).unwrap();
    assert!(mounted_at(&root).is_some());
    assert_eq!(loop_devices_of(&v.image().canonicalize().unwrap()), 1);
    assert!(root.join("sandboxes/a/again").exists());
    drop(held);

    // Release deletes the directory, whatever it holds.
    third.release(&a).unwrap();
    assert!(!a.exists());
    third.release(&a).unwrap();
    // Paths outside the volume and odd names are refused.
    assert!(third.release(Path::new("/tmp/elsewhere")).is_err());
    assert!(third.limit(sandboxes.as_fd(), "../x", MIB).is_err());
    assert!(third.limit(sandboxes.as_fd(), "a/b", MIB).is_err());
    // A plain directory where a subvolume belongs gets no quota: refused.
    std::fs::create_dir(root.join("sandboxes/plain")).unwrap();
    assert!(third.limit(sandboxes.as_fd(), "plain", MIB).is_err());
    third.detach().unwrap();
}

#[test]
fn per_sandbox_cost_of_a_quota() {
    let v = Volume::new(1024);
    let root = v.q().root().to_path_buf();
    let sandboxes = std::fs::File::open(root.join("sandboxes")).unwrap();
    const N: u32 = 50;
    let started = Instant::now();
    for i in 0..N {
        v.q()
            .limit(sandboxes.as_fd(), &format!("s{i}"), 64 * MIB)
            .unwrap();
    }
    let limit = started.elapsed() / N;
    let started = Instant::now();
    for i in 0..N {
        v.q()
            .release(&root.join(format!("sandboxes/s{i}")))
            .unwrap();
    }
    let release = started.elapsed() / N;
    eprintln!("MEASURE per sandbox: subvolume + limit {limit:?}, release {release:?}");
}

#[test]
fn a_state_dir_on_btrfs_with_quotas_is_used_as_it_is() {
    let v = Volume::new(1024);
    let inner = v.q().root().join("inner-state");
    std::fs::create_dir(&inner).unwrap();
    let options = VolumeOptions {
        size_mb: Some(512),
        run_dir: v.dir.path().join("inner-run"),
    };
    let q = DiskQuotas::detect_or_create(&inner, &options).unwrap();
    assert_eq!(q.root(), inner.join("volume"));
    assert!(!inner.join("disk.img").exists(), "made an image on btrfs");
    assert!(mounted_at(&plan::mount_point(&options.run_dir, &inner)).is_none());
    let sandboxes = std::fs::File::open(q.root().join("sandboxes")).unwrap();
    q.limit(sandboxes.as_fd(), "b", 8 * MIB).unwrap();
    let err = write_mib(&q.root().join("sandboxes/b/big"), 32).unwrap_err();
    assert!(is_over_quota(&err), "{err}");
    // Not mounted by this hub: nothing to detach.
    q.detach().unwrap();
    assert!(mounted_at(v.q().root()).is_some());
}

#[test]
fn a_state_dir_on_tmpfs_gets_a_volume_too() {
    // tmpfs has no O_DIRECT: the loop device must do without.
    let dir = tempfile::tempdir().unwrap();
    let tmpfs = dir.path().join("tmpfs");
    std::fs::create_dir(&tmpfs).unwrap();
    rustix::mount::mount(
        "tmpfs",
        &tmpfs,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=400m",
    )
    .unwrap();
    let state = tmpfs.join("state");
    std::fs::create_dir(&state).unwrap();
    let options = VolumeOptions {
        size_mb: Some(300),
        run_dir: dir.path().join("run"),
    };
    let made = DiskQuotas::detect_or_create(&state, &options);
    if let Ok(q) = &made {
        let sandboxes = std::fs::File::open(q.root().join("sandboxes")).unwrap();
        q.limit(sandboxes.as_fd(), "t", 8 * MIB).unwrap();
        let err = write_mib(&q.root().join("sandboxes/t/big"), 16).unwrap_err();
        assert!(is_over_quota(&err), "{err}");
        q.detach().unwrap();
    }
    rustix::mount::unmount(&tmpfs, rustix::mount::UnmountFlags::DETACH).unwrap();
    made.expect("a volume on tmpfs");
}

// ------------------------------------------------------------ the hub

async fn sandbox_with_disk(c: &HubClient, disk_mb: Option<u64>) -> Sandbox {
    let template = format!(
        "disk-{}",
        disk_mb.map_or("default".into(), |d| d.to_string())
    );
    c.put_template(
        &template,
        Template {
            disk_mb,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    c.create(CreateSandbox {
        template: Some(template),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Writes 100 MiB into /workspace; asserts the write stopped at the quota
/// (`limit_mib`), with the error a program sees.
async fn assert_write_stops(c: &HubClient, id: &str, limit_mib: u64) {
    let started = Instant::now();
    let r = sh(
        c,
        id,
        "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; echo rc=$?; \
         stat -c %s /workspace/big; rm -f /workspace/big",
    )
    .await;
    eprintln!(
        "MEASURE dd of 100 MiB into a {limit_mib} MiB quota, through exec: {:?}",
        started.elapsed()
    );
    assert!(
        !r.stdout.contains("rc=0"),
        "the write was not stopped: {r:?}"
    );
    assert!(
        r.stdout.contains("Disk quota exceeded") || r.stdout.contains("No space left"),
        "{r:?}"
    );
    let size: u64 = r.stdout.lines().last().unwrap().trim().parse().unwrap();
    assert!(size <= limit_mib * MIB, "wrote {size} bytes");
}

/// Bytes the hub's disk image takes on the host.
fn image_bytes(hub: &TestHub) -> u64 {
    std::fs::metadata(hub.state_dir.join("disk.img"))
        .unwrap()
        .blocks()
        * 512
}

#[tokio::test]
async fn a_sandbox_stops_at_its_disk_quota_across_suspend_resume_and_reset() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let started = Instant::now();
    let sb = sandbox_with_disk(&c, Some(64)).await;
    eprintln!(
        "MEASURE cold create with a disk quota: {:?}",
        started.elapsed()
    );

    assert_write_stops(&c, &sb.id, 64).await;
    // The host got at most the quota, not the 100 MiB asked for.
    assert!(image_bytes(&hub) < 100 * MIB, "{}", image_bytes(&hub));
    assert!(!hub.state_dir.join("sandboxes").join(&sb.id).exists());
    // Deleting made room again: the same sandbox writes more.
    sh_ok(
        &c,
        &sb.id,
        "dd if=/dev/zero of=/workspace/ok bs=1M count=20 2>&1",
    )
    .await;

    // The workspace survives suspend/resume, and so does its quota.
    c.suspend(&sb.id).await.unwrap();
    c.resume(&sb.id).await.unwrap();
    assert_eq!(
        sh_ok(&c, &sb.id, "stat -c %s /workspace/ok").await,
        "20971520\n"
    );
    assert_write_stops(&c, &sb.id, 64).await;

    // A reset starts from an empty layer under the same quota.
    c.reset(&sb.id).await.unwrap();
    assert_eq!(sh(&c, &sb.id, "test -e /workspace/ok").await.exit_code, 1);
    assert_write_stops(&c, &sb.id, 64).await;

    // A hub restart re-attaches: same volume, same quota.
    hub_restart_keeps_the_quota(hub, c, sb).await;
}

async fn hub_restart_keeps_the_quota(mut hub: TestHub, c: HubClient, sb: Sandbox) {
    sh_ok(&c, &sb.id, "echo kept > /workspace/kept").await;
    let volume = common::disk_volume(&hub.state_dir).expect("the volume is mounted");
    hub.restart().await;
    let c2 = hub.client(None);
    assert_eq!(sh_ok(&c2, &sb.id, "cat /workspace/kept").await, "kept\n");
    assert_write_stops(&c2, &sb.id, 64).await;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mounts = mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(volume.to_str().unwrap()))
        .count();
    assert_eq!(mounts, 1, "the restarted hub mounted the volume again");
    drop(c);
}

#[tokio::test]
async fn workloads_cannot_make_a_subvolume_to_escape_the_quota() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = sandbox_with_disk(&c, Some(64)).await;
    // Reflinks (FICLONE shares btrfs's ioctl type byte) still work.
    sh_ok(
        &c,
        &sb.id,
        "head -c 1048576 /dev/urandom > /workspace/a && cp --reflink=always /workspace/a /workspace/b",
    )
    .await;
    // The raw layer is on btrfs where it is visible; any user may create a
    // subvolume there, and a new subvolume has no limit. Refused.
    let r = sh(
        &c,
        &sb.id,
        "command -v btrfs >/dev/null || { echo no-btrfs; exit 0; }; \
         for d in /.sandhub/overlay/upper /workspace; do \
           [ -d $d ] && btrfs subvolume create $d/escape 2>&1; echo rc=$?; done",
    )
    .await;
    assert!(
        !r.stdout.contains("no-btrfs"),
        "btrfs-progs is not installed"
    );
    assert!(
        !r.stdout.contains("rc=0"),
        "a workload made a subvolume: {r:?}"
    );
    // Where the layer is reachable, the kernel was never asked.
    assert!(
        !r.stdout.contains("/.sandhub/overlay") || r.stdout.contains("Operation not permitted"),
        "{r:?}"
    );
}

#[tokio::test]
async fn the_operator_default_applies_to_templates_without_disk_mb() {
    let hub = TestHub::start(HubOptions {
        extra_args: &["--default-disk-mb", "32"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let sb = c.create(CreateSandbox::default()).await.unwrap();
    assert_write_stops(&c, &sb.id, 32).await;
    // A template's own disk_mb wins over the default.
    let big = sandbox_with_disk(&c, Some(80)).await;
    sh_ok(
        &c,
        &big.id,
        "dd if=/dev/zero of=/workspace/f bs=1M count=50 2>&1",
    )
    .await;
}

#[tokio::test]
async fn disk_mb_out_of_range_is_invalid() {
    let hub = TestHub::start(HubOptions::default()).await;
    let http = hub.http();
    for bad in [
        json!(0),
        json!(15),
        json!(1u64 << 25),
        json!(-1),
        json!("64"),
    ] {
        let r = http
            .put(format!("{}/v1/templates/t", hub.url()))
            .json(&json!({ "disk_mb": bad }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "disk_mb {bad}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");
    }
    let r = http
        .put(format!("{}/v1/templates/t", hub.url()))
        .json(&json!({ "disk_mb": 16 }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

// ------------------------------------------------------------ snapshots

async fn delete_snapshot(hub: &TestHub, key: &str, id: &str, snap: &str) -> (u16, Value) {
    let r = hub
        .http()
        .delete(format!("{}/v1/sandboxes/{id}/snapshots/{snap}", hub.url()))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn list_snapshots(hub: &TestHub, key: &str, id: &str) -> (u16, Value) {
    let r = hub
        .http()
        .get(format!("{}/v1/sandboxes/{id}/snapshots", hub.url()))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn snapshots_are_sized_deleted_and_kept_while_a_fork_uses_them() {
    let hub = TestHub::start(HubOptions {
        api_keys: true,
        ..Default::default()
    })
    .await;
    let alice = hub.client(Some(ALICE_KEY));
    let bob = hub.client(Some(BOB_KEY));
    let sb = alice.create(CreateSandbox::default()).await.unwrap();
    sh_ok(
        &alice,
        &sb.id,
        "head -c 2097152 /dev/urandom > /workspace/data",
    )
    .await;
    let snap = alice.snapshot(&sb.id).await.unwrap();
    assert!(snap.size_bytes.unwrap() >= 2 * MIB, "{snap:?}");
    let volume = common::disk_volume(&hub.state_dir).expect("the volume is mounted");
    let layer = volume.join("snapshots").join(&snap.id);
    assert!(layer.join("data").is_file());

    let (status, list) = list_snapshots(&hub, ALICE_KEY, &sb.id).await;
    assert_eq!(status, 200);
    assert_eq!(list["snapshots"][0]["id"], snap.id.as_str());
    assert_eq!(list["snapshots"][0]["size_bytes"], snap.size_bytes.unwrap());

    // Another tenant cannot tell it exists; a wrong sandbox id misses it.
    let (status, body) = delete_snapshot(&hub, BOB_KEY, &sb.id, &snap.id).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("NOT_FOUND")));
    assert_eq!(
        bob.delete_snapshot(&sb.id, &snap.id)
            .await
            .unwrap_err()
            .code,
        Code::NotFound
    );
    let other = alice.create(CreateSandbox::default()).await.unwrap();
    let (status, _) = delete_snapshot(&hub, ALICE_KEY, &other.id, &snap.id).await;
    assert_eq!(status, 404);
    assert!(layer.is_dir());

    // A fork's workspace stands on the snapshot: refused, and the fork
    // keeps working.
    let fork = alice
        .fork(
            &sb.id,
            ForkRequest {
                snapshot: Some(snap.id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let (status, body) = delete_snapshot(&hub, ALICE_KEY, &sb.id, &snap.id).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("CONFLICT")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains(&fork.id),
        "{body}"
    );
    // Also while the fork is suspended: it needs the layer to resume.
    alice.suspend(&fork.id).await.unwrap();
    assert_eq!(
        alice
            .delete_snapshot(&sb.id, &snap.id)
            .await
            .unwrap_err()
            .code,
        Code::Conflict
    );
    alice.resume(&fork.id).await.unwrap();
    assert_eq!(
        sh_ok(&alice, &fork.id, "wc -c < /workspace/data")
            .await
            .trim(),
        "2097152"
    );

    alice.delete(&fork.id).await.unwrap();
    let (status, _) = delete_snapshot(&hub, ALICE_KEY, &sb.id, &snap.id).await;
    assert_eq!(status, 204);
    assert!(!layer.exists(), "the layer is still on disk");
    let (status, list) = list_snapshots(&hub, ALICE_KEY, &sb.id).await;
    assert_eq!((status, list["snapshots"].clone()), (200, json!([])));
    let (status, _) = delete_snapshot(&hub, ALICE_KEY, &sb.id, &snap.id).await;
    assert_eq!(status, 404);

    // A snapshot outlives its sandbox, stays listed, and can be deleted.
    let kept = alice.snapshot(&sb.id).await.unwrap();
    alice.delete(&sb.id).await.unwrap();
    let (status, list) = list_snapshots(&hub, ALICE_KEY, &sb.id).await;
    assert_eq!(status, 200);
    assert_eq!(list["snapshots"][0]["id"], kept.id.as_str());
    let (status, _) = list_snapshots(&hub, BOB_KEY, &sb.id).await;
    assert_eq!(status, 404);
    let (status, _) = delete_snapshot(&hub, ALICE_KEY, &sb.id, &kept.id).await;
    assert_eq!(status, 204);
    let (status, _) = list_snapshots(&hub, ALICE_KEY, &sb.id).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_upload_past_the_quota_is_refused_and_leaves_nothing() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    let sb = sandbox_with_disk(&c, Some(32)).await;
    let r = hub
        .http()
        .put(format!(
            "{}/v1/sandboxes/{}/files/big.bin",
            hub.url(),
            sb.id
        ))
        .body(vec![7u8; 64 * MIB as usize])
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    eprintln!("upload past the quota: {status} {body}");
    assert_eq!(
        (status, body["code"].as_str()),
        (507, Some("RESOURCE_EXHAUSTED")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("no space"),
        "{body}"
    );
    assert_eq!(sh(&c, &sb.id, "ls -A /workspace").await.stdout, "");
    // And the quota is whole again for a file that fits.
    let r = hub
        .http()
        .put(format!("{}/v1/sandboxes/{}/files/ok.bin", hub.url(), sb.id))
        .body(vec![7u8; 8 * MIB as usize])
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

#[tokio::test]
async fn a_tenant_stops_at_its_snapshot_budget() {
    let hub = TestHub::start(HubOptions {
        extra_args: &["--max-snapshot-mb-per-tenant", "3"],
        ..Default::default()
    })
    .await;
    let c = hub.client(None);
    let sb = c.create(CreateSandbox::default()).await.unwrap();
    sh_ok(&c, &sb.id, "head -c 2097152 /dev/urandom > /workspace/data").await;
    let first = c.snapshot(&sb.id).await.unwrap();
    let second = c.snapshot(&sb.id).await.unwrap();
    // 4 MiB kept, over the 3 MiB budget: no more, also not through a fork
    // that would take one.
    let err = c.snapshot(&sb.id).await.unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    assert!(err.message.contains(&(3 * MIB).to_string()), "{err}");
    let err = c.fork(&sb.id, ForkRequest::default()).await.unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{err}");
    // Deleting makes room again.
    c.delete_snapshot(&sb.id, &first.id).await.unwrap();
    c.delete_snapshot(&sb.id, &second.id).await.unwrap();
    c.snapshot(&sb.id).await.unwrap();
}
