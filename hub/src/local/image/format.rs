//! The JSON of OCI image layouts and `docker save` archives: only the
//! fields the store reads. Pure parsing, no I/O.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `index.json` of an OCI layout, and an image index (multi-platform).
#[derive(Debug, Deserialize)]
pub struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
}

/// An image manifest.
#[derive(Debug, Deserialize)]
pub struct Manifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// One entry of a `docker save` archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerEntry {
    pub config: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    pub layers: Vec<String>,
}

/// The image config: what a template defaults to.
#[derive(Debug, Default, Deserialize)]
pub struct ImageConfigFile {
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// `rootfs.diff_ids`: the sha256 of each layer's uncompressed tar, bottom
/// first. The config's digest is the image's id, so these pin the content
/// of every layer an id stands for.
#[derive(Debug, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
}

pub const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// This machine's architecture in OCI's words.
pub fn this_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `sha256:<64 hex>` as its hex part; anything else is refused (other
/// algorithms are not supported, and a digest names a file in the store).
pub fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// The manifest an index picks for this platform: linux and this
/// machine's architecture, or the only entry.
pub fn pick_for_platform(index: &Index) -> Option<&Descriptor> {
    let arch = this_arch();
    index
        .manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .or(match index.manifests.as_slice() {
            [only] => Some(only),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_strict() {
        let ok = format!("sha256:{}", "a".repeat(64));
        assert_eq!(sha256_hex(&ok), Some("a".repeat(64).as_str()));
        assert_eq!(sha256_hex("sha256:../../etc"), None);
        assert_eq!(sha256_hex(&format!("sha512:{}", "a".repeat(64))), None);
        assert_eq!(sha256_hex(&format!("sha256:{}", "A".repeat(64))), None);
    }

    #[test]
    fn index_picks_this_platform() {
        let arch = this_arch();
        let j = format!(
            r#"{{"manifests":[
              {{"digest":"sha256:1","platform":{{"os":"linux","architecture":"s390x"}}}},
              {{"digest":"sha256:2","platform":{{"os":"linux","architecture":"{arch}"}}}}]}}"#
        );
        let i: Index = serde_json::from_str(&j).unwrap();
        assert_eq!(pick_for_platform(&i).unwrap().digest, "sha256:2");
    }
}
