//! What a claim writes: the cold Sandbox it creates, and the patch that turns
//! a warm pool member into its own. Pure functions of the claim, template and
//! Sandbox; the reconciler does the I/O.

use std::collections::BTreeMap;

use kube::ResourceExt;
use sandhub_api::k8s::common::PodMetadata;
use sandhub_api::k8s::conditions::{created_by, launch_type};
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::volumes::{self as claim_volumes, ClaimVolume};
use sandhub_api::k8s::{Sandbox, SandboxClaim, SandboxSpec, SandboxTemplate};
use sandhub_api::sandboxd_token::SandboxdTokens;
use serde_json::{json, Map, Value};

use super::inject::{inject_env, merge_vcts, EnvRequest};
use crate::object::controller_ref;
use crate::warmpool::build::apply_secure_defaults;

/// Why a cold Sandbox could not be built (each is a claim Ready reason).
#[derive(Debug, PartialEq, Eq)]
pub enum BuildError {
    EnvVarsInjectionRejected(String),
    VolumeClaimTemplatesError(String),
    /// The hub's volume mounts annotation is unsigned, forged or malformed.
    VolumeMounts(String),
}

/// Whether the claim names volume mounts of the hub's (which only a Pod
/// made for it can have: see `sandhub_api::k8s::volumes`).
pub fn has_volume_mounts(claim: &SandboxClaim) -> bool {
    claim
        .annotations()
        .contains_key(claim_volumes::MOUNTS_ANNOTATION)
}

/// The volume mounts the claim's annotation lists, if the hub signed that
/// list for this claim with the key `tokens` holds; none when it names none.
fn volume_mounts(
    claim: &SandboxClaim,
    tokens: Option<&SandboxdTokens>,
) -> Result<Vec<ClaimVolume>, BuildError> {
    let a = claim.annotations();
    let Some(value) = a.get(claim_volumes::MOUNTS_ANNOTATION) else {
        return Ok(Vec::new());
    };
    let refuse = |why: &str| {
        BuildError::VolumeMounts(format!("{}: {why}", claim_volumes::MOUNTS_ANNOTATION))
    };
    let tokens = tokens.ok_or_else(|| {
        refuse("volume mounts need the key the hub signs them with (--sandboxd-token-key-file)")
    })?;
    let signature = a
        .get(claim_volumes::SIGNATURE_ANNOTATION)
        .ok_or_else(|| refuse("not signed by the hub"))?;
    let namespace = claim.namespace().unwrap_or_default();
    if !tokens.verify_volumes(&namespace, &claim.name_any(), value, signature) {
        return Err(refuse("the hub's signature does not match"));
    }
    claim_volumes::parse(value).map_err(BuildError::VolumeMounts)
}

/// The claim's `created-by` label, or `controller`.
fn created_by_of(claim: &SandboxClaim) -> String {
    claim
        .labels()
        .get(names::CREATED_BY)
        .cloned()
        .unwrap_or_else(|| created_by::CONTROLLER.to_string())
}

/// Labels and annotations the claim adds to its Pod (through the Sandbox's
/// pod template, which the Sandbox reconciler propagates): the claim UID
/// label, the claim-name annotation, and `additionalPodMetadata`.
pub fn claim_pod_metadata(
    claim: &SandboxClaim,
    template: &SandboxTemplate,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let extra = claim
        .spec
        .additional_pod_metadata
        .clone()
        .unwrap_or_default();
    let mut labels = extra.labels.unwrap_or_default();
    labels.insert(names::CLAIM_UID.into(), claim.uid().unwrap_or_default());
    labels.insert(
        names::SANDBOX_TEMPLATE_REF_HASH.into(),
        name_hash(&template.name_any()),
    );
    let mut annotations = extra.annotations.unwrap_or_default();
    annotations.insert(names::CLAIM_NAME_ANNOTATION.into(), claim.name_any());
    (labels, annotations)
}

/// The template's own Pod labels and annotations (empty when it sets none).
pub fn template_pod_metadata(template: &SandboxTemplate) -> PodMetadata {
    template
        .spec
        .blueprint
        .pod_template
        .metadata
        .clone()
        .unwrap_or_default()
}

/// The Sandbox a claim creates when no warm one is taken: named exactly like
/// the claim, so a second create for the same claim fails with AlreadyExists.
pub fn cold_sandbox(
    claim: &SandboxClaim,
    template: &SandboxTemplate,
    tokens: Option<&SandboxdTokens>,
) -> Result<Sandbox, BuildError> {
    let mounts = volume_mounts(claim, tokens)?;
    let mut spec = SandboxSpec {
        blueprint: template.spec.blueprint.clone(),
        ..Default::default()
    };
    let claim_vcts = claim
        .spec
        .volume_claim_templates
        .clone()
        .unwrap_or_default();
    let tpl_vcts = spec
        .blueprint
        .volume_claim_templates
        .clone()
        .unwrap_or_default();
    let vcts = merge_vcts(
        &tpl_vcts,
        &claim_vcts,
        template.spec.volume_claim_templates_policy,
    )
    .map_err(BuildError::VolumeClaimTemplatesError)?;
    spec.blueprint.volume_claim_templates = (!vcts.is_empty()).then_some(vcts);
    let env = claim.spec.env.clone().unwrap_or_default();
    let reqs: Vec<EnvRequest<'_>> = env
        .iter()
        .map(|e| EnvRequest {
            name: &e.name,
            value: &e.value,
            container: e.container_name.as_deref(),
        })
        .collect();
    inject_env(
        &mut spec.blueprint.pod_template.spec,
        &reqs,
        template.spec.env_vars_injection_policy,
    )
    .map_err(BuildError::EnvVarsInjectionRejected)?;
    claim_volumes::mount(&mut spec.blueprint.pod_template.spec, &mounts)
        .map_err(BuildError::VolumeMounts)?;
    apply_secure_defaults(&mut spec, template);

    let (pod_labels, pod_annotations) = claim_pod_metadata(claim, template);
    let pm = spec
        .blueprint
        .pod_template
        .metadata
        .get_or_insert_with(Default::default);
    pm.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(pod_labels);
    pm.annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(pod_annotations);

    let tpl_name = template.name_any();
    let labels = BTreeMap::from([
        (
            names::CLAIM_UID.to_string(),
            claim.uid().unwrap_or_default(),
        ),
        (names::CREATED_BY.to_string(), created_by_of(claim)),
        (
            names::LAUNCH_TYPE.to_string(),
            launch_type::COLD.to_string(),
        ),
        (
            names::SANDBOX_TEMPLATE_REF_HASH.to_string(),
            name_hash(&tpl_name),
        ),
    ]);
    let mut annotations =
        BTreeMap::from([(names::SANDBOX_TEMPLATE_REF_ANNOTATION.to_string(), tpl_name)]);
    if let Some(tc) = claim.annotations().get(names::TRACE_CONTEXT) {
        annotations.insert(names::TRACE_CONTEXT.into(), tc.clone());
    }
    let mut sb = Sandbox::new(&claim.name_any(), spec);
    sb.metadata.namespace = claim.namespace();
    sb.metadata.labels = Some(labels);
    sb.metadata.annotations = Some(annotations);
    sb.metadata.owner_references = Some(vec![controller_ref(claim)]);
    Ok(sb)
}

/// The JSON merge patch that hands warm member `sb` to `claim`. It carries
/// `sb`'s resourceVersion, so it fails with 409 if anything changed the
/// Sandbox since it was read (another claim adopting it first, above all).
pub fn adoption_patch(sb: &Sandbox, claim: &SandboxClaim, template: &SandboxTemplate) -> Value {
    let mut labels = Map::new();
    for k in [
        names::WARM_POOL_SANDBOX,
        names::SANDBOX_TEMPLATE_HASH,
        names::SANDBOX_POD_TEMPLATE_HASH,
    ] {
        if sb.labels().contains_key(k) {
            labels.insert(k.into(), Value::Null);
        }
    }
    labels.insert(names::LAUNCH_TYPE.into(), json!(launch_type::WARM));
    labels.insert(
        names::CLAIM_UID.into(),
        json!(claim.uid().unwrap_or_default()),
    );
    labels.insert(names::CREATED_BY.into(), json!(created_by_of(claim)));
    labels.insert(
        names::SANDBOX_TEMPLATE_REF_HASH.into(),
        json!(name_hash(&template.name_any())),
    );

    let current = sb
        .spec
        .blueprint
        .pod_template
        .metadata
        .clone()
        .unwrap_or_default();
    let cur_labels = current.labels.unwrap_or_default();
    let cur_annotations = current.annotations.unwrap_or_default();
    let mut pod_labels = Map::new();
    for k in [
        names::WARM_POOL_SANDBOX,
        names::SANDBOX_TEMPLATE_HASH,
        names::SANDBOX_POD_TEMPLATE_HASH,
    ] {
        if cur_labels.contains_key(k) {
            pod_labels.insert(k.into(), Value::Null);
        }
    }
    let mut pod_annotations = Map::new();
    if cur_annotations
        .get(names::SAFE_TO_EVICT)
        .map(String::as_str)
        == Some("true")
    {
        pod_annotations.insert(names::SAFE_TO_EVICT.into(), Value::Null);
    }
    // The template's own pod metadata (it may have changed since the member
    // was built), then the claim's.
    let tpl_meta = template_pod_metadata(template);
    let (claim_labels, claim_annotations) = claim_pod_metadata(claim, template);
    for (k, v) in tpl_meta
        .labels
        .unwrap_or_default()
        .into_iter()
        .chain(claim_labels)
    {
        pod_labels.insert(k, json!(v));
    }
    for (k, v) in tpl_meta
        .annotations
        .unwrap_or_default()
        .into_iter()
        .chain(claim_annotations)
    {
        pod_annotations.insert(k, json!(v));
    }
    let mut metadata = json!({
        "resourceVersion": sb.resource_version(),
        "labels": labels,
        "ownerReferences": [controller_ref(claim)],
    });
    if let Some(tc) = claim.annotations().get(names::TRACE_CONTEXT) {
        metadata["annotations"] = json!({ names::TRACE_CONTEXT: tc });
    }
    json!({
        "metadata": metadata,
        "spec": {"podTemplate": {"metadata": {"labels": pod_labels, "annotations": pod_annotations}}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;
    use sandhub_api::k8s::claim::ClaimEnvVar;
    use sandhub_api::k8s::common::PersistentVolumeClaimTemplate;
    use sandhub_api::k8s::template::InjectionPolicy;
    use sandhub_api::k8s::{
        SandboxClaimSpec, SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec,
    };

    use crate::object::controller_of;
    use crate::warmpool::build::pool_sandbox;

    fn template() -> SandboxTemplate {
        let mut t = SandboxTemplate::new("tpl", SandboxTemplateSpec::default());
        t.spec.blueprint.pod_template.spec.containers = vec![Container {
            name: "main".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }];
        t.spec.blueprint.pod_template.metadata = Some(PodMetadata {
            labels: Some(BTreeMap::from([(
                "sandbox.users.io/app".into(),
                "x".into(),
            )])),
            annotations: None,
        });
        t
    }

    fn claim() -> SandboxClaim {
        let mut c = SandboxClaim::new("my-claim", SandboxClaimSpec::default());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some("claim-uid-1".into());
        c.metadata.labels = Some(BTreeMap::from([(
            names::CREATED_BY.into(),
            "python-client".into(),
        )]));
        c.spec.warm_pool_ref.name = "pool".into();
        c.spec.additional_pod_metadata = Some(PodMetadata {
            labels: Some(BTreeMap::from([(
                "sandbox.users.io/team".into(),
                "t".into(),
            )])),
            annotations: Some(BTreeMap::from([("note".into(), "n".into())])),
        });
        c
    }

    #[test]
    fn cold_sandbox_is_named_like_the_claim_and_owned_by_it() {
        let sb = cold_sandbox(&claim(), &template(), None).unwrap();
        assert_eq!(sb.name_any(), "my-claim");
        let owner = controller_of(&sb.metadata).unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("SandboxClaim", "claim-uid-1")
        );
        let l = sb.labels();
        assert_eq!(l[names::CLAIM_UID], "claim-uid-1");
        assert_eq!(l[names::LAUNCH_TYPE], "cold");
        assert_eq!(l[names::CREATED_BY], "python-client");
        assert_eq!(l[names::SANDBOX_TEMPLATE_REF_HASH], name_hash("tpl"));
        assert_eq!(
            sb.annotations()[names::SANDBOX_TEMPLATE_REF_ANNOTATION],
            "tpl"
        );
        let pm = sb.spec.blueprint.pod_template.metadata.unwrap();
        let pl = pm.labels.unwrap();
        assert_eq!(pl[names::CLAIM_UID], "claim-uid-1");
        assert_eq!(pl["sandbox.users.io/team"], "t");
        assert_eq!(pl["sandbox.users.io/app"], "x");
        let pa = pm.annotations.unwrap();
        assert_eq!(pa[names::CLAIM_NAME_ANNOTATION], "my-claim");
        assert_eq!(pa["note"], "n");
    }

    #[test]
    fn cold_sandbox_applies_the_injection_policies() {
        let mut c = claim();
        c.spec.env = Some(vec![ClaimEnvVar {
            name: "A".into(),
            value: "1".into(),
            container_name: None,
        }]);
        assert!(matches!(
            cold_sandbox(&c, &template(), None),
            Err(BuildError::EnvVarsInjectionRejected(_))
        ));
        let mut t = template();
        t.spec.env_vars_injection_policy = InjectionPolicy::Allowed;
        let sb = cold_sandbox(&c, &t, None).unwrap();
        let env = sb.spec.blueprint.pod_template.spec.containers[0]
            .env
            .clone()
            .unwrap();
        assert_eq!(env[0].name, "A");

        let mut v = PersistentVolumeClaimTemplate::default();
        v.metadata.name = "data".into();
        c.spec.volume_claim_templates = Some(vec![v]);
        assert!(matches!(
            cold_sandbox(&c, &t, None),
            Err(BuildError::VolumeClaimTemplatesError(_))
        ));
        t.spec.volume_claim_templates_policy = InjectionPolicy::Allowed;
        let sb = cold_sandbox(&c, &t, None).unwrap();
        assert_eq!(
            sb.spec.blueprint.volume_claim_templates.unwrap()[0]
                .metadata
                .name,
            "data"
        );
    }

    #[test]
    fn volume_mounts_are_mounted_only_when_the_hub_signed_them_for_the_claim() {
        let key = SandboxdTokens::new(vec![b'k'; 32]).unwrap();
        let list = r#"[{"claim":"data-t1","path":"/workspace/data","read_only":true}]"#;
        let with = |value: &str, sig: Option<String>| {
            let mut c = claim();
            let a = c.metadata.annotations.get_or_insert_with(BTreeMap::new);
            a.insert(claim_volumes::MOUNTS_ANNOTATION.into(), value.into());
            if let Some(sig) = sig {
                a.insert(claim_volumes::SIGNATURE_ANNOTATION.into(), sig);
            }
            c
        };
        let signed = with(list, Some(key.volumes_signature("ns", "my-claim", list)));
        assert!(has_volume_mounts(&signed) && !has_volume_mounts(&claim()));
        let sb = cold_sandbox(&signed, &template(), Some(&key)).unwrap();
        let pod = &sb.spec.blueprint.pod_template.spec;
        let vol = pod.volumes.as_ref().unwrap().last().unwrap();
        let pvc = vol.persistent_volume_claim.as_ref().unwrap();
        assert_eq!(
            (pvc.claim_name.as_str(), pvc.read_only),
            ("data-t1", Some(true))
        );
        let m = pod.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .last()
            .unwrap();
        assert_eq!(
            (m.name.as_str(), m.mount_path.as_str()),
            (vol.name.as_str(), "/workspace/data")
        );

        let refused = |c: &SandboxClaim, key: Option<&SandboxdTokens>| {
            matches!(
                cold_sandbox(c, &template(), key),
                Err(BuildError::VolumeMounts(_))
            )
        };
        // No key here, no signature, another claim's, a changed list, another key.
        assert!(refused(&signed, None));
        assert!(refused(&with(list, None), Some(&key)));
        let other = with(list, Some(key.volumes_signature("ns", "other-claim", list)));
        assert!(refused(&other, Some(&key)));
        let widened = list.replace("true", "false");
        let changed = with(
            &widened,
            Some(key.volumes_signature("ns", "my-claim", list)),
        );
        assert!(refused(&changed, Some(&key)));
        let theirs = SandboxdTokens::new(vec![b'j'; 32]).unwrap();
        assert!(refused(
            &with(list, Some(theirs.volumes_signature("ns", "my-claim", list))),
            Some(&key)
        ));
        // Signed but malformed, or shadowing: refused all the same.
        let bad = r#"[{"claim":"c","path":"/"}]"#;
        assert!(refused(
            &with(bad, Some(key.volumes_signature("ns", "my-claim", bad))),
            Some(&key)
        ));
    }

    #[test]
    fn adoption_patch_rewrites_ownership_labels_and_pod_metadata_under_a_lock() {
        let mut pool = SandboxWarmPool::new("pool", SandboxWarmPoolSpec::default());
        pool.metadata.namespace = Some("ns".into());
        pool.metadata.uid = Some("pool-uid".into());
        let mut sb = pool_sandbox(&pool, &template(), true);
        sb.metadata.name = Some("pool-abcde".into());
        sb.metadata.resource_version = Some("42".into());
        let p = adoption_patch(&sb, &claim(), &template());
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        let l = &p["metadata"]["labels"];
        assert!(l[names::WARM_POOL_SANDBOX].is_null() && l.get(names::WARM_POOL_SANDBOX).is_some());
        assert!(l
            .get(names::SANDBOX_TEMPLATE_HASH)
            .is_some_and(Value::is_null));
        assert_eq!(l[names::LAUNCH_TYPE], "warm");
        assert_eq!(l[names::CLAIM_UID], "claim-uid-1");
        assert_eq!(l[names::CREATED_BY], "python-client");
        let owners = p["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0]["kind"], "SandboxClaim");
        assert_eq!(owners[0]["controller"], true);
        let pm = &p["spec"]["podTemplate"]["metadata"];
        assert!(pm["labels"]
            .get(names::WARM_POOL_SANDBOX)
            .is_some_and(Value::is_null));
        assert_eq!(pm["labels"][names::CLAIM_UID], "claim-uid-1");
        assert_eq!(pm["labels"]["sandbox.users.io/team"], "t");
        assert!(pm["annotations"]
            .get(names::SAFE_TO_EVICT)
            .is_some_and(Value::is_null));
        assert_eq!(pm["annotations"][names::CLAIM_NAME_ANNOTATION], "my-claim");
    }
}
