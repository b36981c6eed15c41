//! Sub-types shared by the four CRDs (upstream `api/v1beta1` shared types).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// At most this many `volumeClaimTemplates` entries (v1.0.9 admission rule).
pub const MAX_VOLUME_CLAIM_TEMPLATES: usize = 128;
/// Longest `volumeClaimTemplates[].metadata.name` (a DNS label; v1.0.9 admission rule).
pub const MAX_VOLUME_CLAIM_TEMPLATE_NAME: usize = 63;

/// CEL rule on every `volumeClaimTemplates` list: names are unique.
pub const VCT_UNIQUE_NAMES_RULE: &str =
    "self.all(x, self.exists_one(y, y.metadata.name == x.metadata.name))";
pub const VCT_UNIQUE_NAMES_MESSAGE: &str = "volumeClaimTemplates names must be unique";

/// Drops the `default` schemars derives from `#[serde(default)]`: the Rust side is lenient
/// when decoding, but the apiserver must see a missing value as missing, not default it.
fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// Labels and annotations for a Pod (only these two fields of ObjectMeta are honoured).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PodMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The metadata a `volumeClaimTemplates` entry may carry. Since v1.0.9 the name is required,
/// non-empty and a DNS label in length; the Rust side still tolerates a missing name (serde
/// default) so the controller can report objects that slipped past admission instead of
/// failing to decode them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("required" = ["name"]))]
pub struct EmbeddedObjectMetadata {
    #[serde(default)]
    #[schemars(length(min = 1, max = 63), transform = no_default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The Pod a Sandbox runs: a full PodSpec plus labels and annotations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PodTemplate {
    pub spec: PodSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodMetadata>,
}

/// One PVC made per Sandbox, named `<metadata.name>-<sandbox name>`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("required" = ["metadata", "spec"]))]
pub struct PersistentVolumeClaimTemplate {
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub metadata: EmbeddedObjectMetadata,
    pub spec: PersistentVolumeClaimSpec,
}

/// What a sandbox is; inlined into both `Sandbox.spec` and `SandboxTemplate.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxBlueprint {
    pub pod_template: PodTemplate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxItems" = 128,
        "x-kubernetes-list-type" = "atomic",
        "x-kubernetes-validations" = [{"rule": VCT_UNIQUE_NAMES_RULE, "message": VCT_UNIQUE_NAMES_MESSAGE}]
    ))]
    pub volume_claim_templates: Option<Vec<PersistentVolumeClaimTemplate>>,
    /// Unset: keep a pre-existing Service but never create one; `true`: a headless Service;
    /// `false`: delete an owned Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
}

/// What happens to a Sandbox when its `shutdownTime` passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ShutdownPolicy {
    Delete,
    #[default]
    Retain,
}

/// When a Sandbox expires and what happens then; inlined into `Sandbox.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Absent: the Sandbox never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    #[serde(default)]
    pub shutdown_policy: ShutdownPolicy,
}

/// `{name}` reference to another object in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalRef {
    #[schemars(length(min = 1))]
    pub name: String,
}
