//! `process.v1.ProcessService`: spawning, streaming, stdin, signals, PTYs.
//! (Stub; being written.)

use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use sandhub_api::proto::process::v1 as pb;
use tonic::{Request, Response, Status};

use crate::{daemon::Daemon, error::Result};

/// Every process started through `Start`, by pid.
#[derive(Default)]
pub struct ProcessTable {
    _procs: std::sync::Mutex<HashMap<i32, ()>>,
}

impl ProcessTable {
    /// Processes running now (started through any API).
    pub fn active(&self) -> usize {
        0
    }

    /// Waits until no process runs, or `timeout` passes; true if idle.
    pub async fn wait_idle(&self, _timeout: Duration) -> bool {
        true
    }

    /// SIGKILLs the process group of every running process.
    pub fn kill_all(&self) {}
}

/// The result of a process run to completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    pub argv: Vec<String>,
    pub env: HashMap<String, String>,
    /// Relative to the root (or absolute under it); None = the root.
    pub cwd: Option<String>,
    pub stdin: Option<Bytes>,
    /// Killed (whole process group) after this; `timed_out` is then true
    /// and the exit code 124.
    pub timeout: Option<Duration>,
}

/// Runs a process to completion, collecting its output.
pub async fn run(_daemon: &Daemon, _spec: Spec) -> Result<Completed> {
    Err(crate::error::Error::Internal("not implemented".into()))
}

pub struct ProcessService {
    pub daemon: Arc<Daemon>,
}

#[tonic::async_trait]
impl pb::process_service_server::ProcessService for ProcessService {
    type StartStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::StartResponse, Status>> + Send>>;

    async fn start(
        &self,
        _request: Request<pb::StartRequest>,
    ) -> Result<Response<Self::StartStream>, Status> {
        Err(Status::unimplemented("Start"))
    }

    async fn execute(
        &self,
        _request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<pb::ExecuteResponse>, Status> {
        Err(Status::unimplemented("Execute"))
    }

    async fn write_stdin(
        &self,
        _request: Request<pb::WriteStdinRequest>,
    ) -> Result<Response<pb::WriteStdinResponse>, Status> {
        Err(Status::unimplemented("WriteStdin"))
    }

    async fn send_signal(
        &self,
        _request: Request<pb::SendSignalRequest>,
    ) -> Result<Response<pb::SendSignalResponse>, Status> {
        Err(Status::unimplemented("SendSignal"))
    }

    async fn resize_tty(
        &self,
        _request: Request<pb::ResizeTtyRequest>,
    ) -> Result<Response<pb::ResizeTtyResponse>, Status> {
        Err(Status::unimplemented("ResizeTTY"))
    }
}
