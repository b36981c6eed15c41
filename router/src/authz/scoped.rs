//! Scoped tokens: `v1.<payload>.<signature>`, where `payload` is the
//! unpadded base64url of `{"namespace":…,"name":…,"exp":<unix seconds>}` and
//! `signature` the unpadded base64url of HMAC-SHA256(secret, "v1." + payload).
//! A token opens exactly one sandbox until it expires.

use std::{path::Path, time::SystemTime};

use anyhow::{bail, Context};
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

pub const MIN_SECRET_LEN: usize = 32;
const VERSION_PREFIX: &str = "v1.";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scope {
    pub namespace: String,
    pub name: String,
    /// Expiry, Unix seconds.
    pub exp: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScopedTokenError {
    #[error("malformed scoped token")]
    Malformed,
    #[error("bad scoped token signature")]
    BadSignature,
    #[error("scoped token expired")]
    Expired,
}

pub struct ScopedTokens {
    secret: Vec<u8>,
}

impl std::fmt::Debug for ScopedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScopedTokens { secret: <redacted> }")
    }
}

impl ScopedTokens {
    pub fn new(secret: Vec<u8>) -> anyhow::Result<Self> {
        if secret.len() < MIN_SECRET_LEN {
            bail!(
                "the scoped-token secret has {} bytes; at least {MIN_SECRET_LEN} are required",
                secret.len()
            );
        }
        Ok(Self { secret })
    }

    /// Reads the secret file; trailing whitespace (a final newline) is not part of it.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let mut bytes = std::fs::read(path)
            .with_context(|| format!("reading scoped-token secret {}", path.display()))?;
        while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
            bytes.pop();
        }
        Self::new(bytes).with_context(|| format!("secret file {}", path.display()))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.secret).expect("HMAC takes keys of any length")
    }

    pub fn mint(&self, scope: &Scope) -> String {
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(scope).expect("plain struct"));
        let mut mac = self.mac();
        mac.update(VERSION_PREFIX.as_bytes());
        mac.update(payload.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{VERSION_PREFIX}{payload}.{sig}")
    }

    /// The token's scope, once its signature (compared in constant time) and
    /// expiry check out.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Scope, ScopedTokenError> {
        let rest = token
            .strip_prefix(VERSION_PREFIX)
            .ok_or(ScopedTokenError::Malformed)?;
        let (payload, sig) = rest.split_once('.').ok_or(ScopedTokenError::Malformed)?;
        let sig = URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| ScopedTokenError::Malformed)?;
        let mut mac = self.mac();
        mac.update(VERSION_PREFIX.as_bytes());
        mac.update(payload.as_bytes());
        mac.verify_slice(&sig)
            .map_err(|_| ScopedTokenError::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| ScopedTokenError::Malformed)?;
        let scope: Scope =
            serde_json::from_slice(&json).map_err(|_| ScopedTokenError::Malformed)?;
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if now >= scope.exp {
            return Err(ScopedTokenError::Expired);
        }
        Ok(scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tokens() -> ScopedTokens {
        ScopedTokens::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap()
    }

    #[test]
    fn round_trip_and_rejections() {
        let t = tokens();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let scope = Scope {
            namespace: "ns".into(),
            name: "sb".into(),
            exp: 2_000,
        };
        let tok = t.mint(&scope);
        assert!(tok.starts_with("v1."));
        assert_eq!(t.verify(&tok, now), Ok(scope));
        let late = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000);
        assert_eq!(t.verify(&tok, late), Err(ScopedTokenError::Expired));
        let mut forged = tok.clone();
        forged.pop();
        forged.push(if tok.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(t.verify(&forged, now), Err(ScopedTokenError::BadSignature));
        assert_eq!(t.verify("v2.x.y", now), Err(ScopedTokenError::Malformed));
        let other = ScopedTokens::new(vec![7; 32]).unwrap();
        assert_eq!(other.verify(&tok, now), Err(ScopedTokenError::BadSignature));
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(ScopedTokens::new(vec![1; 31]).is_err());
    }
}
