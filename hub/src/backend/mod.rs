//! Where sandboxes run. The hub's model (store, pools, lifecycle, tenancy)
//! is the same on every backend; a backend only starts, stops and reaches
//! sandboxes.

use std::path::PathBuf;

pub mod disk;
pub mod local;

use async_trait::async_trait;
use sandhub_api::hub::Template;
use sandhub_client::{sandboxd::SandboxdClient, Result};

use crate::store::SandboxRow;

/// What to start: the stored row, its template, and the layers that seed
/// its workspace (a fork's snapshot first).
pub struct LaunchRequest<'a> {
    pub row: &'a SandboxRow,
    pub template: &'a Template,
    pub snapshot_layer: Option<PathBuf>,
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Starts a sandbox and returns once its sandboxd answers; the value is
    /// the backend's handle, stored with the row so a restarted hub can
    /// find the sandbox again.
    async fn launch(&self, request: LaunchRequest<'_>) -> Result<serde_json::Value>;
    /// A client for the sandbox's sandboxd.
    fn connect(&self, row: &SandboxRow) -> Result<SandboxdClient>;
    /// Stops every process; the workspace stays (suspend). Also when the
    /// row has no runtime recorded (a launch the hub died during).
    async fn stop(&self, row: &SandboxRow) -> Result<()>;
    /// Stops and removes everything the sandbox had.
    async fn destroy(&self, row: &SandboxRow) -> Result<()>;
    /// Kills every process and restores the workspace to its seed state.
    async fn reset(&self, row: &SandboxRow) -> Result<()>;
    /// Keeps a copy of the workspace's changes under `snapshot_id`;
    /// returns the bytes the copy takes on disk.
    async fn snapshot(&self, row: &SandboxRow, snapshot_id: &str) -> Result<u64>;
    /// Deletes a snapshot's stored layer (one already gone is fine).
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()>;
    /// Where a snapshot's layer lives, if the backend has it.
    fn snapshot_layer(&self, snapshot_id: &str) -> Option<PathBuf>;
    /// Whether the sandbox described by the row still runs.
    fn is_alive(&self, row: &SandboxRow) -> bool;
    /// Whether any workload process runs (an idle timeout must not fire).
    fn busy(&self, row: &SandboxRow) -> bool;
    /// Whether any process of the sandbox (its own machinery included)
    /// still exists, with or without a recorded runtime.
    fn has_processes(&self, row: &SandboxRow) -> bool;
    /// The hub is stopping: let go of what only a running hub needs (the
    /// disk volume's mount). Sandboxes keep running.
    fn shutdown(&self) {}
}
