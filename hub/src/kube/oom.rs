//! `oom_killed` on Kubernetes. The kernel counts a container's OOM kills in
//! its cgroup, which only sandboxd in the Pod can read (`oom_kills` of
//! `GET /v1/_sandhub/usage`). As with entrypoint exits
//! (kube/entrypoints.rs; the shared shape is kube/asking.rs), an event
//! every replica tells under one id must come from a write they all see:
//! each replica asks each Ready sandbox's
//! sandboxd every [`EVERY`] for its counters (with `since` past any point,
//! so the answer is a few dozen bytes), and when the count has passed what
//! the claim records for that Pod, writes the new count to the claim's
//! [`ANNOTATION`]. Every replica's claim watch derives `oom_killed` from
//! that write (kube/events.rs). Two replicas that see one count write the
//! same bytes; the second write changes nothing.
//!
//! **The record names its Pod** (the bound Sandbox and its Pod IP): a
//! resumed sandbox runs in a new Pod whose count starts at 0, so a record
//! of another Pod is no baseline, and the new Pod's first kill is told.
//!
//! **Untrusted.** The count comes from inside the sandbox, which may have
//! replaced sandboxd. It is clamped, the claim is written at most once per
//! [`EVERY`] per replica, and the event goes only to the sandbox's owner:
//! a lying sandboxd can only make noise in its own tenant's feed.
//!
//! Cost: one small GET per Ready sandbox per [`EVERY`] per replica
//! (16 at once, kube/asking.rs); a sandbox whose sandboxd keeps no usage (not
//! Sandhub's, or no cgroup of its own) is asked once per time it is Ready.

use std::{sync::Arc, time::Duration};

use sandhub_api::k8s::SandboxClaim;
use serde::{Deserialize, Serialize};

use super::{
    asking::{self, ReadyClaims},
    Shared,
};

/// The claim's record of the OOM kills told so far ([`OomRecord`]).
pub const ANNOTATION: &str = "sandhub.io/oom-kills";
/// How often each Ready sandbox is asked.
pub const EVERY: Duration = Duration::from_secs(5);
/// A record longer than this is not read (the hub writes < 400 bytes).
const MAX_ANNOTATION: usize = 1024;
/// Most kills believed (as `kube::usage` clamps them).
const MAX_KILLS: u64 = 1 << 32;

/// The kills of one Pod told so far, as a claim records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    /// The Pod counted (`<sandbox>/<pod ip>`).
    pub pod: String,
    /// Its cgroup's `oom_kill` count.
    pub kills: u64,
}

/// The record `claim` carries, if any (and sane).
pub fn record_of(claim: &SandboxClaim) -> Option<OomRecord> {
    asking::recorded(claim, ANNOTATION, MAX_ANNOTATION)
}

/// What `now` tells that `before` did not: `(kills in all, new kills)` of
/// its Pod, or None when nothing is new. A record of another Pod counts
/// from 0.
pub fn news(before: Option<&OomRecord>, now: &OomRecord) -> Option<(u64, u64)> {
    let base = before.filter(|b| b.pod == now.pod).map_or(0, |b| b.kills);
    (now.kills > base).then(|| (now.kills, now.kills - base))
}

/// The Pod a Ready claim runs in, as records name it.
fn pod_of(claim: &SandboxClaim) -> Option<String> {
    let bound = claim.status.as_ref()?.sandbox.as_ref()?;
    Some(format!(
        "{}/{}",
        bound.name,
        bound.pod_ips.first().map(String::as_str).unwrap_or("")
    ))
}

/// Starts the asking (see the module docs).
pub(super) fn spawn(shared: Arc<Shared>) {
    tokio::spawn(async move {
        let mut claims = ReadyClaims::default();
        let mut tick = asking::ticker(EVERY);
        loop {
            tick.tick().await;
            pass(&shared, &mut claims).await;
        }
    });
}

async fn pass(shared: &Shared, claims: &mut ReadyClaims) {
    let ask = claims.this_round(shared);
    let answers = asking::ask_each(shared, ask, |c| async move {
        super::usage::ask_counters(&c).await.map(|r| r.oom_kills)
    })
    .await;
    for (claim, answer) in answers {
        let Some(id) = claim.metadata.name.clone() else {
            continue;
        };
        let kills = match answer {
            None => continue,
            Some(None) => {
                claims.has_nothing(id);
                continue;
            }
            Some(Some(k)) => k.min(MAX_KILLS),
        };
        let Some(pod) = pod_of(&claim) else {
            continue;
        };
        let now = OomRecord { pod, kills };
        if news(record_of(&claim).as_ref(), &now).is_some() {
            asking::record(shared, &id, ANNOTATION, &now).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pod: &str, kills: u64) -> OomRecord {
        OomRecord {
            pod: pod.into(),
            kills,
        }
    }

    #[test]
    fn only_kills_past_the_record_of_the_same_pod_are_news() {
        assert_eq!(news(None, &rec("a/10.0.0.1", 0)), None);
        assert_eq!(news(None, &rec("a/10.0.0.1", 2)), Some((2, 2)));
        let told = rec("a/10.0.0.1", 2);
        assert_eq!(news(Some(&told), &rec("a/10.0.0.1", 2)), None);
        assert_eq!(news(Some(&told), &rec("a/10.0.0.1", 1)), None);
        assert_eq!(news(Some(&told), &rec("a/10.0.0.1", 5)), Some((5, 3)));
        // A new Pod (resumed) counts from 0.
        assert_eq!(news(Some(&told), &rec("a/10.0.0.7", 1)), Some((1, 1)));
    }

    #[test]
    fn an_oversized_or_garbled_record_is_ignored() {
        let mut claim = SandboxClaim::new("sb-1", Default::default());
        let with = |c: &mut SandboxClaim, v: String| {
            c.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ANNOTATION.into(), v);
        };
        with(&mut claim, r#"{"pod":"a/","kills":3}"#.into());
        assert_eq!(record_of(&claim), Some(rec("a/", 3)));
        with(&mut claim, "not json".into());
        assert_eq!(record_of(&claim), None);
        with(
            &mut claim,
            format!(r#"{{"pod":"{}","kills":3}}"#, "x".repeat(2000)),
        );
        assert_eq!(record_of(&claim), None);
    }
}
