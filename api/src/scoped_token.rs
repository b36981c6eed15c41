//! Scoped tokens, the router's `scoped-token` authz: `v1.<payload>.<sig>`,
//! where `payload` is the unpadded base64url of
//! `{"namespace":…,"name":…,"exp":<unix seconds>}` and `sig` the unpadded
//! base64url of HMAC-SHA256(secret, "v1." + payload). The hub mints them and
//! the router verifies them, so the format lives here, once.

use std::time::SystemTime;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Shorter secrets are refused: HMAC-SHA256 wants a full-strength key.
pub const MIN_SECRET_LEN: usize = 32;
const VERSION_PREFIX: &str = "v1.";

/// What a token opens: one sandbox, until `exp`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scope {
    pub namespace: String,
    pub name: String,
    /// Expiry, Unix seconds.
    pub exp: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopedTokenError {
    Malformed,
    BadSignature,
    Expired,
}

impl std::fmt::Display for ScopedTokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ScopedTokenError::Malformed => "malformed scoped token",
            ScopedTokenError::BadSignature => "bad scoped token signature",
            ScopedTokenError::Expired => "scoped token expired",
        })
    }
}

impl std::error::Error for ScopedTokenError {}

/// The HMAC key; never printed.
pub struct ScopedTokens {
    secret: Vec<u8>,
}

impl std::fmt::Debug for ScopedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScopedTokens { secret: <redacted> }")
    }
}

impl ScopedTokens {
    /// `secret` without trailing whitespace (a file's final newline is not
    /// part of the key); at least [`MIN_SECRET_LEN`] bytes.
    pub fn new(mut secret: Vec<u8>) -> Result<Self, String> {
        while secret.last().is_some_and(|b| b.is_ascii_whitespace()) {
            secret.pop();
        }
        if secret.len() < MIN_SECRET_LEN {
            return Err(format!(
                "the scoped-token secret has {} bytes; at least {MIN_SECRET_LEN} are required",
                secret.len()
            ));
        }
        Ok(Self { secret })
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

    /// The token's scope, once its signature (checked in constant time) and
    /// its expiry hold.
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
        ScopedTokens::new(vec![7u8; 32]).unwrap()
    }

    fn scope(exp: u64) -> Scope {
        Scope {
            namespace: "ns".into(),
            name: "sb-1".into(),
            exp,
        }
    }

    #[test]
    fn minted_tokens_verify_until_they_expire() {
        let t = tokens();
        let token = t.mint(&scope(100));
        assert!(token.starts_with("v1."));
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(t.verify(&token, at(99)), Ok(scope(100)));
        assert_eq!(t.verify(&token, at(100)), Err(ScopedTokenError::Expired));
    }

    #[test]
    fn tampering_and_other_keys_are_rejected() {
        let token = tokens().mint(&scope(u64::MAX));
        let other = ScopedTokens::new(vec![8u8; 32]).unwrap();
        assert_eq!(
            other.verify(&token, SystemTime::now()),
            Err(ScopedTokenError::BadSignature)
        );
        let forged_payload =
            URL_SAFE_NO_PAD.encode(br#"{"namespace":"ns","name":"sb-2","exp":99999999999}"#);
        let sig = token.rsplit('.').next().unwrap();
        assert_eq!(
            tokens().verify(&format!("v1.{forged_payload}.{sig}"), SystemTime::now()),
            Err(ScopedTokenError::BadSignature)
        );
        assert_eq!(
            tokens().verify("v2.x.y", SystemTime::now()),
            Err(ScopedTokenError::Malformed)
        );
        assert!(ScopedTokens::new(b"short\n".to_vec()).is_err());
    }
}
