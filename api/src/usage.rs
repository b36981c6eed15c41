//! A sandbox's resource usage (issue #30 §1): the samples the hub keeps
//! per sandbox, the limits they are measured against, and the series
//! `GET /v1/sandboxes/{id}/metrics` answers.

use serde::{Deserialize, Serialize};

/// What a sandbox's usage is measured against; a limit it does not have
/// (or the backend cannot tell) is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    /// CPU cores (fractional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
}

/// One point of a sandbox's usage: over the step that ends at
/// `timestamp` (CPU, network), or at its end (memory, processes, disk).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageSample {
    /// RFC 3339, UTC, whole seconds.
    pub timestamp: String,
    /// CPU cores used on average over the step (1.0 = one core busy).
    pub cpu_cores: f64,
    /// Memory charged to the sandbox (page cache included), at most over the step.
    pub memory_bytes: u64,
    /// Processes and threads, at most over the step.
    pub pids: u64,
    /// Bytes its disk quota counts; absent without a disk quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Payload bytes its egress gateway carried in over the step; absent
    /// for a sandbox without a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_rx_bytes: Option<u64>,
    /// Payload bytes it sent out over the step (as `net_rx_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_tx_bytes: Option<u64>,
}

/// The latest sample of a running sandbox, on its `GET` and in lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxUsage {
    pub latest: UsageSample,
    /// The most memory it has used since it started.
    pub memory_peak_bytes: u64,
    /// Processes the kernel's OOM killer killed in it since it started.
    pub oom_kills: u64,
    pub limits: UsageLimits,
}

/// `GET /v1/sandboxes/{id}/metrics`: the series, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxMetrics {
    /// The step the points were folded to, in seconds (older points may
    /// be coarser: the hub keeps 15 minutes at 1 s, then an hour at 10 s).
    pub step_seconds: u64,
    pub limits: UsageLimits,
    pub samples: Vec<UsageSample>,
}

/// The query of `GET /v1/sandboxes/{id}/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsQuery {
    /// Unix seconds; samples at or after it (default: all kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Seconds per point, 1..=3600 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

/// Largest `step` taken.
pub const MAX_STEP_SECONDS: u64 = 3600;
