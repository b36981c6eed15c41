//! Who a SandboxWarmPool or SandboxTemplate belongs to, and the names a
//! tenant's pools get. Pure functions, tested without a cluster.
//!
//! - A **tenant's** object carries [`TENANT_LABEL`] with its digest; its
//!   cluster name is `<hub name>-<12 hex of the digest>`, so two tenants'
//!   pools of one hub name never collide, and its hub name is kept in an
//!   annotation. Only that tenant sees, changes or deletes it.
//! - An **operator's** object (made with kubectl or Helm) has no tenant
//!   label: every tenant may claim from it and use its template, none may
//!   change or delete it through the hub.
//! - Anything labelled for another tenant is invisible.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sandhub_api::k8s::{common::LocalRef, names, warmpool::SandboxWarmPoolSpec, SandboxWarmPool};

use super::model::{tenant_label_value, CREATED_BY_HUB, TENANT_LABEL};

/// A tenant object's name in the hub (its cluster name has a suffix).
pub const HUB_NAME_ANNOTATION: &str = "sandhub.io/name";
/// Longest hub name of a tenant's pool: with the 13-character suffix the
/// cluster name stays at 53, leaving room for the `-xxxxx` the controller
/// appends to make each warm Sandbox's (a DNS label, at most 63) name.
pub const MAX_TENANT_NAME: usize = 40;
const SUFFIX_HEX: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// No tenant label: made by the operator.
    Operator,
    /// Labelled with the caller's digest.
    Caller,
    /// Labelled with another tenant's digest.
    Other,
}

pub fn owner(meta: &ObjectMeta, tenant: &str) -> Owner {
    match meta.labels.as_ref().and_then(|l| l.get(TENANT_LABEL)) {
        None => Owner::Operator,
        Some(v) if *v == tenant_label_value(tenant) => Owner::Caller,
        Some(_) => Owner::Other,
    }
}

/// The cluster name of `tenant`'s object called `name` in the hub.
pub fn object_name(tenant: &str, name: &str) -> String {
    format!("{name}-{}", &tenant_label_value(tenant)[..SUFFIX_HEX])
}

/// The hub name of the pool (or template) a claim of `tenant`'s names (its own objects'
/// cluster names carry the tenant suffix; operator pools' do not).
pub fn pool_hub_name(tenant: &str, object: &str) -> String {
    pool_hub_name_by_key(&tenant_label_value(tenant), object)
}

/// [`pool_hub_name`] for the tenant whose label value is `key` (the
/// lifecycle events see only that); an empty key (an operator's) keeps
/// the cluster name.
pub fn pool_hub_name_by_key(key: &str, object: &str) -> String {
    let Some(hex) = key.get(..SUFFIX_HEX) else {
        return object.to_string();
    };
    let suffix = format!("-{hex}");
    object
        .strip_suffix(&suffix)
        .filter(|n| !n.is_empty())
        .unwrap_or(object)
        .to_string()
}

/// The name `tenant` knows the object by, if it may see it at all.
pub fn hub_name(meta: &ObjectMeta, tenant: &str) -> Option<String> {
    let name = meta.name.clone()?;
    match owner(meta, tenant) {
        Owner::Operator => Some(name),
        Owner::Caller => Some(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(HUB_NAME_ANNOTATION))
                .cloned()
                .unwrap_or(name),
        ),
        Owner::Other => None,
    }
}

/// The selector for `tenant`'s own objects.
pub fn tenant_selector(tenant: &str) -> String {
    format!("{TENANT_LABEL}={}", tenant_label_value(tenant))
}

/// `tenant`'s pool `name` of `replicas` warm Sandboxes of the template whose
/// cluster name is `template`.
pub fn tenant_pool(tenant: &str, name: &str, template: &str, replicas: u32) -> SandboxWarmPool {
    let mut pool = SandboxWarmPool::new(
        &object_name(tenant, name),
        SandboxWarmPoolSpec {
            replicas: replicas.min(i32::MAX as u32) as i32,
            sandbox_template_ref: LocalRef {
                name: template.into(),
            },
            ..Default::default()
        },
    );
    pool.metadata = tenant_metadata(tenant, name);
    pool
}

/// The metadata of `tenant`'s object called `name` in the hub: its cluster
/// name ([`object_name`]), the tenant and created-by labels, and the hub
/// name annotation. Pools, templates and pre-pull DaemonSets all carry it.
pub fn tenant_metadata(tenant: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(object_name(tenant, name)),
        labels: Some(tenant_labels(tenant)),
        annotations: Some(BTreeMap::from([(
            HUB_NAME_ANNOTATION.to_string(),
            name.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The labels that mark an object as `tenant`'s, made by the hub.
pub fn tenant_labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TENANT_LABEL.to_string(), tenant_label_value(tenant)),
        (names::CREATED_BY.to_string(), CREATED_BY_HUB.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_pools_never_share_a_name_and_fit_the_sandbox_names() {
        let a = object_name("tenant-a", "python");
        let b = object_name("tenant-b", "python");
        assert_ne!(a, b);
        assert!(a.starts_with("python-"));
        let longest = object_name("t", &"p".repeat(MAX_TENANT_NAME));
        // The controller names warm Sandboxes `<pool>-<5 random>`.
        assert!(longest.len() + 6 <= 63, "{}", longest.len());
        assert!(sandhub_api::hub::is_dns_label(&longest));
    }

    #[test]
    fn ownership_follows_the_tenant_label() {
        let pool = tenant_pool("tenant-a", "python", "python", 3);
        assert_eq!(owner(&pool.metadata, "tenant-a"), Owner::Caller);
        assert_eq!(owner(&pool.metadata, "tenant-b"), Owner::Other);
        assert_eq!(
            hub_name(&pool.metadata, "tenant-a").as_deref(),
            Some("python")
        );
        assert_eq!(hub_name(&pool.metadata, "tenant-b"), None);
        assert_eq!(
            pool_hub_name("tenant-a", &object_name("tenant-a", "python")),
            "python"
        );
        assert_eq!(pool_hub_name("tenant-a", "shared"), "shared");
        assert_eq!(pool.spec.replicas, 3);
        assert_eq!(pool.spec.sandbox_template_ref.name, "python");
        assert_eq!(
            tenant_selector("tenant-a"),
            format!("{TENANT_LABEL}={}", tenant_label_value("tenant-a"))
        );

        let operator = SandboxWarmPool::new("shared", Default::default());
        assert_eq!(owner(&operator.metadata, "tenant-a"), Owner::Operator);
        assert_eq!(
            hub_name(&operator.metadata, "tenant-b").as_deref(),
            Some("shared")
        );
    }
}
