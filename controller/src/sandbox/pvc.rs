//! One PersistentVolumeClaim per `volumeClaimTemplates` entry, named `<vct>-<sandbox>`.
//! Kept through suspend; deleted only with the Sandbox (ownerReference).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sandhub_api::k8s::common::PersistentVolumeClaimTemplate;
use sandhub_api::k8s::{names, Sandbox};

use super::owner::{ownership, Ownership};
use crate::context::SANDBOX_CONTROLLER;
use crate::error::Error;
use crate::object::controller_ref;

pub fn pvc_name(vct: &str, sandbox: &str) -> String {
    format!("{vct}-{sandbox}")
}

pub fn desired(
    sb: &Sandbox,
    vct: &PersistentVolumeClaimTemplate,
    name_hash: &str,
) -> PersistentVolumeClaim {
    let mut labels = vct.metadata.labels.clone().unwrap_or_default();
    labels.insert(names::SANDBOX_NAME_HASH.to_string(), name_hash.to_string());
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(pvc_name(&vct.metadata.name, &sb.name_any())),
            namespace: sb.namespace(),
            labels: Some(labels),
            annotations: vct.metadata.annotations.clone(),
            owner_references: Some(vec![controller_ref(sb)]),
            ..Default::default()
        },
        spec: Some(vct.spec.clone()),
        status: None,
    }
}

pub async fn ensure(
    api: &Api<PersistentVolumeClaim>,
    sb: &Sandbox,
    name_hash: &str,
) -> Result<(), Error> {
    let uid = sb.uid().unwrap_or_default();
    for vct in sb.spec.blueprint.volume_claim_templates.iter().flatten() {
        let want = desired(sb, vct, name_hash);
        let name = want.name_any();
        match api.get_opt(&name).await? {
            None => match api.create(&PostParams { field_manager: Some(SANDBOX_CONTROLLER.into()), ..Default::default() }, &want).await {
                Ok(_) => {}
                // Created by a parallel pass of ours; the next pass checks its owner.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            },
            Some(have) => match ownership(&have.metadata, &uid, name_hash) {
                Ownership::Owned => {}
                Ownership::Adoptable => {
                    let patch = serde_json::json!({"metadata": {
                        "ownerReferences": [controller_ref(sb)],
                        "labels": {names::SANDBOX_NAME_HASH: name_hash},
                    }});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                }
                Ownership::Foreign(owner) => {
                    return Err(Error::ChildConflict(format!(
                        "PersistentVolumeClaim {name} is controlled by {owner}"
                    )))
                }
                Ownership::NotAdoptable => {
                    return Err(Error::ChildConflict(format!(
                        "PersistentVolumeClaim {name} exists, is not owned by this Sandbox and is not labelled {}=true",
                        names::ADOPTABLE
                    )))
                }
            },
        }
    }
    Ok(())
}
