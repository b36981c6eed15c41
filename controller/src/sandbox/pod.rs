//! The Sandbox's Pod: built from `spec.podTemplate`, one PVC volume per template entry.

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Pod, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use sandhub_api::k8s::{names, Sandbox};

use super::metadata::PodMeta;
use super::owner::sandbox_ref;
use super::pvc::pvc_name;

/// The Pod's name: the `pod-name` annotation if a Sandbox has one (older objects, or a
/// claim adoption), else the Sandbox's name.
pub fn pod_name(sb: &Sandbox) -> String {
    sb.annotations()
        .get(names::POD_NAME_ANNOTATION)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| sb.name_any())
}

pub fn desired(sb: &Sandbox, meta: &PodMeta) -> Pod {
    let mut spec = sb.spec.blueprint.pod_template.spec.clone();
    let sandbox = sb.name_any();
    for vct in sb.spec.blueprint.volume_claim_templates.iter().flatten() {
        let volume = Volume {
            name: vct.metadata.name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc_name(&vct.metadata.name, &sandbox),
                read_only: None,
            }),
            ..Default::default()
        };
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        match volumes.iter_mut().find(|v| v.name == volume.name) {
            Some(v) => *v = volume,
            None => volumes.push(volume),
        }
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(sb)),
            namespace: sb.namespace(),
            labels: Some(meta.labels.clone()),
            annotations: (!meta.annotations.is_empty()).then(|| meta.annotations.clone()),
            owner_references: Some(vec![sandbox_ref(sb)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;
    use sandhub_api::k8s::common::{EmbeddedObjectMetadata, PersistentVolumeClaimTemplate};
    use std::collections::BTreeMap;

    #[test]
    fn pvc_volumes_replace_same_named_ones_and_the_pod_is_owned() {
        let mut sb = Sandbox::new("sb", Default::default());
        sb.metadata.uid = Some("u1".into());
        sb.spec.blueprint.pod_template.spec.containers = vec![Container {
            name: "c".into(),
            ..Default::default()
        }];
        sb.spec.blueprint.pod_template.spec.volumes = Some(vec![
            Volume {
                name: "data".into(),
                ..Default::default()
            },
            Volume {
                name: "keep".into(),
                ..Default::default()
            },
        ]);
        sb.spec.blueprint.volume_claim_templates = Some(vec![PersistentVolumeClaimTemplate {
            metadata: EmbeddedObjectMetadata {
                name: "data".into(),
                ..Default::default()
            },
            spec: Default::default(),
        }]);
        let pod = desired(
            &sb,
            &PodMeta {
                labels: BTreeMap::new(),
                ..Default::default()
            },
        );
        let vols = pod.spec.unwrap().volumes.unwrap();
        assert_eq!(vols.len(), 2);
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "data-sb"
        );
        assert_eq!(pod.metadata.owner_references.unwrap()[0].uid, "u1");
        assert_eq!(pod.metadata.name.as_deref(), Some("sb"));

        sb.metadata.annotations = Some(BTreeMap::from([(
            names::POD_NAME_ANNOTATION.to_string(),
            "legacy".to_string(),
        )]));
        assert_eq!(pod_name(&sb), "legacy");
    }
}
