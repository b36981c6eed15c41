//! The one Sandhub client.
//!
//! [`Sandboxes`] is the whole model (sandboxes, processes, files, watches,
//! lifecycle, templates, pools) as one async trait. The hub implements it
//! in-process, [`http::HubClient`] implements it against a hub URL, and MCP,
//! Gym and the CLI are written against the trait, so they behave the same
//! whichever side of the network they run on.
//! [`sandboxd::SandboxdClient`] talks to one sandboxd directly (REST + gRPC),
//! which is how the hub's local backend reaches its sandboxes.
//!
//! The Python SDK (`python/`, the `sandhub` package) is PyO3 bindings of
//! [`http::HubClient`] (its `Hub` and `AsyncHub`) and of
//! [`sandboxd::SandboxdClient`] (its `Sandboxd`), so Python callers get this
//! crate's error mapping, timeouts and streaming, not a second client.

pub mod error;
pub mod http;
mod image_archive;
mod paths;
pub mod propagate;
pub mod sandboxd;
pub mod types;

pub use error::{Error, Result};
pub use sandboxd::KeptProcess;
pub use types::*;

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use sandhub_api::{
    hub::{
        CreateSandbox, ExecRequest, ExecResult, ForkRequest, NamedTemplate, NetworkSpec, Pool,
        PoolSpec, Sandbox, Snapshot, Template,
    },
    sandboxd::{DirectoryListing, FileEntry},
    usage::{MetricsQuery, SandboxMetrics},
};

/// A code execution's events (`POST /v1/sandboxes/{id}/code`), `end` last;
/// an error item ends it.
pub type CodeEvents =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<sandhub_api::code::CodeEvent>> + Send>>;

#[async_trait]
pub trait Sandboxes: Send + Sync {
    /// The hub's URL when this client reaches one over HTTP (what a
    /// sandbox port's URL starts with); `None` for in-process views.
    fn hub_url(&self) -> Option<String> {
        None
    }

    // Sandboxes.
    async fn create(&self, request: CreateSandbox) -> Result<Sandbox>;
    async fn get(&self, id: &str) -> Result<Sandbox>;
    /// Sandboxes whose labels include every pair in `labels`.
    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>>;
    async fn delete(&self, id: &str) -> Result<()>;

    // Processes.
    /// Runs a command to completion.
    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult>;
    /// Starts a command and streams its output; the first event is
    /// `Started` with the pid that the calls below take.
    async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents>;
    async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()>;
    async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()>;
    async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()>;

    /// Runs code in a context of the sandbox's code interpreter (issue
    /// #33). Views without one answer UNIMPLEMENTED.
    async fn run_code(
        &self,
        _id: &str,
        _request: sandhub_api::code::ExecuteCode,
    ) -> Result<CodeEvents> {
        Err(Error::new(
            sandhub_api::error::Code::Unimplemented,
            "this view has no code interpreter",
        ))
    }

    // Kept processes: started processes that outlive the call, and the
    // hub replica, that started them, found again under the starter's
    // `label` (Kubernetes: sandboxd's `keep.v1`). A backend that lives in
    // one process keeps none: its callers' own tables are the truth there,
    // so the defaults start an ordinary process and find nothing.
    /// Starts a process as [`start`](Sandboxes::start) does, kept past its
    /// stream where the backend can; `tag` is the starter's own name for it.
    async fn start_kept(
        &self,
        id: &str,
        request: StartProcess,
        label: &str,
        tag: &str,
    ) -> Result<ProcessEvents> {
        let _ = (label, tag);
        self.start(id, request).await
    }
    /// The kept processes of sandbox `id` under `label`, running or lately
    /// exited; `None` where the backend keeps none.
    async fn list_kept(&self, id: &str, label: &str) -> Result<Option<Vec<KeptProcess>>> {
        let _ = (id, label);
        Ok(None)
    }
    /// Kept process `pid`'s retained output (its last MiB), then its live
    /// output to its exit; `None` where the backend keeps none, NOT_FOUND
    /// unless it was started under `label`.
    async fn attach_kept(&self, id: &str, pid: i32, label: &str) -> Result<Option<ProcessEvents>> {
        let _ = (id, pid, label);
        Ok(None)
    }

    // Files (paths are relative to the workspace).
    async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream>;
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()>;
    async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing>;
    /// `None` when nothing exists at `path`.
    async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>>;
    async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()>;
    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents>;

    // Lifecycle.
    /// Stops every process; the files stay (`Suspended`).
    async fn suspend(&self, id: &str) -> Result<Sandbox>;
    /// Freezes every process in place (`Paused`): memory, open files and
    /// sockets stay, no CPU is used; `resume` thaws it in milliseconds.
    async fn pause(&self, id: &str) -> Result<Sandbox>;
    /// Runs a `Suspended` sandbox again on its files, or thaws a `Paused` one.
    async fn resume(&self, id: &str) -> Result<Sandbox>;
    async fn snapshot(&self, id: &str) -> Result<Snapshot>;
    /// Deletes a snapshot taken of sandbox `id` (which may be gone by
    /// now) and the disk space it holds. Refused (`CONFLICT`) while a
    /// sandbox forked from it exists: that sandbox's workspace sits on it.
    async fn delete_snapshot(&self, id: &str, snapshot: &str) -> Result<()>;
    /// Drops every change to the workspace and kills every process.
    async fn reset(&self, id: &str) -> Result<Sandbox>;
    async fn fork(&self, id: &str, request: ForkRequest) -> Result<Sandbox>;
    /// Replaces a running sandbox's own narrowing of its template's
    /// `network` (`PATCH /v1/sandboxes/{id}/network`): new connections and
    /// DNS queries follow it at once. It may narrow the template's policy,
    /// never widen it; `none` cuts the sandbox off.
    async fn set_network(&self, id: &str, network: NetworkSpec) -> Result<Sandbox>;

    // Usage.
    /// A sandbox's resource usage over time, oldest first, with the limits
    /// it is measured against (`GET /v1/sandboxes/{id}/metrics`); empty
    /// while it is not running. The latest sample is also on [`get`].
    ///
    /// [`get`]: Sandboxes::get
    async fn metrics(&self, id: &str, query: MetricsQuery) -> Result<SandboxMetrics>;

    // Templates and pools.
    async fn put_template(&self, name: &str, template: Template) -> Result<NamedTemplate>;
    async fn get_template(&self, name: &str) -> Result<NamedTemplate>;
    async fn list_templates(&self) -> Result<Vec<NamedTemplate>>;
    async fn delete_template(&self, name: &str) -> Result<()>;
    async fn put_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool>;
    async fn get_pool(&self, name: &str) -> Result<Pool>;
    async fn list_pools(&self) -> Result<Vec<Pool>>;
    async fn delete_pool(&self, name: &str) -> Result<()>;

    /// The caller's named volumes (and none where the hub has no volumes:
    /// `UNIMPLEMENTED`). Read-only here: creating, deleting and their
    /// files are the hub's own API (`HubClient::create_volume`, ...).
    async fn volumes(&self) -> Result<Vec<sandhub_api::volumes::Volume>> {
        Err(Error::new(
            sandhub_api::error::Code::Unimplemented,
            "named volumes are not available here",
        ))
    }
}

/// Reads a whole file into memory (for small files; prefer the stream).
pub async fn read_to_vec<S: Sandboxes + ?Sized>(
    sandboxes: &S,
    id: &str,
    path: &str,
) -> Result<Vec<u8>> {
    use futures::TryStreamExt;
    let stream = sandboxes.read_file(id, path).await?;
    let chunks: Vec<Bytes> = stream.try_collect().await?;
    Ok(chunks.concat())
}

/// Writes bytes held in memory.
pub async fn write_bytes<S: Sandboxes + ?Sized>(
    sandboxes: &S,
    id: &str,
    path: &str,
    data: impl Into<Bytes>,
    options: WriteOptions,
) -> Result<()> {
    let data: Bytes = data.into();
    let stream = futures::stream::once(async move { Ok(data) });
    sandboxes
        .write_file(id, path, Box::pin(stream), options)
        .await
}
