//! `disk_quota_exceeded` on Kubernetes. There a sandbox's disk is its
//! container's `ephemeral-storage` limit (the template's `disk_mb`), and
//! the kubelet enforces it by evicting the Pod, not by refusing writes:
//! the Pod turns `Failed` with reason `Evicted` and a message naming the
//! limit, and the Sandbox (and its claim) turn Finished with `PodFailed`,
//! whose words (upstream's) do not say why.
//!
//! So each replica, every [`EVERY`], looks at the Pod of each Finished
//! claim it has not looked at yet (one `GET`, the Role's `pods: get`), and
//! when the kubelet evicted it for local storage, writes the Pod and the
//! kubelet's message to the claim's [`ANNOTATION`]; every replica's claim
//! watch derives `disk_quota_exceeded` from that write (kube/events.rs),
//! the shape `oom_killed` has (kube/oom.rs, kube/asking.rs). The Pod's
//! status is the kubelet's, not the sandbox's: nothing in the sandbox can
//! forge it. The message is still bounded before it is copied.

use std::{collections::HashSet, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use sandhub_api::{hub::SandboxState, k8s::SandboxClaim};
use serde::{Deserialize, Serialize};

use super::{asking, model, Shared};

/// The claim's record of its Pod's eviction ([`Eviction`]).
pub const ANNOTATION: &str = "sandhub.io/disk-eviction";
/// How often Finished claims are looked at.
pub const EVERY: Duration = Duration::from_secs(5);
/// Pods read at most per pass, per replica.
const PER_PASS: usize = 16;
/// The kubelet's message is cut to this many bytes on the claim.
const MAX_MESSAGE: usize = 512;
/// A record longer than this is not read.
const MAX_ANNOTATION: usize = 1024;

/// A Pod the kubelet evicted for using more local storage than its limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Eviction {
    /// The Pod's name.
    pub pod: String,
    /// The kubelet's words, e.g. `Pod ephemeral local storage usage
    /// exceeds the total limit of containers 64Mi.`
    pub message: String,
}

/// The record `claim` carries, if any (and sane).
pub fn record_of(claim: &SandboxClaim) -> Option<Eviction> {
    asking::recorded(claim, ANNOTATION, MAX_ANNOTATION)
}

/// The kubelet's message when it evicted `pod` for local storage: its
/// container's or the Pod's `ephemeral-storage` limit, or an `emptyDir`'s
/// `sizeLimit`. Evictions for node pressure or by the API say otherwise.
pub fn storage_eviction(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Failed") || status.reason.as_deref() != Some("Evicted") {
        return None;
    }
    let message = status.message.as_deref().unwrap_or_default();
    let lower = message.to_ascii_lowercase();
    let local = lower.contains("ephemeral local storage")
        || lower.contains("local ephemeral storage")
        || (lower.contains("emptydir") && lower.contains("exceeds the limit"));
    local.then(|| cut(message.trim(), MAX_MESSAGE))
}

/// `s`, at most `max` bytes, cut at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Starts the looking (see the module docs).
pub(super) fn spawn(shared: Arc<Shared>) {
    tokio::spawn(async move {
        let mut looked: HashSet<String> = HashSet::new();
        let mut tick = asking::ticker(EVERY);
        loop {
            tick.tick().await;
            pass(&shared, &mut looked).await;
        }
    });
}

/// One pass: the Pods of Finished claims not looked at yet (each at most
/// once while it stays Finished), [`PER_PASS`] at most.
async fn pass(shared: &Shared, looked: &mut HashSet<String>) {
    let finished: Vec<Arc<SandboxClaim>> = shared
        .claim_cache
        .state()
        .into_iter()
        .filter(|c| {
            c.metadata.deletion_timestamp.is_none() && model::state_of(c) == SandboxState::Finished
        })
        .collect();
    let ids: HashSet<&String> = finished
        .iter()
        .filter_map(|c| c.metadata.name.as_ref())
        .collect();
    looked.retain(|id| ids.contains(id));
    let todo: Vec<Arc<SandboxClaim>> = finished
        .iter()
        .filter(|c| {
            c.metadata
                .name
                .as_ref()
                .is_some_and(|n| !looked.contains(n))
                && record_of(c).is_none()
        })
        .take(PER_PASS)
        .cloned()
        .collect();
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), &shared.namespace);
    for claim in todo {
        let Some(id) = claim.metadata.name.clone() else {
            continue;
        };
        let pod_name = shared.pod_name(&model::sandbox_name(&claim, &id)).await;
        let pod = match pods.get_opt(&pod_name).await {
            Ok(pod) => pod,
            Err(e) => {
                // Looked at again next pass.
                tracing::debug!(sandbox = %id, error = %e, "reading a finished sandbox's Pod");
                continue;
            }
        };
        looked.insert(id.clone());
        if let Some(message) = pod.as_ref().and_then(storage_eviction) {
            let record = Eviction {
                pod: pod_name,
                message,
            };
            asking::record(shared, &id, ANNOTATION, &record).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn pod(phase: &str, reason: Option<&str>, message: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(Into::into),
                message: Some(message.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_kubelets_local_storage_evictions_count() {
        // The kubelet's words for each local-storage limit.
        for m in [
            "Pod ephemeral local storage usage exceeds the total limit of containers 64Mi. ",
            "Container sandboxd exceeded its local ephemeral storage limit \"64Mi\". ",
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Gi\". ",
        ] {
            assert_eq!(
                storage_eviction(&pod("Failed", Some("Evicted"), m)).as_deref(),
                Some(m.trim()),
                "{m}"
            );
        }
        // Node pressure, other failures, a Pod still running: not the disk quota.
        let pressure = "The node was low on resource: memory. Threshold quantity: 100Mi";
        assert!(storage_eviction(&pod("Failed", Some("Evicted"), pressure)).is_none());
        assert!(
            storage_eviction(&pod("Failed", Some("OOMKilled"), "ephemeral local storage"))
                .is_none()
        );
        assert!(storage_eviction(&pod(
            "Running",
            Some("Evicted"),
            "Pod ephemeral local storage usage exceeds the total limit of containers 64Mi."
        ))
        .is_none());
        // A long message is cut, on a character boundary.
        let long = format!("Pod ephemeral local storage usage {}", "é".repeat(600));
        let got = storage_eviction(&pod("Failed", Some("Evicted"), &long)).unwrap();
        assert!(got.len() <= MAX_MESSAGE && long.starts_with(&got));
    }
}
