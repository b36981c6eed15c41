//! Scoped tokens (`v1.<payload>.<signature>`, HMAC-SHA256 over a namespace,
//! a sandbox name and an expiry). The format lives in `sandhub-api`, shared
//! with the hub that mints them; this module only reads the secret file.

use std::path::Path;

use anyhow::Context;
pub use sandhub_api::scoped_token::{Scope, ScopedTokenError, ScopedTokens, MIN_SECRET_LEN};

/// Reads the secret file (trailing whitespace, such as a final newline, is
/// not part of the key; at least [`MIN_SECRET_LEN`] bytes must remain).
pub fn load(path: &Path) -> anyhow::Result<ScopedTokens> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("reading scoped-token secret {}", path.display()))?;
    ScopedTokens::new(bytes).map_err(|e| anyhow::anyhow!("secret file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn secret_file_round_trip_and_rejections() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, b"0123456789abcdef0123456789abcdef\n").unwrap();
        let t = load(&file).unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let scope = Scope {
            namespace: "ns".into(),
            name: "sb".into(),
            exp: 2_000,
        };
        let tok = t.mint(&scope);
        assert_eq!(t.verify(&tok, now), Ok(scope));
        // The newline is not part of the key: the same secret without it agrees.
        let same = ScopedTokens::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
        assert!(same.verify(&tok, now).is_ok());
        let other = ScopedTokens::new(vec![7; 32]).unwrap();
        assert_eq!(other.verify(&tok, now), Err(ScopedTokenError::BadSignature));
        std::fs::write(&file, b"too short\n").unwrap();
        assert!(format!("{:#}", load(&file).err().unwrap()).contains("at least 32"));
    }
}
