//! Feeding the warm candidate index and the Sandbox cache from one watch.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use sandhub_api::k8s::names;
use sandhub_api::k8s::{Sandbox, SandboxWarmPool};

use crate::object::{controlled_by_kind, sandbox_ready};
use crate::warmpool::queue::{Candidate, WarmIndex};

/// The pool and candidate view of `sb`, when it is an adoptable warm member:
/// not being deleted, carrying the pool and template-ref labels, and
/// controlled by the SandboxWarmPool whose name hash its label holds.
pub fn candidate_of(sb: &Sandbox) -> Option<(String, Candidate)> {
    if sb.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let labels = sb.labels();
    let pool_hash = labels.get(names::WARM_POOL_SANDBOX)?;
    labels.get(names::SANDBOX_TEMPLATE_REF_HASH)?;
    let owner = controlled_by_kind::<SandboxWarmPool>(&sb.metadata)?;
    if names::name_hash(&owner.name) != *pool_hash {
        return None;
    }
    let status = sb.status.clone().unwrap_or_default();
    Some((
        owner.name.clone(),
        Candidate {
            name: sb.name_any(),
            node: (!status.node_name.is_empty()).then_some(status.node_name),
            ready: sandbox_ready(sb),
            has_ip: !status.pod_ips.is_empty(),
            template_hash: labels.get(names::SANDBOX_TEMPLATE_HASH).cloned(),
            template_name: sb
                .annotations()
                .get(names::SANDBOX_TEMPLATE_REF_ANNOTATION)
                .cloned(),
        },
    ))
}

fn apply(index: &WarmIndex, sb: &Sandbox) {
    let ns = sb.namespace().unwrap_or_default();
    let member = candidate_of(sb);
    index.apply(
        &ns,
        &sb.name_any(),
        member.as_ref().map(|(p, c)| (p.as_str(), c.clone())),
    );
}

/// Runs forever: every Sandbox event updates the cache (first, so a claim
/// that takes a candidate finds its object) and then the index. A relist is
/// applied to the index only once complete, so the index is never emptied
/// for the length of a list.
pub async fn feed(
    api: Api<Sandbox>,
    wc: watcher::Config,
    index: Arc<WarmIndex>,
    mut writer: Writer<Sandbox>,
) {
    let mut relist: Vec<Sandbox> = Vec::new();
    let stream = kube::runtime::watcher(api, wc).default_backoff();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!(error = %e, "sandbox watch for the warm index failed; retrying");
                continue;
            }
        };
        writer.apply_watcher_event(&ev);
        match ev {
            Event::Apply(sb) => apply(&index, &sb),
            Event::Delete(sb) => index.delete(&sb.namespace().unwrap_or_default(), &sb.name_any()),
            Event::Init => relist.clear(),
            Event::InitApply(sb) => relist.push(sb),
            Event::InitDone => {
                index.clear_members();
                for sb in relist.drain(..) {
                    apply(&index, &sb);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::k8s::{SandboxSpec, SandboxStatus, SandboxWarmPoolSpec};

    use crate::object::controller_ref;

    fn member(pool: &str, owner: &str) -> Sandbox {
        let mut p = SandboxWarmPool::new(owner, SandboxWarmPoolSpec::default());
        p.metadata.uid = Some("u".into());
        let mut sb = Sandbox::new("pool-x", SandboxSpec::default());
        sb.metadata.namespace = Some("ns".into());
        sb.metadata.labels = Some(
            [
                (names::WARM_POOL_SANDBOX.to_string(), names::name_hash(pool)),
                (
                    names::SANDBOX_TEMPLATE_REF_HASH.to_string(),
                    names::name_hash("t"),
                ),
            ]
            .into(),
        );
        sb.metadata.owner_references = Some(vec![controller_ref(&p)]);
        sb.status = Some(SandboxStatus {
            pod_ips: vec!["10.244.0.9".into()],
            node_name: "fake-node-0".into(),
            ..Default::default()
        });
        sb
    }

    #[test]
    fn warm_members_are_candidates_of_their_owning_pool() {
        let (pool, c) = candidate_of(&member("pool", "pool")).unwrap();
        assert_eq!(pool, "pool");
        assert_eq!(
            (c.has_ip, c.ready, c.node.as_deref()),
            (true, false, Some("fake-node-0"))
        );
    }

    #[test]
    fn claimed_foreign_or_deleting_sandboxes_are_not_candidates() {
        // The label names one pool, the owner another.
        assert!(candidate_of(&member("pool", "other")).is_none());
        let mut sb = member("pool", "pool");
        sb.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(names::WARM_POOL_SANDBOX);
        assert!(candidate_of(&sb).is_none());
        let mut sb = member("pool", "pool");
        sb.metadata.owner_references = None;
        assert!(candidate_of(&sb).is_none());
        let mut sb = member("pool", "pool");
        sb.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert!(candidate_of(&sb).is_none());
    }
}
