//! Optional bearer-token auth. Only the SHA-256 of a token is kept in
//! memory, and a presented token is hashed and compared in constant time,
//! so neither timing nor a memory dump reveals the token.
//!
//! Up to two tokens open one sandboxd: the operator's (`--auth-token-file`
//! or `--auth-token-sha256`, the upstream SDK's `auth_token`, the same for
//! every Pod that mounts it) and the sandbox's own
//! (`--sandbox-token-sha256`, which sandhub-controller gives each Pod: a
//! token that opens this Pod and no other).

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::Error;

#[derive(Clone)]
pub struct Auth {
    /// Each accepted token's SHA-256 (one or two).
    digests: Vec<[u8; 32]>,
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
            digests: vec![Sha256::digest(token.as_bytes()).into()],
        })
    }

    pub fn from_file(path: &Path) -> Result<Self, String> {
        let raw = std::fs::read_to_string(path)
            .map_err(|e| format!("reading auth token file {}: {e}", path.display()))?;
        Self::from_token(raw.trim())
    }

    pub fn from_sha256_hex(hex_digest: &str) -> Result<Self, String> {
        Ok(Auth {
            digests: vec![parse_digest("--auth-token-sha256", hex_digest)?],
        })
    }

    /// `self` (if any) plus the token whose hex SHA-256 is `hex_digest`
    /// (`--sandbox-token-sha256`).
    pub fn also_sha256_hex(auth: Option<Self>, hex_digest: &str) -> Result<Self, String> {
        let digest = parse_digest("--sandbox-token-sha256", hex_digest)?;
        let mut digests = auth.map(|a| a.digests).unwrap_or_default();
        digests.push(digest);
        Ok(Auth { digests })
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
        // Every digest is compared (no early exit), so timing does not say
        // which one matched.
        let matched = self
            .digests
            .iter()
            .fold(subtle::Choice::from(0), |m, d| m | presented.ct_eq(d));
        if bool::from(matched) {
            Ok(())
        } else {
            Err(Error::Unauthenticated("invalid bearer token".into()))
        }
    }
}

fn parse_digest(flag: &str, hex_digest: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(hex_digest.trim()).map_err(|e| format!("{flag} is not hex: {e}"))?;
    bytes
        .try_into()
        .map_err(|_| format!("{flag} must be 64 hex characters"))
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

    #[test]
    fn the_sandbox_token_opens_alongside_the_operator_token() {
        let sandbox = hex::encode(Sha256::digest(b"pod-a"));
        let alone = Auth::also_sha256_hex(None, &sandbox).unwrap();
        assert!(alone.check_header(Some(b"Bearer pod-a")).is_ok());
        assert!(alone.check_header(Some(b"Bearer pod-b")).is_err());
        assert!(alone.check_header(None).is_err());

        let both =
            Auth::also_sha256_hex(Some(Auth::from_token("shared").unwrap()), &sandbox).unwrap();
        assert!(both.check_header(Some(b"Bearer pod-a")).is_ok());
        assert!(both.check_header(Some(b"Bearer shared")).is_ok());
        assert!(both.check_header(Some(b"Bearer pod-b")).is_err());
        // The digest itself (what the Pod's environment shows) is no token.
        let shown = format!("Bearer {sandbox}");
        assert!(both.check_header(Some(shown.as_bytes())).is_err());
        assert!(Auth::also_sha256_hex(None, "zz").is_err());
    }
}
