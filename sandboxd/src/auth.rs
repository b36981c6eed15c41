//! Optional bearer-token auth. Only the SHA-256 of the token is kept in
//! memory, and a presented token is hashed and compared in constant time,
//! so neither timing nor a memory dump reveals the token.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::Error;

#[derive(Clone)]
pub struct Auth {
    digest: [u8; 32],
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth(<redacted>)")
    }
}

impl Auth {
    pub fn from_token(token: &str) -> Result<Self, String> {
        if token.is_empty() {
            return Err("auth token is empty".into());
        }
        Ok(Auth {
            digest: Sha256::digest(token.as_bytes()).into(),
        })
    }

    pub fn from_file(path: &Path) -> Result<Self, String> {
        let raw = std::fs::read_to_string(path)
            .map_err(|e| format!("reading auth token file {}: {e}", path.display()))?;
        Self::from_token(raw.trim())
    }

    pub fn from_sha256_hex(hex_digest: &str) -> Result<Self, String> {
        let bytes = hex::decode(hex_digest.trim())
            .map_err(|e| format!("--auth-token-sha256 is not hex: {e}"))?;
        let digest: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "--auth-token-sha256 must be 64 hex characters".to_string())?;
        Ok(Auth { digest })
    }

    /// Checks an `Authorization` header value (`Bearer <token>`).
    pub fn check_header(&self, header: Option<&[u8]>) -> Result<(), Error> {
        let Some(value) = header else {
            return Err(Error::Unauthenticated(
                "missing Authorization: Bearer <token>".into(),
            ));
        };
        let token = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .ok_or_else(|| Error::Unauthenticated("Authorization must be a Bearer token".into()))?;
        let presented: [u8; 32] = Sha256::digest(token).into();
        if bool::from(presented.ct_eq(&self.digest)) {
            Ok(())
        } else {
            Err(Error::Unauthenticated("invalid bearer token".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_token() {
        let a = Auth::from_token("s3cret").unwrap();
        assert!(a.check_header(Some(b"Bearer s3cret")).is_ok());
        assert!(a.check_header(Some(b"Bearer s3cret ")).is_err());
        assert!(a.check_header(Some(b"Bearer other")).is_err());
        assert!(a.check_header(Some(b"s3cret")).is_err());
        assert!(a.check_header(None).is_err());
    }

    #[test]
    fn sha256_form_matches_token_form() {
        let hex_digest = hex::encode(Sha256::digest(b"tok"));
        let a = Auth::from_sha256_hex(&hex_digest).unwrap();
        assert!(a.check_header(Some(b"Bearer tok")).is_ok());
        assert!(Auth::from_sha256_hex("abcd").is_err());
        assert!(Auth::from_token("").is_err());
    }
}
