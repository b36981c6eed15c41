//! The local image store, under `<state-dir>/images/` (hub only, 0700):
//!
//! ```text
//! blobs/sha256/<hex>   every file of an imported archive, by content
//! layers/<hex>/        one unpacked layer per diff id (the sha256 of its
//!                      tar, checked as it unpacks), shared by every image
//!                      that has it; overlay format, owners shifted
//! images/<hex>.json    one image (by config digest): layers, config, and
//!                      each tenant holding it with that tenant's tags
//! pins/<sandbox id>    the image a sandbox runs (tenant, id): never removed
//!                      while that sandbox exists
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
//! Tenancy: layers and blobs are shared by content (an image two tenants
//! import is stored once), but everything a tenant can name is its own. A
//! tag belongs to one tenant, so no tenant can re-point another's
//! `app:1`; an image is listed, resolved (even by id) and removable only
//! by a tenant that imported or pulled it; and it leaves the disk only
//! when no tenant holds it, no template names it and no sandbox runs it.
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
    collections::{BTreeMap, BTreeSet, HashSet},
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
    hub::{
        Image, ImageRunConfig, PrepullRequest, PrepullResult, PruneResult, PullEvent, PullRequest,
    },
    validate,
};

use crate::{backend::ImageService, local::runtime::IdMap};

fn internal(what: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(Code::Internal, format!("{what}: {e}"))
}

fn not_found(r: &str) -> ErrorBody {
    ErrorBody::new(Code::NotFound, format!("no image `{r}` in the store"))
}

/// A tag the store lacks: `INVALID_ARGUMENT` when no registry could serve
/// it either (Kubernetes' `InvalidImageName`), so a caller can tell a name
/// that will never work from an image not pulled yet.
fn missing(r: &str) -> ErrorBody {
    match pull::parse_reference(r) {
        Err(invalid) => invalid,
        Ok(_) => not_found(r),
    }
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

/// What uses images, as the hub knows it: its templates and sandboxes.
#[derive(Debug, Default)]
pub struct Users {
    /// `(tenant, reference)` of every template with `image:`.
    pub templates: Vec<(String, String)>,
    /// Every sandbox the hub holds, in any state: a pin of any other
    /// sandbox is stale (a hub died between destroy and unpin).
    pub sandboxes: HashSet<String>,
}

/// Asks the hub what uses images (read before the store's lock is taken).
pub type InUse = Arc<dyn Fn() -> Result<Users, ErrorBody> + Send + Sync>;

/// `(tenant, image id)`: a tenant's template or sandbox uses the image.
type Used = HashSet<(String, String)>;

/// An image as stored: the image, and the tenants holding it with their
/// tags for it (`Image::tags` itself is kept empty on disk).
#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    #[serde(flatten)]
    image: Image,
    #[serde(default)]
    tenants: BTreeMap<String, BTreeSet<String>>,
}

impl Record {
    /// The image as `tenant` sees it: with its own tags only.
    fn view(&self, tenant: &str) -> Image {
        let mut image = self.image.clone();
        image.tags = self
            .tenants
            .get(tenant)
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default();
        image
    }

    fn hex(&self) -> Result<&str, ErrorBody> {
        format::sha256_hex(&self.image.id).ok_or_else(|| internal("image id", &self.image.id))
    }
}

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
    async fn list(&self, tenant: &str) -> Result<Vec<Image>, ErrorBody> {
        let tenant = tenant.to_string();
        self.blocking(move |s, _| s.list(&tenant)).await
    }

    async fn remove(&self, tenant: &str, reference: String) -> Result<Image, ErrorBody> {
        let tenant = tenant.to_string();
        self.blocking(move |s, u| s.remove(&tenant, &reference, &u()?))
            .await
    }

    async fn prune(&self, tenant: &str) -> Result<PruneResult, ErrorBody> {
        let tenant = tenant.to_string();
        self.blocking(move |s, u| s.prune(&tenant, &u()?)).await
    }

    async fn import(
        &self,
        tenant: &str,
        input: Box<dyn Read + Send>,
        tag: Option<String>,
        pick: Option<String>,
    ) -> Result<Image, ErrorBody> {
        let tenant = tenant.to_string();
        self.blocking(move |s, _| s.import(&tenant, input, tag.as_deref(), pick.as_deref()))
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
        request: PrepullRequest,
    ) -> Result<PrepullResult, ErrorBody> {
        pull::prepull(&self.store, tenant, request).await
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
    /// Most bytes (compressed layers) of images one tenant may hold; 0:
    /// no limit.
    max_tenant_bytes: u64,
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
        for d in [
            "blobs/sha256",
            "layers",
            "images",
            "pins",
            "tmp",
            "mnt",
            "empty",
        ] {
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
            max_tenant_bytes: 0,
            pulls: pull::Pulls::default(),
        })
    }

    /// Bounds what one tenant's images may take (`bytes` of compressed
    /// layers; 0: no limit).
    pub fn with_tenant_quota(mut self, bytes: u64) -> Self {
        self.max_tenant_bytes = bytes;
        self
    }

    /// Refuses a new image of `size` bytes that would take `tenant` past
    /// its quota. Called with the lock held, before any layer is unpacked.
    fn admit(&self, tenant: &str, id: &str, size: u64) -> Result<(), ErrorBody> {
        if self.max_tenant_bytes == 0 {
            return Ok(());
        }
        let mut held = 0u64;
        for r in self.records()? {
            if r.tenants.contains_key(tenant) {
                if r.image.id == id {
                    return Ok(()); // already counted: a new tag costs nothing
                }
                held = held.saturating_add(r.image.size_bytes);
            }
        }
        if held.saturating_add(size) > self.max_tenant_bytes {
            return Err(ErrorBody::new(
                Code::ResourceExhausted,
                format!(
                    "this image ({} MiB) would take the tenant's images past {} MiB \
                     (held now: {} MiB); remove some (`sandhub image rm`, `prune`)",
                    size.div_ceil(1 << 20),
                    self.max_tenant_bytes >> 20,
                    held.div_ceil(1 << 20),
                ),
            ));
        }
        Ok(())
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unpacked layer directory of a layer digest (hex).
    pub fn layer_dir(&self, hex: &str) -> PathBuf {
        self.root.join("layers").join(hex)
    }

    /// Imports an OCI layout or `docker save` archive (one tar stream,
    /// uncompressed) for `tenant`. `tag` names it, else the archive's own
    /// tag does. Blocking: call from a blocking thread.
    pub fn import(
        &self,
        tenant: &str,
        input: impl Read,
        tag: Option<&str>,
        pick: Option<&str>,
    ) -> Result<Image, ErrorBody> {
        if let Some(t) = tag {
            validate::image_reference(t)?;
        }
        let _g = self.guard();
        let files = ingest::ingest(input, &self.blobs)?;
        let described = files.describe(&self.blobs, pick)?;
        let layers: Vec<(String, u64)> = described
            .layers
            .iter()
            .map(|blob| {
                let size = std::fs::metadata(self.blobs.path(blob))
                    .map(|m| m.len())
                    .unwrap_or(0);
                (blob.clone(), size)
            })
            .collect();
        self.register_locked(
            tenant,
            &described.config,
            &layers,
            tag.or(described.tag.as_deref()),
        )
    }

    /// Makes an image of `tenant` from blobs in `blobs/`: reads the config,
    /// admits its size against the tenant's quota, unpacks each layer not
    /// yet unpacked (checked against the config's diff ids), and writes
    /// the record with `tag`. Import and pull both end here, with the
    /// store's lock held. `layers` are `(blob hex, compressed size)`,
    /// bottom first; the blob of a layer already unpacked may be absent.
    fn register_locked(
        &self,
        tenant: &str,
        config_hex: &str,
        layers: &[(String, u64)],
        tag: Option<&str>,
    ) -> Result<Image, ErrorBody> {
        let (config, diff_ids) = self.read_config(config_hex)?;
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
        let size = layers.iter().map(|(_, size)| size).sum();
        let id = format!("sha256:{config_hex}");
        if let Err(e) = self.admit(tenant, &id, size) {
            // The new blobs are nobody's: drop them now.
            self.collect(&mut PruneResult::default())?;
            return Err(e);
        }
        for ((blob, _), diff_id) in layers.iter().zip(&diff_ids) {
            self.ensure_layer(blob, diff_id)?;
        }
        let tag = match tag {
            Some(t) => {
                validate::image_reference(t)?;
                Some(validate::normalize_image_reference(t))
            }
            None => None,
        };
        let mut record = self.read_record(config_hex)?.unwrap_or_else(|| Record {
            image: Image {
                id,
                tags: Vec::new(),
                layers: diff_ids.iter().map(|h| format!("sha256:{h}")).collect(),
                size_bytes: size,
                config,
            },
            tenants: BTreeMap::new(),
        });
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

    /// The run config and the layers' diff ids (hex) of a config blob.
    fn read_config(&self, hex: &str) -> Result<(ImageRunConfig, Vec<String>), ErrorBody> {
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
        let diff_ids = file
            .rootfs
            .unwrap_or_default()
            .diff_ids
            .iter()
            .map(|d| {
                format::sha256_hex(d).map(str::to_string).ok_or_else(|| {
                    ErrorBody::new(
                        Code::InvalidArgument,
                        format!("image config has a bad diff id `{d}`"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let c = file.config.unwrap_or_default();
        let run = ImageRunConfig {
            env: c.env.unwrap_or_default(),
            workdir: c.working_dir.filter(|w| !w.is_empty()),
            user: c.user.filter(|u| !u.is_empty()),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
        };
        Ok((run, diff_ids))
    }

    /// Unpacks layer blob `hex` unless layer `diff_id` already is: into
    /// `tmp/`, then one rename, so `layers/<diff id>` only ever holds a
    /// whole layer whose tar hashed to its name. Keyed by diff id, not by
    /// blob, an image id (its config's digest) names its content exactly:
    /// no tenant can plant other content under an id another will import.
    fn ensure_layer(&self, hex: &str, diff_id: &str) -> Result<(), ErrorBody> {
        let dest = self.layer_dir(diff_id);
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
        let mut tar = ingest::Hashing::new(decompress(BufReader::new(blob))?);
        let stats =
            unpack::unpack_layer(&mut tar, root.as_fd(), &self.idmap, max_bytes).map_err(|e| {
                match e {
                    unpack::UnpackError::Io(e) => {
                        internal(&format!("unpacking layer sha256:{hex}"), e)
                    }
                    e => ErrorBody::new(
                        Code::InvalidArgument,
                        format!("layer sha256:{hex} refused: {e}"),
                    ),
                }
            })?;
        // The tar's end-of-archive padding counts too; bounded like the rest.
        io::copy(&mut (&mut tar).take(max_bytes), &mut io::sink())
            .map_err(|e| internal(&format!("reading layer sha256:{hex}"), e))?;
        let got = tar.hex();
        if got != diff_id {
            return Err(ErrorBody::new(
                Code::InvalidArgument,
                format!("layer sha256:{hex} unpacks to sha256:{got}, but the image config says sha256:{diff_id}"),
            ));
        }
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

    fn read_record(&self, hex: &str) -> Result<Option<Record>, ErrorBody> {
        match std::fs::read(self.record_path(hex)) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| internal("reading an image record", e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(internal("reading an image record", e)),
        }
    }

    fn write_record(&self, record: &Record) -> Result<(), ErrorBody> {
        let hex = record.hex()?;
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .map_err(|e| internal("writing an image record", e))?;
        serde_json::to_writer(tmp.as_file(), record)
            .map_err(|e| internal("writing an image record", e))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| internal("writing an image record", e))?;
        tmp.persist(self.record_path(hex))
            .map_err(|e| internal("writing an image record", e.error))?;
        Ok(())
    }

    fn records(&self) -> Result<Vec<Record>, ErrorBody> {
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
        out.sort_by(|a, b| a.image.id.cmp(&b.image.id));
        Ok(out)
    }

    /// The images `tenant` holds, by tag then id.
    pub fn list(&self, tenant: &str) -> Result<Vec<Image>, ErrorBody> {
        let _g = self.guard();
        let mut out: Vec<Image> = self
            .records()?
            .iter()
            .filter(|r| r.tenants.contains_key(tenant))
            .map(|r| r.view(tenant))
            .collect();
        out.sort_by(|a, b| a.tags.cmp(&b.tags).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The record a tenant's reference names: one of its tags, or the id
    /// of an image it holds. Another tenant's image is `NOT_FOUND`, even by
    /// id, so ids say nothing about what others hold.
    fn find(&self, tenant: &str, reference: &str) -> Result<Record, ErrorBody> {
        validate::image_reference(reference)?;
        if let Some(hex) = format::sha256_hex(reference) {
            return self
                .read_record(hex)?
                .filter(|r| r.tenants.contains_key(tenant))
                .ok_or_else(|| not_found(reference));
        }
        let tag = validate::normalize_image_reference(reference);
        self.records()?
            .into_iter()
            .find(|r| r.tenants.get(tenant).is_some_and(|t| t.contains(&tag)))
            .ok_or_else(|| missing(reference))
    }

    /// The image a tenant's reference (tag or id) names.
    pub fn get(&self, tenant: &str, reference: &str) -> Result<Image, ErrorBody> {
        let _g = self.guard();
        Ok(self.find(tenant, reference)?.view(tenant))
    }

    fn pin_path(&self, sandbox: &str) -> Result<PathBuf, ErrorBody> {
        // Sandbox ids are the hub's own (`prefix-` and [a-z0-9]); a name
        // that could leave pins/ is a bug, not an input.
        if sandbox.is_empty() || sandbox.starts_with('.') || sandbox.contains(['/', '\0']) {
            return Err(internal(
                "pinning an image",
                format!("bad sandbox id {sandbox:?}"),
            ));
        }
        Ok(self.root.join("pins").join(sandbox))
    }

    /// Records that `sandbox` (of `tenant`) runs image `id`. Called with
    /// the lock held, by [`ImageStore::root_of`].
    fn pin(&self, sandbox: &str, tenant: &str, id: &str) -> Result<(), ErrorBody> {
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .map_err(|e| internal("pinning an image", e))?;
        std::fs::write(tmp.path(), format!("{tenant}\n{id}\n"))
            .map_err(|e| internal("pinning an image", e))?;
        tmp.persist(self.pin_path(sandbox)?)
            .map_err(|e| internal("pinning an image", e.error))?;
        Ok(())
    }

    /// Forgets what a destroyed sandbox ran.
    pub fn unpin(&self, sandbox: &str) {
        let _g = self.guard();
        if let Ok(path) = self.pin_path(sandbox) {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(%sandbox, error = %e, "removing an image pin");
                }
            }
        }
    }

    /// `(tenant, image id)` of everything in use: every template's image
    /// (resolved in its tenant) and every live sandbox's pin. Stale pins
    /// (of sandboxes the hub no longer holds) are dropped on the way.
    fn used(&self, users: &Users) -> Result<Used, ErrorBody> {
        let mut used = Used::new();
        for (tenant, reference) in &users.templates {
            if let Ok(r) = self.find(tenant, reference) {
                used.insert((tenant.clone(), r.image.id));
            }
        }
        let dir = std::fs::read_dir(self.root.join("pins"))
            .map_err(|e| internal("listing image pins", e))?;
        for e in dir {
            let e = e.map_err(|e| internal("listing image pins", e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !users.sandboxes.contains(&name) {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            if let Some((tenant, id)) = text.trim_end().split_once('\n') {
                used.insert((tenant.to_string(), id.to_string()));
            }
        }
        Ok(used)
    }

    /// Removes one of `tenant`'s tags, or (named by id or by its last tag)
    /// the tenant's hold on the image. An image the tenant's templates or
    /// sandboxes use is refused with `CONFLICT`. The image leaves the disk
    /// when no tenant holds it any more.
    pub fn remove(&self, tenant: &str, reference: &str, users: &Users) -> Result<Image, ErrorBody> {
        let _g = self.guard();
        let mut record = self.find(tenant, reference)?;
        let image = record.view(tenant);
        let by_id = format::sha256_hex(reference).is_some();
        if !by_id && image.tags.len() > 1 {
            let tag = validate::normalize_image_reference(reference);
            if let Some(tags) = record.tenants.get_mut(tenant) {
                tags.remove(&tag);
            }
            self.write_record(&record)?;
            return Ok(record.view(tenant));
        }
        let used = self.used(users)?;
        if used.contains(&(tenant.to_string(), record.image.id.clone())) {
            return Err(ErrorBody::new(
                Code::Conflict,
                format!("image `{reference}` is in use by a template or a sandbox"),
            ));
        }
        record.tenants.remove(tenant);
        self.release(&record, &used, &mut PruneResult::default())?;
        self.collect(&mut PruneResult::default())?;
        Ok(image)
    }

    /// Drops `tenant`'s holds on its untagged images it does not use, then
    /// removes every image no tenant holds and nothing uses, and every
    /// layer and blob no image needs.
    pub fn prune(&self, tenant: &str, users: &Users) -> Result<PruneResult, ErrorBody> {
        let _g = self.guard();
        let used = self.used(users)?;
        let mut result = PruneResult::default();
        for mut record in self.records()? {
            let untagged = record.tenants.get(tenant).is_some_and(|t| t.is_empty());
            if untagged && !used.contains(&(tenant.to_string(), record.image.id.clone())) {
                record.tenants.remove(tenant);
                if !record.tenants.is_empty() {
                    // Still another tenant's: to this one it is gone.
                    result.images.push(record.image.id.clone());
                }
            } else if !record.tenants.is_empty() {
                continue;
            }
            self.release(&record, &used, &mut result)?;
        }
        self.collect(&mut result)?;
        Ok(result)
    }

    /// Writes a record whose holders changed, or deletes it when no tenant
    /// holds it and no sandbox runs it.
    fn release(
        &self,
        record: &Record,
        used: &Used,
        result: &mut PruneResult,
    ) -> Result<(), ErrorBody> {
        let hex = record.hex()?;
        let running = used.iter().any(|(_, id)| *id == record.image.id);
        if !record.tenants.is_empty() || running {
            return self.write_record(record);
        }
        std::fs::remove_file(self.record_path(hex))
            .map_err(|e| internal("removing an image record", e))?;
        self.unmount(hex);
        result.images.push(record.image.id.clone());
        Ok(())
    }

    /// Removes layers and blobs no image record refers to. Called with
    /// the lock held, so no import is between writing blobs and its record.
    fn collect(&self, result: &mut PruneResult) -> Result<(), ErrorBody> {
        let mut keep = HashSet::new();
        for record in self.records()? {
            let image = &record.image;
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
