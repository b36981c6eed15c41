//! Reading an image archive (an OCI layout or a `docker save`, as one tar
//! stream) into content-addressed blobs, then finding its config and
//! layers. Directories are tarred by the client first, so the hub reads
//! only the request body, never a path a caller names.

use std::{
    collections::HashMap,
    io::{self, Read, Write},
    path::{Component, Path},
};

use sandhub_api::error::{Code, ErrorBody};
use sha2::{Digest, Sha256};

use super::{
    format::{self, DockerEntry, Index, Manifest},
    Blobs,
};

/// Largest JSON file (index, manifest, config) read into memory.
const MAX_JSON: u64 = 4 << 20;
/// How many index levels (index of indexes) are followed.
const MAX_INDEX_DEPTH: usize = 4;

fn invalid(m: impl Into<String>) -> ErrorBody {
    ErrorBody::new(Code::InvalidArgument, m)
}

/// The archive's files, as blobs: path -> sha256 hex.
#[derive(Default)]
pub struct Ingested {
    files: HashMap<String, String>,
    /// Symlinks in the archive (`docker save` links duplicate layers):
    /// path -> target path, both normalized.
    links: HashMap<String, String>,
}

/// What an archive describes: its config and its layers (bottom first),
/// as blob hex digests, and the tag it names, if any.
pub struct Described {
    pub config: String,
    pub layers: Vec<String>,
    pub tag: Option<String>,
}

/// A path inside the outer archive, normalized; `None` for the archive
/// root and for anything climbing out of it (never used as a host path,
/// but a lookup key must be unambiguous).
fn norm(path: &Path) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            _ => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Streams every file of the archive into `blobs`, checking that a file
/// under `blobs/sha256/` holds what its name says.
pub fn ingest(input: impl Read, blobs: &Blobs) -> Result<Ingested, ErrorBody> {
    let mut out = Ingested::default();
    let mut archive = tar::Archive::new(input);
    let corrupt = |e: io::Error| invalid(format!("image archive is not a readable tar: {e}"));
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let path = entry.path().map_err(corrupt)?.into_owned();
        let Some(key) = norm(&path) else { continue };
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let hex = blobs.write(&mut entry).map_err(|e| {
                    ErrorBody::new(
                        if e.kind() == io::ErrorKind::UnexpectedEof {
                            Code::InvalidArgument
                        } else {
                            Code::Internal
                        },
                        format!("storing {key}: {e}"),
                    )
                })?;
                if let Some(named) = key.strip_prefix("blobs/sha256/") {
                    if named != hex {
                        return Err(invalid(format!(
                            "blob {key} has digest sha256:{hex}, not the one its name says"
                        )));
                    }
                }
                out.files.insert(key, hex);
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let Some(target) = entry.link_name().map_err(corrupt)? else {
                    continue;
                };
                let base = match entry.header().entry_type() {
                    // A symlink is relative to its own directory.
                    tar::EntryType::Symlink => path.parent().unwrap_or(Path::new("")).join(target),
                    _ => target.into_owned(),
                };
                if let Some(t) = norm(&base) {
                    out.links.insert(key, t);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

impl Ingested {
    fn lookup(&self, path: &str) -> Option<&str> {
        let mut p = path.to_string();
        // A few hops at most: a loop of links is not a file.
        for _ in 0..8 {
            if let Some(hex) = self.files.get(&p) {
                return Some(hex);
            }
            p = self.links.get(&p)?.clone();
        }
        None
    }

    fn json<T: serde::de::DeserializeOwned>(
        &self,
        blobs: &Blobs,
        hex: &str,
        what: &str,
    ) -> Result<T, ErrorBody> {
        let mut buf = Vec::new();
        blobs
            .open(hex)
            .map_err(|_| invalid(format!("{what} sha256:{hex} is not in the archive")))?
            .take(MAX_JSON)
            .read_to_end(&mut buf)
            .map_err(|e| ErrorBody::new(Code::Internal, format!("reading {what}: {e}")))?;
        serde_json::from_slice(&buf).map_err(|e| invalid(format!("{what} is not valid: {e}")))
    }

    fn blob(&self, digest: &str, what: &str) -> Result<String, ErrorBody> {
        let hex = format::sha256_hex(digest)
            .ok_or_else(|| invalid(format!("{what} digest `{digest}` is not sha256:<hex>")))?;
        if self.files.values().any(|h| h == hex) {
            Ok(hex.to_string())
        } else {
            Err(invalid(format!(
                "{what} {digest} is missing from the archive"
            )))
        }
    }

    /// The image the archive holds: an OCI layout (`index.json`) first,
    /// then a `docker save` (`manifest.json`).
    /// The image the archive holds; in an OCI layout holding several,
    /// the one whose `org.opencontainers.image.ref.name` is `pick`.
    pub fn describe(&self, blobs: &Blobs, pick: Option<&str>) -> Result<Described, ErrorBody> {
        if let Some(hex) = self.lookup("index.json") {
            return self.describe_oci(blobs, hex, pick);
        }
        if pick.is_some() {
            return Err(invalid(
                "`ref` picks an image of an OCI layout; this archive is a docker save",
            ));
        }
        if let Some(hex) = self.lookup("manifest.json") {
            return self.describe_docker(blobs, hex);
        }
        Err(invalid(
            "not an image archive: no index.json (OCI layout) or manifest.json (docker save)",
        ))
    }

    fn describe_oci(
        &self,
        blobs: &Blobs,
        index_hex: &str,
        pick: Option<&str>,
    ) -> Result<Described, ErrorBody> {
        let index: Index = self.json(blobs, index_hex, "index.json")?;
        let ref_name = |d: &format::Descriptor| {
            d.annotations
                .get("org.opencontainers.image.ref.name")
                .cloned()
        };
        let names = || {
            let names: Vec<String> = index.manifests.iter().filter_map(ref_name).collect();
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        let mut desc = match (pick, index.manifests.as_slice()) {
            (Some(want), _) => index
                .manifests
                .iter()
                .find(|d| ref_name(d).as_deref() == Some(want))
                .cloned()
                .ok_or_else(|| {
                    invalid(format!(
                        "index.json has no image named `{want}` (it names: {})",
                        names()
                    ))
                })?,
            (None, [only]) => only.clone(),
            (None, _) => format::pick_for_platform(&index).cloned().ok_or_else(|| {
                invalid(format!(
                    "index.json holds several images; pick one with `ref` (it names: {})",
                    names()
                ))
            })?,
        };
        let tag = desc
            .annotations
            .get("org.opencontainers.image.ref.name")
            .cloned();
        for _ in 0..MAX_INDEX_DEPTH {
            if !format::INDEX_TYPES.contains(&desc.media_type.as_str()) {
                break;
            }
            let hex = self.blob(&desc.digest, "image index")?;
            let inner: Index = self.json(blobs, &hex, "image index")?;
            desc = format::pick_for_platform(&inner)
                .cloned()
                .ok_or_else(|| invalid("the image index has no image for this platform"))?;
        }
        let hex = self.blob(&desc.digest, "manifest")?;
        let manifest: Manifest = self.json(blobs, &hex, "manifest")?;
        let config = self.blob(&manifest.config.digest, "config")?;
        let layers = manifest
            .layers
            .iter()
            .map(|l| self.blob(&l.digest, "layer"))
            .collect::<Result<Vec<_>, _>>()?;
        // An OCI ref name may be a bare tag ("latest"): not a reference.
        let tag = tag.filter(|t| t.contains(':') || t.contains('/'));
        Ok(Described {
            config,
            layers,
            tag,
        })
    }

    fn describe_docker(&self, blobs: &Blobs, hex: &str) -> Result<Described, ErrorBody> {
        let entries: Vec<DockerEntry> = self.json(blobs, hex, "manifest.json")?;
        let entry = match entries.as_slice() {
            [one] => one,
            [] => return Err(invalid("manifest.json lists no image")),
            _ => {
                return Err(invalid(
                    "manifest.json lists several images; import them one archive each",
                ))
            }
        };
        let find = |p: &str, what: &str| {
            norm(Path::new(p))
                .and_then(|k| self.lookup(&k).map(str::to_string))
                .ok_or_else(|| invalid(format!("{what} {p} is missing from the archive")))
        };
        Ok(Described {
            config: find(&entry.config, "config")?,
            layers: entry
                .layers
                .iter()
                .map(|l| find(l, "layer"))
                .collect::<Result<_, _>>()?,
            tag: entry.repo_tags.as_ref().and_then(|t| t.first().cloned()),
        })
    }
}

/// Copies `input` to `out` while hashing it; the hex sha256.
pub fn copy_hashed(input: &mut impl Read, out: &mut impl Write) -> io::Result<(String, u64)> {
    let mut input = Hashing::new(input);
    let total = io::copy(&mut input, out)?;
    Ok((input.hex(), total))
}

/// A reader that hashes (sha256) what passes through it.
pub struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// The hex sha256 of everything read so far.
    pub fn hex(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}
