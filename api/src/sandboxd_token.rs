//! Per-sandbox sandboxd tokens. Each Sandbox's sandboxd accepts a token that
//! opens that Sandbox and no other:
//!
//! ```text
//! token  = hex(HMAC-SHA256(key, "sandhub-sandboxd-token/v1" NUL namespace NUL sandbox))
//! digest = hex(SHA-256(token))
//! ```
//!
//! sandhub-controller, holding `key`, puts `digest` into each Pod it builds
//! (`SANDBOXD_SANDBOX_TOKEN_SHA256`); the hub, holding the same key,
//! presents `token` to that Pod's sandboxd (directly, or through the router
//! in `X-Sandboxd-Authorization`). The Pod holds only the digest: its
//! workload can neither invert it nor derive another Sandbox's token. No
//! Secret per Sandbox, nothing to garbage-collect, and the hub needs no
//! right to read Secrets. The derivation lives here so the two programs
//! cannot drift.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Where the controller puts a Pod's digest (sandboxd's `--sandbox-token-sha256`).
pub const DIGEST_ENV: &str = "SANDBOXD_SANDBOX_TOKEN_SHA256";
/// Shorter keys are refused: HMAC-SHA256 wants a full-strength key.
pub const MIN_KEY_LEN: usize = 32;
const DOMAIN: &[u8] = b"sandhub-sandboxd-token/v1";
/// The egress proxy's credentials (issue #27, Kubernetes): the same key,
/// another domain, so a Pod's proxy credential (which its workload can
/// read) is never its sandboxd token, nor reveals it.
const PROXY_DOMAIN: &[u8] = b"sandhub-egress-proxy/v1";
/// The hub's bearer on the proxy's meter route (another domain again:
/// no Pod ever holds it, and it opens no sandbox).
const METER_DOMAIN: &[u8] = b"sandhub-egress-meter/v1";
/// The hub's signature on a claim's volume mounts (issue #32): the
/// controller mounts the claims a SandboxClaim names only when the hub
/// signed that list for that claim (`crate::k8s::volumes`).
const VOLUMES_DOMAIN: &[u8] = b"sandhub-claim-volumes/v1";

/// The HMAC key; never printed.
#[derive(Clone)]
pub struct SandboxdTokens {
    key: Vec<u8>,
}

impl std::fmt::Debug for SandboxdTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SandboxdTokens { key: <redacted> }")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl SandboxdTokens {
    /// `key` without trailing whitespace (a file's final newline is not
    /// part of it); at least [`MIN_KEY_LEN`] bytes.
    pub fn new(mut key: Vec<u8>) -> Result<Self, String> {
        while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
            key.pop();
        }
        if key.len() < MIN_KEY_LEN {
            return Err(format!(
                "the sandboxd token key has {} bytes; at least {MIN_KEY_LEN} are required",
                key.len()
            ));
        }
        Ok(Self { key })
    }

    /// Reads the key from a file (a mounted Secret).
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let key = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::new(key).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The token that opens Sandbox `sandbox` in `namespace`.
    pub fn token(&self, namespace: &str, sandbox: &str) -> String {
        self.derive(DOMAIN, namespace, sandbox)
    }

    /// The credential sandbox `sandbox` (the hub's id: its claim's name)
    /// presents to `sandhub egress-proxy` (`HTTP_PROXY`'s password).
    pub fn proxy_credential(&self, namespace: &str, sandbox: &str) -> String {
        self.derive(PROXY_DOMAIN, namespace, sandbox)
    }

    /// What the hub presents to `sandhub egress-proxy`'s meter route
    /// (`Authorization: Bearer ...`) for the sandboxes of `namespace`.
    pub fn meter_token(&self, namespace: &str) -> String {
        self.derive(METER_DOMAIN, namespace, "")
    }

    /// The hub's signature on `mounts` (the JSON of a claim's volume
    /// mounts annotation) for claim `claim` of `namespace`.
    pub fn volumes_signature(&self, namespace: &str, claim: &str, mounts: &str) -> String {
        self.derive_parts(
            VOLUMES_DOMAIN,
            &[namespace.as_bytes(), claim.as_bytes(), mounts.as_bytes()],
        )
    }

    /// Whether `signature` is [`Self::volumes_signature`]'s, compared in
    /// constant time.
    pub fn verify_volumes(
        &self,
        namespace: &str,
        claim: &str,
        mounts: &str,
        signature: &str,
    ) -> bool {
        let want = self.volumes_signature(namespace, claim, mounts);
        want.len() == signature.len()
            && want
                .bytes()
                .zip(signature.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    fn derive(&self, domain: &[u8], namespace: &str, sandbox: &str) -> String {
        self.derive_parts(domain, &[namespace.as_bytes(), sandbox.as_bytes()])
    }

    fn derive_parts(&self, domain: &[u8], parts: &[&[u8]]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        // NUL separators: names never hold NUL (nor does JSON, which
        // escapes it), so no two lists of parts feed the MAC the same bytes.
        mac.update(domain);
        mac.update(&[0]);
        for part in parts {
            mac.update(part);
            mac.update(&[0]);
        }
        hex(&mac.finalize().into_bytes())
    }

    /// What the Sandbox's sandboxd is given: the SHA-256 of its token, in hex.
    pub fn digest(&self, namespace: &str, sandbox: &str) -> String {
        hex(&Sha256::digest(self.token(namespace, sandbox).as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(byte: u8) -> SandboxdTokens {
        SandboxdTokens::new(vec![byte; 32]).unwrap()
    }

    #[test]
    fn each_sandbox_gets_its_own_token() {
        let t = tokens(7);
        let a = t.token("ns", "pool-abcde");
        assert_eq!(a, t.token("ns", "pool-abcde"), "deterministic");
        assert_eq!(a.len(), 64);
        assert_ne!(a, t.token("ns", "pool-abcdf"));
        assert_ne!(a, t.token("ns2", "pool-abcde"));
        // The separator keeps ("a", "bc") and ("ab", "c") apart.
        assert_ne!(t.token("a", "bc"), t.token("ab", "c"));
        assert_ne!(a, tokens(8).token("ns", "pool-abcde"), "another key");
    }

    #[test]
    fn proxy_credentials_are_per_sandbox_and_never_the_sandboxd_token() {
        let t = tokens(7);
        let c = t.proxy_credential("ns", "sb-1");
        assert_eq!(c, t.proxy_credential("ns", "sb-1"));
        assert_eq!(c.len(), 64);
        assert_ne!(c, t.proxy_credential("ns", "sb-2"));
        assert_ne!(c, t.token("ns", "sb-1"));
        assert_ne!(c, t.digest("ns", "sb-1"));
    }

    #[test]
    fn the_digest_is_the_sha256_of_the_token_and_not_the_token() {
        let t = tokens(1);
        let token = t.token("ns", "sb");
        let digest = t.digest("ns", "sb");
        assert_eq!(digest, hex(&Sha256::digest(token.as_bytes())));
        assert_ne!(digest, token);
    }

    #[test]
    fn a_volumes_signature_covers_the_namespace_the_claim_and_the_list() {
        let t = tokens(3);
        let m = r#"[{"claim":"data-x","path":"/workspace/d","read_only":false}]"#;
        let sig = t.volumes_signature("ns", "sb-1", m);
        assert!(t.verify_volumes("ns", "sb-1", m, &sig));
        assert!(!t.verify_volumes("ns", "sb-2", m, &sig), "another claim");
        assert!(
            !t.verify_volumes("ns2", "sb-1", m, &sig),
            "another namespace"
        );
        let other = m.replace("false", "true");
        assert!(
            !t.verify_volumes("ns", "sb-1", &other, &sig),
            "another list"
        );
        assert!(!t.verify_volumes("ns", "sb-1", m, &sig[1..]), "a prefix");
        assert!(
            !tokens(4).verify_volumes("ns", "sb-1", m, &sig),
            "another key"
        );
        // Never any other credential of the same names.
        assert_ne!(sig, t.token("ns", "sb-1"));
    }

    #[test]
    fn short_keys_are_refused_and_the_key_is_never_printed() {
        assert!(SandboxdTokens::new(vec![1; 31]).is_err());
        // A file's trailing newline does not count.
        let mut k = vec![b'k'; 31];
        k.push(b'\n');
        assert!(SandboxdTokens::new(k).is_err());
        let t = SandboxdTokens::new(b"0123456789abcdef0123456789abcdef\n".to_vec()).unwrap();
        let same = SandboxdTokens::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
        assert_eq!(t.token("n", "s"), same.token("n", "s"));
        assert!(!format!("{t:?}").contains("0123"));
    }
}
