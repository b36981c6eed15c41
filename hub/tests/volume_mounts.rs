//! Named volumes mounted into sandboxes on the local backend (issue #32
//! §1): `volumes: [{name, path, read_only}]` on templates and create
//! requests, against a real `sandhub serve` whose volumes are btrfs
//! subvolumes on its disk-quota volume (root, loop devices, mkfs.btrfs).

mod common;

use sandhub_api::{
    error::Code,
    hub::{CreateSandbox, SandboxState, Template},
    volumes::{CreateVolume, VolumeMount},
};
use sandhub_client::{http::HubClient, Sandboxes};

use common::{shell, shell_ok as sh_ok, HubOptions, TestHub, ALICE_KEY, BOB_KEY};

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        path: path.into(),
        read_only,
    }
}

async fn volume(c: &HubClient, name: &str, size_mb: u64) {
    c.create_volume(&CreateVolume {
        name: name.into(),
        size_mb,
        labels: Default::default(),
        access_mode: None,
        from_snapshot: None,
    })
    .await
    .expect("create volume");
}

async fn with_volumes(c: &HubClient, volumes: Vec<VolumeMount>) -> sandhub_client::Result<String> {
    let sb = c
        .create(CreateSandbox {
            volumes,
            ..Default::default()
        })
        .await?;
    assert_eq!(sb.state, SandboxState::Ready);
    Ok(sb.id)
}

async fn from_template(c: &HubClient, template: &str) -> sandhub_api::hub::Sandbox {
    c.create(CreateSandbox {
        template: Some(template.into()),
        ..Default::default()
    })
    .await
    .expect("create")
}

fn keys_hub(extra_args: &'static [&'static str]) -> HubOptions {
    HubOptions {
        api_keys: true,
        extra_args,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_volume_outlives_its_sandbox_and_serves_readers_beside_a_writer() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    volume(&c, "data", 64).await;

    // Written in A, below /workspace; A goes; B mounts it elsewhere.
    let a = with_volumes(&c, vec![mount("data", "/workspace/data", false)])
        .await
        .unwrap();
    sh_ok(
        &c,
        &a,
        "echo first > /workspace/data/f && mkdir /workspace/data/d && \
         stat -c %u:%g /workspace/data /workspace/data/f",
    )
    .await;
    c.delete(&a).await.unwrap();
    let writer = with_volumes(&c, vec![mount("data", "/mnt/data", false)])
        .await
        .unwrap();
    assert_eq!(sh_ok(&c, &writer, "cat /mnt/data/f").await, "first\n");

    // Two readers beside the writer: they see its writes at once and
    // cannot write themselves.
    let mut readers = Vec::new();
    for _ in 0..2 {
        readers.push(
            with_volumes(&c, vec![mount("data", "/srv/ro", true)])
                .await
                .unwrap(),
        );
    }
    sh_ok(&c, &writer, "echo second > /mnt/data/g").await;
    for r in &readers {
        assert_eq!(
            sh_ok(&c, r, "cat /srv/ro/f /srv/ro/g").await,
            "first\nsecond\n"
        );
        let w = shell(&c, r, "echo x > /srv/ro/h").await;
        assert_ne!(w.exit_code, 0, "a read-only mount took a write: {w:?}");
        assert!(w.stderr.contains("Read-only"), "{w:?}");
        // Not even root inside can make it writable: mounting is denied.
        let m = shell(&c, r, "mount -o remount,rw /srv/ro").await;
        assert_ne!(m.exit_code, 0, "{m:?}");
        assert_ne!(shell(&c, r, "echo x > /srv/ro/h").await.exit_code, 0);
    }
    // The writer's files are the sandbox root's, inside every sandbox.
    assert_eq!(
        sh_ok(&c, &readers[0], "stat -c %u:%g /srv/ro /srv/ro/f").await,
        "0:0\n0:0\n"
    );

    // The volume's size is a hard limit inside too.
    let full = shell(
        &c,
        &writer,
        "dd if=/dev/zero of=/mnt/data/big bs=1M count=96 conv=fsync",
    )
    .await;
    assert_ne!(full.exit_code, 0, "{full:?}");
    assert!(full.stderr.contains("quota exceeded"), "{full:?}");
    sh_ok(&c, &writer, "rm /mnt/data/big && echo ok > /mnt/data/after").await;
}

#[tokio::test]
async fn a_reset_keeps_the_volumes_below_the_workspace() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    volume(&c, "cache", 16).await;
    c.put_template(
        "cached",
        Template {
            volumes: vec![mount("cache", "/workspace/.cache", false)],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let sb = from_template(&c, "cached").await;
    sh_ok(
        &c,
        &sb.id,
        "echo kept > /workspace/.cache/k && echo gone > /workspace/scratch",
    )
    .await;
    c.reset(&sb.id).await.unwrap();
    let after = shell(&c, &sb.id, "cat /workspace/.cache/k; ls /workspace/scratch").await;
    assert_eq!(after.stdout, "kept\n", "{after:?}");
    assert!(after.stderr.contains("No such file"), "{after:?}");
    // Still a mount, and still writable.
    sh_ok(
        &c,
        &sb.id,
        "grep -q ' /workspace/.cache ' /proc/self/mountinfo && echo more >> /workspace/.cache/k",
    )
    .await;
    assert_eq!(
        sh_ok(&c, &sb.id, "cat /workspace/.cache/k").await,
        "kept\nmore\n"
    );
}

#[tokio::test]
async fn a_mounted_volume_cannot_be_deleted_even_after_a_killed_hub() {
    let mut hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    volume(&c, "busy", 8).await;
    let sb = with_volumes(&c, vec![mount("busy", "/busy", false)])
        .await
        .unwrap();
    let e = c.delete_volume("busy").await.unwrap_err();
    assert_eq!(e.code, Code::Conflict, "{e}");
    assert!(e.to_string().contains(&sb), "names the sandbox: {e}");

    hub.kill9();
    hub.restart().await;
    let c = hub.client(None);
    sh_ok(&c, &sb, "echo alive > /busy/x").await;
    assert_eq!(
        c.delete_volume("busy").await.unwrap_err().code,
        Code::Conflict
    );
    // Suspended, it would mount it again on resume: still in use.
    c.suspend(&sb).await.unwrap();
    assert_eq!(
        c.delete_volume("busy").await.unwrap_err().code,
        Code::Conflict
    );
    c.resume(&sb).await.unwrap();
    assert_eq!(sh_ok(&c, &sb, "cat /busy/x").await, "alive\n");
    c.delete(&sb).await.unwrap();
    c.delete_volume("busy").await.unwrap();
}

#[tokio::test]
async fn tenants_mount_only_their_own_volumes_and_shared_ones_read_only() {
    let hub = TestHub::start(keys_hub(&["--shared-volume", "alice/datasets"])).await;
    let alice = hub.client(Some(ALICE_KEY));
    let bob = hub.client(Some(BOB_KEY));
    volume(&alice, "private", 8).await;
    volume(&alice, "datasets", 8).await;
    let a = with_volumes(&alice, vec![mount("datasets", "/data", false)])
        .await
        .unwrap();
    sh_ok(&alice, &a, "echo rows > /data/table").await;

    // Another tenant's volume by name: 404, as if it did not exist.
    let e = with_volumes(&bob, vec![mount("private", "/p", true)])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
    // The shared one: read-only only.
    let e = with_volumes(&bob, vec![mount("datasets", "/data", false)])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    let b = with_volumes(&bob, vec![mount("datasets", "/data", true)])
        .await
        .unwrap();
    assert_eq!(sh_ok(&bob, &b, "cat /data/table").await, "rows\n");
    assert_ne!(shell(&bob, &b, "echo x > /data/x").await.exit_code, 0);
    // Its owner cannot delete it under bob's sandbox.
    alice.delete(&a).await.unwrap();
    assert_eq!(
        alice.delete_volume("datasets").await.unwrap_err().code,
        Code::Conflict
    );
    // A volume of bob's own by that name wins over the shared one.
    volume(&bob, "datasets", 8).await;
    let own = with_volumes(&bob, vec![mount("datasets", "/data", false)])
        .await
        .unwrap();
    let r = shell(&bob, &own, "ls /data").await;
    assert_eq!(r.stdout, "", "{r:?}");
}

#[tokio::test]
async fn a_link_planted_at_a_mount_point_is_refused_not_followed() {
    let hub = TestHub::start(HubOptions::default()).await;
    let c = hub.client(None);
    volume(&c, "v", 8).await;
    c.put_template("t", Template::default()).await.unwrap();
    let sb = from_template(&c, "t").await;
    // The workload leaves a link where the template will later mount a
    // volume, pointing at a directory it wants covered.
    sh_ok(
        &c,
        &sb.id,
        "mkdir -p /workspace/real && ln -s /workspace/real /workspace/v",
    )
    .await;
    c.suspend(&sb.id).await.unwrap();
    c.put_template(
        "t",
        Template {
            volumes: vec![mount("v", "/workspace/v", false)],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let e = c.resume(&sb.id).await.unwrap_err();
    eprintln!("resume refused: {e}");
    assert!(
        e.to_string().contains("/workspace/v"),
        "the refusal names the mount point: {e}"
    );

    // Invalid mount paths never reach a sandbox.
    for bad in ["/", "/proc/x", "/workspace", "relative", "/a/../b", "/dev"] {
        let e = with_volumes(&c, vec![mount("v", bad, false)])
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument, "{bad}: {e}");
    }
    let e = with_volumes(&c, vec![mount("v", "/a", false), mount("v", "/a/b", true)])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument, "{e}");
    let e = with_volumes(&c, vec![mount("nope", "/a", false)])
        .await
        .unwrap_err();
    assert_eq!(e.code, Code::NotFound, "{e}");
}

#[tokio::test]
async fn links_planted_in_a_volume_lead_nowhere_outside_a_later_sandbox() {
    let hub = TestHub::start(keys_hub(&[])).await;
    let alice = hub.client(Some(ALICE_KEY));
    let bob = hub.client(Some(BOB_KEY));
    volume(&alice, "v", 8).await;
    volume(&bob, "secret", 8).await;
    let b = with_volumes(&bob, vec![mount("secret", "/s", false)])
        .await
        .unwrap();
    sh_ok(&bob, &b, "echo bobs-7f3a9c2e > /s/file").await;
    // Where the host keeps volumes: the quota volume's root.
    let host_volumes = hub
        .sandboxes_dir()
        .parent()
        .unwrap()
        .join("volumes")
        .display()
        .to_string();

    let a = with_volumes(&alice, vec![mount("v", "/workspace/v", false)])
        .await
        .unwrap();
    sh_ok(
        &alice,
        &a,
        &format!(
            "cd /workspace/v && ln -s / root && ln -s ../../../../../../.. up && \
             ln -s {host_volumes} host && ln -s /proc/1/root pid1"
        ),
    )
    .await;
    alice.delete(&a).await.unwrap();
    let later = with_volumes(&alice, vec![mount("v", "/mnt/v", true)])
        .await
        .unwrap();
    // Each link resolves inside the later sandbox's own root: the host's
    // volumes directory does not exist there, and `..` stops at its `/`.
    let host = shell(&alice, &later, "ls /mnt/v/host/").await;
    assert_ne!(host.exit_code, 0, "{host:?}");
    assert!(host.stderr.contains("No such file"), "{host:?}");
    assert_eq!(sh_ok(&alice, &later, "readlink -f /mnt/v/up").await, "/\n");
    // Nothing of bob's is anywhere in alice's sandbox.
    let found = sh_ok(
        &alice,
        &later,
        "grep -rsl bobs-7f3a9c2e / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr | head -3; true",
    )
    .await;
    assert_eq!(found, "", "reached bob's volume");
    // And the hub itself never follows them: the volume still holds just
    // the links, and bob's file is untouched.
    assert_eq!(sh_ok(&bob, &b, "cat /s/file").await, "bobs-7f3a9c2e\n");
}
