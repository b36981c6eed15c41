//! Building the Sandboxes a pool keeps warm, and the secure defaults claims
//! share with pools. Pure functions of the objects they read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodDNSConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use sandhub_api::k8s::conditions::{created_by, launch_type};
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::template::NetworkPolicyManagement;
use sandhub_api::k8s::{Sandbox, SandboxSpec, SandboxTemplate, SandboxWarmPool};

use super::plan::blueprint_hash;
use crate::object::controller_ref;

/// The nameservers of the default "secure" network policy: the Pod cannot
/// reach cluster DNS, so it gets public resolvers.
const SECURE_NAMESERVERS: [&str; 2] = ["8.8.8.8", "1.1.1.1"];

/// The template's blueprint hash (the `sandbox-template-hash` label).
pub fn template_hash(template: &SandboxTemplate) -> String {
    blueprint_hash(&serde_json::to_value(&template.spec.blueprint).unwrap_or_default())
}

/// Upstream's `ApplySandboxSecureDefaults`: no service account token unless
/// asked for; with the managed default network policy (which blocks cluster
/// DNS) and no DNS policy of its own, public resolvers.
pub fn apply_secure_defaults(spec: &mut SandboxSpec, template: &SandboxTemplate) {
    let pod = &mut spec.blueprint.pod_template.spec;
    if pod.automount_service_account_token.is_none() {
        pod.automount_service_account_token = Some(false);
    }
    let default_policy = template.spec.network_policy_management
        == NetworkPolicyManagement::Managed
        && template.spec.network_policy.is_none();
    if default_policy && pod.dns_policy.is_none() {
        pod.dns_policy = Some("None".into());
        pod.dns_config = Some(PodDNSConfig {
            nameservers: Some(SECURE_NAMESERVERS.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        });
    }
}

/// A new warm member of `pool` (created with `generateName: <pool>-`).
pub fn pool_sandbox(pool: &SandboxWarmPool, template: &SandboxTemplate, eviction: bool) -> Sandbox {
    let pool_hash = name_hash(&pool.name_any());
    let tpl_name = template.name_any();
    let tpl_ref_hash = name_hash(&tpl_name);
    let tpl_hash = template_hash(template);
    let pod_tpl_hash = name_hash(
        &serde_json::to_string(&template.spec.blueprint.pod_template).unwrap_or_default(),
    );
    let mut spec = SandboxSpec {
        blueprint: template.spec.blueprint.clone(),
        ..Default::default()
    };
    apply_secure_defaults(&mut spec, template);
    let pod_meta = spec
        .blueprint
        .pod_template
        .metadata
        .get_or_insert_with(Default::default);
    let pod_labels = pod_meta.labels.get_or_insert_with(BTreeMap::new);
    pod_labels.insert(names::WARM_POOL_SANDBOX.into(), pool_hash.clone());
    pod_labels.insert(
        names::SANDBOX_TEMPLATE_REF_HASH.into(),
        tpl_ref_hash.clone(),
    );
    pod_labels.insert(names::SANDBOX_TEMPLATE_HASH.into(), tpl_hash.clone());
    pod_labels.insert(
        names::SANDBOX_POD_TEMPLATE_HASH.into(),
        pod_tpl_hash.clone(),
    );
    if eviction {
        pod_meta
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(names::SAFE_TO_EVICT.into(), "true".into());
    }
    let labels = BTreeMap::from([
        (names::WARM_POOL_SANDBOX.to_string(), pool_hash),
        (names::SANDBOX_TEMPLATE_REF_HASH.to_string(), tpl_ref_hash),
        (
            names::LAUNCH_TYPE.to_string(),
            launch_type::WARM.to_string(),
        ),
        (names::SANDBOX_POD_TEMPLATE_HASH.to_string(), pod_tpl_hash),
        (names::SANDBOX_TEMPLATE_HASH.to_string(), tpl_hash),
        (
            names::CREATED_BY.to_string(),
            created_by::CONTROLLER.to_string(),
        ),
    ]);
    Sandbox {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", pool.name_any())),
            namespace: pool.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                names::SANDBOX_TEMPLATE_REF_ANNOTATION.to_string(),
                tpl_name,
            )])),
            owner_references: Some(vec![controller_ref(pool)]),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{controlled_by_kind, controller_of};
    use k8s_openapi::api::core::v1::Container;
    use sandhub_api::k8s::{SandboxTemplateSpec, SandboxWarmPoolSpec};

    fn template() -> SandboxTemplate {
        let mut t = SandboxTemplate::new("tpl", SandboxTemplateSpec::default());
        t.spec.blueprint.pod_template.spec.containers = vec![Container {
            name: "main".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }];
        t
    }

    fn pool() -> SandboxWarmPool {
        let mut p = SandboxWarmPool::new("pool", SandboxWarmPoolSpec::default());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    #[test]
    fn pool_members_carry_the_pool_and_template_labels_and_the_owner() {
        let sb = pool_sandbox(&pool(), &template(), true);
        let l = sb.metadata.labels.as_ref().unwrap();
        assert_eq!(l[names::WARM_POOL_SANDBOX], name_hash("pool"));
        assert_eq!(l[names::SANDBOX_TEMPLATE_REF_HASH], name_hash("tpl"));
        assert_eq!(l[names::LAUNCH_TYPE], "warm");
        assert_eq!(l[names::CREATED_BY], "controller");
        assert_eq!(l[names::SANDBOX_TEMPLATE_HASH], template_hash(&template()));
        assert_eq!(sb.metadata.generate_name.as_deref(), Some("pool-"));
        let owner = controller_of(&sb.metadata).unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("SandboxWarmPool", "pool")
        );
        assert!(controlled_by_kind::<SandboxWarmPool>(&sb.metadata).is_some());
        assert!(controlled_by_kind::<Sandbox>(&sb.metadata).is_none());
        let pm = sb.spec.blueprint.pod_template.metadata.as_ref().unwrap();
        assert_eq!(
            pm.labels.as_ref().unwrap()[names::WARM_POOL_SANDBOX],
            name_hash("pool")
        );
        assert_eq!(
            pm.annotations.as_ref().unwrap()[names::SAFE_TO_EVICT],
            "true"
        );
        assert_eq!(
            sb.spec
                .blueprint
                .pod_template
                .spec
                .automount_service_account_token,
            Some(false)
        );
        assert_eq!(
            sb.spec.blueprint.pod_template.spec.dns_policy.as_deref(),
            Some("None")
        );
        let no_evict = pool_sandbox(&pool(), &template(), false);
        assert!(no_evict
            .spec
            .blueprint
            .pod_template
            .metadata
            .unwrap()
            .annotations
            .is_none());
    }

    #[test]
    fn secure_defaults_respect_explicit_settings() {
        let mut t = template();
        t.spec
            .blueprint
            .pod_template
            .spec
            .automount_service_account_token = Some(true);
        t.spec.network_policy_management = NetworkPolicyManagement::Unmanaged;
        let sb = pool_sandbox(&pool(), &t, false);
        let spec = &sb.spec.blueprint.pod_template.spec;
        assert_eq!(spec.automount_service_account_token, Some(true));
        assert_eq!(spec.dns_policy, None);
    }
}
