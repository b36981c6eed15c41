//! `extensions.agents.x-k8s.io/v1beta1` SandboxTemplate: a reusable blueprint plus the
//! network policy and the injection policies claims are held to.

use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::common::SandboxBlueprint;

/// User rules for the template's NetworkPolicy; podSelector and policyTypes are the
/// controller's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<NetworkPolicyIngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<NetworkPolicyEgressRule>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NetworkPolicyManagement {
    #[default]
    Managed,
    Unmanaged,
}

/// How far a claim may change what the template says (env vars or PVC templates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum InjectionPolicy {
    #[default]
    Disallowed,
    /// Append only; a name clash with the template is refused.
    Allowed,
    /// Replace same-named entries, append new ones.
    Overrides,
}

/// A reusable Sandbox blueprint, its NetworkPolicy, and what claims may inject.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    shortname = "sandboxtemplate",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    #[serde(flatten)]
    pub blueprint: SandboxBlueprint,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
    #[serde(default)]
    pub network_policy_management: NetworkPolicyManagement,
    #[serde(default)]
    pub env_vars_injection_policy: InjectionPolicy,
    #[serde(default)]
    pub volume_claim_templates_policy: InjectionPolicy,
}
