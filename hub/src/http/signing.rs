//! Tokens the hub signs for itself, so nothing needs storing: E2B's envd
//! access tokens and the browser tokens of host-routed ports.
//!
//! A token is `<tenant, base64url>.<HMAC-SHA256(key, tenant NUL scope)>`:
//! it names its tenant (its bearer carries no API key) and opens only its
//! scope (a sandbox; a sandbox's port until a deadline), so a token for one
//! opens no other.
//!
//! Where the key comes from:
//! - the operator's `--signing-key-file` (a mounted Secret): one key per
//!   line, newest first. Every replica of a hub on Kubernetes reads the same
//!   file, so a token one replica signed opens on every other and outlives
//!   restarts. Tokens are signed with the first key and accepted under any,
//!   so a rotation puts the new key first and drops the old one after the
//!   longest token's lifetime;
//! - otherwise, on the local backend, the hub's own key in its state dir
//!   (0600), made on first start.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::Context;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

const KEY_LEN: usize = 32;
/// More keys than this in one file is a mistake, not a rotation.
const MAX_KEYS: usize = 8;
/// What a key's fingerprint is the MAC of: it names the key in logs and in
/// the cluster's record of the replicas' key (`kube::signing`), and reveals
/// nothing of it.
const FINGERPRINT_DOMAIN: &[u8] = b"sandhub-signing-key-fingerprint/v1";

/// The keys, newest first; never printed.
pub struct Tokens {
    keys: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens {{ fingerprints: {:?} }}", self.fingerprints())
    }
}

impl Tokens {
    /// The key at `path`, made (random, 0600) if there is none.
    pub fn load_or_create(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let key: [u8; KEY_LEN] = bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("{}: not a {KEY_LEN}-byte key", path.display()))?;
                Ok(Tokens {
                    keys: vec![key.to_vec()],
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let tokens = Tokens::random();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                file.write_all(&tokens.keys[0])?;
                file.sync_all()?;
                Ok(tokens)
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The operator's keys: one per line, newest first, each at least
    /// [`KEY_LEN`] bytes once its surrounding whitespace is cut; blank
    /// lines and `#` comments are skipped.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("{}", path.display()))
    }

    fn parse(text: &[u8]) -> anyhow::Result<Self> {
        let mut keys = Vec::new();
        for (n, line) in text.split(|b| *b == b'\n').enumerate() {
            let line = line.trim_ascii();
            if line.is_empty() || line.starts_with(b"#") {
                continue;
            }
            anyhow::ensure!(
                line.len() >= KEY_LEN,
                "line {}: a signing key needs at least {KEY_LEN} bytes, this one has {}",
                n + 1,
                line.len()
            );
            keys.push(line.to_vec());
        }
        anyhow::ensure!(!keys.is_empty(), "no signing key in the file");
        anyhow::ensure!(
            keys.len() <= MAX_KEYS,
            "{} signing keys; at most {MAX_KEYS} (newest first) are accepted",
            keys.len()
        );
        Ok(Tokens { keys })
    }

    /// A key for this process only (tokens die with it).
    pub fn random() -> Self {
        Tokens {
            keys: vec![rand::random::<[u8; KEY_LEN]>().to_vec()],
        }
    }

    /// Each key's fingerprint, newest first: 16 hex digits of a MAC under
    /// its own domain, so equal fingerprints mean equal keys and nothing
    /// about a key can be learned from its fingerprint.
    pub fn fingerprints(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|key| {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
                mac.update(FINGERPRINT_DOMAIN);
                mac.finalize().into_bytes()[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            })
            .collect()
    }

    fn mac(key: &[u8], tenant: &str, scope: &str) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
        mac.update(tenant.as_bytes());
        mac.update(b"\0");
        mac.update(scope.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// A token for `tenant` that opens `scope` (no NUL in either).
    pub fn issue(&self, tenant: &str, scope: &str) -> String {
        format!(
            "{}.{}",
            B64.encode(tenant),
            B64.encode(Self::mac(&self.keys[0], tenant, scope))
        )
    }

    /// The tenant `token` names, NOT verified: only for finding the scope
    /// to check it against (a volume's, which depends on the tenant's
    /// volume) before [`Tokens::verify`] decides.
    pub fn claimed_tenant(token: &str) -> Option<String> {
        let (tenant, _) = token.split_once('.')?;
        String::from_utf8(B64.decode(tenant).ok()?).ok()
    }

    /// The tenant `token` was issued to, if it opens `scope` under any of
    /// the keys (every key is tried, so the time taken does not say which
    /// one matched).
    pub fn verify(&self, token: &str, scope: &str) -> Option<String> {
        let (tenant, mac) = token.split_once('.')?;
        let tenant = String::from_utf8(B64.decode(tenant).ok()?).ok()?;
        let mac = B64.decode(mac).ok()?;
        let mut ok = subtle::Choice::from(0);
        for key in &self.keys {
            ok |= Self::mac(key, &tenant, scope)
                .as_slice()
                .ct_eq(mac.as_slice());
        }
        bool::from(ok).then_some(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_own_sandbox_only() {
        let t = Tokens::random();
        let token = t.issue("alice", "sb-1");
        assert_eq!(t.verify(&token, "sb-1").as_deref(), Some("alice"));
        assert_eq!(t.verify(&token, "sb-2"), None);
        // Renaming the tenant in the token breaks its MAC.
        let forged = format!("{}.{}", B64.encode("bob"), token.split_once('.').unwrap().1);
        assert_eq!(t.verify(&forged, "sb-1"), None);
        assert_eq!(Tokens::random().verify(&token, "sb-1"), None);
        for junk in ["", ".", "a.b", "no-dot", "!!.??"] {
            assert_eq!(t.verify(junk, "sb-1"), None, "{junk}");
        }
    }

    #[test]
    fn the_key_is_kept_across_loads_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e2b").join("token.key");
        let a = Tokens::load_or_create(&path).unwrap();
        let b = Tokens::load_or_create(&path).unwrap();
        assert_eq!(b.verify(&a.issue("t", "s"), "s").as_deref(), Some("t"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, b"short").unwrap();
        assert!(Tokens::load_or_create(&path).is_err());
    }

    const OLD: &str = "old-key-old-key-old-key-old-key-old-key";
    const NEW: &str = "new-key-new-key-new-key-new-key-new-key";

    #[test]
    fn a_rotation_signs_with_the_newest_key_and_accepts_the_previous() {
        let before = Tokens::parse(OLD.as_bytes()).unwrap();
        let rotated =
            Tokens::parse(format!("# newest first\n{NEW}\n\n  {OLD}  \n").as_bytes()).unwrap();
        let after = Tokens::parse(NEW.as_bytes()).unwrap();
        let old_token = before.issue("t", "sb");
        // During the grace period both keys open old and new tokens...
        assert_eq!(rotated.verify(&old_token, "sb").as_deref(), Some("t"));
        let new_token = rotated.issue("t", "sb");
        assert_eq!(after.verify(&new_token, "sb").as_deref(), Some("t"));
        // ...and a replica still on the old key alone refuses new ones,
        // which is why the new key goes in as the second line first.
        assert_eq!(before.verify(&new_token, "sb"), None);
        // Once the old key is dropped, its tokens stop opening anything.
        assert_eq!(after.verify(&old_token, "sb"), None);
        assert_eq!(
            rotated.fingerprints(),
            [
                after.fingerprints()[0].clone(),
                before.fingerprints()[0].clone()
            ]
        );
        assert_ne!(before.fingerprints(), after.fingerprints());
        assert!(
            !format!("{rotated:?}").contains("key-"),
            "keys are never printed"
        );
    }

    #[test]
    fn bad_key_files_are_refused_with_the_reason() {
        for (text, why) in [
            ("", "no signing key"),
            ("# only a comment\n", "no signing key"),
            ("short\n", "line 1"),
            (&format!("{NEW}\nshort"), "line 2"),
            (&format!("{NEW}\n").repeat(9), "at most 8"),
        ] {
            let err = format!("{:#}", Tokens::parse(text.as_bytes()).unwrap_err());
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
