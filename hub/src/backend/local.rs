//! The embedded local backend (being connected to `crate::local`).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};

use super::{Backend, LaunchRequest};
use crate::store::SandboxRow;

pub struct LocalBackend {
    _state_dir: PathBuf,
}

impl LocalBackend {
    pub fn new(state_dir: &Path, _allow_no_cgroup_limits: bool) -> anyhow::Result<Self> {
        Ok(LocalBackend {
            _state_dir: state_dir.to_path_buf(),
        })
    }
}

fn todo() -> Error {
    Error::unavailable("the local runtime is not connected yet")
}

#[async_trait]
impl Backend for LocalBackend {
    async fn launch(&self, _request: LaunchRequest<'_>) -> Result<serde_json::Value> {
        Err(todo())
    }
    fn connect(&self, _row: &SandboxRow) -> Result<SandboxdClient> {
        Err(todo())
    }
    async fn stop(&self, _row: &SandboxRow) -> Result<()> {
        Err(todo())
    }
    async fn destroy(&self, _row: &SandboxRow) -> Result<()> {
        Ok(())
    }
    async fn reset(&self, _row: &SandboxRow) -> Result<()> {
        Err(todo())
    }
    async fn snapshot(&self, _row: &SandboxRow, _id: &str) -> Result<PathBuf> {
        Err(todo())
    }
    fn snapshot_layer(&self, _id: &str) -> Option<PathBuf> {
        None
    }
    fn is_alive(&self, _row: &SandboxRow) -> bool {
        false
    }
    fn busy(&self, _row: &SandboxRow) -> bool {
        false
    }
}
