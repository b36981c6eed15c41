//! The objects this process last wrote, for the moments its caches lag them.
//!
//! A claim pass runs on the controller's cached copy, and the Sandbox watch
//! can trigger a pass before the claim cache shows our own last write. Such a
//! pass used to rewrite a status the server already had (a 409 and a re-read
//! each), or redo an adoption patch (another 409): in a 300-claim burst that
//! was a quarter of all writes. The memo answers with the copy the API server
//! returned to us instead, until the cache catches up or [`TTL`] passes.
//!
//! Staleness is decided without comparing resourceVersions (opaque by the
//! API contract): the cache has caught up once it shows the fields we wrote,
//! because only this controller writes them; a higher `generation` in the
//! cache means someone changed the spec after us, and then the cache wins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use sandhub_api::k8s::names;
use sandhub_api::k8s::{Sandbox, SandboxClaim};

use crate::object::controlled_by_kind;

/// Longer than any cache lag seen under a full burst; a memo entry older than
/// this is never used.
pub const TTL: Duration = Duration::from_secs(10);
/// Expired entries are swept when the memo grows past this.
const SWEEP_AT: usize = 4096;

/// Entries by key, each with when it was written.
type Written<K, V> = Mutex<HashMap<K, (Arc<V>, Instant)>>;

#[derive(Default)]
pub struct Memo {
    /// By claim UID.
    claims: Written<String, SandboxClaim>,
    /// By namespace and name.
    sandboxes: Written<(String, String), Sandbox>,
}

fn insert<K: Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, (V, Instant)>,
    k: K,
    v: V,
    now: Instant,
) {
    if map.len() >= SWEEP_AT {
        map.retain(|_, (_, at)| now.duration_since(*at) < TTL);
    }
    map.insert(k, (v, now));
}

/// The fields of a claim only this controller writes.
fn ours(
    c: &SandboxClaim,
) -> (
    Option<&String>,
    Option<&String>,
    Option<&sandhub_api::k8s::SandboxClaimStatus>,
) {
    let a = c.annotations();
    (
        a.get(names::SANDBOX_NAME_ANNOTATION),
        a.get(names::CONTROLLER_FIRST_OBSERVED_AT),
        c.status.as_ref(),
    )
}

impl Memo {
    /// The API server returned `claim` to one of our writes.
    pub fn wrote_claim(&self, claim: &SandboxClaim) {
        let Some(uid) = claim.uid() else { return };
        let mut m = self.claims.lock().expect("memo poisoned");
        insert(&mut m, uid, Arc::new(claim.clone()), Instant::now());
    }

    /// Our last written copy of `cached`, if the cache has not shown it yet.
    pub fn fresher_claim(&self, cached: &SandboxClaim) -> Option<SandboxClaim> {
        let uid = cached.uid()?;
        let mut m = self.claims.lock().expect("memo poisoned");
        let (mine, at) = m.get(&uid)?;
        let stale_memo = at.elapsed() >= TTL
            || cached.metadata.deletion_timestamp.is_some()
            || cached.metadata.generation > mine.metadata.generation
            || ours(cached) == ours(mine);
        if stale_memo {
            m.remove(&uid);
            return None;
        }
        Some((**mine).clone())
    }

    /// Forget the claim: a write under our copy conflicted, so it is not the
    /// newest after all.
    pub fn forget_claim(&self, claim: &SandboxClaim) {
        if let Some(uid) = claim.uid() {
            self.claims.lock().expect("memo poisoned").remove(&uid);
        }
    }

    /// The API server returned `sb` to our adoption patch or create.
    pub fn wrote_sandbox(&self, sb: &Sandbox) {
        let key = (sb.namespace().unwrap_or_default(), sb.name_any());
        let mut m = self.sandboxes.lock().expect("memo poisoned");
        insert(&mut m, key, Arc::new(sb.clone()), Instant::now());
    }

    /// The Sandbox `ns/name` as we last wrote it, if it is controlled by the
    /// claim `claim_uid` and younger than [`TTL`]. Callers use it only when
    /// their cache does not yet show that control (only we set it).
    pub fn sandbox_of(&self, ns: &str, name: &str, claim_uid: &str) -> Option<Sandbox> {
        let key = (ns.to_string(), name.to_string());
        let mut m = self.sandboxes.lock().expect("memo poisoned");
        let (sb, at) = m.get(&key)?;
        if at.elapsed() >= TTL {
            m.remove(&key);
            return None;
        }
        controlled_by_kind::<SandboxClaim>(&sb.metadata)
            .is_some_and(|o| o.uid == claim_uid)
            .then(|| (**sb).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use sandhub_api::k8s::{SandboxClaimSpec, SandboxClaimStatus};

    fn claim(rv: &str, generation: i64) -> SandboxClaim {
        let mut c = SandboxClaim::new("c", SandboxClaimSpec::default());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("uid-1".into());
        c.metadata.resource_version = Some(rv.into());
        c.metadata.generation = Some(generation);
        c
    }

    fn named(mut c: SandboxClaim, sb: &str) -> SandboxClaim {
        c.annotations_mut()
            .insert(names::SANDBOX_NAME_ANNOTATION.into(), sb.into());
        c
    }

    #[test]
    fn a_cache_behind_our_write_gets_our_copy() {
        let memo = Memo::default();
        let written = named(claim("2", 1), "warm-a");
        memo.wrote_claim(&written);
        let got = memo.fresher_claim(&claim("1", 1)).expect("memo copy");
        assert_eq!(got.resource_version().as_deref(), Some("2"));
        assert_eq!(
            got.annotations()
                .get(names::SANDBOX_NAME_ANNOTATION)
                .map(String::as_str),
            Some("warm-a")
        );
    }

    #[test]
    fn a_cache_showing_our_write_wins_and_the_entry_goes() {
        let memo = Memo::default();
        let mut written = named(claim("2", 1), "warm-a");
        written.status = Some(SandboxClaimStatus::default());
        memo.wrote_claim(&written);
        // Caught up, plus a later label change by someone else.
        let mut cached = written.clone();
        cached.metadata.resource_version = Some("3".into());
        cached.labels_mut().insert("x".into(), "y".into());
        assert!(memo.fresher_claim(&cached).is_none());
        // The entry is gone: an older copy is not answered any more either.
        assert!(memo.fresher_claim(&claim("1", 1)).is_none());
    }

    #[test]
    fn a_spec_change_after_our_write_makes_the_cache_win() {
        let memo = Memo::default();
        memo.wrote_claim(&named(claim("2", 1), "warm-a"));
        assert!(memo.fresher_claim(&claim("5", 2)).is_none());
    }

    #[test]
    fn a_conflict_forgets_the_claim() {
        let memo = Memo::default();
        let written = named(claim("2", 1), "warm-a");
        memo.wrote_claim(&written);
        memo.forget_claim(&written);
        assert!(memo.fresher_claim(&claim("1", 1)).is_none());
    }

    #[test]
    fn a_sandbox_is_answered_only_for_the_claim_that_controls_it() {
        let memo = Memo::default();
        let mut sb = Sandbox::new("warm-a", Default::default());
        sb.metadata.namespace = Some("ns".into());
        sb.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "extensions.agents.x-k8s.io/v1beta1".into(),
            kind: "SandboxClaim".into(),
            name: "c".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        memo.wrote_sandbox(&sb);
        assert!(memo.sandbox_of("ns", "warm-a", "uid-1").is_some());
        assert!(memo.sandbox_of("ns", "warm-a", "uid-2").is_none());
        assert!(memo.sandbox_of("other", "warm-a", "uid-1").is_none());
    }
}
