//! `deploy/crds/` must be exactly what `sandhub-controller crd` generates from the types.
//! Regenerate with `SANDHUB_UPDATE_CRDS=1 cargo test -p sandhub-controller --test crds_in_sync`.

use std::path::PathBuf;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

#[test]
fn deploy_crds_match_the_generated_crds() {
    let dir = crds_dir();
    let files = sandhub_controller::crdgen::crd_files();
    if std::env::var_os("SANDHUB_UPDATE_CRDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, yaml) in &files {
            std::fs::write(dir.join(name), yaml).unwrap();
        }
    }
    for (name, yaml) in &files {
        let path = dir.join(name);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; regenerate with SANDHUB_UPDATE_CRDS=1",
                path.display()
            )
        });
        assert!(
            on_disk == *yaml,
            "{} drifted from the CRD generated from sandhub-api; regenerate with \
             SANDHUB_UPDATE_CRDS=1 cargo test -p sandhub-controller --test crds_in_sync",
            path.display()
        );
    }
    let mut expected: Vec<_> = files.iter().map(|(n, _)| n.clone()).collect();
    expected.sort();
    let mut present: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    present.sort();
    assert_eq!(
        present, expected,
        "deploy/crds holds a CRD file the types do not generate"
    );
}

#[test]
fn crd_subcommand_prints_all_four() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandhub-controller"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, sandhub_controller::crdgen::crds_yaml());
    for name in [
        "sandboxes.agents.x-k8s.io",
        "sandboxclaims.extensions.agents.x-k8s.io",
        "sandboxtemplates.extensions.agents.x-k8s.io",
        "sandboxwarmpools.extensions.agents.x-k8s.io",
    ] {
        assert!(text.contains(&format!("name: {name}")), "missing {name}");
    }
}
