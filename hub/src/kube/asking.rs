//! Asking every Ready sandbox's sandboxd something every few seconds and
//! recording what it says on the claim: the shape `entrypoint_exited`
//! (kube/entrypoints.rs) and `oom_killed` (kube/oom.rs) share. Only
//! sandboxd knows these things and only answers when asked, while an event
//! every replica tells under one id must come from a write they all see:
//! so each replica asks, and the first to hear something new writes it to
//! an annotation of the claim, which every replica's claim watch turns into
//! the event (kube/events.rs).

use std::{collections::HashSet, future::Future, sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    api::{Patch, PatchParams},
    Api,
};
use sandhub_api::k8s::SandboxClaim;
use sandhub_client::sandboxd::SandboxdClient;

use super::{model, reach::Target, Shared};

/// Sandboxes asked at once, per asker.
const CONCURRENT: usize = 16;

/// A ticker for `period` that never bursts to catch up.
pub(super) fn ticker(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// The Ready claims worth asking, minus those whose sandboxd has nothing
/// to say (asked again only once they are Ready anew).
#[derive(Default)]
pub(super) struct ReadyClaims {
    without: HashSet<String>,
}

impl ReadyClaims {
    /// This round's claims: Ready, not being deleted, not known to have
    /// nothing. A claim that stopped being Ready is forgotten.
    pub fn this_round(&mut self, shared: &Shared) -> Vec<Arc<SandboxClaim>> {
        let ready: Vec<Arc<SandboxClaim>> = shared
            .claim_cache
            .state()
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none() && model::is_ready(c))
            .collect();
        let ids: HashSet<&String> = ready
            .iter()
            .filter_map(|c| c.metadata.name.as_ref())
            .collect();
        self.without.retain(|id| ids.contains(id));
        ready
            .into_iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| !self.without.contains(n))
            })
            .collect()
    }

    /// `id`'s sandboxd has nothing of this kind: not asked again while it
    /// stays Ready.
    pub fn has_nothing(&mut self, id: String) {
        self.without.insert(id);
    }
}

/// `ask` of each claim's sandboxd ([`CONCURRENT`] at once): None where the
/// claim's Pod cannot be reached this round.
pub(super) async fn ask_each<T, F, Fut>(
    shared: &Shared,
    claims: Vec<Arc<SandboxClaim>>,
    ask: F,
) -> Vec<(Arc<SandboxClaim>, Option<T>)>
where
    F: Fn(SandboxdClient) -> Fut,
    Fut: Future<Output = T>,
{
    futures::stream::iter(claims)
        .map(|claim| {
            let client = client(shared, &claim);
            let asked = client.map(&ask);
            async move {
                let answer = match asked {
                    Some(f) => Some(f.await),
                    None => None,
                };
                (claim, answer)
            }
        })
        .buffer_unordered(CONCURRENT)
        .collect()
        .await
}

/// What `claim`'s annotation `key` records, if any: JSON of at most `max`
/// bytes (what the hub writes is far smaller), else nothing. Anyone who may
/// patch the claim may write there, so a garbled or oversized value reads
/// as none rather than failing the watch.
pub(super) fn recorded<T: serde::de::DeserializeOwned>(
    claim: &SandboxClaim,
    key: &str,
    max: usize,
) -> Option<T> {
    let raw = claim.metadata.annotations.as_ref()?.get(key)?;
    if raw.len() > max {
        return None;
    }
    serde_json::from_str(raw).ok()
}

/// Writes `value` to claim `id`'s annotation `key` (a merge patch: two
/// replicas writing the same bytes change nothing). A failure is only
/// logged: the next round tries again.
pub(super) async fn record(shared: &Shared, id: &str, key: &str, value: &impl serde::Serialize) {
    let Ok(value) = serde_json::to_string(value) else {
        return;
    };
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    let claims: Api<SandboxClaim> = Api::namespaced(shared.client.clone(), &shared.namespace);
    if let Err(e) = claims
        .patch(id, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(sandbox = %id, annotation = key, error = %e, "recording on a claim");
    }
}

/// A client for the Pod of Ready `claim` (the one the tenant's calls use).
fn client(shared: &Shared, claim: &SandboxClaim) -> Option<SandboxdClient> {
    let id = claim.metadata.name.as_deref()?;
    let bound = claim.status.as_ref()?.sandbox.as_ref()?;
    let pod_ip = bound.pod_ips.first().cloned();
    let key = format!("{id}/{}/{}", bound.name, pod_ip.as_deref().unwrap_or(""));
    if let Some(c) = shared.cached_client(&key) {
        return Some(c);
    }
    let client = shared
        .reach
        .client(&Target {
            namespace: &shared.namespace,
            sandbox: &bound.name,
            pod_ip: pod_ip.as_deref(),
        })
        .ok()?;
    shared.cache_client(key, client.clone());
    Some(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Rec {
        n: u64,
    }

    #[test]
    fn a_garbled_or_oversized_record_reads_as_none() {
        let mut claim = SandboxClaim::new("sb-1", Default::default());
        let with = |c: &mut SandboxClaim, v: String| {
            c.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert("k".into(), v);
        };
        assert_eq!(recorded::<Rec>(&claim, "k", 64), None, "none written");
        with(&mut claim, r#"{"n":3}"#.into());
        assert_eq!(recorded(&claim, "k", 64), Some(Rec { n: 3 }));
        with(&mut claim, "not json".into());
        assert_eq!(recorded::<Rec>(&claim, "k", 64), None);
        with(
            &mut claim,
            format!(r#"{{"n":3,"pad":"{}"}}"#, "x".repeat(100)),
        );
        assert_eq!(recorded::<Rec>(&claim, "k", 64), None, "past the bound");
    }
}
