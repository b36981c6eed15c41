//! `entrypoint_exited` on Kubernetes. sandboxd in the Pod records its
//! entrypoint's end and only answers when asked, and an event every
//! replica derives must come from a write they all see: so each replica
//! asks the Ready sandboxes' sandboxd every [`EVERY`], and when a run has
//! ended that the claim does not record yet, writes the exit (the GET's
//! words, clamped) to the claim's [`ANNOTATION`]. Every replica's claim
//! watch then derives `entrypoint_exited` from that write, under one id
//! (kube/events.rs). Two replicas that see one exit write the same bytes,
//! and the second write changes nothing. The annotation is the claim's
//! memory: an exit is told once, also across restarts of every replica.
//!
//! Cost: one small GET per Ready sandbox with an entrypoint per [`EVERY`]
//! per replica ([`CONCURRENT`] at once); a sandbox whose sandboxd runs no
//! entrypoint is asked once per time it is Ready.

use std::{collections::HashSet, sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    api::{Patch, PatchParams},
    Api,
};
use sandhub_api::k8s::SandboxClaim;
use serde::{Deserialize, Serialize};

use super::{model, reach::Target, Shared};

/// The claim's record of its entrypoint's last told exit ([`Exit`]).
pub const ANNOTATION: &str = "sandhub.io/entrypoint-exit";
/// How often a Ready sandbox with an entrypoint is asked.
pub const EVERY: Duration = Duration::from_secs(5);
const CONCURRENT: usize = 16;
/// An annotation longer than this is not read (the hub writes ~300 bytes).
const MAX_ANNOTATION: usize = 4096;

/// One run's end, as a claim records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exit {
    /// The run (its start, Unix ms, as sandboxd said).
    pub run: i64,
    /// `entrypoint_exited`'s details (`crate::entrypoint::exit_details`).
    pub details: serde_json::Value,
}

/// The exit `claim` records, if any (and sane).
pub fn exit_of(claim: &SandboxClaim) -> Option<Exit> {
    let raw = claim.metadata.annotations.as_ref()?.get(ANNOTATION)?;
    if raw.len() > MAX_ANNOTATION {
        return None;
    }
    serde_json::from_str(raw).ok()
}

/// Starts the asking (see the module docs).
pub(super) fn spawn(shared: Arc<Shared>) {
    tokio::spawn(async move {
        let mut without: HashSet<String> = HashSet::new();
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            pass(&shared, &mut without).await;
        }
    });
}

async fn pass(shared: &Shared, without: &mut HashSet<String>) {
    let ready: Vec<Arc<SandboxClaim>> = shared
        .claim_cache
        .state()
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() && model::is_ready(c))
        .collect();
    // Forgotten once not Ready: asked afresh when it is again.
    let ids: HashSet<String> = ready
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    without.retain(|id| ids.contains(id));
    let ask = ready.into_iter().filter(|c| {
        c.metadata
            .name
            .as_ref()
            .is_some_and(|n| !without.contains(n))
    });
    let answers: Vec<_> = futures::stream::iter(ask)
        .map(|claim| async move {
            let answer = match client(shared, &claim) {
                Some(c) => crate::entrypoint::answer(&c).await,
                None => None,
            };
            (claim, answer)
        })
        .buffer_unordered(CONCURRENT)
        .collect()
        .await;
    for (claim, answer) in answers {
        let Some(id) = claim.metadata.name.clone() else {
            continue;
        };
        let record = match answer {
            None => continue,
            Some(None) => {
                without.insert(id);
                continue;
            }
            Some(Some(r)) => r,
        };
        if !record.ended() || exit_of(&claim).is_some_and(|e| e.run == record.started_at_unix_ms) {
            continue;
        }
        let exit = Exit {
            run: record.started_at_unix_ms,
            // The Pod's OOM count is the kubelet's, not the hub's (see
            // `crate::entrypoint`): an OOM kill reads as an Error here.
            details: crate::entrypoint::exit_details(&record, 0, crate::backend::now_ms()),
        };
        let Ok(value) = serde_json::to_string(&exit) else {
            continue;
        };
        let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION: value}}});
        let claims: Api<SandboxClaim> = Api::namespaced(shared.client.clone(), &shared.namespace);
        if let Err(e) = claims
            .patch(&id, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!(sandbox = %id, error = %e, "recording an entrypoint's exit");
        }
    }
}

/// A client for the Pod of Ready `claim` (the one the tenant's calls use).
pub(super) fn client(
    shared: &Shared,
    claim: &SandboxClaim,
) -> Option<sandhub_client::sandboxd::SandboxdClient> {
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
