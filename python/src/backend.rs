//! What a sandbox call goes through: the hub (a sandbox id picks the
//! sandbox) or one sandboxd reached directly (the id is ignored). One enum
//! so the Python classes are written once for both.

use std::time::Duration;

use sandhub_api::{
    error::Code,
    hub::{ExecRequest, ExecResult},
    sandboxd::{DirectoryListing, FileEntry},
};
use sandhub_client::{
    http::HubClient, sandboxd::SandboxdClient, ByteStream, Error, ProcessEvents, PtySize, Result,
    Sandboxes, Signal, StartProcess, StdinInput, WatchEvents, WriteOptions,
};

#[derive(Clone)]
pub enum Backend {
    Hub(HubClient),
    /// Boxed: a sandboxd client is ten times a hub client's size, and
    /// every call clones the backend into its task.
    Direct(Box<SandboxdClient>),
}

/// Reads that change nothing are retried this many times when the
/// connection was reset under them; calls that change something never are
/// (a lost answer to an exec does not mean the command did not run).
const READ_RETRIES: u32 = 2;
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Retries `op` on an UNAVAILABLE answer (a reset or refused connection).
/// Only for idempotent reads.
pub async fn retry_read<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.code == Code::Unavailable && attempt < READ_RETRIES => {
                attempt += 1;
                tokio::time::sleep(RETRY_PAUSE * attempt).await;
            }
            other => return other,
        }
    }
}

impl Backend {
    pub fn hub(&self) -> Result<&HubClient> {
        match self {
            Backend::Hub(h) => Ok(h),
            Backend::Direct(_) => Err(Error::new(
                Code::Unimplemented,
                "a direct sandboxd connection has no hub: use sandhub.Hub for this",
            )),
        }
    }

    pub fn direct(&self) -> Result<&SandboxdClient> {
        match self {
            Backend::Direct(d) => Ok(d),
            Backend::Hub(_) => Err(Error::new(
                Code::Unimplemented,
                "the hub does not expose a sandbox's sandboxd health or metadata",
            )),
        }
    }

    pub async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult> {
        match self {
            Backend::Hub(h) => h.exec(id, request).await,
            Backend::Direct(d) => d.exec(request).await,
        }
    }

    pub async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents> {
        match self {
            Backend::Hub(h) => h.start(id, request).await,
            Backend::Direct(d) => d.start(request).await,
        }
    }

    pub async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()> {
        match self {
            Backend::Hub(h) => h.write_stdin(id, pid, input).await,
            Backend::Direct(d) => d.write_stdin(pid, input).await,
        }
    }

    pub async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()> {
        match self {
            Backend::Hub(h) => h.signal(id, pid, signal).await,
            Backend::Direct(d) => d.signal(pid, signal).await,
        }
    }

    pub async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()> {
        match self {
            Backend::Hub(h) => h.resize(id, pid, size).await,
            Backend::Direct(d) => d.resize(pid, size).await,
        }
    }

    pub async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream> {
        retry_read(|| async {
            match self {
                Backend::Hub(h) => h.read_file(id, path).await,
                Backend::Direct(d) => d.read_file(path).await,
            }
        })
        .await
    }

    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        match self {
            Backend::Hub(h) => h.write_file(id, path, data, options).await,
            Backend::Direct(d) => d.write_file(path, data, options).await,
        }
    }

    pub async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing> {
        retry_read(|| async {
            match self {
                Backend::Hub(h) => h.list_files(id, path).await,
                Backend::Direct(d) => d.list_files(path).await,
            }
        })
        .await
    }

    pub async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        retry_read(|| async {
            match self {
                Backend::Hub(h) => h.stat(id, path).await,
                Backend::Direct(d) => d.stat(path).await,
            }
        })
        .await
    }

    pub async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        match self {
            Backend::Hub(h) => h.delete_file(id, path, recursive).await,
            Backend::Direct(d) => d.delete_file(path, recursive).await,
        }
    }

    pub async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents> {
        match self {
            Backend::Hub(h) => h.watch(id, path, recursive).await,
            Backend::Direct(d) => d.watch(path, recursive).await,
        }
    }

    /// After a call on sandbox `id` failed with `cause`: was it because the
    /// sandbox itself is gone? Only asked on failures that could mean that.
    pub async fn vanished(&self, id: &str, cause: &Error) -> bool {
        let Backend::Hub(h) = self else {
            return false;
        };
        // NOT_FOUND is left out: on a sandbox that never existed it is the
        // plain answer, not a loss.
        if !matches!(cause.code, Code::Unavailable | Code::Internal) {
            return false;
        }
        matches!(h.get(id).await, Err(e) if e.code == Code::NotFound)
    }
}
