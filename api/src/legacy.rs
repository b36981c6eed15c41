//! JSON bodies of the legacy Python runtime (`POST /execute`, `/upload`,
//! `/list`, `/exists`), which the `k8s-agent-sandbox` SDK speaks in its
//! non-sandboxd connection modes.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteRequest {
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecuteResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    #[serde(default)]
    pub timed_out: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListEntry {
    pub name: String,
    pub size: u64,
    #[serde(rename = "type")]
    pub kind: crate::sandboxd::EntryType,
    /// Seconds since the epoch, as a float (Python's `st_mtime`).
    pub mod_time: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistsResponse {
    pub path: String,
    pub exists: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub message: String,
}

/// Exit code the legacy runtime and the SDK use for a command killed at its
/// deadline (the coreutils `timeout` convention).
pub const TIMEOUT_EXIT_CODE: i32 = 124;
