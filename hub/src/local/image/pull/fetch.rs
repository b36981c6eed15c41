//! The fetch engine: the registry client (its settings and its errors in
//! the store's words) and one blob brought into `partial/<tenant key>/`,
//! resumed with a Range request after a cut, bounded by the descriptor's
//! size and checked against its sha256.

use std::{
    io::{self, Read},
    path::{Path, PathBuf},
    sync::Once,
    time::{Duration, Instant},
};

use futures::StreamExt;
use oci_client::{
    client::{BlobResponse, ClientConfig, ClientProtocol, SizedStream},
    errors::{OciDistributionError, OciErrorCode},
    manifest::{ImageIndexEntry, OciDescriptor},
    Client, Reference,
};
use sandhub_api::error::{Code, ErrorBody};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{internal, invalid};
use crate::local::{
    image::{format, ImageStore},
    RegistryArgs,
};

/// `layer` events: at most one per this many bytes and this long.
const PROGRESS_BYTES: u64 = 256 << 10;
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

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

pub(super) fn client(args: &RegistryArgs) -> Client {
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
pub(super) fn registry_error(reference: &str, e: OciDistributionError) -> ErrorBody {
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
pub(super) struct Blob {
    pub(super) hex: String,
    pub(super) size: u64,
    media_type: String,
}

impl Blob {
    pub(super) fn of(d: &OciDescriptor, what: &str) -> Result<Blob, ErrorBody> {
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

    pub(super) fn digest(&self) -> String {
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
pub(super) fn check_layer_type(media_type: &str, digest: &str) -> Result<(), ErrorBody> {
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
    pub(super) fn partial_dir(&self, tkey: &str) -> Result<PathBuf, ErrorBody> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.root.join("partial").join(tkey);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| internal("making the store's partial/ directory", e))?;
        Ok(dir)
    }

    /// Refuses a pull whose missing blobs cannot fit on the store's disk;
    /// the bytes still to fetch.
    pub(super) fn check_space<'a>(
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
    pub(super) async fn fetch_blob(
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
                    self.pulls.mark_verified(key.clone());
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
        self.pulls.mark_verified(key);
        Ok(false)
    }
}

pub(super) fn remove(path: &Path) {
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
}
