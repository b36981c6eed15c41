//! Helpers on the objects every reconciler reads and writes: who controls
//! an object ([`controller_of`], [`controlled_by_kind`], [`controller_ref`]),
//! whether a Sandbox is Ready, and metav1.Condition bookkeeping
//! ([`conditions`]). Pure functions of the objects.

pub mod conditions;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use sandhub_api::k8s::conditions::types;
use sandhub_api::k8s::Sandbox;

/// The controller owner reference of `owner` (controller + blockOwnerDeletion).
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The owner reference marked as controller, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Whether `meta`'s controller is a `K` (group and kind match; any version).
pub fn controlled_by_kind<K: Resource<DynamicType = ()>>(
    meta: &ObjectMeta,
) -> Option<&OwnerReference> {
    let group = K::group(&());
    controller_of(meta).filter(|r| {
        r.kind == K::kind(&())
            && r.api_version.split_once('/').map(|(g, _)| g) == Some(group.as_ref())
    })
}

/// The Sandbox's Ready condition is True.
pub fn sandbox_ready(sb: &Sandbox) -> bool {
    sb.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::READY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::k8s::{SandboxClaim, SandboxWarmPool};

    fn owned(refs: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(refs),
            ..Default::default()
        }
    }

    #[test]
    fn the_controller_is_the_reference_marked_controller() {
        let mut pool = SandboxWarmPool::new("pool", Default::default());
        pool.metadata.uid = Some("u1".into());
        let mut plain = controller_ref(&pool);
        plain.controller = None;
        let meta = owned(vec![plain, controller_ref(&pool)]);
        let c = controller_of(&meta).unwrap();
        assert_eq!((c.kind.as_str(), c.uid.as_str()), ("SandboxWarmPool", "u1"));
        assert!(controlled_by_kind::<SandboxWarmPool>(&meta).is_some());
        assert!(controlled_by_kind::<SandboxClaim>(&meta).is_none());
        assert!(controller_of(&ObjectMeta::default()).is_none());
    }

    #[test]
    fn kind_checks_the_group_not_the_version() {
        let mut r = controller_ref(&SandboxWarmPool::new("pool", Default::default()));
        r.api_version = "extensions.agents.x-k8s.io/v1alpha1".into();
        let meta = owned(vec![r.clone()]);
        assert!(controlled_by_kind::<SandboxWarmPool>(&meta).is_some());
        r.api_version = "elsewhere.example/v1".into();
        assert!(controlled_by_kind::<SandboxWarmPool>(&owned(vec![r])).is_none());
    }
}
