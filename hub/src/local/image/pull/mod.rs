//! Pulling images from OCI / Docker v2 registries into the store, with
//! `oci-client` speaking the registry protocol (token and basic
//! challenges, index resolution, manifests).
//!
//! ```text
//! reference -> manifest (an index picks linux/<this arch>)
//!           -> config and layer blobs, each into partial/<hex>:
//!                resumed with a Range request after a cut (hub killed,
//!                registry gone), bounded by the descriptor's size,
//!                checked against its sha256 (a mismatch deletes it)
//!           -> under the store's lock: renamed into blobs/ and
//!              registered (the same tail as an import)
//! ```
//!
//! `partial/` survives restarts (unlike `tmp/`), and nothing reads a blob
//! before it is whole and checked, so a cut pull never leaves half a layer
//! anyone could use. A failed pull writes no image record, and once its
//! blobs were all fetched it leaves none of them behind; a cut one stays
//! for the pull to resume, until `prune` finds it abandoned.
//!
//! `partial/` has a directory per tenant (a hash of its name): a blob is
//! the tenant's only once its own registry sent it, never because another
//! tenant fetched the same digest. A pull fetches every blob the tenant
//! has not proven (see register.rs), even when its layer is unpacked
//! already: a registry of the tenant's own could name any digest. Only a
//! layer of an image the tenant holds is not fetched again, and the
//! config of such an image.
//!
//! Pulls of one reference by one tenant with the same credentials share a
//! flight: the second caller gets the first's events and result. A blob is
//! fetched by one pull of the tenant at a time (a lock per tenant and
//! digest), so two pulls of images sharing a layer fetch it once.

use std::{
    collections::{HashMap, HashSet},
    io::{self, Read},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, Once},
    time::{Duration, Instant},
};

use clap::Args;
use futures::{StreamExt, TryStreamExt};
use oci_client::{
    client::{BlobResponse, ClientConfig, ClientProtocol, SizedStream},
    errors::{OciDistributionError, OciErrorCode},
    manifest::{ImageIndexEntry, OciDescriptor},
    secrets::RegistryAuth,
    Client, Reference,
};
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{
        Image, PrepullImage, PrepullRequest, PrepullResult, PullEvent, PullLayer, PullRequest,
        DEFAULT_PREPULL_TIMEOUT_SECONDS,
    },
    validate,
};
use sha2::{Digest, Sha256};
use tokio::{io::AsyncWriteExt, sync::mpsc};

use super::{
    format,
    register::LayerBlob,
    registry_auth::{Credentials, DockerConfig},
    ImageStore,
};

/// Default of `--max-image-bytes`.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 16 << 30;
/// Largest image config a pull takes (the store reads 4 MiB of it).
const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Layers of one pull downloaded at the same time.
const PARALLEL_LAYERS: usize = 3;
/// `layer` events: at most one per this many bytes and this long.
const PROGRESS_BYTES: u64 = 256 << 10;
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// The registry flags of `sandhub serve` (local backend).
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// A Docker-style `config.json` with registry credentials (`auths`:
    /// `auth` as base64 of `user:password`, or `username` and `password`);
    /// read at each pull, so it may change while the hub runs.
    #[arg(long, env = "SANDHUB_REGISTRY_CONFIG")]
    pub registry_config: Option<PathBuf>,

    /// A registry (`HOST:PORT`, as in image references) reached over plain
    /// HTTP instead of HTTPS; repeat it, or comma-separate the env var.
    /// For test registries: loopback is not implied.
    #[arg(
        long = "insecure-registry",
        env = "SANDHUB_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,

    /// Largest image (its config and layer blobs, compressed) a pull
    /// stores; each blob is also held to the size its manifest states, so
    /// a registry cannot fill the disk. Default 16 GiB.
    #[arg(long, env = "SANDHUB_MAX_IMAGE_BYTES", default_value_t = DEFAULT_MAX_IMAGE_BYTES)]
    pub max_image_bytes: u64,
}

impl Default for RegistryArgs {
    fn default() -> Self {
        RegistryArgs {
            registry_config: None,
            insecure_registries: Vec::new(),
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }
}

impl RegistryArgs {
    /// Checks the flags at start: a config file given must parse.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.registry_config {
            let bytes = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("--registry-config {}: {e}", path.display()))?;
            DockerConfig::parse(&bytes).map_err(|e| {
                anyhow::anyhow!("--registry-config {}: {}", path.display(), e.message)
            })?;
        }
        for r in &self.insecure_registries {
            if r.is_empty() || r.contains('/') {
                anyhow::bail!("--insecure-registry {r:?}: expected HOST[:PORT]");
            }
        }
        Ok(())
    }
}

/// What one pull asks beyond its reference.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `name:tag` for the image (default: the reference).
    pub tag: Option<String>,
    /// Credentials for this pull; else the `--registry-config` entry.
    pub credentials: Option<Credentials>,
}

/// The store's pull state: settings, flights, blob locks.
pub struct Pulls {
    args: Mutex<RegistryArgs>,
    flights: Mutex<HashMap<String, Arc<Flight>>>,
    blob_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Blobs in `partial/` checked whole by this process, not yet moved
    /// into `blobs/`, as `<tenant key>/<hex>`.
    verified: Mutex<HashSet<String>>,
}

impl Default for Pulls {
    fn default() -> Self {
        Pulls {
            args: Mutex::new(RegistryArgs::default()),
            flights: Mutex::default(),
            blob_locks: Mutex::default(),
            verified: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Everyone waiting on one pull: its events so far (enough to catch up)
/// and where to send the next.
#[derive(Default)]
struct Flight {
    state: Mutex<FlightState>,
}

#[derive(Default)]
struct FlightState {
    subscribers: Vec<mpsc::UnboundedSender<PullEvent>>,
    /// `resolved` and `layer_done` so far, for a late joiner.
    replay: Vec<PullEvent>,
    last: Option<PullEvent>,
}

impl Flight {
    fn emit(&self, event: PullEvent) {
        let mut s = lock(&self.state);
        if matches!(
            event,
            PullEvent::Resolved { .. } | PullEvent::LayerDone { .. }
        ) {
            s.replay.push(event.clone());
        }
        if event.is_final() {
            s.last = Some(event.clone());
        }
        s.subscribers.retain(|tx| tx.send(event.clone()).is_ok());
        if event.is_final() {
            s.subscribers.clear();
        }
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<PullEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut s = lock(&self.state);
        for e in &s.replay {
            let _ = tx.send(e.clone());
        }
        match &s.last {
            Some(last) => {
                let _ = tx.send(last.clone());
            }
            None => s.subscribers.push(tx),
        }
        rx
    }
}

/// Held while one blob is fetched; forgets the blob's lock when no one
/// else waits on it.
struct BlobLock<'a> {
    pulls: &'a Pulls,
    hex: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for BlobLock<'_> {
    fn drop(&mut self) {
        let mut locks = lock(&self.pulls.blob_locks);
        // The map's reference and ours: nobody else holds or waits.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.hex);
        }
    }
}

impl Pulls {
    /// The hub's registry flags (set once at start).
    pub fn configure(&self, args: RegistryArgs) {
        *lock(&self.args) = args;
    }

    fn args(&self) -> RegistryArgs {
        lock(&self.args).clone()
    }

    fn blob_lock(&self, hex: &str) -> BlobLock<'_> {
        let lock = lock(&self.blob_locks)
            .entry(hex.to_string())
            .or_default()
            .clone();
        BlobLock {
            pulls: self,
            hex: hex.to_string(),
            lock,
        }
    }

    fn is_verified(&self, key: &str) -> bool {
        lock(&self.verified).contains(key)
    }

    /// Forgets a partial blob (`<tenant key>/<hex>`) that was removed.
    pub(super) fn forget(&self, key: &str) {
        lock(&self.verified).remove(key);
    }
}

/// A tenant's directory name under `partial/`: tenant names are not
/// paths.
fn tenant_key(tenant: &str) -> String {
    hex::encode(&Sha256::digest(tenant.as_bytes())[..16])
}

/// The in-flight name that keeps `partial/<key>` from being pruned.
pub(super) fn partial_claim(key: &str) -> String {
    format!("partial/{key}")
}

fn invalid(m: impl Into<String>) -> ErrorBody {
    ErrorBody::new(Code::InvalidArgument, m)
}

fn internal(what: &str, e: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(Code::Internal, format!("{what}: {e}"))
}

/// A disk error: a full disk is `RESOURCE_EXHAUSTED`, the rest `INTERNAL`.
fn disk(what: &str, e: io::Error) -> ErrorBody {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        ErrorBody::new(
            Code::ResourceExhausted,
            format!("{what}: the image store's disk is full"),
        )
    } else {
        internal(what, e)
    }
}

/// A reference as the registry client reads it; checked by the same rule
/// as every other image reference first.
pub fn parse_reference(reference: &str) -> Result<Reference, ErrorBody> {
    validate::image_reference(reference)?;
    if format::sha256_hex(reference).is_some() {
        return Err(invalid(format!(
            "`{reference}` is an image id, not a reference a registry can serve"
        )));
    }
    Reference::try_from(reference)
        .map_err(|e| invalid(format!("image reference `{reference}`: {e}")))
}

/// The manifest an index names for linux on this machine's architecture.
fn this_platform(manifests: &[ImageIndexEntry]) -> Option<String> {
    let arch = format::this_arch();
    manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os.to_string() == "linux" && p.architecture.to_string() == arch)
        })
        .map(|m| m.digest.clone())
}

fn client(args: &RegistryArgs) -> Client {
    static PROVIDER: Once = Once::new();
    // reqwest's rustls has no provider of its own here: ring, as
    // everywhere else in the workspace. Another one installed first is
    // as good.
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    Client::new(ClientConfig {
        protocol: if args.insecure_registries.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(args.insecure_registries.clone())
        },
        platform_resolver: Some(Box::new(this_platform)),
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(60)),
        user_agent: concat!("sandhub/", env!("CARGO_PKG_VERSION")),
        ..Default::default()
    })
}

/// A registry's answer as `{code, message}`, with the upstream code words.
fn registry_error(reference: &str, e: OciDistributionError) -> ErrorBody {
    use OciDistributionError as E;
    let (code, why) = match &e {
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => (
            Code::Unauthenticated,
            "the registry wants credentials (refused or missing: give username and \
             password, or an entry in the hub's --registry-config)"
                .to_string(),
        ),
        E::RegistryError { envelope, .. } => {
            let first = envelope.errors.first();
            let code = match first.map(|e| &e.code) {
                Some(
                    OciErrorCode::ManifestUnknown
                    | OciErrorCode::NameUnknown
                    | OciErrorCode::BlobUnknown,
                ) => Code::NotFound,
                Some(OciErrorCode::Unauthorized) => Code::Unauthenticated,
                Some(OciErrorCode::Denied) => Code::PermissionDenied,
                Some(OciErrorCode::Toomanyrequests) => Code::Unavailable,
                Some(OciErrorCode::Unsupported) => Code::Unimplemented,
                _ => Code::InvalidArgument,
            };
            (code, e.to_string())
        }
        E::ServerError { code, .. } => (
            match code {
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::NotFound,
                429 | 500..=599 => Code::Unavailable,
                _ => Code::InvalidArgument,
            },
            e.to_string(),
        ),
        E::ImageManifestNotFoundError(_) => (
            Code::NotFound,
            format!("{e} (this hub runs linux/{})", format::this_arch()),
        ),
        E::RequestError(r) => (
            Code::Unavailable,
            if r.is_connect() || r.is_timeout() {
                format!("the registry is unreachable: {}", chain(r))
            } else {
                format!("talking to the registry: {}", chain(r))
            },
        ),
        E::IoError(_) => (Code::Unavailable, e.to_string()),
        E::DigestError(_) => (Code::InvalidArgument, e.to_string()),
        E::ManifestParsingError(_)
        | E::VersionedParsingError(_)
        | E::UnsupportedMediaTypeError(_)
        | E::UnsupportedSchemaVersionError(_)
        | E::SpecViolationError(_)
        | E::IncompatibleLayerMediaTypeError(_)
        | E::ManifestEncodingError(_)
        | E::JsonError(_)
        | E::RegistryNoDigestError => (
            Code::InvalidArgument,
            format!("the registry's answer is not a usable image: {e}"),
        ),
        _ => (Code::Internal, e.to_string()),
    };
    ErrorBody::new(code, format!("pulling `{reference}`: {why}"))
}

/// An error and its sources, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        source = inner.source();
    }
    s
}

/// One blob an image needs, as its manifest describes it.
#[derive(Debug, Clone)]
struct Blob {
    hex: String,
    size: u64,
    media_type: String,
}

impl Blob {
    fn of(d: &OciDescriptor, what: &str) -> Result<Blob, ErrorBody> {
        let hex = format::sha256_hex(&d.digest).ok_or_else(|| {
            invalid(format!(
                "{what} digest `{}` is not sha256:<hex> (the only algorithm the store takes)",
                d.digest
            ))
        })?;
        let size = u64::try_from(d.size)
            .map_err(|_| invalid(format!("{what} {} has a negative size", d.digest)))?;
        Ok(Blob {
            hex: hex.to_string(),
            size,
            media_type: d.media_type.clone(),
        })
    }

    fn digest(&self) -> String {
        format!("sha256:{}", self.hex)
    }

    /// Only what the registry needs: no `urls`, so a manifest cannot send
    /// the hub to fetch from anywhere else.
    fn descriptor(&self) -> OciDescriptor {
        OciDescriptor {
            media_type: self.media_type.clone(),
            digest: self.digest(),
            size: self.size as i64,
            ..Default::default()
        }
    }
}

/// Layers are tars, gzip-compressed or not; zstd is not supported yet.
fn check_layer_type(media_type: &str, digest: &str) -> Result<(), ErrorBody> {
    if media_type.contains("zstd") {
        return Err(ErrorBody::new(
            Code::Unimplemented,
            format!("layer {digest} is zstd-compressed ({media_type}): not supported yet"),
        ));
    }
    let tar_like = media_type.is_empty()
        || media_type.ends_with(".tar")
        || media_type.ends_with("tar+gzip")
        || media_type.ends_with("tar.gzip");
    if tar_like {
        Ok(())
    } else {
        Err(invalid(format!(
            "layer {digest} has media type {media_type}: not a container image layer"
        )))
    }
}

impl ImageStore {
    /// `partial/<tenant key>/`, made if missing.
    fn partial_dir(&self, tkey: &str) -> Result<PathBuf, ErrorBody> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.root.join("partial").join(tkey);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| internal("making the store's partial/ directory", e))?;
        Ok(dir)
    }

    /// The registry settings of the hub (`sandhub serve` flags).
    pub fn configure_pulls(&self, args: RegistryArgs) {
        self.pulls.configure(args);
    }

    /// Pulls `reference` for `tenant` into the store. Events go to
    /// `progress` as they happen, the last being `done` or `error`; a pull
    /// already under way for the same reference, tenant, tag and
    /// credentials is joined instead of repeated. The pull itself runs on
    /// its own task: a caller going away does not cut it short for others.
    pub async fn pull(
        self: &Arc<Self>,
        tenant: &str,
        reference: &str,
        opts: PullOptions,
        progress: Option<mpsc::UnboundedSender<PullEvent>>,
    ) -> Result<Image, ErrorBody> {
        let send = |e: PullEvent| {
            if let Some(tx) = &progress {
                let _ = tx.send(e);
            }
        };
        let prepared = self.prepare(reference, opts);
        let (target, tag, auth) = match prepared {
            Ok(p) => p,
            Err(e) => {
                send(PullEvent::Error {
                    code: e.code,
                    message: e.message.clone(),
                });
                return Err(e);
            }
        };
        let who = match &auth {
            RegistryAuth::Basic(u, p) => {
                hex::encode(Sha256::digest(format!("{u}\0{p}").as_bytes()))
            }
            _ => String::new(),
        };
        let key = format!("{tenant}\0{}\0{tag}\0{who}", target.whole());
        let mut rx = {
            let mut flights = lock(&self.pulls.flights);
            if let Some(flight) = flights.get(&key) {
                tracing::info!(reference, "joining a pull under way");
                flight.subscribe()
            } else {
                let flight = Arc::new(Flight::default());
                flights.insert(key.clone(), flight.clone());
                let rx = flight.subscribe();
                let store = self.clone();
                let tenant = tenant.to_string();
                let reference = reference.to_string();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let result = store
                        .run_pull(&tenant, &reference, &target, &tag, auth, &flight)
                        .await;
                    lock(&store.pulls.flights).remove(&key);
                    match result {
                        Ok(image) => {
                            tracing::info!(reference, id = %image.id, secs = started.elapsed().as_secs_f64(), "image pulled");
                            flight.emit(PullEvent::Done { image });
                        }
                        Err(e) => {
                            tracing::warn!(reference, code = %e.code, error = %e.message, "image pull failed");
                            flight.emit(PullEvent::Error {
                                code: e.code,
                                message: e.message,
                            });
                        }
                    }
                });
                rx
            }
        };
        while let Some(event) = rx.recv().await {
            send(event.clone());
            match event {
                PullEvent::Done { image } => return Ok(image),
                PullEvent::Error { code, message } => return Err(ErrorBody::new(code, message)),
                _ => {}
            }
        }
        let e = internal("the pull task", "ended without an answer");
        send(PullEvent::Error {
            code: e.code,
            message: e.message.clone(),
        });
        Err(e)
    }

    /// The reference, the tag the image gets, and the credentials to use.
    fn prepare(
        &self,
        reference: &str,
        opts: PullOptions,
    ) -> Result<(Reference, String, RegistryAuth), ErrorBody> {
        let target = parse_reference(reference)?;
        let tag = opts.tag.filter(|t| !t.is_empty());
        let tag = tag.as_deref().unwrap_or(reference);
        validate::image_reference(tag)?;
        let tag = validate::normalize_image_reference(tag);
        let credentials = match opts.credentials {
            Some(c) => Some(c),
            None => match &self.pulls.args().registry_config {
                Some(path) => {
                    let bytes = std::fs::read(path).map_err(|e| {
                        internal(&format!("reading --registry-config {}", path.display()), e)
                    })?;
                    DockerConfig::parse(&bytes)?.credentials(target.registry())?
                }
                None => None,
            },
        };
        let auth = match credentials {
            Some(c) => RegistryAuth::Basic(c.username, c.password),
            None => RegistryAuth::Anonymous,
        };
        Ok((target, tag, auth))
    }

    async fn run_pull(
        self: &Arc<Self>,
        tenant: &str,
        reference: &str,
        target: &Reference,
        tag: &str,
        auth: RegistryAuth,
        flight: &Flight,
    ) -> Result<Image, ErrorBody> {
        let args = self.pulls.args();
        let client = client(&args);
        let (manifest, digest) = client
            .pull_image_manifest(target, &auth)
            .await
            .map_err(|e| {
                let mut body = registry_error(reference, e);
                let registry = target.resolve_registry();
                if body.code == Code::Unavailable
                    && !args.insecure_registries.iter().any(|r| r == registry)
                {
                    body.message.push_str(&format!(
                        " (over HTTPS: a plain-HTTP registry needs the hub's \
                         --insecure-registry {registry})"
                    ));
                }
                body
            })?;
        let config = Blob::of(&manifest.config, "config")?;
        if config.size > MAX_CONFIG_BYTES {
            return Err(invalid(format!(
                "the image config is {} bytes, more than the {MAX_CONFIG_BYTES} taken",
                config.size
            )));
        }
        let layers = manifest
            .layers
            .iter()
            .map(|d| {
                check_layer_type(&d.media_type, &d.digest)?;
                Blob::of(d, "layer")
            })
            .collect::<Result<Vec<_>, _>>()?;
        let total = layers
            .iter()
            .fold(config.size, |sum, l| sum.saturating_add(l.size));
        if total > args.max_image_bytes {
            return Err(ErrorBody::new(
                Code::ResourceExhausted,
                format!(
                    "`{reference}` is {total} bytes, more than this hub's limit of {} \
                     (--max-image-bytes)",
                    args.max_image_bytes
                ),
            ));
        }
        flight.emit(PullEvent::Resolved {
            reference: target.whole(),
            digest,
            layers: layers
                .iter()
                .map(|l| PullLayer {
                    digest: l.digest(),
                    size: l.size,
                })
                .collect(),
        });
        let tkey = tenant_key(tenant);
        let key = |b: &Blob| format!("{tkey}/{}", b.hex);
        // Held until the pull ends, so no prune takes a blob it fetched.
        let mut claim = self.inflight.claim(
            std::iter::once(&config)
                .chain(&layers)
                .map(|b| partial_claim(&key(b))),
        );
        // The config of an image the tenant holds is its own already
        // (claimed first, so no removal meanwhile takes it).
        claim.extend([config.hex.clone()]);
        let config_file = if self.holds(tenant, &config.digest())? {
            self.blobs.path(&config.hex)
        } else {
            self.check_space(&tkey, std::iter::once(&config))?;
            self.fetch_blob(&client, reference, target, &tkey, &config, &|_| {})
                .await?;
            self.partial_dir(&tkey)?.join(&config.hex)
        };
        // Only the layers of the tenant's own images are not fetched: the
        // rest must come from its registry even when unpacked already.
        let proven = self.proven_layers(tenant, &config_file, &layers)?;
        let wanted: Vec<&Blob> = layers
            .iter()
            .zip(&proven)
            .filter(|(_, p)| !**p)
            .map(|(l, _)| l)
            .collect();
        let mut charge = self.ledger.charge(tenant);
        let room = self
            .check_space(&tkey, wanted.iter().copied())
            .and_then(|need| {
                charge
                    .add(0, need)
                    .map_err(|o| o.error(&format!("pulling `{reference}`")))
            });
        if let Err(e) = room {
            // Refused before any layer: the config fetched is no use.
            self.discard_partials(&tkey, std::iter::once(&config)).await;
            return Err(e);
        }
        let client = &client;
        let tkey = &tkey;
        let fetches =
            layers
                .iter()
                .cloned()
                .zip(proven.clone())
                .map(|(layer, proven)| async move {
                    let digest = layer.digest();
                    if proven {
                        flight.emit(PullEvent::LayerDone {
                            digest,
                            cached: true,
                        });
                        return Ok(());
                    }
                    let total = layer.size;
                    let progress = |downloaded| {
                        flight.emit(PullEvent::Layer {
                            digest: digest.clone(),
                            downloaded,
                            total,
                        })
                    };
                    let cached = self
                        .fetch_blob(client, reference, target, tkey, &layer, &progress)
                        .await?;
                    flight.emit(PullEvent::LayerDone {
                        digest: digest.clone(),
                        cached,
                    });
                    Ok::<_, ErrorBody>(())
                });
        futures::stream::iter(fetches)
            .buffer_unordered(PARALLEL_LAYERS)
            .try_collect::<Vec<()>>()
            .await?;

        let partial = self.partial_dir(tkey)?;
        let blobs: Vec<LayerBlob> = layers
            .iter()
            .zip(&proven)
            .map(|(l, proven)| LayerBlob {
                hex: l.hex.clone(),
                size: l.size,
                file: (!proven).then(|| partial.join(&l.hex)),
            })
            .collect();
        let store = self.clone();
        let (tenant, tag, config_hex) = (tenant.to_string(), tag.to_string(), config.hex.clone());
        let result = tokio::task::spawn_blocking(move || {
            store.register(
                &tenant,
                &config_file,
                &config_hex,
                &blobs,
                Some(&tag),
                charge,
            )
        })
        .await
        .map_err(|e| internal("the image task", e))
        .and_then(|r| r);
        // Stored or refused, the pull's blobs are no use in partial/ any
        // more (the config, if stored, was moved out).
        let fetched = std::iter::once(&config).chain(wanted.iter().copied());
        self.discard_partials(tkey, fetched).await;
        drop(claim);
        result
    }

    /// Removes the partial files of a pull that ended, unless another
    /// pull of the tenant uses them too.
    async fn discard_partials(&self, tkey: &str, blobs: impl Iterator<Item = &Blob>) {
        for b in blobs {
            let key = format!("{tkey}/{}", b.hex);
            let held = self.pulls.blob_lock(&key);
            let _guard = held.lock.lock().await;
            // Ours is one claim; another means another pull needs it.
            if self.inflight.count(&partial_claim(&key)) > 1 {
                continue;
            }
            remove(&self.root.join("partial").join(&key));
            self.pulls.forget(&key);
        }
    }

    /// True when `tenant` holds image `id`.
    fn holds(&self, tenant: &str, id: &str) -> Result<bool, ErrorBody> {
        let Some(hex) = format::sha256_hex(id) else {
            return Ok(false);
        };
        let _g = self.guard();
        Ok(self
            .read_record(hex)?
            .is_some_and(|r| r.tenants.contains_key(tenant)))
    }

    /// Which of a config's layers `tenant` has proven (an image it holds
    /// has that blob for that layer, and the layer is in place): those
    /// need not be fetched. None when the config cannot be read.
    fn proven_layers(
        &self,
        tenant: &str,
        config_file: &Path,
        layers: &[Blob],
    ) -> Result<Vec<bool>, ErrorBody> {
        let count = layers.len();
        let diff_ids = std::fs::read(config_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<format::ImageConfigFile>(&b).ok())
            .and_then(|c| c.rootfs)
            .map(|r| r.diff_ids)
            .unwrap_or_default();
        if diff_ids.len() != count {
            return Ok(vec![false; count]);
        }
        let _g = self.guard();
        let records = self.records()?;
        let proven = super::register::proven_by(&records, tenant);
        Ok(diff_ids
            .iter()
            .zip(layers)
            .map(|(d, blob)| {
                format::sha256_hex(d).is_some_and(|h| {
                    proven.contains(&(blob.hex.as_str(), h)) && self.layer_dir(h).is_dir()
                })
            })
            .collect())
    }

    /// Refuses a pull whose missing blobs cannot fit on the store's disk;
    /// the bytes still to fetch.
    fn check_space<'a>(
        &self,
        tkey: &str,
        blobs: impl Iterator<Item = &'a Blob>,
    ) -> Result<u64, ErrorBody> {
        let partial = self.partial_dir(tkey)?;
        let mut need = 0u64;
        for b in blobs {
            let have = std::fs::metadata(partial.join(&b.hex))
                .map(|m| m.len())
                .unwrap_or(0);
            need = need.saturating_add(b.size.saturating_sub(have));
        }
        let Ok(st) = rustix::fs::statvfs(&self.root) else {
            return Ok(need);
        };
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if need > free {
            return Err(ErrorBody::new(
                Code::ResourceExhausted,
                format!(
                    "the image needs {need} more bytes of blobs; the image store's disk has {free} free"
                ),
            ));
        }
        Ok(need)
    }

    /// Brings one blob into the tenant's `partial/<tkey>/`, whole and
    /// checked. True when nothing had to be fetched.
    async fn fetch_blob(
        &self,
        client: &Client,
        reference: &str,
        target: &Reference,
        tkey: &str,
        blob: &Blob,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<bool, ErrorBody> {
        let key = format!("{tkey}/{}", blob.hex);
        let held = self.pulls.blob_lock(&key);
        let _guard = held.lock.lock().await;
        let path = self.partial_dir(tkey)?.join(&blob.hex);
        let have = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if self.pulls.is_verified(&key) && have == blob.size {
            return Ok(true);
        }
        let digest = blob.digest();
        let mut have = have;
        if have > blob.size {
            remove(&path);
            have = 0;
        }
        // Resuming: hash what is there first.
        let mut hasher = Sha256::new();
        if have > 0 {
            let (p, n) = (path.clone(), have);
            hasher = tokio::task::spawn_blocking(move || hash_prefix(&p, n))
                .await
                .map_err(|e| internal("hashing a partial blob", e))?
                .map_err(|e| disk("reading a partial blob", e))?;
            if have == blob.size {
                if hex::encode(hasher.clone().finalize()) == blob.hex {
                    lock(&self.pulls.verified).insert(key.clone());
                    progress(have);
                    return Ok(false);
                }
                remove(&path);
                have = 0;
                hasher = Sha256::new();
            } else {
                tracing::info!(blob = %digest, have, size = blob.size, "resuming a blob download");
            }
        }
        let desc = blob.descriptor();
        let mut stream: SizedStream = if have > 0 {
            match client
                .pull_blob_stream_partial(target, &desc, have, None)
                .await
                .map_err(|e| registry_error(reference, e))?
            {
                BlobResponse::Partial(s) => s,
                BlobResponse::Full(s) => {
                    // No ranges here: from the start.
                    have = 0;
                    hasher = Sha256::new();
                    s
                }
            }
        } else {
            client
                .pull_blob_stream(target, &desc)
                .await
                .map_err(|e| registry_error(reference, e))?
        };
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(have == 0)
            .open(&path)
            .await
            .map_err(|e| disk("opening a partial blob", e))?;
        if have > 0 {
            // Append after exactly what was hashed.
            file.set_len(have)
                .await
                .map_err(|e| disk("opening a partial blob", e))?;
            use tokio::io::AsyncSeekExt;
            file.seek(io::SeekFrom::Start(have))
                .await
                .map_err(|e| disk("opening a partial blob", e))?;
        }
        let mut written = have;
        let (mut shown, mut shown_at) = (written, Instant::now());
        progress(written);
        let mut cut = None;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                // Whole but refused by the client's own digest check: ours
                // below says so with the store's words.
                Err(_) if written == blob.size => break,
                Err(e) => {
                    cut = Some(e);
                    break;
                }
            };
            if written + chunk.len() as u64 > blob.size {
                drop(file);
                remove(&path);
                return Err(invalid(format!(
                    "pulling `{reference}`: the registry sent more of blob {digest} than its \
                     {} bytes: refused",
                    blob.size
                )));
            }
            hasher.update(&chunk);
            if let Err(e) = file.write_all(&chunk).await {
                drop(file);
                remove(&path);
                return Err(disk(&format!("writing blob {digest}"), e));
            }
            written += chunk.len() as u64;
            if written - shown >= PROGRESS_BYTES && shown_at.elapsed() >= PROGRESS_EVERY {
                progress(written);
                (shown, shown_at) = (written, Instant::now());
            }
        }
        file.sync_all()
            .await
            .map_err(|e| disk(&format!("writing blob {digest}"), e))?;
        drop(file);
        if written < blob.size {
            let why = cut.map(|e| format!(": {}", chain(&e))).unwrap_or_default();
            return Err(ErrorBody::new(
                Code::Unavailable,
                format!(
                    "pulling `{reference}`: the download of {digest} stopped at {written} of {} \
                     bytes{why}; pulling again resumes it",
                    blob.size
                ),
            ));
        }
        let got = hex::encode(hasher.finalize());
        if got != blob.hex {
            remove(&path);
            return Err(invalid(format!(
                "pulling `{reference}`: blob {digest} from the registry has digest sha256:{got}: \
                 corrupt or tampered, refused (nothing of it is kept)"
            )));
        }
        if written != shown {
            progress(written);
        }
        lock(&self.pulls.verified).insert(key);
        Ok(false)
    }
}

/// Pulls at the same time in one prepull.
const PREPULL_PARALLEL: usize = 4;

/// `POST /v1/images/pull`'s body, checked, then pulled.
pub async fn pull_request(
    store: &Arc<ImageStore>,
    tenant: &str,
    request: PullRequest,
    progress: Option<mpsc::UnboundedSender<PullEvent>>,
) -> Result<Image, ErrorBody> {
    let credentials = match (request.username, request.password) {
        (None, None) => None,
        (Some(username), Some(password)) if !username.is_empty() => {
            Some(Credentials { username, password })
        }
        _ => {
            let e = invalid("give both username and password, or neither");
            if let Some(tx) = &progress {
                let _ = tx.send(PullEvent::Error {
                    code: e.code,
                    message: e.message.clone(),
                });
            }
            return Err(e);
        }
    };
    let opts = PullOptions {
        tag: request.tag,
        credentials,
    };
    store.pull(tenant, &request.reference, opts, progress).await
}

/// Checks a pull request before anything is streamed: its reference, tag
/// and credentials.
pub fn check_request(request: &PullRequest) -> Result<(), ErrorBody> {
    parse_reference(&request.reference)?;
    if let Some(tag) = request.tag.as_deref().filter(|t| !t.is_empty()) {
        validate::image_reference(tag)?;
    }
    match (&request.username, &request.password) {
        (None, None) => Ok(()),
        (Some(u), Some(_)) if !u.is_empty() => Ok(()),
        _ => Err(invalid("give both username and password, or neither")),
    }
}

/// Pulls each reference, `max_parallel` (default [`PREPULL_PARALLEL`]) at
/// a time, with the hub's credentials; one item per reference, in order.
/// A bad reference refuses the whole request before anything is pulled;
/// past `timeout_seconds` the unfinished pulls are reported as failed (they
/// go on, and a later pull joins them). The DaemonSet knobs are
/// Kubernetes'.
pub async fn prepull(
    store: &Arc<ImageStore>,
    tenant: &str,
    request: PrepullRequest,
) -> Result<PrepullResult, ErrorBody> {
    request.validate()?;
    for r in &request.references {
        parse_reference(r)?;
    }
    let parallel = request
        .max_parallel
        .map_or(PREPULL_PARALLEL, |n| n as usize);
    let timeout = std::time::Duration::from_secs(
        request
            .timeout_seconds
            .unwrap_or(DEFAULT_PREPULL_TIMEOUT_SECONDS),
    );
    let deadline = tokio::time::Instant::now() + timeout;
    let images: Vec<PrepullImage> = futures::stream::iter(request.references)
        .map(|reference| async move {
            let pull = store.pull(tenant, &reference, PullOptions::default(), None);
            let outcome = match tokio::time::timeout_at(deadline, pull).await {
                Ok(outcome) => outcome,
                Err(_) => Err(ErrorBody::new(
                    Code::DeadlineExceeded,
                    format!("not pulled within {} s", timeout.as_secs()),
                )),
            };
            match outcome {
                Ok(image) => PrepullImage {
                    reference,
                    ok: true,
                    id: Some(image.id),
                    ..Default::default()
                },
                Err(e) => PrepullImage {
                    reference,
                    ok: false,
                    error: Some(format!("{}: {}", e.code, e.message)),
                    ..Default::default()
                },
            }
        })
        .buffered(parallel)
        .collect()
        .await;
    Ok(PrepullResult {
        ok: images.iter().all(|i| i.ok),
        images,
        daemonsets: Vec::new(),
    })
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a partial blob");
        }
    }
}

/// The sha256 state of a file's first `n` bytes.
fn hash_prefix(path: &Path, n: u64) -> io::Result<Sha256> {
    let mut hasher = Sha256::new();
    let mut f = std::fs::File::open(path)?.take(n);
    let mut buf = vec![0u8; 256 << 10];
    let mut read = 0u64;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        hasher.update(&buf[..k]);
        read += k as u64;
    }
    if read != n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the partial blob shrank",
        ));
    }
    Ok(hasher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_types() {
        for ok in [
            "application/vnd.oci.image.layer.v1.tar",
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "",
        ] {
            check_layer_type(ok, "d").unwrap();
        }
        assert_eq!(
            check_layer_type("application/vnd.oci.image.layer.v1.tar+zstd", "d")
                .unwrap_err()
                .code,
            Code::Unimplemented
        );
        assert_eq!(
            check_layer_type("application/vnd.cncf.helm.chart.content.v1.tar+gzip.x", "d")
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn references() {
        let r = parse_reference("127.0.0.1:5000/sandhub/test:latest").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "sandhub/test");
        assert!(parse_reference(&format!("sha256:{}", "a".repeat(64))).is_err());
        assert!(parse_reference("../x").is_err());
    }

    #[test]
    fn a_late_joiner_catches_up() {
        let f = Flight::default();
        let mut early = f.subscribe();
        f.emit(PullEvent::Resolved {
            reference: "r".into(),
            digest: "d".into(),
            layers: vec![],
        });
        f.emit(PullEvent::Layer {
            digest: "l".into(),
            downloaded: 1,
            total: 2,
        });
        let mut late = f.subscribe();
        f.emit(PullEvent::Error {
            code: Code::NotFound,
            message: "m".into(),
        });
        let mut after = f.subscribe();
        let drain = |rx: &mut mpsc::UnboundedReceiver<PullEvent>| {
            let mut v = Vec::new();
            while let Ok(e) = rx.try_recv() {
                v.push(e);
            }
            v
        };
        assert_eq!(drain(&mut early).len(), 3);
        let late = drain(&mut late);
        assert!(matches!(late[0], PullEvent::Resolved { .. }));
        assert!(late[1].is_final() && late.len() == 2);
        assert_eq!(drain(&mut after).len(), 2);
    }
}
