//! `agents.x-k8s.io/v1beta1` Sandbox: one Pod (plus PVCs and an optional headless Service)
//! with a stable identity and a lifecycle.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::common::{Lifecycle, SandboxBlueprint, ShutdownPolicy};

/// CEL rule on `Sandbox.spec`: the PVC templates cannot change after creation.
pub const VCT_IMMUTABLE_RULE: &str = "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && (!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)";
pub const VCT_IMMUTABLE_MESSAGE: &str = "volumeClaimTemplates is immutable";

/// `Running` keeps a Pod; `Suspended` deletes it and keeps the Sandbox and its PVCs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OperatingMode {
    #[default]
    Running,
    Suspended,
}

/// A Pod (plus PVCs and an optional headless Service) with a stable identity, suspend/resume
/// and an expiry.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    shortname = "sandbox",
    namespaced,
    status = "SandboxStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": VCT_IMMUTABLE_RULE, "message": VCT_IMMUTABLE_MESSAGE}]))]
pub struct SandboxSpec {
    #[serde(flatten)]
    pub blueprint: SandboxBlueprint,
    #[serde(flatten)]
    pub lifecycle: Lifecycle,
    #[serde(default)]
    pub operating_mode: OperatingMode,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// `<service>.<namespace>.svc.<cluster-domain>` while the Service exists.
    #[serde(
        default,
        rename = "serviceFQDN",
        skip_serializing_if = "String::is_empty"
    )]
    pub service_fqdn: String,
    /// Name of the Service; empty when there is none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// `agents.x-k8s.io/sandbox-name-hash=<hash>` once a Pod exists.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// Cleared when there is no (owned) Pod.
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
}
