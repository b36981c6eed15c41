//! The console's files, embedded at build time (`hub/build.rs` writes the
//! table from `console/dist/`), with the type and ETag each is served with.

use std::{collections::HashMap, sync::OnceLock};

use sha2::{Digest, Sha256};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));
}

pub struct Asset {
    pub bytes: &'static [u8],
    pub content_type: &'static str,
    /// A strong ETag: the first 128 bits of the file's SHA-256.
    pub etag: String,
    /// Named by its content's hash (under `assets/`), so cacheable forever.
    pub immutable: bool,
}

/// The file at `name` (relative to `console/dist/`), if there is one.
pub fn get(name: &str) -> Option<&'static Asset> {
    static TABLE: OnceLock<HashMap<&'static str, Asset>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            embedded::FILES
                .iter()
                .map(|&(name, bytes)| {
                    let digest = Sha256::digest(bytes);
                    let asset = Asset {
                        bytes,
                        content_type: content_type(name),
                        etag: format!("\"{}\"", hex::encode(&digest[..16])),
                        immutable: name.starts_with("assets/"),
                    };
                    (name, asset)
                })
                .collect()
        })
        .get(name)
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("woff2") => "font/woff2",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_built_console_is_embedded() {
        let index = super::get("index.html").expect("console/dist/index.html is embedded");
        assert_eq!(index.content_type, "text/html; charset=utf-8");
        assert!(!index.immutable);
        assert!(super::get("../Cargo.toml").is_none());
    }
}
