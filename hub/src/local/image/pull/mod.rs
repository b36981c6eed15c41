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
//! # Layout
//!
//! ```text
//! mod.rs       a pull from manifest to record (resolve, claim, fetch,
//!              register); the request and prepull entry points
//! fetch.rs     the fetch engine: the registry client, a blob into partial/
//!              (resumed, bounded, checked), the registry's errors
//! coalesce.rs  Pulls: one flight per reference, tenant and credentials,
//!              one fetch per blob at a time
//! ```

mod coalesce;
mod fetch;

use std::{path::Path, sync::Arc};

use futures::{StreamExt, TryStreamExt};
use oci_client::{secrets::RegistryAuth, Reference};
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{
        Image, PrepullImage, PrepullRequest, PrepullResult, PullEvent, PullLayer, PullRequest,
        DEFAULT_PREPULL_TIMEOUT_SECONDS,
    },
    validate,
};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use coalesce::Flight;
pub use coalesce::Pulls;
use fetch::{check_layer_type, client, registry_error, remove, Blob};

use super::{
    format,
    register::LayerBlob,
    registry_auth::{Credentials, DockerConfig},
    ImageStore,
};
use crate::local::RegistryArgs;

/// Largest image config a pull takes (the store reads 4 MiB of it).
const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Layers of one pull downloaded at the same time.
const PARALLEL_LAYERS: usize = 3;

/// What one pull asks beyond its reference.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `name:tag` for the image (default: the reference).
    pub tag: Option<String>,
    /// Credentials for this pull; else the `--registry-config` entry.
    pub credentials: Option<Credentials>,
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

/// A reference as the registry client reads it; checked first by the
/// API's rule for a reference a registry can serve.
pub fn parse_reference(reference: &str) -> Result<Reference, ErrorBody> {
    validate::registry_reference(reference)?;
    Reference::try_from(reference)
        .map_err(|e| invalid(format!("image reference `{reference}`: {e}")))
}

impl ImageStore {
    /// The registry settings of the hub (`sandhub serve` flags).
    pub fn configure_pulls(&self, args: RegistryArgs) {
        self.pulls.configure(args);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = parse_reference("127.0.0.1:5000/sandhub/test:latest").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "sandhub/test");
        assert!(parse_reference(&format!("sha256:{}", "a".repeat(64))).is_err());
        assert!(parse_reference("../x").is_err());
    }
}
