//! The tail that imports and pulls share: blobs (staged by the caller in
//! `tmp/` or `partial/`) -> checked layers -> an image record.
//!
//! ```text
//! read the config                      no lock
//! plan: quota, proofs, claims          lock (short)
//! verify or unpack each layer          no lock; charged as it goes
//! commit: renames, record              lock (short)
//! ```
//!
//! A layer directory is shared by content, but a tenant gets one only by
//! proving it holds that content: a tenant that holds an image with the
//! layer proved it when that image was stored; any other tenant's blob is
//! decompressed and hashed first (the layer is not unpacked again), and a
//! blob that is not the diff id its config names is refused. Digests are
//! not secrets, so naming a diff id proves nothing (registries refuse a
//! cross-repository blob mount without pull rights for the same reason).
//!
//! What an image costs its tenant: its compressed layer blobs plus every
//! layer's unpacked size (file data plus a fixed cost per entry, as the
//! unpack budget counts it), recorded per layer so a reused layer costs
//! what it did when it was unpacked. An unpack stops at the tenant's
//! quota, the store's cap, or the layer's expansion bound, whichever
//! comes first.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::{self, BufReader, Read},
    os::{fd::AsFd, unix::fs::PermissionsExt},
    path::{Path, PathBuf},
};

use sandhub_api::{
    error::{Code, ErrorBody},
    hub::Image,
    validate,
};

use super::{
    budget::{Charge, Claim, Over},
    format, ingest, internal, unpack, ImageStore, Record,
};

/// A layer may unpack to at most this many times its blob's size (real
/// layers: 2-5x), so a gzip bomb within `--max-upload-bytes` cannot fill
/// the disk; but to at least [`MIN_UNPACK_BUDGET`].
pub(super) const MAX_EXPANSION: u64 = 32;
pub(super) const MIN_UNPACK_BUDGET: u64 = 512 << 20;

/// One layer blob of an image being stored.
pub(super) struct LayerBlob {
    pub hex: String,
    /// Compressed size, as the archive or the manifest has it.
    pub size: u64,
    /// The tenant's copy of the blob; `None` when it was not fetched
    /// because the tenant already proved the layer.
    pub file: Option<PathBuf>,
}

/// What one layer needs, decided under the lock.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Unpacked already and proven by this tenant: nothing to do.
    Reuse(u64),
    /// Unpacked already, not proven by this tenant: its blob must hash to
    /// the diff id. Carries the layer's unpacked size.
    Verify(u64),
    /// Not unpacked yet.
    Unpack,
}

/// A layer ready to be committed: a fresh directory, or one in place.
struct Ready {
    blob: String,
    diff_id: String,
    dir: Option<PathBuf>,
    bytes: u64,
}

/// A layer's unpack budget from its expansion bound alone.
fn expansion_bound(packed: u64) -> u64 {
    packed.saturating_mul(MAX_EXPANSION).max(MIN_UNPACK_BUDGET)
}

/// A reader that charges the store's cap for every byte it passes on
/// (an archive being staged in `tmp/`); a refusal ends the stream and is
/// kept for the caller.
pub(super) struct Metered<'a, R> {
    pub inner: R,
    pub charge: &'a mut Charge,
    pub refused: Option<ErrorBody>,
}

impl<R: Read> Read for Metered<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Err(over) = self.charge.add(0, n as u64) {
            self.refused = Some(over.error("this archive"));
            return Err(io::Error::other("the image store is full"));
        }
        Ok(n)
    }
}

impl ImageStore {
    /// Stores an image of `tenant` from its config blob and layer blobs,
    /// and tags it with `tag`. Blocking. `charge` already holds what the
    /// caller staged; all of it is given back when this returns.
    pub(super) fn register(
        &self,
        tenant: &str,
        config_file: &Path,
        config_hex: &str,
        layers: &[LayerBlob],
        tag: Option<&str>,
        mut charge: Charge,
    ) -> Result<Image, ErrorBody> {
        let tag = tag
            .map(|t| validate::image_reference(t).map(|()| validate::normalize_image_reference(t)))
            .transpose()?;
        let (config, diff_ids) = self.read_config(config_file)?;
        if diff_ids.len() != layers.len() {
            return Err(ErrorBody::new(
                Code::InvalidArgument,
                format!(
                    "image config names {} layers (rootfs.diff_ids) but the manifest {}",
                    diff_ids.len(),
                    layers.len()
                ),
            ));
        }
        let id = format!("sha256:{config_hex}");
        let size = layers.iter().map(|l| l.size).sum::<u64>();
        let (steps, claim) = {
            let _g = self.guard();
            self.plan(
                tenant,
                &id,
                config_hex,
                &diff_ids,
                layers,
                size,
                &mut charge,
            )?
        };
        let mut ready = Vec::with_capacity(layers.len());
        // Dropped on any error: the unpacked directories go with them.
        let mut fresh = Vec::new();
        for ((layer, diff_id), step) in layers.iter().zip(&diff_ids).zip(steps) {
            let (dir, bytes) = match step {
                Step::Reuse(bytes) => (None, bytes),
                Step::Verify(bytes) => {
                    self.verify_layer(layer, diff_id)?;
                    (None, bytes)
                }
                Step::Unpack => {
                    let (dir, bytes) = self.unpack_layer(layer, diff_id, &mut charge)?;
                    let path = dir.path().to_path_buf();
                    fresh.push(dir);
                    (Some(path), bytes)
                }
            };
            ready.push(Ready {
                blob: layer.hex.clone(),
                diff_id: diff_id.clone(),
                dir,
                bytes,
            });
        }
        let _g = self.guard();
        let image = self.commit(tenant, config_file, config_hex, config, size, &ready, tag)?;
        drop(fresh);
        drop(claim);
        self.refresh_ledger()?;
        Ok(image)
    }

    /// Under the lock: charges the image's bytes, decides each layer's
    /// step, and claims what the image will use so no prune removes it.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        tenant: &str,
        id: &str,
        config_hex: &str,
        diff_ids: &[String],
        layers: &[LayerBlob],
        size: u64,
        charge: &mut Charge,
    ) -> Result<(Vec<Step>, Claim), ErrorBody> {
        let records = self.records()?;
        self.refresh_from(&records)?;
        let claim = self
            .inflight
            .claim(diff_ids.iter().cloned().chain([config_hex.to_string()]));
        // An image the tenant holds already is counted already: a new tag
        // costs nothing (its blobs are still checked, below).
        let held = records
            .iter()
            .any(|r| r.image.id == id && r.tenants.contains_key(tenant));
        let mut charge = |bytes: u64, what: &dyn Fn() -> String| {
            if held {
                return Ok(());
            }
            charge.add(bytes, 0).map_err(|o: Over| o.error(&what()))
        };
        charge(size, &|| {
            format!("this image ({} MiB compressed)", mib(size))
        })?;
        let proven = proven_by(&records, tenant);
        let known = layer_sizes(&records);
        let mut steps = Vec::with_capacity(layers.len());
        for (layer, diff_id) in layers.iter().zip(diff_ids) {
            let dir = self.layer_dir(diff_id);
            if !dir.is_dir() {
                steps.push(Step::Unpack);
            } else {
                let bytes = match known.get(diff_id.as_str()) {
                    Some(b) => *b,
                    None => measure_dir(&dir),
                };
                charge(bytes, &|| {
                    format!("layer sha256:{diff_id} ({} MiB unpacked)", mib(bytes))
                })?;
                steps.push(
                    if proven.contains(&(layer.hex.as_str(), diff_id.as_str())) {
                        Step::Reuse(bytes)
                    } else {
                        Step::Verify(bytes)
                    },
                );
            }
            if !matches!(steps.last(), Some(Step::Reuse(_))) && layer.file.is_none() {
                return Err(ErrorBody::new(
                    Code::Unavailable,
                    format!(
                        "layer sha256:{diff_id} left the tenant's images during the pull \
                         (removed?): pull again"
                    ),
                ));
            }
        }
        Ok((steps, claim))
    }

    /// Checks that a blob decompresses to `diff_id` without unpacking it:
    /// proof that the tenant holds the layer already in the store.
    fn verify_layer(&self, layer: &LayerBlob, diff_id: &str) -> Result<(), ErrorBody> {
        let hex = &layer.hex;
        let (mut tar, packed) = open_layer(layer)?;
        // A tar is a little longer than what its unpack counts (headers,
        // padding): twice the unpack bound is room enough for any layer
        // that unpacks within it.
        let bound = expansion_bound(packed).saturating_mul(2);
        let read = io::copy(&mut (&mut tar).take(bound), &mut io::sink())
            .map_err(|e| refused_read(hex, e))?;
        if read == bound {
            return Err(ErrorBody::new(
                Code::InvalidArgument,
                format!("layer sha256:{hex} decompresses to more than {bound} bytes: refused"),
            ));
        }
        check_diff_id(hex, &tar.hex(), diff_id)
    }

    /// Unpacks one layer blob into a fresh directory under `tmp/`, charged
    /// as it goes; the directory and the bytes it took.
    fn unpack_layer(
        &self,
        layer: &LayerBlob,
        diff_id: &str,
        charge: &mut Charge,
    ) -> Result<(tempfile::TempDir, u64), ErrorBody> {
        let hex = &layer.hex;
        let tmp = self.tmp_dir(&format!("layer-{}-", &hex[..12]))?;
        let (uid, gid) = self.idmap.image_owner(0, 0);
        std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid))
            .and_then(|()| {
                std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            })
            .map_err(|e| internal("preparing a layer directory", e))?;
        let root = crate::local::runtime::open_hub_dir(tmp.path())
            .map_err(|e| internal("opening a layer directory", e))?;
        let (mut tar, packed) = open_layer(layer)?;
        let max_bytes = expansion_bound(packed);
        let what = format!("layer sha256:{hex}");
        let mut spend = |cost: u64| charge.add(cost, cost).map_err(|o| o.error(&what));
        let stats = unpack::unpack_layer_charged(
            &mut tar,
            root.as_fd(),
            &self.idmap,
            max_bytes,
            &mut spend,
        )
        .map_err(|e| match e {
            unpack::UnpackError::Io(e) => internal(&format!("unpacking {what}"), e),
            unpack::UnpackError::Refused(e) => e,
            e => ErrorBody::new(Code::InvalidArgument, format!("{what} refused: {e}")),
        })?;
        // The tar's end-of-archive padding counts too; bounded like the rest.
        io::copy(&mut (&mut tar).take(max_bytes), &mut io::sink())
            .map_err(|e| refused_read(hex, e))?;
        check_diff_id(hex, &tar.hex(), diff_id)?;
        tracing::debug!(layer = %hex, entries = stats.entries, bytes = stats.charged, "layer unpacked");
        Ok((tmp, stats.charged))
    }

    /// Under the lock: moves the config blob and the fresh layers into
    /// place and writes the record with the tenant and its tag.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        tenant: &str,
        config_file: &Path,
        config_hex: &str,
        config: sandhub_api::hub::ImageRunConfig,
        size: u64,
        ready: &[Ready],
        tag: Option<String>,
    ) -> Result<Image, ErrorBody> {
        let dest = self.blobs.path(config_hex);
        if !dest.exists() {
            // Durable before it is named: an import stages it unsynced.
            File::open(config_file)
                .and_then(|f| f.sync_all())
                .map_err(|e| internal("syncing the image config", e))?;
            std::fs::rename(config_file, &dest)
                .map_err(|e| internal("moving the image config into place", e))?;
        }
        for layer in ready {
            let dest = self.layer_dir(&layer.diff_id);
            match &layer.dir {
                // Another import of the same layer got there first: its
                // copy is the same content.
                Some(dir) if !dest.is_dir() => std::fs::rename(dir, &dest)
                    .map_err(|e| internal("moving a layer into place", e))?,
                Some(_) => {}
                // Claimed since the plan, so still there.
                None if dest.is_dir() => {}
                None => {
                    return Err(internal(
                        "committing an image",
                        format!("layer {} left the store", layer.diff_id),
                    ))
                }
            }
        }
        let id = format!("sha256:{config_hex}");
        let mut record = self.read_record(config_hex)?.unwrap_or_else(|| Record {
            image: Image {
                id,
                tags: Vec::new(),
                layers: ready
                    .iter()
                    .map(|l| format!("sha256:{}", l.diff_id))
                    .collect(),
                size_bytes: size,
                config,
            },
            tenants: Default::default(),
            layer_bytes: ready.iter().map(|l| l.bytes).collect(),
            layer_blobs: Vec::new(),
        });
        // Every blob checked here is proof for the image's holders.
        record
            .layer_blobs
            .resize(record.image.layers.len(), Default::default());
        for (blobs, layer) in record.layer_blobs.iter_mut().zip(ready) {
            blobs.insert(layer.blob.clone());
        }
        if let Some(tag) = &tag {
            // A tag names one of the tenant's images: take it from any other.
            for mut other in self.records()? {
                if other.image.id == record.image.id {
                    continue;
                }
                if let Some(tags) = other.tenants.get_mut(tenant) {
                    if tags.remove(tag) {
                        self.write_record(&other)?;
                    }
                }
            }
        }
        let tags = record.tenants.entry(tenant.to_string()).or_default();
        tags.extend(tag);
        self.write_record(&record)?;
        let image = record.view(tenant);
        tracing::info!(id = %image.id, %tenant, tags = ?image.tags, layers = image.layers.len(), "image stored");
        Ok(image)
    }
}

fn mib(b: u64) -> u64 {
    b.div_ceil(1 << 20)
}

/// `(blob hex, diff id hex)` of every layer blob `tenant` has proven
/// unpacks to its layer: those of the images it holds (each blob was
/// checked when an image with it was stored; a tenant holding the layer
/// may name any blob checked for it, as it holds the content anyway).
pub(super) fn proven_by<'a>(records: &'a [Record], tenant: &str) -> HashSet<(&'a str, &'a str)> {
    let mut out = HashSet::new();
    for r in records.iter().filter(|r| r.tenants.contains_key(tenant)) {
        for (d, blobs) in r.image.layers.iter().zip(&r.layer_blobs) {
            if let Some(h) = format::sha256_hex(d) {
                out.extend(blobs.iter().map(|b| (b.as_str(), h)));
            }
        }
    }
    out
}

/// Each stored layer's unpacked size (diff id hex -> bytes).
pub(super) fn layer_sizes(records: &[Record]) -> HashMap<&str, u64> {
    let mut out = HashMap::new();
    for r in records {
        for (d, b) in r.image.layers.iter().zip(&r.layer_bytes) {
            if let Some(h) = format::sha256_hex(d) {
                out.insert(h, *b);
            }
        }
    }
    out
}

/// A layer directory's size as the unpack budget counts it (file data
/// plus a fixed cost per entry), for layers stored before sizes were
/// recorded. Never follows a symlink.
pub(super) fn measure_dir(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            total = total.saturating_add(unpack::ENTRY_COST);
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total = total.saturating_add(m.len());
            }
        }
    }
    total
}

/// A layer blob as a hashed tar stream, and the blob's size.
fn open_layer(layer: &LayerBlob) -> Result<(ingest::Hashing<Box<dyn Read>>, u64), ErrorBody> {
    let Some(path) = &layer.file else {
        return Err(internal("opening a layer blob", "no blob"));
    };
    let blob = File::open(path).map_err(|e| internal("opening a layer blob", e))?;
    let packed = blob.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((
        ingest::Hashing::new(decompress(BufReader::new(blob))?),
        packed,
    ))
}

fn refused_read(hex: &str, e: io::Error) -> ErrorBody {
    // A corrupt gzip stream is the blob's fault.
    if e.kind() == io::ErrorKind::InvalidInput || e.kind() == io::ErrorKind::InvalidData {
        ErrorBody::new(
            Code::InvalidArgument,
            format!("layer sha256:{hex} is not a readable stream: {e}"),
        )
    } else {
        internal(&format!("reading layer sha256:{hex}"), e)
    }
}

fn check_diff_id(hex: &str, got: &str, diff_id: &str) -> Result<(), ErrorBody> {
    if got == diff_id {
        return Ok(());
    }
    Err(ErrorBody::new(
        Code::InvalidArgument,
        format!(
            "layer sha256:{hex} unpacks to sha256:{got}, but the image config says \
             sha256:{diff_id}"
        ),
    ))
}

/// A layer blob as a tar stream: gzip is sniffed by its magic bytes;
/// zstd is refused by name.
fn decompress(mut input: BufReader<File>) -> Result<Box<dyn Read>, ErrorBody> {
    use std::io::BufRead;
    let head = input
        .fill_buf()
        .map_err(|e| internal("reading a layer", e))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(input)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Err(ErrorBody::new(
            Code::Unimplemented,
            "zstd-compressed layers are not supported yet",
        ))
    } else {
        Ok(Box::new(input))
    }
}
