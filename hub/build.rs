//! Embeds the web console's built files (`console/dist/`, committed; see
//! `console/README.md`) in the binary, so `cargo build` needs no Node: it
//! writes `$OUT_DIR/console_assets.rs`, a table of `include_bytes!`, which
//! `src/http/console/assets.rs` includes.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

fn main() {
    // Read when the script runs, not baked in when it was compiled: a
    // build script reused from another checkout must embed this one's files.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dist = Path::new(&manifest_dir).join("../console/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    if dist.is_dir() {
        walk(&dist, &mut files);
    }
    files.sort();
    let mut out = String::from("pub static FILES: &[(&str, &[u8])] = &[\n");
    for file in &files {
        // Each directory is watched too, so a new or removed file rebuilds.
        if let Some(dir) = file.parent() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        let name = file
            .strip_prefix(&dist)
            .expect("under dist")
            .to_str()
            .expect("console asset names are UTF-8");
        let abs = fs::canonicalize(file).expect("asset path");
        writeln!(out, "    ({name:?}, include_bytes!({:?})),", abs.display()).unwrap();
    }
    out.push_str("];\n");
    let target =
        PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("console_assets.rs");
    fs::write(target, out).expect("writing console_assets.rs");
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading console/dist") {
        let path = entry.expect("console/dist entry").path();
        // symlink_metadata: a symlink in dist is not followed (nor embedded).
        let meta = fs::symlink_metadata(&path).expect("console/dist entry");
        if meta.is_dir() {
            walk(&path, files);
        } else if meta.is_file() {
            files.push(path);
        }
    }
}
