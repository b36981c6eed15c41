//! The local image store, under `<state-dir>/images/` (hub only, 0700):
//!
//! ```text
//! blobs/sha256/<hex>   the config blob of every stored image (layer
//!                      blobs are not kept once their layer is unpacked)
//! layers/<hex>/        one unpacked layer per diff id (the sha256 of its
//!                      tar, checked as it unpacks), shared by every image
//!                      that has it; overlay format, owners shifted
//! images/<hex>.json    one image (by config digest): layers and what each
//!                      unpacked to, config, and each tenant holding it
//!                      with that tenant's tags
//! pins/<sandbox id>    the image a sandbox runs (tenant, id): never removed
//!                      while that sandbox exists
//! mnt/<hex>/           an image's root: its layers as one read-only overlay
//! empty/               the bottom layer of every such overlay
//! tmp/                 work in progress (an import's staged archive, a
//!                      layer unpacking, a collected layer being deleted);
//!                      emptied when the store opens
//! partial/<tenant>/<hex>  blobs a tenant is pulling; kept across restarts,
//!                      so a pull resumes where it stopped (see pull/);
//!                      pruned when untouched for a day
//! ```
//!
//! Everything lands in `tmp/` first and is renamed into place only when
//! complete, so a hub killed mid-import leaves at most junk in `tmp/`:
//! a directory under `layers/` is always a whole layer, and a refused
//! import or pull leaves nothing at all. The store's lock is held only to
//! read or change records and to move things into or out of place: an
//! archive streams and a layer unpacks without it, so no tenant's listing
//! waits on another's import. What an import in progress relies on is
//! claimed (budget.rs), so a prune meanwhile leaves it alone.
//!
//! Tenancy: layers are shared by content (an image two tenants import is
//! stored once), but everything a tenant can name is its own. A tag
//! belongs to one tenant, so no tenant can re-point another's `app:1`; an
//! image is listed, resolved (even by id) and removable only by a tenant
//! that imported or pulled it; a layer in the store serves a tenant only
//! once it proved it holds its content (register.rs); and an image leaves
//! the disk only when no tenant holds it, no template names it and no
//! sandbox runs it.
//!
//! Bounds: a tenant's images (compressed blobs plus unpacked layers, each
//! image counted for each tenant holding it) stay within its quota, and
//! the whole store (layers once, blobs, partial downloads, imports in
//! progress) within the store's cap; both are charged as bytes are
//! written, so an unpack stops at the limit (budget.rs).
//!
//! ```text
//! mod.rs       ImageStore: open, import, list, get, pins; Images (its ImageService)
//! prune.rs     remove, prune, and collecting what no image needs
//! register.rs  blobs -> proven or unpacked layers -> record (import, pull)
//! budget.rs    quota charges and claims of work in progress
//! pull/        registry -> partial/ -> register (resumable, checked, coalesced):
//!   mod.rs       a pull from manifest to record
//!   fetch.rs     the fetch engine (registry client, one blob into partial/)
//!   coalesce.rs  one flight per pull asked twice, one fetch per blob
//! registry_auth.rs  credentials from a Docker config.json (pure)
//! ingest.rs    archive -> staged blobs -> (config, layers, tag)
//! format.rs    the OCI / docker JSON the store reads (pure)
//! unpack.rs    one layer tar -> one directory, fd-relative and confined
//! mount.rs     an image's layers -> one read-only overlay (its root)
//! ```

mod budget;
mod format;
mod ingest;
mod mount;
mod prune;
pub mod pull;
mod register;
pub(super) mod registry_auth;
pub mod unpack;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs::File,
    io::{self, Read},
    os::unix::fs::{DirBuilderExt, PermissionsExt},
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
    ///
    /// Not synced: blobs are written only into an import's staging
    /// directory, and all but the config are gone once it is registered;
    /// the config is synced as it is moved into the store (`commit`). A
    /// sync per staged layer was most of what staging added to an import.
    pub fn write(&self, input: &mut impl Read) -> io::Result<String> {
        let tmp = tempfile::NamedTempFile::new_in(&self.tmp)?;
        let mut file = tmp.as_file();
        let (hex, _) = ingest::copy_hashed(input, &mut file)?;
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
    /// What each layer unpacked to (file data plus a fixed cost per
    /// entry), bottom first like `image.layers`; filled in at open for
    /// records stored before it was kept.
    #[serde(default)]
    layer_bytes: Vec<u64>,
    /// Per layer, the blobs checked to unpack to it (register.rs): proof
    /// for each tenant holding the image. Empty for records stored before
    /// proofs were kept (their blobs are checked again).
    #[serde(default)]
    layer_blobs: Vec<BTreeSet<String>>,
}

impl Record {
    /// What the image costs each tenant holding it: its compressed layer
    /// blobs (`size_bytes`, the API's figure) plus its unpacked layers.
    fn quota_bytes(&self) -> u64 {
        self.layer_bytes
            .iter()
            .fold(self.image.size_bytes, |sum, b| sum.saturating_add(*b))
    }

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

pub struct ImageStore {
    root: PathBuf,
    blobs: Blobs,
    idmap: IdMap,
    /// Held to read or change records and to move things into or out of
    /// place; never while a layer unpacks or a blob downloads.
    lock: Mutex<()>,
    /// Bytes counted against the tenant quota and the store cap.
    ledger: Arc<budget::Ledger>,
    /// Layers and blobs imports and pulls in progress rely on.
    inflight: Arc<budget::InFlight>,
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
        let store = ImageStore {
            blobs: Blobs {
                dir: root.join("blobs/sha256"),
                tmp: root.join("tmp"),
            },
            root,
            idmap,
            lock: Mutex::new(()),
            ledger: Arc::default(),
            inflight: Arc::default(),
            pulls: pull::Pulls::default(),
        };
        store
            .record_layer_sizes()
            .and_then(|()| store.refresh_ledger())
            .map_err(|e| io::Error::other(e.message))?;
        Ok(store)
    }

    /// Bounds what one tenant's images may take (`bytes`, compressed
    /// layers plus unpacked layers of each image it holds; 0: no limit).
    pub fn with_tenant_quota(self, bytes: u64) -> Self {
        let store = self.ledger.max_store();
        self.ledger.set_limits(bytes, store);
        self
    }

    /// Bounds the whole store on disk (`bytes`: unpacked layers once each,
    /// blobs, partial downloads, imports in progress; 0: no limit), so
    /// the host's disk is bounded whatever the tenants do.
    pub fn with_store_cap(self, bytes: u64) -> Self {
        let tenant = self.ledger.max_tenant();
        self.ledger.set_limits(tenant, bytes);
        self
    }

    /// Records the unpacked size of every layer of records stored before
    /// sizes were kept (measured once, at open).
    fn record_layer_sizes(&self) -> Result<(), ErrorBody> {
        for mut record in self.records()? {
            if record.layer_bytes.len() == record.image.layers.len() {
                continue;
            }
            record.layer_bytes = record
                .image
                .layers
                .iter()
                .map(|d| {
                    format::sha256_hex(d).map_or(0, |h| register::measure_dir(&self.layer_dir(h)))
                })
                .collect();
            self.write_record(&record)?;
        }
        Ok(())
    }

    /// Reads the committed figures of the ledger from the records and the
    /// disk. Called with the lock held, or before the store is shared.
    fn refresh_ledger(&self) -> Result<(), ErrorBody> {
        self.refresh_from(&self.records()?)
    }

    fn refresh_from(&self, records: &[Record]) -> Result<(), ErrorBody> {
        let mut held: HashMap<String, u64> = HashMap::new();
        for r in records {
            for t in r.tenants.keys() {
                let h = held.entry(t.clone()).or_default();
                *h = h.saturating_add(r.quota_bytes());
            }
        }
        let layers: u64 = register::layer_sizes(records).values().sum();
        let stored = layers
            .saturating_add(files_bytes(&self.root.join("blobs/sha256")))
            .saturating_add(files_bytes(&self.root.join("partial")));
        self.ledger.refresh(held, stored);
        Ok(())
    }

    /// A fresh directory under `tmp/`, removed when dropped.
    fn tmp_dir(&self, prefix: &str) -> Result<tempfile::TempDir, ErrorBody> {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(self.root.join("tmp"))
            .map_err(|e| internal("making a work directory", e))
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
    ///
    /// The archive is staged in a directory of its own under `tmp/`, so a
    /// refused import (no image in it, a bad config, a quota, a bad layer)
    /// leaves nothing behind: only the config blob of a stored image ever
    /// reaches `blobs/`. No lock is held while it streams or unpacks.
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
        let staging = self.tmp_dir("import-")?;
        let blobs = Blobs {
            dir: staging.path().to_path_buf(),
            tmp: staging.path().to_path_buf(),
        };
        let mut charge = self.ledger.charge(tenant);
        let mut metered = register::Metered {
            inner: input,
            charge: &mut charge,
            refused: None,
        };
        let files = match ingest::ingest(&mut metered, &blobs) {
            Ok(files) => files,
            Err(e) => return Err(metered.refused.take().unwrap_or(e)),
        };
        let described = files.describe(&blobs, pick)?;
        let layers: Vec<register::LayerBlob> = described
            .layers
            .iter()
            .map(|hex| register::LayerBlob {
                hex: hex.clone(),
                size: std::fs::metadata(blobs.path(hex)).map_or(0, |m| m.len()),
                file: Some(blobs.path(hex)),
            })
            .collect();
        self.register(
            tenant,
            &blobs.path(&described.config),
            &described.config,
            &layers,
            tag.or(described.tag.as_deref()),
            charge,
        )
    }

    /// The run config and the layers' diff ids (hex) of a config blob.
    fn read_config(&self, path: &Path) -> Result<(ImageRunConfig, Vec<String>), ErrorBody> {
        let mut buf = Vec::new();
        File::open(path)
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
}

/// Bytes of the files under `dir` (one level of subdirectories: the
/// layout of `blobs/` and `partial/`).
fn files_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                total = total.saturating_add(f.metadata().map_or(0, |m| m.len()));
            }
        } else {
            total = total.saturating_add(m.len());
        }
    }
    total
}

#[cfg(test)]
mod tests;
