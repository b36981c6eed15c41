//! The store and the unpacker against archives built here, byte by byte
//! where the tar crate would refuse to write the hostile entry itself.

use std::{
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::Path,
};

use sandhub_api::error::Code;
use sha2::{Digest, Sha256};

use std::os::fd::AsFd;

use super::*;

/// One tar entry, with its name and link name written raw (no checks).
pub(crate) struct E<'a> {
    pub path: &'a str,
    pub kind: tar::EntryType,
    pub data: &'a [u8],
    pub link: &'a str,
    pub uid: u64,
    pub mode: u32,
}

pub(crate) fn file<'a>(path: &'a str, data: &'a [u8]) -> E<'a> {
    E {
        path,
        kind: tar::EntryType::Regular,
        data,
        link: "",
        uid: 0,
        mode: 0o644,
    }
}

pub(crate) fn dir(path: &str) -> E<'_> {
    E {
        path,
        kind: tar::EntryType::Directory,
        data: b"",
        link: "",
        uid: 0,
        mode: 0o755,
    }
}

pub(crate) fn link<'a>(path: &'a str, kind: tar::EntryType, target: &'a str) -> E<'a> {
    E {
        path,
        kind,
        data: b"",
        link: target,
        uid: 0,
        mode: 0o777,
    }
}

pub(crate) fn tar_of(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_old();
        let old = h.as_old_mut();
        old.name[..e.path.len()].copy_from_slice(e.path.as_bytes());
        old.linkname[..e.link.len()].copy_from_slice(e.link.as_bytes());
        h.set_entry_type(e.kind);
        h.set_size(e.data.len() as u64);
        h.set_mode(e.mode);
        h.set_uid(e.uid);
        h.set_gid(e.uid);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, e.data).unwrap();
    }
    b.into_inner().unwrap()
}

/// Appends a plain 0644 file to an archive being built.
fn add_file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, name, data).unwrap();
}

/// Every entry of an archive: its path and its bytes.
fn entries_of(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut ar = tar::Archive::new(archive);
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            (name, data)
        })
        .collect()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// An OCI layout archive of `layers` (bottom first) with `config`.
pub(crate) fn oci_archive(layers: &[Vec<u8>], config: &serde_json::Value) -> Vec<u8> {
    // A real config pins its layers by the sha256 of each tar.
    let mut config = config.clone();
    config["rootfs"] = serde_json::json!({"type": "layers",
        "diff_ids": layers.iter().map(|l| format!("sha256:{}", sha(l))).collect::<Vec<_>>()});
    let config = &config;
    let config = serde_json::to_vec(config).unwrap();
    let mut blobs: Vec<(String, Vec<u8>)> = vec![(sha(&config), config.clone())];
    let mut descs = Vec::new();
    for l in layers {
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{}", sha(l)), "size": l.len()}));
        blobs.push((sha(l), l.clone()));
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{}", sha(&config)), "size": config.len()},
        "layers": descs}))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{}", sha(&manifest)), "size": manifest.len()}]}))
    .unwrap();
    blobs.push((sha(&manifest), manifest));
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| add_file(&mut b, name, data);
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", &index);
    for (h, data) in &blobs {
        add(&format!("blobs/sha256/{h}"), data);
    }
    b.into_inner().unwrap()
}

/// A legacy `docker save` archive (layers as `<n>/layer.tar`).
pub(crate) fn docker_archive(layers: &[Vec<u8>], config: &serde_json::Value, tag: &str) -> Vec<u8> {
    // A real config pins its layers by the sha256 of each tar.
    let mut config = config.clone();
    config["rootfs"] = serde_json::json!({"type": "layers",
        "diff_ids": layers.iter().map(|l| format!("sha256:{}", sha(l))).collect::<Vec<_>>()});
    let config = &config;
    let config = serde_json::to_vec(config).unwrap();
    let cname = format!("{}.json", sha(&config));
    let lnames: Vec<String> = (0..layers.len())
        .map(|i| format!("l{i}/layer.tar"))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": cname, "RepoTags": [tag], "Layers": lnames}]))
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| add_file(&mut b, name, data);
    add("manifest.json", &manifest);
    add(&cname, &config);
    for (n, l) in lnames.iter().zip(layers) {
        add(n, l);
    }
    b.into_inner().unwrap()
}

fn config() -> serde_json::Value {
    serde_json::json!({"os": "linux", "architecture": "amd64",
        "config": {"Env": ["PATH=/bin", "GREETING=hi"], "WorkingDir": "/srv", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": []}})
}

fn unpack(
    entries: &[E<'_>],
) -> (
    tempfile::TempDir,
    Result<unpack::UnpackStats, unpack::UnpackError>,
) {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("layer")).unwrap();
    let fd = crate::local::runtime::open_hub_dir(&t.path().join("layer")).unwrap();
    let res = unpack::unpack_layer(
        &tar_of(entries)[..],
        fd.as_fd(),
        &IdMap::for_current_user(),
        1 << 20,
    );
    (t, res)
}

#[test]
fn whiteouts_and_opaque_dirs_become_overlay_format() {
    let (t, res) = unpack(&[
        dir("etc"),
        file("etc/.wh.hidden", b""),
        dir("var/cache"),
        file("var/cache/.wh..wh..opq", b""),
        file("var/cache/kept", b"k"),
    ]);
    res.unwrap();
    let l = t.path().join("layer");
    let wh = std::fs::symlink_metadata(l.join("etc/hidden")).unwrap();
    assert!(wh.file_type().is_char_device());
    assert_eq!(wh.rdev(), 0);
    assert!(!l.join("etc/.wh.hidden").exists());
    let v = rustix::fs::getxattr(l.join("var/cache"), "trusted.overlay.opaque", &mut [0u8; 4]);
    assert_eq!(v.ok(), Some(1), "opaque xattr set");
    assert!(!l.join("var/cache/.wh..wh..opq").exists());
    assert_eq!(std::fs::read(l.join("var/cache/kept")).unwrap(), b"k");
}

#[test]
fn owners_are_shifted_into_the_sandbox_range() {
    let idmap = IdMap::for_current_user();
    let mut user = file("home/u/f", b"x");
    user.uid = 1000;
    let (t, res) = unpack(&[file("rootfile", b"r"), user]);
    res.unwrap();
    let l = t.path().join("layer");
    let (root_uid, _) = idmap.image_owner(0, 0);
    let (user_uid, _) = idmap.image_owner(1000, 1000);
    assert_eq!(
        std::fs::metadata(l.join("rootfile")).unwrap().uid(),
        root_uid
    );
    assert_eq!(
        std::fs::metadata(l.join("home/u/f")).unwrap().uid(),
        user_uid
    );
}

/// Each classic escape is refused, and the file it aimed at is untouched.
#[test]
fn hostile_entries_are_refused_and_write_nothing_outside() {
    let t = tempfile::tempdir().unwrap();
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"host").unwrap();
    let v = victim.to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<E<'_>>)> = vec![
        (
            "dotdot",
            vec![file("../../../../../../../../tmp/x-escape", b"pwned")],
        ),
        ("absolute", vec![file(&v, b"pwned")]),
        (
            "symlink then write through",
            vec![
                link("esc", tar::EntryType::Symlink, t.path().to_str().unwrap()),
                file("esc/victim", b"pwned"),
            ],
        ),
        (
            "hard link to a host file",
            vec![link("h", tar::EntryType::Link, &v)],
        ),
        (
            "hard link up and out",
            vec![link("h", tar::EntryType::Link, "../../../../../etc/passwd")],
        ),
        (
            "hard link through a symlink",
            vec![
                link("d", tar::EntryType::Symlink, t.path().to_str().unwrap()),
                link("h", tar::EntryType::Link, "d/victim"),
            ],
        ),
    ];
    for (what, entries) in cases {
        let (_l, res) = unpack(&entries);
        let err = res.expect_err(what);
        assert!(
            matches!(err, unpack::UnpackError::Hostile { .. }),
            "{what}: {err}"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"host", "{what}");
        assert_eq!(std::fs::metadata(&victim).unwrap().nlink(), 1, "{what}");
    }
    assert!(!Path::new("/tmp/x-escape").exists());
}

#[test]
fn a_layer_past_its_unpack_budget_is_refused() {
    let big = vec![0u8; 2 << 20];
    let (_t, res) = unpack(&[file("bomb", &big)]);
    let err = res.unwrap_err().to_string();
    assert!(err.contains("more than"), "{err}");
}

#[test]
fn hard_links_inside_the_layer_work() {
    let (t, res) = unpack(&[file("a", b"same"), link("b", tar::EntryType::Link, "./a")]);
    res.unwrap();
    let l = t.path().join("layer");
    assert_eq!(std::fs::metadata(l.join("b")).unwrap().nlink(), 2);
}

fn store() -> (tempfile::TempDir, ImageStore) {
    let t = tempfile::tempdir().unwrap();
    let s = ImageStore::open(t.path(), IdMap::for_current_user()).unwrap();
    (t, s)
}

#[test]
fn oci_and_docker_archives_import_and_share_layers() {
    let (_t, s) = store();
    let base = tar_of(&[dir("bin"), file("bin/tool", b"v1")]);
    let top = tar_of(&[file("etc-note", b"top")]);
    let a = s
        .import(
            "t1",
            &oci_archive(&[base.clone(), top.clone()], &config())[..],
            Some("a:1"),
            None,
        )
        .unwrap();
    assert_eq!(a.tags, vec!["a:1".to_string()]);
    assert_eq!(a.layers.len(), 2);
    assert_eq!(a.config.workdir.as_deref(), Some("/srv"));
    assert!(a.config.env.contains(&"GREETING=hi".to_string()));
    let mut other = config();
    other["config"]["WorkingDir"] = "/other".into();
    let b = s
        .import(
            "t1",
            &docker_archive(std::slice::from_ref(&base), &other, "b:2")[..],
            None,
            None,
        )
        .unwrap();
    assert_eq!(b.tags, vec!["b:2".to_string()]);
    // One unpacked copy of the shared base layer.
    assert_eq!(a.layers[0], b.layers[0]);
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 2);
    assert_eq!(s.get("t1", "a:1").unwrap().id, a.id);
    assert_eq!(s.get("t1", &b.id).unwrap().id, b.id);
    assert_eq!(s.list("t1").unwrap().len(), 2);

    // In use: refused. Not in use: gone, and the shared layer stays.
    let in_use = Users {
        templates: vec![("t1".into(), "a:1".into())],
        ..Users::default()
    };
    assert_eq!(
        s.remove("t1", "a:1", &in_use).unwrap_err().code,
        Code::Conflict
    );
    s.remove("t1", "a:1", &Users::default()).unwrap();
    assert_eq!(s.get("t1", "a:1").unwrap_err().code, Code::NotFound);
    assert!(s
        .layer_dir(b.layers[0].trim_start_matches("sha256:"))
        .is_dir());
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 1);
}

#[test]
fn a_hostile_layer_leaves_no_image_and_no_layer() {
    let (_t, s) = store();
    let bad = tar_of(&[file("../escape", b"x")]);
    let err = s
        .import(
            "t1",
            &oci_archive(&[bad], &config())[..],
            Some("bad:1"),
            None,
        )
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument, "{}", err.message);
    assert!(err.message.contains("`..`"), "{}", err.message);
    assert!(s.list("t1").unwrap().is_empty());
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(s.root.join("tmp")).unwrap().count(), 0);
    // The refused import left no blob for a prune to find.
    assert_eq!(
        std::fs::read_dir(s.root.join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
    let r = s.prune("t1", &Users::default()).unwrap();
    assert_eq!(r.blobs, 0, "{r:?}");
}

#[test]
fn a_blob_that_lies_about_its_digest_is_refused() {
    let (_t, s) = store();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(3);
    h.set_cksum();
    b.append_data(
        &mut h,
        format!("blobs/sha256/{}", "0".repeat(64)),
        &b"abc"[..],
    )
    .unwrap();
    let err = s
        .import("t1", &b.into_inner().unwrap()[..], None, None)
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("digest"), "{}", err.message);
    let err = s
        .import("t1", &b"not a tar at all"[..], None, None)
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument, "{}", err.message);
}

#[test]
fn leftovers_of_a_killed_import_are_cleared_on_open() {
    let (t, s) = store();
    std::fs::create_dir_all(s.root.join("tmp/layer-abc/half")).unwrap();
    drop(s);
    let s = ImageStore::open(t.path(), IdMap::for_current_user()).unwrap();
    assert_eq!(std::fs::read_dir(s.root.join("tmp")).unwrap().count(), 0);
}

/// Tags are a tenant's own: another tenant can neither see, resolve (even
/// by id), re-point nor remove them; a shared image is stored once and
/// leaves the disk only when its last holder lets go.
#[test]
fn tenants_share_layers_but_not_names() {
    let (_t, s) = store();
    let archive = oci_archive(&[tar_of(&[file("mark", b"one")])], &config());
    let a = s
        .import("alice", &archive[..], Some("app:1"), None)
        .unwrap();
    assert!(s.list("bob").unwrap().is_empty());
    assert_eq!(s.get("bob", "app:1").unwrap_err().code, Code::NotFound);
    assert_eq!(s.get("bob", &a.id).unwrap_err().code, Code::NotFound);
    assert_eq!(
        s.remove("bob", &a.id, &Users::default()).unwrap_err().code,
        Code::NotFound
    );

    // Bob's own app:1 is another image; alice's tag still names hers.
    let other = oci_archive(&[tar_of(&[file("mark", b"two")])], &config());
    let b = s.import("bob", &other[..], Some("app:1"), None).unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(s.get("alice", "app:1").unwrap().id, a.id);
    assert_eq!(s.get("bob", "app:1").unwrap().id, b.id);

    // The same archive from bob: one record, one layer, each with own tags.
    let again = s.import("bob", &archive[..], Some("mine:2"), None).unwrap();
    assert_eq!(again.id, a.id);
    assert_eq!(again.tags, vec!["mine:2".to_string()]);
    assert_eq!(
        s.get("alice", &a.id).unwrap().tags,
        vec!["app:1".to_string()]
    );
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 2);

    // Alice lets go: bob still has it on disk; then bob lets go too.
    s.remove("alice", "app:1", &Users::default()).unwrap();
    assert!(s.list("alice").unwrap().is_empty());
    assert_eq!(s.get("bob", "mine:2").unwrap().id, a.id);
    s.remove("bob", "mine:2", &Users::default()).unwrap();
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 1);
    // Prune by one tenant never touches another's untagged image.
    let c = s.import("alice", &archive[..], None, None).unwrap();
    let r = s.prune("bob", &Users::default()).unwrap();
    assert!(r.images.is_empty(), "{r:?}");
    assert_eq!(s.get("alice", &c.id).unwrap().id, c.id);
}

/// A running sandbox pins its image: neither remove nor prune takes it
/// while the sandbox exists; a pin of a sandbox the hub no longer holds
/// is stale and dropped.
#[test]
fn a_pinned_image_stays_until_its_sandbox_is_gone() {
    let (_t, s) = store();
    let archive = oci_archive(&[tar_of(&[file("mark", b"one")])], &config());
    let a = s.import("alice", &archive[..], None, None).unwrap();
    s.pin("sbx-1", "alice", &a.id).unwrap();
    let live = Users {
        sandboxes: ["sbx-1".to_string()].into(),
        ..Users::default()
    };
    assert_eq!(
        s.remove("alice", &a.id, &live).unwrap_err().code,
        Code::Conflict
    );
    assert!(s.prune("alice", &live).unwrap().images.is_empty());
    assert_eq!(s.get("alice", &a.id).unwrap().id, a.id);
    // The sandbox is gone (no unpin: a hub that died): the pin is stale.
    let r = s.prune("alice", &Users::default()).unwrap();
    assert_eq!(r.images, vec![a.id.clone()]);
    assert_eq!(s.get("alice", &a.id).unwrap_err().code, Code::NotFound);
    assert_eq!(std::fs::read_dir(s.root.join("pins")).unwrap().count(), 0);
    assert!(s.pin("../x", "alice", &a.id).is_err());
}

/// An image id is its config's digest, and the config pins each layer by
/// the sha256 of its tar: an archive that pairs a config with other
/// layers (to plant content under an id another tenant will import) is
/// refused, and the real image still imports with its own content.
#[test]
fn a_config_paired_with_other_layers_is_refused() {
    let (_t, s) = store();
    let real = tar_of(&[file("mark", b"real")]);
    let fake = tar_of(&[file("mark", b"planted")]);
    let mut cfg = config();
    cfg["rootfs"] = serde_json::json!({"type": "layers",
        "diff_ids": [format!("sha256:{}", sha(&real))]});
    // oci_archive fills diff_ids from its layers; build the lie by hand.
    let lie = oci_archive(std::slice::from_ref(&fake), &cfg);
    let lie = retarget_config(&lie, &cfg);
    let err = s
        .import("mallory", &lie[..], Some("x:1"), None)
        .unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument, "{}", err.message);
    assert!(err.message.contains("unpacks to"), "{}", err.message);
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 0);
    let a = s
        .import(
            "alice",
            &oci_archive(&[real], &config())[..],
            Some("a:1"),
            None,
        )
        .unwrap();
    let hex = a.layers[0].trim_start_matches("sha256:").to_string();
    assert_eq!(
        std::fs::read(s.layer_dir(&hex).join("mark")).unwrap(),
        b"real"
    );
}

/// An OCI archive whose config blob is replaced by `config` (verbatim,
/// diff ids and all) and whose manifest points at it.
fn retarget_config(archive: &[u8], config: &serde_json::Value) -> Vec<u8> {
    let files = entries_of(archive);
    let config = serde_json::to_vec(config).unwrap();
    let mut manifest_name = String::new();
    let mut manifest: serde_json::Value = serde_json::Value::Null;
    for (name, data) in &files {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
            if v.get("config").is_some() && v.get("layers").is_some() {
                manifest_name = name.clone();
                manifest = v;
            }
        }
    }
    manifest["config"]["digest"] = format!("sha256:{}", sha(&config)).into();
    manifest["config"]["size"] = config.len().into();
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let old_manifest = manifest_name.rsplit('/').next().unwrap().to_string();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{}", sha(&manifest)), "size": manifest.len()}]}))
    .unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| add_file(&mut b, name, data);
    for (name, data) in &files {
        if name.ends_with(&old_manifest) || name == "index.json" {
            continue;
        }
        add(name, data);
    }
    add(&format!("blobs/sha256/{}", sha(&config)), &config);
    add(&format!("blobs/sha256/{}", sha(&manifest)), &manifest);
    add("index.json", &index);
    b.into_inner().unwrap()
}

/// An OCI layout may hold several images; `ref` picks one by its ref
/// name, and without it the error names what there is.
#[test]
fn a_layout_with_several_images_is_picked_by_ref_name() {
    let (_t, s) = store();
    let one = oci_archive(&[tar_of(&[file("mark", b"one")])], &config());
    let two = oci_archive(&[tar_of(&[file("mark", b"two")])], &config());
    let merged = merge_layouts(&[(&one, "app:one"), (&two, "app:two")]);
    let err = s.import("t1", &merged[..], None, None).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("app:one, app:two"), "{}", err.message);
    let err = s
        .import("t1", &merged[..], None, Some("app:three"))
        .unwrap_err();
    assert!(
        err.message.contains("no image named `app:three`"),
        "{}",
        err.message
    );
    let img = s.import("t1", &merged[..], None, Some("app:two")).unwrap();
    assert_eq!(img.tags, vec!["app:two".to_string()]);
    let hex = img.layers[0].trim_start_matches("sha256:").to_string();
    assert_eq!(
        std::fs::read(s.layer_dir(&hex).join("mark")).unwrap(),
        b"two"
    );
}

/// One OCI layout holding the images of several single-image layouts,
/// each index entry named by its ref name.
fn merge_layouts(layouts: &[(&[u8], &str)]) -> Vec<u8> {
    let mut blobs: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    let mut manifests = Vec::new();
    for (archive, name) in layouts {
        for (path, data) in entries_of(archive) {
            if path == "index.json" {
                let index: serde_json::Value = serde_json::from_slice(&data).unwrap();
                let mut m = index["manifests"][0].clone();
                m["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": name});
                manifests.push(m);
            } else if path.starts_with("blobs/") {
                blobs.insert(path, data);
            }
        }
    }
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| add_file(&mut b, name, data);
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    for (path, data) in &blobs {
        add(path, data);
    }
    let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests});
    add("index.json", &serde_json::to_vec(&index).unwrap());
    b.into_inner().unwrap()
}

/// A tenant's images are bounded (compressed layer bytes plus unpacked
/// bytes): past the quota an import is RESOURCE_EXHAUSTED and keeps
/// nothing; a new tag of an image it holds costs nothing; another tenant
/// has its own quota.
#[test]
fn a_tenant_past_its_image_quota_is_refused_and_nothing_is_kept() {
    let layer = |mark: &[u8]| tar_of(&[file("mark", mark), file("pad", &[b'x'; 2000])]);
    // One image: its blob, plus its files and two entries unpacked. Room
    // for two such images, not three.
    let cost = layer(b"one").len() as u64 + 3 + 2000 + 2 * unpack::ENTRY_COST;
    let quota = cost * 5 / 2;
    let t = tempfile::tempdir().unwrap();
    let s = ImageStore::open(t.path(), IdMap::for_current_user())
        .unwrap()
        .with_tenant_quota(quota);
    let one = oci_archive(&[layer(b"one")], &config());
    let two = oci_archive(&[layer(b"two")], &config());
    let three = oci_archive(&[layer(b"three")], &config());
    s.import("alice", &one[..], Some("a:1"), None).unwrap();
    s.import("alice", &two[..], Some("a:2"), None).unwrap();
    s.import("alice", &one[..], Some("a:1b"), None).unwrap();
    let err = s
        .import("alice", &three[..], Some("a:3"), None)
        .unwrap_err();
    assert_eq!(err.code, Code::ResourceExhausted, "{}", err.message);
    assert_eq!(s.list("alice").unwrap().len(), 2);
    assert_eq!(std::fs::read_dir(s.root.join("layers")).unwrap().count(), 2);
    let blobs = std::fs::read_dir(s.root.join("blobs/sha256")).unwrap();
    let refused = sha(&layer(b"three"));
    assert!(
        blobs
            .flatten()
            .all(|b| b.file_name().to_string_lossy() != refused),
        "the refused layer's blob was kept"
    );
    s.import("bob", &three[..], Some("b:3"), None).unwrap();
}
