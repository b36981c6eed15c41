//! The per-hub CA that signs the certificates the gateway shows a
//! sandbox when it brokers a secret, and the bounded cache of those
//! leaf certificates.
//!
//! On Kubernetes the CA lives in a Kubernetes Secret that the egress
//! proxy replicas share ([`Authority::generate`], [`Authority::from_pem`]).
//!
//! The CA is made once into the hub's state dir (`egress-ca/ca.pem`,
//! `egress-ca/ca-key.pem`, the key 0600 in a 0700 directory) and loaded
//! on every start after, so sandboxes that outlive a hub restart keep
//! trusting it. Its subject is fixed: loading rebuilds the issuer from
//! the same parameters and the key (rcgen derives the key identifier
//! from the key), so no certificate parser is needed.

use std::{
    collections::HashMap,
    io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::{pki_types::PrivateKeyDer, sign::CertifiedKey};

/// Leaf certificates kept at once; past it the cache starts over (a
/// leaf costs a key generation and a signature).
pub const LEAF_CACHE: usize = 1024;
/// A leaf is valid for 30 days and reused for 7, so a long-running hub
/// never shows an expired one.
const LEAF_VALID: Duration = Duration::from_secs(30 * 86400);
const LEAF_REUSE: Duration = Duration::from_secs(7 * 86400);

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Sandhub egress gateway CA");
    dn.push(DnType::OrganizationName, "Sandhub");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = rcgen::date_time_ymd(2025, 1, 1);
    p.not_after = rcgen::date_time_ymd(2045, 1, 1);
    p
}

/// The hub's CA.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    leaves: Mutex<HashMap<String, (Instant, Arc<CertifiedKey>)>>,
}

impl Authority {
    /// Loads the CA from `dir`, or makes it there.
    pub fn load_or_create(dir: &Path) -> io::Result<Authority> {
        let (cert, key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        let (cert_pem, key_pem) = match (std::fs::read_to_string(&cert), std::fs::read(&key)) {
            (Ok(c), Ok(k)) => {
                let mode = std::fs::metadata(&key)?.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(other(format!(
                        "{}: mode {:o}; the CA key must be readable by its owner only (0600)",
                        key.display(),
                        mode & 0o777
                    )));
                }
                (c, String::from_utf8(k).map_err(other)?)
            }
            _ => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
                let kp = KeyPair::generate().map_err(other)?;
                let c = ca_params().self_signed(&kp).map_err(other)?;
                // The key first, 0600 from its creation; the certificate
                // last, so a half-made CA is made again, not loaded.
                let tmp = dir.join(format!(".ca-key.{}", std::process::id()));
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                io::Write::write_all(&mut f, kp.serialize_pem().as_bytes())?;
                f.sync_all()?;
                std::fs::rename(&tmp, &key)?;
                std::fs::write(&cert, c.pem())?;
                (c.pem(), kp.serialize_pem())
            }
        };
        Authority::from_pem(cert_pem, &key_pem)
    }

    /// A new CA: (certificate PEM, key PEM). For a store other than a
    /// directory (the egress proxy's Kubernetes Secret).
    pub fn generate() -> io::Result<(String, String)> {
        let kp = KeyPair::generate().map_err(other)?;
        let c = ca_params().self_signed(&kp).map_err(other)?;
        Ok((c.pem(), kp.serialize_pem()))
    }

    /// The CA from its certificate and key (as [`Authority::generate`]
    /// made them). The subject is fixed, so the issuer is rebuilt from the
    /// key alone; `cert_pem` is what sandboxes are told to trust.
    pub fn from_pem(cert_pem: String, key_pem: &str) -> io::Result<Authority> {
        let kp = KeyPair::from_pem(key_pem).map_err(other)?;
        Ok(Authority {
            issuer: Issuer::new(ca_params(), kp),
            cert_pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM (what sandboxes trust).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for `name` signed by the CA (cached).
    pub fn leaf(&self, name: &str) -> io::Result<Arc<CertifiedKey>> {
        if let Some((made, k)) = self
            .leaves
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            if made.elapsed() < LEAF_REUSE {
                return Ok(k.clone());
            }
        }
        let kp = KeyPair::generate().map_err(other)?;
        let mut p = CertificateParams::new(vec![name.to_string()]).map_err(other)?;
        p.distinguished_name
            .push(DnType::CommonName, name.to_string());
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = std::time::SystemTime::now();
        p.not_before = (now - Duration::from_secs(3600)).into();
        p.not_after = (now + LEAF_VALID).into();
        let cert = p.signed_by(&kp, &self.issuer).map_err(other)?;
        let key = PrivateKeyDer::try_from(kp.serialize_der()).map_err(other)?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(other)?;
        let ck = Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing));
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if leaves.len() >= LEAF_CACHE {
            leaves.clear();
        }
        leaves.insert(name.to_string(), (Instant::now(), ck.clone()));
        Ok(ck)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_with_a_private_key_and_loaded_after() {
        let dir = tempfile_dir();
        let a = Authority::load_or_create(&dir).unwrap();
        let mode = std::fs::metadata(dir.join("ca-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = Authority::load_or_create(&dir).unwrap();
        assert_eq!(a.cert_pem(), b.cert_pem());
        assert!(b.leaf("api.test").is_ok());
        // A key others may read is refused, not used.
        std::fs::set_permissions(
            dir.join("ca-key.pem"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert!(Authority::load_or_create(&dir).is_err());
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn a_generated_ca_loads_from_its_pem_and_junk_is_refused() {
        let (cert, key) = Authority::generate().unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        let a = Authority::from_pem(cert.clone(), &key).unwrap();
        assert_eq!(a.cert_pem(), cert);
        assert!(a.leaf("api.test").is_ok());
        assert!(Authority::from_pem(cert, "not a key").is_err());
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sandhub-ca-test-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        d.join("egress-ca")
    }
}
