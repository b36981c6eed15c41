//! Property tests of path confinement: whatever path a client sends, through
//! whatever symlinks the tree holds, what gets opened is beneath the root.

use std::{fs, os::unix::fs::symlink, path::Path};

use proptest::prelude::*;
use sandboxd::{
    confine::{RelPath, Root},
    files::request_path,
};

/// A tree with every kind of link that matters: inside, relative escapes,
/// absolute escapes, absolute links that would land inside if followed as
/// a chroot would, loops, and dangling links.
fn build_tree(root: &Path, outside: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::write(root.join("a/b/c/file"), "in").unwrap();
    fs::write(outside.join("secret"), "SECRET").unwrap();
    symlink("b", root.join("a/in_rel")).unwrap();
    symlink("../../..", root.join("a/b/up3")).unwrap();
    symlink("../..", root.join("a/b/up2")).unwrap();
    symlink(outside, root.join("a/abs_out")).unwrap();
    symlink(root.join("a"), root.join("abs_in")).unwrap();
    symlink("/proc/self/root", root.join("magic")).unwrap();
    symlink("loop", root.join("loop")).unwrap();
    symlink("nowhere", root.join("dangling")).unwrap();
}

const SEGMENTS: &[&str] = &[
    "..", ".", "", "a", "b", "c", "file", "in_rel", "up2", "up3", "abs_out", "abs_in", "magic",
    "loop", "dangling", "secret", "%2F", "%2e%2e", "..%2F", "%00",
];

fn client_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(SEGMENTS), 0..8).prop_map(|segs| segs.join("/"))
}

fn opened_host_path(fd: &impl std::os::fd::AsRawFd) -> std::path::PathBuf {
    fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, .. ProptestConfig::default() })]

    #[test]
    fn nothing_outside_the_root_is_ever_opened(raw in client_path()) {
        thread_local! {
            static FIXTURE: (tempfile::TempDir, tempfile::TempDir, Root) = {
                let root = tempfile::tempdir().unwrap();
                let outside = tempfile::tempdir().unwrap();
                build_tree(root.path(), outside.path());
                let r = Root::open(root.path()).unwrap();
                (root, outside, r)
            };
        }
        FIXTURE.with(|(root_dir, outside, root)| {
            let canonical_root = root_dir.path().canonicalize().unwrap();
            let url_path = format!("/v1/files/{raw}");
            let Ok(rel) = request_path(&url_path, "/v1/files") else { return Ok(()) };
            if let Ok(fd) = root.open_path(&rel) {
                let host = opened_host_path(&fd);
                prop_assert!(host.starts_with(&canonical_root), "{raw} opened {}", host.display());
                prop_assert!(!host.starts_with(outside.path()));
            }
            if let Ok(file) = root.open_read(&rel) {
                let host = opened_host_path(&file);
                prop_assert!(host.starts_with(&canonical_root), "{raw} read {}", host.display());
            }
            if let Ok(entries) = root.list(&rel) {
                prop_assert!(entries.iter().all(|(name, _)| name != "secret"));
            }
            Ok(())
        })?;
    }

    #[test]
    fn parse_never_yields_dot_segments(raw in "[a-z./%]{0,40}") {
        if let Ok(rel) = RelPath::parse(&raw) {
            prop_assert!(rel.as_str().split('/').all(|s| s != ".." && s != "."));
            prop_assert!(!rel.as_str().starts_with('/'));
            prop_assert!(!rel.as_str().contains("//"));
        }
    }
}

#[test]
fn known_escapes_are_refused() {
    let root_dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    build_tree(root_dir.path(), outside.path());
    let root = Root::open(root_dir.path()).unwrap();
    for raw in [
        "a/abs_out/secret",
        "a/b/up3/x",
        "magic/etc/passwd",
        "abs_in/b",
        "loop",
    ] {
        let rel = RelPath::parse(raw).unwrap();
        assert!(root.open_path(&rel).is_err(), "{raw} opened");
    }
    let inside = RelPath::parse("a/in_rel/c/file").unwrap();
    assert_eq!(
        std::io::read_to_string(root.open_read(&inside).unwrap()).unwrap(),
        "in"
    );
    let up2 = RelPath::parse("a/b/up2/a/b/c/file").unwrap();
    assert!(
        root.open_read(&up2).is_ok(),
        "a relative link that stays inside works"
    );
}
