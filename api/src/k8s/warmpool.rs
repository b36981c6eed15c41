//! `extensions.agents.x-k8s.io/v1beta1` SandboxWarmPool: N ready Sandboxes of one template,
//! waiting to be adopted by claims. Scalable through the scale subresource (HPA).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::common::LocalRef;

/// How stale members (template changed) are replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UpdateStrategyType {
    /// Delete stale unclaimed members at once.
    Recreate,
    /// Replace stale members only as they are claimed or deleted.
    #[default]
    OnReplenish,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateStrategy {
    #[serde(default, rename = "type")]
    pub type_: UpdateStrategyType,
}

fn one() -> i32 {
    1
}

/// Keeps `replicas` Sandboxes of a template ready for claims.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    shortname = "swp",
    namespaced,
    status = "SandboxWarmPoolStatus",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    #[serde(default = "one")]
    #[schemars(extend("minimum" = 0))]
    pub replicas: i32,
    pub sandbox_template_ref: LocalRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

impl Default for SandboxWarmPoolSpec {
    fn default() -> Self {
        Self {
            replicas: 1,
            sandbox_template_ref: LocalRef::default(),
            update_strategy: None,
        }
    }
}

impl SandboxWarmPoolSpec {
    pub fn update_strategy_type(&self) -> UpdateStrategyType {
        self.update_strategy
            .as_ref()
            .map(|s| s.type_)
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    /// Active (not terminating) members.
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    /// `agents.x-k8s.io/warm-pool-sandbox=<NameHash(pool)>`, for the scale subresource.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A Sandhub annotation the controller writes on a pool each time warm
/// starts of it fail (a member replaced for not getting Ready within the
/// readiness grace, or a member the API server refused to create), so the
/// hub's replicas can all tell `pool_start_failed` from one write.
pub const START_FAILURES_ANNOTATION: &str = "sandhub.io/start-failures";

/// The value of [`START_FAILURES_ANNOTATION`]: the failures counted since
/// the pool was made (never decreasing) and the latest one's reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartFailures {
    pub failures: u64,
    pub last_error: String,
}

impl StartFailures {
    /// The longest `last_error` written (a Pod's message can be long).
    pub const MAX_ERROR: usize = 1024;
    /// A value longer than this is not read.
    const MAX_ANNOTATION: usize = 4096;

    /// What `pool` records, if anything (and sane).
    pub fn of(pool: &SandboxWarmPool) -> Option<StartFailures> {
        let raw = pool
            .metadata
            .annotations
            .as_ref()?
            .get(START_FAILURES_ANNOTATION)?;
        if raw.len() > Self::MAX_ANNOTATION {
            return None;
        }
        serde_json::from_str(raw).ok()
    }
}
