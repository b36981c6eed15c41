//! The TLS listener's configuration, with client certificates (mTLS) off,
//! optional or required, reloaded when the certificate, key or CA files
//! change (Kubernetes swaps Secret files under a running Pod).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::{bail, Context};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
use sha2::{Digest, Sha256};

use crate::{
    config::MtlsMode,
    metrics::{Metrics, OutcomeLabels},
};

/// How often the files are checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    pub mode: MtlsMode,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds a server config from the files as they are now.
pub fn build(files: &TlsFiles) -> anyhow::Result<ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .with_context(|| format!("reading {}", files.cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing certificates in {}", files.cert.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", files.cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading a private key from {}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match files.mode {
        MtlsMode::Off => builder.with_no_client_auth(),
        MtlsMode::Optional | MtlsMode::Required => {
            let ca = files
                .client_ca
                .as_ref()
                .context("--mtls-mode optional/required needs --tls-client-ca-file")?;
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("reading {}", ca.display()))?
            {
                roots
                    .add(cert.with_context(|| format!("parsing {}", ca.display()))?)
                    .with_context(|| format!("adding a CA from {}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = if files.mode == MtlsMode::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder
                .with_client_cert_verifier(verifier.build().context("client certificate verifier")?)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("certificate and key do not match")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The current config; each new connection takes the latest.
pub struct TlsState {
    current: RwLock<Arc<ServerConfig>>,
}

impl TlsState {
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn fingerprint(files: &TlsFiles) -> Option<[u8; 32]> {
    let mut h = Sha256::new();
    let paths: [Option<&Path>; 3] = [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_deref(),
    ];
    for p in paths.into_iter().flatten() {
        h.update(std::fs::read(p).ok()?);
        h.update([0]);
    }
    Some(h.finalize().into())
}

/// Loads the files (failing startup if they are bad) and starts watching them.
pub fn start(files: TlsFiles, metrics: Arc<Metrics>) -> anyhow::Result<Arc<TlsState>> {
    let state = Arc::new(TlsState {
        current: RwLock::new(Arc::new(build(&files)?)),
    });
    let watched = state.clone();
    tokio::spawn(async move {
        let mut seen = fingerprint(&files);
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = fingerprint(&files);
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            // A half-written pair fails here and succeeds on a later change.
            let outcome = match build(&files) {
                Ok(config) => {
                    *watched.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                    tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                    "success"
                }
                Err(e) => {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "TLS reload failed; keeping the previous certificate"
                    );
                    "failure"
                }
            };
            metrics
                .cert_reloads
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
        }
    });
    Ok(state)
}
