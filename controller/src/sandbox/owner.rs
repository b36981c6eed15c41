//! Who owns a child object (Pod, Service, PVC), checked before any write to it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sandhub_api::k8s::names;
use sandhub_api::k8s::Sandbox;

use crate::object::controller_of;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Controlled by this Sandbox.
    Owned,
    /// No controller, and labelled `adoptable=true` or with this Sandbox's name hash.
    Adoptable,
    /// No controller and no label authorising adoption.
    NotAdoptable,
    /// Controlled by something else (kind/name given).
    Foreign(String),
}

pub fn ownership(meta: &ObjectMeta, owner_uid: &str, name_hash: &str) -> Ownership {
    match controller_of(meta) {
        Some(r) if r.uid == owner_uid => Ownership::Owned,
        Some(r) => Ownership::Foreign(format!("{} {}", r.kind, r.name)),
        None => {
            let labels = meta.labels.as_ref();
            let adoptable = labels
                .and_then(|l| l.get(names::ADOPTABLE))
                .is_some_and(|v| v == "true");
            let tracked = labels
                .and_then(|l| l.get(names::SANDBOX_NAME_HASH))
                .is_some_and(|v| v == name_hash);
            if adoptable || tracked {
                Ownership::Adoptable
            } else {
                Ownership::NotAdoptable
            }
        }
    }
}

/// The kind of the Sandbox's controller (`SandboxClaim`, `SandboxWarmPool`) and its name.
pub fn sandbox_owner(sb: &Sandbox) -> Option<(&str, &str)> {
    controller_of(&sb.metadata).map(|r| (r.kind.as_str(), r.name.as_str()))
}

/// `owned_by` metric label: `SandboxClaim`, `SandboxWarmPool` or `None`.
pub fn owned_by_label(sb: &Sandbox) -> String {
    match sandbox_owner(sb) {
        Some((kind @ ("SandboxClaim" | "SandboxWarmPool"), _)) => kind.to_string(),
        _ => "None".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use std::collections::BTreeMap;

    fn meta(owner: Option<&str>, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            owner_references: owner.map(|uid| {
                vec![OwnerReference {
                    uid: uid.into(),
                    kind: "Sandbox".into(),
                    name: "x".into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn adoption_needs_the_adoptable_label_or_the_tracking_label() {
        assert_eq!(
            ownership(&meta(Some("u1"), &[]), "u1", "h"),
            Ownership::Owned
        );
        assert_eq!(
            ownership(&meta(Some("u2"), &[]), "u1", "h"),
            Ownership::Foreign("Sandbox x".into())
        );
        assert_eq!(
            ownership(&meta(None, &[]), "u1", "h"),
            Ownership::NotAdoptable
        );
        assert_eq!(
            ownership(&meta(None, &[(names::ADOPTABLE, "true")]), "u1", "h"),
            Ownership::Adoptable
        );
        assert_eq!(
            ownership(&meta(None, &[(names::ADOPTABLE, "yes")]), "u1", "h"),
            Ownership::NotAdoptable
        );
        assert_eq!(
            ownership(&meta(None, &[(names::SANDBOX_NAME_HASH, "h")]), "u1", "h"),
            Ownership::Adoptable
        );
        assert_eq!(
            ownership(
                &meta(None, &[(names::SANDBOX_NAME_HASH, "other")]),
                "u1",
                "h"
            ),
            Ownership::NotAdoptable
        );
    }
}
