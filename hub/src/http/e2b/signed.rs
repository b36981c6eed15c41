//! E2B's signed file URLs: `/files?path=&signature=v1_<sig>` (with
//! `signature_expiration` when it expires), where `sig` is the unpadded
//! base64 of SHA-256(`{path}:{read|write}:{user}:{access token}[:{exp}]`),
//! made by the SDK from the sandbox's access token, so a URL opens one file,
//! for one operation, until it expires, without any header. Since a token
//! names its tenant, the hub tries the tenants it knows (its keys file's,
//! or the open tenant): one hash each.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Tokens;
use crate::backend::now_s;

/// The query of a signed URL.
#[derive(Debug, Default, serde::Deserialize)]
pub struct SignedQuery {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub signature: Option<String>,
    #[serde(default)]
    pub signature_expiration: Option<u64>,
}

fn signature(path: &str, operation: &str, user: &str, token: &str, exp: Option<u64>) -> String {
    use base64::Engine;
    let raw = match exp {
        None => format!("{path}:{operation}:{user}:{token}"),
        Some(e) => format!("{path}:{operation}:{user}:{token}:{e}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// The tenant whose token signed `q` for `operation` on sandbox `id`, if
/// one did and it has not expired.
pub fn verify(
    tokens: &Tokens,
    tenants: &[String],
    id: &str,
    operation: &str,
    q: &SignedQuery,
) -> Option<String> {
    let (Some(path), Some(given)) = (q.path.as_deref(), q.signature.as_deref()) else {
        return None;
    };
    if let Some(exp) = q.signature_expiration {
        if exp < now_s() {
            return None;
        }
    }
    let user = q.username.as_deref().unwrap_or("");
    let mut found = None;
    // Every candidate is checked, so the time taken says nothing about which.
    for tenant in tenants {
        let want = signature(
            path,
            operation,
            user,
            &tokens.issue(tenant, id),
            q.signature_expiration,
        );
        if bool::from(want.as_bytes().ct_eq(given.as_bytes())) {
            found = Some(tenant.clone());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks_recipe() {
        // e2b's get_signature("/a.txt", "read", "", "tok"): sha256 of
        // "/a.txt:read::tok", base64 without padding, "v1_" in front.
        let s = signature("/a.txt", "read", "", "tok", None);
        let digest = Sha256::digest(b"/a.txt:read::tok");
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
        assert_eq!(s, format!("v1_{}", b64.trim_end_matches('=')));
    }

    #[test]
    fn a_signature_opens_its_file_operation_and_sandbox_only() {
        let tokens = Tokens::random();
        let tenants = vec!["alice".to_string(), "bob".to_string()];
        let token = tokens.issue("bob", "sb-1");
        let q = SignedQuery {
            path: Some("/a.txt".into()),
            signature: Some(signature("/a.txt", "read", "", &token, None)),
            ..Default::default()
        };
        assert_eq!(
            verify(&tokens, &tenants, "sb-1", "read", &q).as_deref(),
            Some("bob")
        );
        assert_eq!(verify(&tokens, &tenants, "sb-1", "write", &q), None);
        assert_eq!(verify(&tokens, &tenants, "sb-2", "read", &q), None);
        let other_path = SignedQuery {
            path: Some("/b.txt".into()),
            signature: q.signature.clone(),
            ..Default::default()
        };
        assert_eq!(verify(&tokens, &tenants, "sb-1", "read", &other_path), None);
        let expired = SignedQuery {
            path: Some("/a.txt".into()),
            signature: Some(signature("/a.txt", "read", "", &token, Some(1000))),
            signature_expiration: Some(1000),
            ..Default::default()
        };
        assert_eq!(verify(&tokens, &tenants, "sb-1", "read", &expired), None);
        let later = now_s() + 600;
        let live = SignedQuery {
            path: Some("/a.txt".into()),
            signature: Some(signature("/a.txt", "read", "", &token, Some(later))),
            signature_expiration: Some(later),
            ..Default::default()
        };
        assert_eq!(
            verify(&tokens, &tenants, "sb-1", "read", &live).as_deref(),
            Some("bob")
        );
        // Unknown tenants are never tried.
        assert_eq!(
            verify(&tokens, &["alice".to_string()], "sb-1", "read", &q),
            None
        );
    }
}
