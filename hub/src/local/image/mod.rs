//! The local image store, under `<state-dir>/images/` (hub only, 0700):
//!
//! ```text
//! blobs/sha256/<hex>   every file of an imported archive, by content
//! layers/<hex>/        one unpacked layer per layer blob, shared by every
//!                      image that has it; overlay format, owners shifted
//! images/<hex>.json    one image (by config digest): tags, layers, config
//! mnt/<hex>/           an image's root: its layers as one read-only overlay
//! empty/               the bottom layer of every such overlay
//! tmp/                 work in progress; emptied when the store opens
//! partial/<hex>        blobs being pulled; kept across restarts, so a
//!                      pull resumes where it stopped (see pull.rs)
//! ```
//!
//! Everything lands in `tmp/` first and is renamed into place only when
//! complete, so a hub killed mid-import leaves at most junk in `tmp/`:
//! a directory under `layers/` is always a whole layer. One lock
//! serializes imports, removals and prunes; reads take it too (they are
//! cheap), so no one sees an image whose layers are being removed.
//!
//! ```text
//! mod.rs     ImageStore: import, list, get, remove, prune
//! pull.rs    registry -> partial/ -> blobs (resumable, checked, coalesced)
//! registry_auth.rs  credentials from a Docker config.json (pure)
//! ingest.rs  archive -> blobs -> (config, layers, tag)
//! format.rs  the OCI / docker JSON the store reads (pure)
//! unpack.rs  one layer tar -> one directory, fd-relative and confined
//! mount.rs   an image's layers -> one read-only overlay (its root)
//! ```

mod format;
mod ingest;
mod mount;
pub mod pull;
mod registry_auth;
pub mod unpack;

use std::{
    collections::HashSet,
    fs::File,
    io::{self, BufReader, Read},
    os::{
        fd::AsFd,
        unix::fs::{DirBuilderExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{Image, ImageRunConfig, PrepullResult, PruneResult, PullEvent, PullRequest},
    validate,
};

use crate::{backend::ImageService, local::runtime::IdMap};

fn internal(what: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(Code::Internal, format!("{what}: {e}"))
}

fn not_found(r: &str) -> ErrorBody {
    ErrorBody::new(Code::NotFound, format!("no image `{r}` in the store"))
}

/// The content-addressed blob directory.
pub struct Blobs {
    dir: PathBuf,
    tmp: PathBuf,
}

impl Blobs {
    /// Stores `input` under its sha256; returns the hex digest.
    pub fn write(&self, input: &mut impl Read) -> io::Result<String> {
        let tmp = tempfile::NamedTempFile::new_in(&self.tmp)?;
        let mut file = tmp.as_file();
        let (hex, _) = ingest::copy_hashed(input, &mut file)?;
        file.sync_all()?;
        let dest = self.dir.join(&hex);
        if !dest.exists() {
            tmp.persist(&dest).map_err(|e| e.error)?;
        }
        Ok(hex)
    }

    pub fn open(&self, hex: &str) -> io::Result<File> {
        File::open(self.path(hex))
    }

    fn path(&self, hex: &str) -> PathBuf {
        self.dir.join(hex)
    }
}

/// What the images the hub's templates use are: their ids.
pub type InUse = Arc<dyn Fn() -> Result<HashSet<String>, ErrorBody> + Send + Sync>;

/// The store and who uses its images, for the front doors. The blocking
/// store calls run on blocking threads.
#[derive(Clone)]
pub struct Images {
    pub store: Arc<ImageStore>,
    in_use: InUse,
}

impl Images {
    pub fn new(store: Arc<ImageStore>, in_use: InUse) -> Self {
        Images { store, in_use }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ImageStore, &InUse) -> Result<T, ErrorBody> + Send + 'static,
    ) -> Result<T, ErrorBody> {
        let (store, in_use) = (self.store.clone(), self.in_use.clone());
        tokio::task::spawn_blocking(move || f(&store, &in_use))
            .await
            .map_err(|e| internal("image task", e))?
    }
}

#[async_trait::async_trait]
impl ImageService for Images {
    async fn list(&self) -> Result<Vec<Image>, ErrorBody> {
        self.blocking(|s, _| s.list()).await
    }

    async fn remove(&self, reference: String) -> Result<Image, ErrorBody> {
        self.blocking(move |s, u| s.remove(&reference, &u()?)).await
    }

    async fn prune(&self) -> Result<PruneResult, ErrorBody> {
        self.blocking(|s, u| s.prune(&u()?)).await
    }

    async fn import(
        &self,
        input: Box<dyn Read + Send>,
        tag: Option<String>,
    ) -> Result<Image, ErrorBody> {
        self.blocking(move |s, _| s.import(input, tag.as_deref()))
            .await
    }

    async fn pull(
        &self,
        tenant: &str,
        request: PullRequest,
        progress: Option<tokio::sync::mpsc::UnboundedSender<PullEvent>>,
    ) -> Result<Image, ErrorBody> {
        pull::pull_request(&self.store, tenant, request, progress).await
    }

    async fn prepull(
        &self,
        tenant: &str,
        references: Vec<String>,
    ) -> Result<PrepullResult, ErrorBody> {
        pull::prepull(&self.store, tenant, references).await
    }
}

/// A layer may unpack to at most this many times its blob's size (real
/// layers: 2-5x), so a gzip bomb within `--max-upload-bytes` cannot fill
/// the disk; but to at least [`MIN_UNPACK_BUDGET`].
const MAX_EXPANSION: u64 = 32;
const MIN_UNPACK_BUDGET: u64 = 512 << 20;

pub struct ImageStore {
    root: PathBuf,
    blobs: Blobs,
    idmap: IdMap,
    lock: Mutex<()>,
    /// Registry pulls: settings, pulls under way, blobs being fetched.
    pulls: pull::Pulls,
}

impl ImageStore {
    /// Opens (creating) the store under `state_dir` and empties `tmp/`:
    /// whatever is there was cut short.
    pub fn open(state_dir: &Path, idmap: IdMap) -> io::Result<Self> {
        let root = state_dir.join("images");
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        for d in ["blobs/sha256", "layers", "images", "tmp", "mnt", "empty"] {
            b.create(root.join(d))?;
        }
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
        for e in std::fs::read_dir(root.join("tmp"))? {
            let p = e?.path();
            let res = if std::fs::symlink_metadata(&p)?.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            if let Err(e) = res {
                tracing::warn!(path = %p.display(), error = %e, "could not clear an unfinished import");
            }
        }
        Ok(ImageStore {
            blobs: Blobs {
                dir: root.join("blobs/sha256"),
                tmp: root.join("tmp"),
            },
            root,
            idmap,
            lock: Mutex::new(()),
            pulls: pull::Pulls::default(),
        })
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unpacked layer directory of a layer digest (hex).
    pub fn layer_dir(&self, hex: &str) -> PathBuf {
        self.root.join("layers").join(hex)
    }

    /// Imports an OCI layout or `docker save` archive (one tar stream,
    /// uncompressed). `tag` names it, else the archive's own tag does.
    /// Blocking: call from a blocking thread.
    pub fn import(&self, input: impl Read, tag: Option<&str>) -> Result<Image, ErrorBody> {
        if let Some(t) = tag {
            validate::image_reference(t)?;
        }
        let _g = self.guard();
        let files = ingest::ingest(input, &self.blobs)?;
        let described = files.describe(&self.blobs)?;
        self.register_locked(
            "",
            &described.config,
            &described.layers,
            tag.or(described.tag.as_deref()),
        )
    }

    /// Makes an image of blobs already in `blobs/`: reads its config,
    /// unpacks each layer not yet unpacked, and writes its record with
    /// `tag`. Import and pull both end here.
    // The tenant the tag belongs to (tags become per-tenant).
    pub fn register(
        &self,
        tenant: &str,
        config_hex: &str,
        layers: &[String],
        tag: Option<&str>,
    ) -> Result<Image, ErrorBody> {
        let _g = self.guard();
        self.register_locked(tenant, config_hex, layers, tag)
    }

    /// [`Self::register`] with the store's lock already held.
    fn register_locked(
        &self,
        _tenant: &str,
        config_hex: &str,
        layers: &[String],
        tag: Option<&str>,
    ) -> Result<Image, ErrorBody> {
        let config = self.read_config(config_hex)?;
        let mut size = 0;
        for hex in layers {
            size += std::fs::metadata(self.blobs.path(hex))
                .map(|m| m.len())
                .unwrap_or(0);
            self.ensure_layer(hex)?;
        }
        let tag = match tag {
            Some(t) => {
                validate::image_reference(t)?;
                Some(validate::normalize_image_reference(t))
            }
            None => None,
        };
        let mut image = self.read_record(config_hex)?.unwrap_or_else(|| Image {
            id: format!("sha256:{config_hex}"),
            tags: Vec::new(),
            layers: layers.iter().map(|h| format!("sha256:{h}")).collect(),
            size_bytes: size,
            config,
        });
        if let Some(tag) = tag {
            // A tag names one image: take it from any other.
            for mut other in self.records()? {
                if other.id != image.id && other.tags.contains(&tag) {
                    other.tags.retain(|t| t != &tag);
                    self.write_record(&other)?;
                }
            }
            if !image.tags.contains(&tag) {
                image.tags.push(tag);
            }
        }
        self.write_record(&image)?;
        tracing::info!(id = %image.id, tags = ?image.tags, layers = image.layers.len(), "image stored");
        Ok(image)
    }

    fn read_config(&self, hex: &str) -> Result<ImageRunConfig, ErrorBody> {
        let mut buf = Vec::new();
        self.blobs
            .open(hex)
            .map_err(|e| internal("opening the image config", e))?
            .take(4 << 20)
            .read_to_end(&mut buf)
            .map_err(|e| internal("reading the image config", e))?;
        let file: format::ImageConfigFile = serde_json::from_slice(&buf).map_err(|e| {
            ErrorBody::new(
                Code::InvalidArgument,
                format!("image config is not valid: {e}"),
            )
        })?;
        if let Some(os) = file.os.as_deref().filter(|os| *os != "linux") {
            return Err(ErrorBody::new(
                Code::InvalidArgument,
                format!("image is for {os}, not linux"),
            ));
        }
        let c = file.config.unwrap_or_default();
        Ok(ImageRunConfig {
            env: c.env.unwrap_or_default(),
            workdir: c.working_dir.filter(|w| !w.is_empty()),
            user: c.user.filter(|u| !u.is_empty()),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
        })
    }

    /// Unpacks a layer blob unless it already is: into `tmp/`, then one
    /// rename, so `layers/<hex>` only ever holds a whole layer.
    fn ensure_layer(&self, hex: &str) -> Result<(), ErrorBody> {
        let dest = self.layer_dir(hex);
        if dest.is_dir() {
            return Ok(());
        }
        let tmp = tempfile::Builder::new()
            .prefix(&format!("layer-{}-", &hex[..12]))
            .tempdir_in(self.root.join("tmp"))
            .map_err(|e| internal("making a layer directory", e))?;
        let (uid, gid) = self.idmap.image_owner(0, 0);
        std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid))
            .and_then(|()| {
                std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            })
            .map_err(|e| internal("preparing a layer directory", e))?;
        let root = crate::local::runtime::open_hub_dir(tmp.path())
            .map_err(|e| internal("opening a layer directory", e))?;
        let blob = self
            .blobs
            .open(hex)
            .map_err(|e| internal("opening a layer blob", e))?;
        let packed = blob.metadata().map(|m| m.len()).unwrap_or(0);
        let max_bytes = packed.saturating_mul(MAX_EXPANSION).max(MIN_UNPACK_BUDGET);
        let stats = unpack::unpack_layer(
            decompress(BufReader::new(blob))?,
            root.as_fd(),
            &self.idmap,
            max_bytes,
        )
        .map_err(|e| match e {
            unpack::UnpackError::Io(e) => internal(&format!("unpacking layer sha256:{hex}"), e),
            e => ErrorBody::new(
                Code::InvalidArgument,
                format!("layer sha256:{hex} refused: {e}"),
            ),
        })?;
        let tmp = tmp.keep();
        if let Err(e) = std::fs::rename(&tmp, &dest) {
            let _ = std::fs::remove_dir_all(&tmp);
            if !dest.is_dir() {
                return Err(internal("moving a layer into place", e));
            }
        }
        tracing::debug!(layer = %hex, entries = stats.entries, bytes = stats.bytes, "layer unpacked");
        Ok(())
    }

    fn record_path(&self, hex: &str) -> PathBuf {
        self.root.join("images").join(format!("{hex}.json"))
    }

    fn read_record(&self, hex: &str) -> Result<Option<Image>, ErrorBody> {
        match std::fs::read(self.record_path(hex)) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| internal("reading an image record", e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(internal("reading an image record", e)),
        }
    }

    fn write_record(&self, image: &Image) -> Result<(), ErrorBody> {
        let hex = format::sha256_hex(&image.id).ok_or_else(|| internal("image id", &image.id))?;
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .map_err(|e| internal("writing an image record", e))?;
        serde_json::to_writer(tmp.as_file(), image)
            .map_err(|e| internal("writing an image record", e))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| internal("writing an image record", e))?;
        tmp.persist(self.record_path(hex))
            .map_err(|e| internal("writing an image record", e.error))?;
        Ok(())
    }

    fn records(&self) -> Result<Vec<Image>, ErrorBody> {
        let mut out = Vec::new();
        let dir = std::fs::read_dir(self.root.join("images"))
            .map_err(|e| internal("listing images", e))?;
        for e in dir {
            let name = e.map_err(|e| internal("listing images", e))?.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if let Some(img) = self.read_record(hex)? {
                out.push(img);
            }
        }
        out.sort_by(|a, b| a.tags.cmp(&b.tags).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    pub fn list(&self) -> Result<Vec<Image>, ErrorBody> {
        let _g = self.guard();
        self.records()
    }

    fn find(&self, reference: &str) -> Result<Image, ErrorBody> {
        validate::image_reference(reference)?;
        if let Some(hex) = format::sha256_hex(reference) {
            return self.read_record(hex)?.ok_or_else(|| not_found(reference));
        }
        let tag = validate::normalize_image_reference(reference);
        self.records()?
            .into_iter()
            .find(|i| i.tags.contains(&tag))
            .ok_or_else(|| not_found(reference))
    }

    /// The image a reference (tag or id) names.
    pub fn get(&self, reference: &str) -> Result<Image, ErrorBody> {
        let _g = self.guard();
        self.find(reference)
    }

    /// Removes a tag, or the whole image when named by id or by its only
    /// tag. `in_use` holds the ids of images templates or sandboxes use:
    /// those are refused with `CONFLICT`.
    pub fn remove(&self, reference: &str, in_use: &HashSet<String>) -> Result<Image, ErrorBody> {
        let _g = self.guard();
        let mut image = self.find(reference)?;
        let hex = format::sha256_hex(&image.id)
            .ok_or_else(|| internal("image id", &image.id))?
            .to_string();
        let by_id = format::sha256_hex(reference).is_some();
        if !by_id && image.tags.len() > 1 {
            let tag = validate::normalize_image_reference(reference);
            image.tags.retain(|t| *t != tag);
            self.write_record(&image)?;
            return Ok(image);
        }
        if in_use.contains(&image.id) {
            return Err(ErrorBody::new(
                Code::Conflict,
                format!("image `{reference}` is in use by a template or a sandbox"),
            ));
        }
        std::fs::remove_file(self.record_path(&hex))
            .map_err(|e| internal("removing an image record", e))?;
        self.unmount(&hex);
        self.collect(&mut PruneResult::default())?;
        Ok(image)
    }

    /// Removes untagged images nobody uses, then every layer and blob no
    /// image refers to.
    pub fn prune(&self, in_use: &HashSet<String>) -> Result<PruneResult, ErrorBody> {
        let _g = self.guard();
        let mut result = PruneResult::default();
        for image in self.records()? {
            if image.tags.is_empty() && !in_use.contains(&image.id) {
                if let Some(hex) = format::sha256_hex(&image.id) {
                    std::fs::remove_file(self.record_path(hex))
                        .map_err(|e| internal("removing an image record", e))?;
                    self.unmount(hex);
                    result.images.push(image.id);
                }
            }
        }
        self.collect(&mut result)?;
        Ok(result)
    }

    /// Removes layers and blobs no image record refers to. Called with
    /// the lock held, so no import is between writing blobs and its record.
    fn collect(&self, result: &mut PruneResult) -> Result<(), ErrorBody> {
        let mut keep = HashSet::new();
        for image in self.records()? {
            for d in image.layers.iter().chain(std::iter::once(&image.id)) {
                if let Some(h) = format::sha256_hex(d) {
                    keep.insert(h.to_string());
                }
            }
        }
        for (sub, is_layer) in [("layers", true), ("blobs/sha256", false)] {
            let dir = self.root.join(sub);
            for e in std::fs::read_dir(&dir).map_err(|e| internal("listing the store", e))? {
                let e = e.map_err(|e| internal("listing the store", e))?;
                let name = e.file_name().to_string_lossy().into_owned();
                if keep.contains(&name) {
                    continue;
                }
                let res = if is_layer {
                    std::fs::remove_dir_all(e.path())
                } else {
                    std::fs::remove_file(e.path())
                };
                res.map_err(|e| internal(&format!("removing {sub}/{name}"), e))?;
                if is_layer {
                    result.layers += 1;
                } else {
                    result.blobs += 1;
                }
            }
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests;
