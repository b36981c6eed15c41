//! The checks every front door shares, at the one place all of them pass:
//! between a tenant's request and the backend. REST, Gym and MCP all act
//! through a [`TenantView`]; [`Guarded`] wraps the backend's so that what
//! no backend can honour (a timeout past the clock's end, an upload over
//! the operator's cap) is refused the same way whichever door it came in
//! by, and whichever backend is behind.

use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use sandhub_api::{
    error::Code,
    hub::{
        CreateSandbox, ExecRequest, ExecResult, ForkRequest, NamedTemplate, Pool, PoolSpec,
        Sandbox, SandboxState, Snapshot, Template,
    },
    limits::DEFAULT_MAX_UPLOAD_BYTES,
    sandboxd::{DirectoryListing, FileEntry},
};
use sandhub_client::{
    sandboxd::SandboxdClient, ByteStream, Error, KeptProcess, ProcessEvents, PtySize, Result,
    Sandboxes, Signal, StartProcess, StdinInput, WatchEvents, WriteOptions,
};

use crate::{
    backend::{Backend, TenantView},
    ops::{Op, Operations},
};

/// What the operator bounds for every tenant (`sandhub serve` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file one upload may write (`--max-upload-bytes`).
    pub max_upload_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
        }
    }
}

impl Limits {
    /// The refusal for an upload over the cap.
    pub fn upload_too_large(&self) -> Error {
        Error::new(
            Code::PayloadTooLarge,
            format!(
                "the upload is larger than this hub's limit of {} bytes (--max-upload-bytes)",
                self.max_upload_bytes
            ),
        )
    }

    /// `data` cut off with an error once it passes the upload cap, and a
    /// flag that says whether it was. The error (not a clean end) is what
    /// makes the receiving sandboxd discard its temporary file instead of
    /// committing a truncated one; the flag lets the caller answer 413
    /// whatever the transport made of the abort.
    pub fn cap_upload(&self, data: ByteStream) -> (ByteStream, Tripped) {
        let tripped = Tripped::default();
        let capped = Capped {
            inner: data,
            left: self.max_upload_bytes,
            tripped: tripped.clone(),
            error: self.upload_too_large(),
        };
        (Box::pin(capped), tripped)
    }
}

/// Set once a capped stream has passed its cap.
#[derive(Debug, Clone, Default)]
pub struct Tripped(Arc<AtomicBool>);

impl Tripped {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

struct Capped {
    inner: ByteStream,
    left: u64,
    tripped: Tripped,
    error: Error,
}

impl Stream for Capped {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.tripped.is_set() {
            return Poll::Ready(None);
        }
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let len = chunk.len() as u64;
                if len > self.left {
                    self.tripped.0.store(true, Ordering::Release);
                    return Poll::Ready(Some(Err(self.error.clone())));
                }
                self.left -= len;
                Poll::Ready(Some(Ok(chunk)))
            }
            other => other,
        }
    }
}

/// How long the rest of a refused upload is read, at most, so that its
/// sender gets the answer (see [`drainable`]). The hub's bound in bytes is
/// the upload cap (`--max-upload-bytes`), which the stream in front of the
/// drain enforces anyway.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `data` passed on as it is, plus a handle to whatever of it the
/// receiver left unread. A sandbox that refuses a body early (its disk
/// quota is full, the path is bad) answers before the client finished
/// sending; closing then would hand the client a broken pipe instead of
/// the answer. [`Remainder::drain`] reads the rest first (see
/// [`sandhub_common::drain`]).
pub fn drainable(data: ByteStream) -> (ByteStream, Remainder) {
    let (theirs, rest) = sandhub_common::drain::split(data);
    (Box::pin(theirs), rest)
}

/// What a receiver left of a [`drainable`] stream.
pub type Remainder = sandhub_common::drain::Unread<ByteStream>;

/// A backend with the shared checks in front of it, each operation timed.
pub struct Guarded {
    inner: Arc<dyn Backend>,
    limits: Limits,
    ops: Arc<Operations>,
}

impl Guarded {
    /// With histograms nobody reads (stdio MCP, tests).
    pub fn wrap(inner: Arc<dyn Backend>, limits: Limits) -> Arc<dyn Backend> {
        Self::wrap_measured(inner, limits, Arc::default())
    }

    /// With the operations recorded in `ops` (the hub's `/metrics`).
    pub fn wrap_measured(
        inner: Arc<dyn Backend>,
        limits: Limits,
        ops: Arc<Operations>,
    ) -> Arc<dyn Backend> {
        Arc::new(Guarded { inner, limits, ops })
    }
}

#[async_trait]
impl Backend for Guarded {
    fn tenant(&self, tenant: &str) -> Arc<dyn TenantView> {
        Arc::new(GuardedView {
            inner: self.inner.tenant(tenant),
            limits: self.limits,
            ops: self.ops.clone(),
            backend: self.inner.kind(),
        })
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn ready(&self) -> Result<()> {
        self.inner.ready().await
    }

    async fn sandbox_count(&self) -> Result<usize> {
        self.inner.sandbox_count().await
    }

    async fn gauges(&self) -> Result<crate::gauges::Gauges> {
        self.inner.gauges().await
    }

    fn images(&self) -> Option<Arc<dyn crate::backend::ImageService>> {
        self.inner.images()
    }

    fn egress_usage(&self) -> Vec<crate::backend::TenantEgress> {
        self.inner.egress_usage()
    }

    fn shared_mcp_sessions(&self) -> Option<Arc<dyn sandhub_mcp::SharedSessions>> {
        self.inner.shared_mcp_sessions()
    }
}

struct GuardedView {
    inner: Arc<dyn TenantView>,
    limits: Limits,
    ops: Arc<Operations>,
    backend: &'static str,
}

impl GuardedView {
    /// `call`, timed as `op` whatever its answer.
    async fn timed<T>(
        &self,
        op: Op,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.ops.time(op, self.backend, |_| op, call).await
    }
}

#[async_trait]
impl TenantView for GuardedView {
    fn tenant(&self) -> &str {
        self.inner.tenant()
    }

    async fn sandboxd(&self, id: &str, op: &str) -> Result<SandboxdClient> {
        self.inner.sandboxd(id, op).await
    }

    async fn list_snapshots(&self, id: &str) -> Result<Vec<Snapshot>> {
        self.inner.list_snapshots(id).await
    }

    async fn connect_port(&self, id: &str, port: u16) -> Result<crate::backend::PortStream> {
        self.timed(Op::PortConnect, self.inner.connect_port(id, port))
            .await
    }

    async fn port_access(&self, id: &str) -> Result<()> {
        self.inner.port_access(id).await
    }

    async fn list_ports(&self, id: &str) -> Result<Vec<sandhub_api::hub::ListeningPort>> {
        self.inner.list_ports(id).await
    }

    async fn egress_log(&self, id: &str) -> Result<Vec<sandhub_api::hub::EgressDecision>> {
        self.inner.egress_log(id).await
    }

    async fn set_deadline(&self, id: &str, seconds: u64) -> Result<sandhub_api::hub::Sandbox> {
        self.inner.set_deadline(id, seconds).await
    }

    async fn put_secret(
        &self,
        name: &str,
        value: String,
    ) -> Result<sandhub_api::secrets::SecretInfo> {
        self.inner.put_secret(name, value).await
    }

    async fn list_secrets(&self) -> Result<sandhub_api::secrets::SecretList> {
        self.inner.list_secrets().await
    }

    async fn delete_secret(&self, name: &str) -> Result<()> {
        self.inner.delete_secret(name).await
    }

    async fn create_volume(
        &self,
        req: sandhub_api::volumes::CreateVolume,
    ) -> Result<sandhub_api::volumes::Volume> {
        self.inner.create_volume(req).await
    }

    async fn list_volumes(&self) -> Result<sandhub_api::volumes::VolumeList> {
        self.inner.list_volumes().await
    }

    async fn get_volume(&self, name: &str) -> Result<sandhub_api::volumes::Volume> {
        self.inner.get_volume(name).await
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.inner.delete_volume(name).await
    }

    async fn volume_dir(&self, name: &str) -> Result<crate::volume_files::VolumeDir> {
        self.inner.volume_dir(name).await
    }

    async fn volume_sandboxd(
        &self,
        name: &str,
    ) -> Result<sandhub_client::sandboxd::SandboxdClient> {
        self.inner.volume_sandboxd(name).await
    }

    async fn create_volume_snapshot(
        &self,
        volume: &str,
        req: sandhub_api::volumes::CreateVolumeSnapshot,
    ) -> Result<sandhub_api::volumes::VolumeSnapshot> {
        self.inner.create_volume_snapshot(volume, req).await
    }

    async fn list_volume_snapshots(
        &self,
        volume: &str,
    ) -> Result<sandhub_api::volumes::VolumeSnapshotList> {
        self.inner.list_volume_snapshots(volume).await
    }

    async fn delete_volume_snapshot(&self, volume: &str, name: &str) -> Result<()> {
        self.inner.delete_volume_snapshot(volume, name).await
    }
}

/// The label that makes a create idempotent: a create carrying it answers
/// the tenant's sandbox that already carries the same value, if one exists,
/// instead of making a second. A client that lost a create's answer (its
/// hub replica was killed mid-call) retries with the same value and gets
/// the sandbox the first call made.
pub const IDEMPOTENCY_LABEL: &str = "sandhub.io/idempotency-key";

/// How long a retried create waits for the sandbox the first call started.
const IDEMPOTENT_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

impl GuardedView {
    /// The sandbox an earlier create with the same idempotency label made.
    /// Retries of one create are sequential (the client retries after the
    /// first call failed); two concurrent creates with one value may both
    /// make a sandbox, as two calls without it would.
    async fn already_made(&self, request: &CreateSandbox) -> Result<Option<Sandbox>> {
        let Some(key) = request.labels.get(IDEMPOTENCY_LABEL) else {
            return Ok(None);
        };
        let selector = BTreeMap::from([(IDEMPOTENCY_LABEL.to_string(), key.clone())]);
        let Some(made) = self.inner.list(&selector).await?.into_iter().next() else {
            return Ok(None);
        };
        // A create answers a started sandbox: the first call may have been
        // cut while its sandbox was still starting.
        let deadline = std::time::Instant::now() + IDEMPOTENT_WAIT;
        loop {
            let sb = self.inner.get(&made.id).await?;
            if sb.state != SandboxState::Pending || std::time::Instant::now() >= deadline {
                return Ok(Some(sb));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// Everything not checked here goes straight through.
#[async_trait]
impl Sandboxes for GuardedView {
    async fn create(&self, request: CreateSandbox) -> Result<Sandbox> {
        request.validate()?;
        if let Some(sb) = self.already_made(&request).await? {
            return Ok(sb);
        }
        self.ops
            .time(
                Op::Create,
                self.backend,
                Op::of_create,
                self.inner.create(request),
            )
            .await
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        self.inner.get(id).await
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        self.inner.list(labels).await
    }

    async fn delete(&self, id: &str) -> Result<()> {
        self.timed(Op::Delete, self.inner.delete(id)).await
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult> {
        request.validate()?;
        self.timed(Op::Exec, self.inner.exec(id, request)).await
    }

    async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents> {
        self.timed(Op::Start, self.inner.start(id, request)).await
    }

    async fn start_kept(
        &self,
        id: &str,
        request: StartProcess,
        label: &str,
        tag: &str,
    ) -> Result<ProcessEvents> {
        self.timed(Op::Start, self.inner.start_kept(id, request, label, tag))
            .await
    }

    async fn list_kept(&self, id: &str, label: &str) -> Result<Option<Vec<KeptProcess>>> {
        self.inner.list_kept(id, label).await
    }

    async fn attach_kept(&self, id: &str, pid: i32, label: &str) -> Result<Option<ProcessEvents>> {
        self.inner.attach_kept(id, pid, label).await
    }

    async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()> {
        self.inner.write_stdin(id, pid, input).await
    }

    async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()> {
        self.inner.signal(id, pid, signal).await
    }

    async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()> {
        self.inner.resize(id, pid, size).await
    }

    /// Through the sandbox's sandboxd, as `POST /v1/sandboxes/{id}/code`
    /// (the same checks and bounds: `crate::code`).
    async fn run_code(
        &self,
        id: &str,
        request: sandhub_api::code::ExecuteCode,
    ) -> Result<sandhub_client::CodeEvents> {
        crate::code::check(&request)?;
        let client = self.inner.sandboxd(id, "running code").await?;
        crate::code::execute(&client, &request).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream> {
        self.timed(Op::Download, self.inner.read_file(id, path))
            .await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        let (data, tripped) = self.limits.cap_upload(data);
        self.timed(Op::Upload, async {
            let result = self.inner.write_file(id, path, data, options).await;
            if tripped.is_set() {
                return Err(self.limits.upload_too_large());
            }
            result
        })
        .await
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing> {
        self.inner.list_files(id, path).await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        self.inner.stat(id, path).await
    }

    async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        self.inner.delete_file(id, path, recursive).await
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents> {
        self.inner.watch(id, path, recursive).await
    }

    async fn suspend(&self, id: &str) -> Result<Sandbox> {
        self.timed(Op::Suspend, self.inner.suspend(id)).await
    }

    async fn pause(&self, id: &str) -> Result<Sandbox> {
        self.timed(Op::Pause, self.inner.pause(id)).await
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        self.timed(Op::Resume, self.inner.resume(id)).await
    }

    async fn snapshot(&self, id: &str) -> Result<Snapshot> {
        self.timed(Op::Snapshot, self.inner.snapshot(id)).await
    }

    async fn delete_snapshot(&self, id: &str, snapshot: &str) -> Result<()> {
        self.inner.delete_snapshot(id, snapshot).await
    }

    async fn reset(&self, id: &str) -> Result<Sandbox> {
        self.timed(Op::Reset, self.inner.reset(id)).await
    }

    async fn fork(&self, id: &str, request: ForkRequest) -> Result<Sandbox> {
        self.timed(Op::Fork, self.inner.fork(id, request)).await
    }

    async fn metrics(
        &self,
        id: &str,
        query: sandhub_api::usage::MetricsQuery,
    ) -> Result<sandhub_api::usage::SandboxMetrics> {
        self.inner.metrics(id, query).await
    }

    async fn set_network(
        &self,
        id: &str,
        network: sandhub_api::hub::NetworkSpec,
    ) -> Result<Sandbox> {
        sandhub_api::validate::network(&network)?;
        self.inner.set_network(id, network).await
    }

    async fn put_template(&self, name: &str, template: Template) -> Result<NamedTemplate> {
        self.inner.put_template(name, template).await
    }

    async fn get_template(&self, name: &str) -> Result<NamedTemplate> {
        self.inner.get_template(name).await
    }

    async fn list_templates(&self) -> Result<Vec<NamedTemplate>> {
        self.inner.list_templates().await
    }

    async fn delete_template(&self, name: &str) -> Result<()> {
        self.inner.delete_template(name).await
    }

    async fn put_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool> {
        self.inner.put_pool(name, spec).await
    }

    async fn get_pool(&self, name: &str) -> Result<Pool> {
        self.inner.get_pool(name).await
    }

    async fn list_pools(&self) -> Result<Vec<Pool>> {
        self.inner.list_pools().await
    }

    async fn volumes(&self) -> Result<Vec<sandhub_api::volumes::Volume>> {
        self.inner.volumes().await
    }

    async fn delete_pool(&self, name: &str) -> Result<()> {
        self.inner.delete_pool(name).await
    }
}

#[cfg(test)]
mod tests {
    use futures::{stream, StreamExt};

    use super::*;

    fn chunks(sizes: &[usize]) -> ByteStream {
        let items: Vec<Result<Bytes>> = sizes
            .iter()
            .map(|n| Ok(Bytes::from(vec![b'x'; *n])))
            .collect();
        Box::pin(stream::iter(items))
    }

    #[tokio::test]
    async fn a_stream_within_the_cap_passes_whole() {
        let limits = Limits {
            max_upload_bytes: 10,
        };
        let (s, tripped) = limits.cap_upload(chunks(&[4, 6]));
        let got: Vec<Result<Bytes>> = s.collect().await;
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|c| c.is_ok()));
        assert!(!tripped.is_set());
    }

    #[tokio::test]
    async fn a_stream_past_the_cap_ends_in_an_error_not_a_clean_end() {
        let limits = Limits {
            max_upload_bytes: 10,
        };
        let (s, tripped) = limits.cap_upload(chunks(&[4, 6, 1, 100]));
        let got: Vec<Result<Bytes>> = s.collect().await;
        // Two chunks, then the error, then nothing more is read.
        assert_eq!(got.len(), 3);
        let e = got[2].as_ref().unwrap_err();
        assert_eq!(e.code, Code::PayloadTooLarge);
        assert!(e.message.contains("10 bytes"), "{e}");
        assert!(tripped.is_set());
    }
}
