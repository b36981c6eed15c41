//! `extensions.agents.x-k8s.io/v1beta1` SandboxClaim: one user's request for a Sandbox from
//! a warm pool (adopted warm, or created cold).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::common::{LocalRef, PersistentVolumeClaimTemplate, PodMetadata};
use super::common::{VCT_UNIQUE_NAMES_MESSAGE, VCT_UNIQUE_NAMES_RULE};

/// What happens to a claim (and its Sandbox) when the claim expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ClaimShutdownPolicy {
    /// Delete the claim (and through ownership, the Sandbox) in the background.
    Delete,
    /// Delete the claim with foreground propagation.
    DeleteForeground,
    /// Delete the Sandbox, keep the claim.
    #[default]
    Retain,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// Counted from the claim's mirrored `Finished` condition's lastTransitionTime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    #[serde(default)]
    pub shutdown_policy: ClaimShutdownPolicy,
}

/// One environment variable a claim injects (subject to the template's policy).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEnvVar {
    #[schemars(length(min = 1))]
    pub name: String,
    #[serde(default)]
    pub value: String,
    /// Default: the first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
}

/// A request for one Sandbox from a warm pool.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    shortname = "sandboxclaim",
    namespaced,
    status = "SandboxClaimStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Sandbox","type":"string","jsonPath":".status.sandbox.name"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    pub warm_pool_ref: LocalRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
    /// Forces a cold create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub env: Option<Vec<ClaimEnvVar>>,
    /// Forces a cold create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxItems" = 128,
        "x-kubernetes-list-type" = "atomic",
        "x-kubernetes-validations" = [{"rule": VCT_UNIQUE_NAMES_RULE, "message": VCT_UNIQUE_NAMES_MESSAGE}]
    ))]
    pub volume_claim_templates: Option<Vec<PersistentVolumeClaimTemplate>>,
}

/// The Sandbox a claim is bound to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSandboxStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    #[serde(
        default,
        rename = "serviceFQDN",
        skip_serializing_if = "String::is_empty"
    )]
    pub service_fqdn: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimSandboxStatus>,
}
