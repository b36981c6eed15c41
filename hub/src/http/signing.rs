//! Tokens the hub signs for itself, so nothing needs storing: E2B's envd
//! access tokens and the browser tokens of host-routed ports.
//!
//! A token is `<tenant, base64url>.<HMAC-SHA256(key, tenant NUL scope)>`:
//! it names its tenant (its bearer carries no API key) and opens only its
//! scope (a sandbox; a sandbox's port until a deadline), so a token for one
//! opens no other. The key is the hub's own, kept in its state dir (0600)
//! so tokens outlive a restart.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::Context;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

const KEY_LEN: usize = 32;

pub struct Tokens {
    key: [u8; KEY_LEN],
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
                Ok(Tokens { key })
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
                file.write_all(&tokens.key)?;
                file.sync_all()?;
                Ok(tokens)
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// A key for this process only (tokens die with it).
    pub fn random() -> Self {
        Tokens {
            key: rand::random(),
        }
    }

    fn mac(&self, tenant: &str, scope: &str) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
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
            B64.encode(self.mac(tenant, scope))
        )
    }

    /// The tenant `token` was issued to, if it opens `scope`.
    pub fn verify(&self, token: &str, scope: &str) -> Option<String> {
        let (tenant, mac) = token.split_once('.')?;
        let tenant = String::from_utf8(B64.decode(tenant).ok()?).ok()?;
        let mac = B64.decode(mac).ok()?;
        let want = self.mac(&tenant, scope);
        bool::from(want.as_slice().ct_eq(mac.as_slice())).then_some(tenant)
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
}
