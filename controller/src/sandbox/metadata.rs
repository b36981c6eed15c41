//! Which labels and annotations a Sandbox's Pod carries, and the merge patch that brings an
//! existing Pod there. User keys come from `spec.podTemplate.metadata` (reserved prefixes
//! dropped) and are recorded in the `propagated-*` annotations, so a key later removed from
//! the template is removed from the Pod while keys others put on the Pod are left alone.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use sandhub_api::k8s::names;
use sandhub_api::k8s::Sandbox;
use serde_json::{Map, Value};

use super::owner::sandbox_owner;

/// Labels the controller derives from the Sandbox; removed from the Pod when no longer due.
const MANAGED_LABELS: [&str; 6] = [
    names::WARM_POOL_SANDBOX,
    names::SANDBOX_TEMPLATE_REF_HASH,
    names::SANDBOX_TEMPLATE_HASH,
    names::SANDBOX_POD_TEMPLATE_HASH,
    names::CLAIM_UID,
    names::CREATED_BY,
];
/// Labels a Pod keeps only while its Sandbox belongs to a warm pool.
const POOL_ONLY_LABELS: [&str; 3] = [
    names::WARM_POOL_SANDBOX,
    names::SANDBOX_TEMPLATE_HASH,
    names::SANDBOX_POD_TEMPLATE_HASH,
];

pub fn is_reserved(key: &str) -> bool {
    names::RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

fn user_entries(map: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| !is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn keys_csv(map: &BTreeMap<String, String>) -> String {
    map.keys().cloned().collect::<Vec<_>>().join(",")
}

fn parse_csv(v: Option<&String>) -> BTreeSet<String> {
    v.map(|s| {
        s.split(',')
            .filter(|k| !k.is_empty())
            .map(String::from)
            .collect()
    })
    .unwrap_or_default()
}

/// The Pod metadata a Sandbox asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMeta {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Managed labels that must not be on the Pod.
    pub absent_labels: Vec<&'static str>,
}

pub fn desired(sb: &Sandbox, name_hash: &str) -> PodMeta {
    let tmpl = sb.spec.blueprint.pod_template.metadata.as_ref();
    let user_labels = user_entries(tmpl.and_then(|m| m.labels.as_ref()));
    let user_annotations = user_entries(tmpl.and_then(|m| m.annotations.as_ref()));
    let owner = sandbox_owner(sb);
    let pool_owned = matches!(owner, Some(("SandboxWarmPool", _)));

    let mut labels = user_labels.clone();
    let mut absent_labels = Vec::new();
    let tmpl_labels = tmpl.and_then(|m| m.labels.as_ref());
    for key in MANAGED_LABELS {
        let pool_only = POOL_ONLY_LABELS.contains(&key);
        let value = sb.labels().get(key).or_else(|| {
            if pool_only {
                tmpl_labels.and_then(|l| l.get(key))
            } else {
                None
            }
        });
        match value {
            Some(v) if pool_owned || !pool_only => {
                labels.insert(key.to_string(), v.clone());
            }
            _ => absent_labels.push(key),
        }
    }
    labels.insert(names::SANDBOX_NAME_HASH.to_string(), name_hash.to_string());

    let mut annotations = user_annotations.clone();
    if !user_labels.is_empty() {
        annotations.insert(names::PROPAGATED_LABELS.to_string(), keys_csv(&user_labels));
    }
    if !user_annotations.is_empty() {
        annotations.insert(
            names::PROPAGATED_ANNOTATIONS.to_string(),
            keys_csv(&user_annotations),
        );
    }
    if let Some(("SandboxClaim", claim)) = owner {
        annotations.insert(names::CLAIM_NAME_ANNOTATION.to_string(), claim.to_string());
    }
    PodMeta {
        labels,
        annotations,
        absent_labels,
    }
}

/// `{"metadata": {"labels": {...}, "annotations": {...}}}` merge patch, or None when the Pod
/// already matches. Nulls remove keys.
pub fn drift_patch(pod: &ObjectMeta, want: &PodMeta) -> Option<Value> {
    let empty = BTreeMap::new();
    let have_labels = pod.labels.as_ref().unwrap_or(&empty);
    let have_annotations = pod.annotations.as_ref().unwrap_or(&empty);
    let mut labels = Map::new();
    let mut annotations = Map::new();

    for (k, v) in &want.labels {
        if have_labels.get(k) != Some(v) {
            labels.insert(k.clone(), Value::String(v.clone()));
        }
    }
    for k in &want.absent_labels {
        if have_labels.contains_key(*k) {
            labels.insert(k.to_string(), Value::Null);
        }
    }
    for k in parse_csv(have_annotations.get(names::PROPAGATED_LABELS)) {
        if !want.labels.contains_key(&k) && have_labels.contains_key(&k) && !is_reserved(&k) {
            labels.insert(k, Value::Null);
        }
    }

    for (k, v) in &want.annotations {
        if have_annotations.get(k) != Some(v) {
            annotations.insert(k.clone(), Value::String(v.clone()));
        }
    }
    for k in parse_csv(have_annotations.get(names::PROPAGATED_ANNOTATIONS)) {
        if !want.annotations.contains_key(&k)
            && have_annotations.contains_key(&k)
            && !is_reserved(&k)
        {
            annotations.insert(k, Value::Null);
        }
    }
    for key in [names::PROPAGATED_LABELS, names::PROPAGATED_ANNOTATIONS] {
        if !want.annotations.contains_key(key) && have_annotations.contains_key(key) {
            annotations.insert(key.to_string(), Value::Null);
        }
    }

    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut meta = Map::new();
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Some(serde_json::json!({ "metadata": meta }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use sandhub_api::k8s::common::PodMetadata;
    use serde_json::json;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sandbox(
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        owner_kind: Option<&str>,
    ) -> Sandbox {
        let mut sb = Sandbox::new("sb", Default::default());
        sb.metadata.labels = Some(map(&[
            (names::SANDBOX_TEMPLATE_REF_HASH, "t1"),
            (names::WARM_POOL_SANDBOX, "p1"),
        ]));
        sb.metadata.owner_references = owner_kind.map(|k| {
            vec![OwnerReference {
                kind: k.into(),
                name: "owner".into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        sb.spec.blueprint.pod_template.metadata = Some(PodMetadata {
            labels: Some(map(labels)),
            annotations: Some(map(annotations)),
        });
        sb
    }

    #[test]
    fn reserved_template_keys_are_dropped_and_the_rest_recorded() {
        let sb = sandbox(
            &[("app", "x"), ("agents.x-k8s.io/evil", "1"), ("b", "2")],
            &[("note", "n")],
            None,
        );
        let want = desired(&sb, "h");
        assert_eq!(want.labels.get("app").map(String::as_str), Some("x"));
        assert!(!want.labels.contains_key("agents.x-k8s.io/evil"));
        assert_eq!(want.labels[names::SANDBOX_NAME_HASH], "h");
        assert_eq!(want.labels[names::SANDBOX_TEMPLATE_REF_HASH], "t1");
        // Not owned by a pool: the pool label must go.
        assert!(!want.labels.contains_key(names::WARM_POOL_SANDBOX));
        assert!(want.absent_labels.contains(&names::WARM_POOL_SANDBOX));
        assert_eq!(want.annotations[names::PROPAGATED_LABELS], "app,b");
        assert_eq!(want.annotations[names::PROPAGATED_ANNOTATIONS], "note");
    }

    #[test]
    fn pool_label_stays_while_pool_owned_and_claim_name_follows_the_claim() {
        let want = desired(&sandbox(&[], &[], Some("SandboxWarmPool")), "h");
        assert_eq!(want.labels[names::WARM_POOL_SANDBOX], "p1");
        let want = desired(&sandbox(&[], &[], Some("SandboxClaim")), "h");
        assert_eq!(want.annotations[names::CLAIM_NAME_ANNOTATION], "owner");
        assert!(!want.annotations.contains_key(names::PROPAGATED_LABELS));
    }

    #[test]
    fn drift_patch_removes_only_keys_it_propagated() {
        let pod = ObjectMeta {
            labels: Some(map(&[
                ("app", "old"),
                ("gone", "1"),
                ("someone-else", "keep"),
                (names::WARM_POOL_SANDBOX, "p1"),
                (names::SANDBOX_NAME_HASH, "h"),
                (names::SANDBOX_TEMPLATE_REF_HASH, "t1"),
            ])),
            annotations: Some(map(&[
                (names::PROPAGATED_LABELS, "app,gone"),
                (names::PROPAGATED_ANNOTATIONS, "safe"),
                ("safe", "true"),
            ])),
            ..Default::default()
        };
        let sb = sandbox(&[("app", "new")], &[], Some("SandboxClaim"));
        let patch = drift_patch(&pod, &desired(&sb, "h")).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {
                "labels": {"app": "new", "gone": null, names::WARM_POOL_SANDBOX: null},
                "annotations": {
                    names::PROPAGATED_LABELS: "app",
                    names::PROPAGATED_ANNOTATIONS: null,
                    "safe": null,
                    names::CLAIM_NAME_ANNOTATION: "owner"
                }
            }})
        );
    }

    #[test]
    fn no_patch_when_the_pod_matches() {
        let sb = sandbox(&[("app", "x")], &[], None);
        let want = desired(&sb, "h");
        let pod = ObjectMeta {
            labels: Some(want.labels.clone()),
            annotations: Some(want.annotations.clone()),
            ..Default::default()
        };
        assert_eq!(drift_patch(&pod, &want), None);
    }
}
