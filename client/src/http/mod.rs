//! [`HubClient`]: the [`Sandboxes`] trait over the hub's REST API.
//!
//! Every route is one line in the table `Sandboxes` is written to (see the
//! method bodies); errors come back as the hub's `{code, message}` body.

mod code;
mod events;
mod gym;
mod lines;
mod ndjson;
mod ports;
mod pull;
mod sse;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::TryStreamExt;
use reqwest::{header, Method, RequestBuilder, Response};
use sandhub_api::{
    error::Code,
    hub::{
        CreateSandbox, ExecRequest, ExecResult, ForkRequest, Image, ImageList, NamedTemplate,
        NetworkSpec, Pool, PoolList, PoolSpec, PrepullRequest, PrepullResult, PruneResult,
        PullEvent, PullRequest, ResizeRequest, Sandbox, SandboxList, SignalRequest, Snapshot,
        SnapshotList, Template, TemplateList,
    },
    sandboxd::{DirectoryListing, FileEntry},
    volumes::{
        CreateVolume, CreateVolumeSnapshot, Volume, VolumeList, VolumeSnapshot, VolumeSnapshotList,
    },
};
use serde::de::DeserializeOwned;

pub use self::events::{Event, EventFilter};
pub use self::ndjson::{decode as decode_process_event, encode as encode_process_event};
use crate::{
    paths::{encode, encode_path, root_entry, split_parent, write_query},
    ByteStream, Error, ProcessEvents, PtySize, Result, Sandboxes, Signal, StartProcess, StdinInput,
    WatchEvents, WriteOptions,
};

/// Reads and small changes: the hub answers these from its state store.
const QUICK: Duration = Duration::from_secs(60);
/// Lifecycle changes may start, stop or copy a sandbox (a cold start on
/// Kubernetes includes pulling an image).
const SLOW: Duration = Duration::from_secs(600);
/// How much longer than a command's own timeout `exec` waits for the hub.
const EXEC_MARGIN: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Half the hub's 1 MiB limit on one stdin write.
const STDIN_CHUNK: usize = 512 * 1024;

#[derive(Clone)]
pub struct HubClient {
    http: reqwest::Client,
    /// No trailing slash.
    base: Arc<str>,
    api_key: Option<Arc<str>>,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("base", &self.base)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl HubClient {
    /// A client of the hub at `base_url` (e.g. `http://127.0.0.1:8420`),
    /// sending `api_key` as a bearer token when given.
    pub fn new(base_url: impl Into<String>, api_key: Option<String>) -> Result<Self> {
        let base = base_url.into();
        let base = base.trim_end_matches('/').to_string();
        let url = reqwest::Url::parse(&base)
            .map_err(|e| Error::invalid(format!("hub URL {base}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(Error::invalid(format!(
                "hub URL {base}: expected http(s)://host[:port]"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .user_agent(concat!("sandhub-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::internal(format!("building the HTTP client: {e}")))?;
        Ok(HubClient {
            http,
            base: base.into(),
            api_key: api_key.filter(|k| !k.is_empty()).map(Into::into),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut builder = self.http.request(method, format!("{}{}", self.base, path));
        if crate::propagate::active() {
            let mut trace = reqwest::header::HeaderMap::new();
            crate::propagate::apply(&mut trace);
            builder = builder.headers(trace);
        }
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// `GET /v1/sandboxes/{id}/snapshots`: the snapshots taken of a
    /// sandbox (listed while any exist, also after the sandbox is gone).
    pub async fn list_snapshots(&self, id: &str) -> Result<Vec<Snapshot>> {
        let list: SnapshotList = self
            .call(self.sandbox(Method::GET, id, "/snapshots").timeout(QUICK))
            .await?;
        Ok(list.snapshots)
    }

    /// `POST /v1/volumes`: a new, empty named volume (local backend).
    pub async fn create_volume(&self, request: &CreateVolume) -> Result<Volume> {
        self.call(
            self.request(Method::POST, "/v1/volumes")
                .json(request)
                .timeout(QUICK),
        )
        .await
    }

    /// `GET /v1/volumes`: the caller's volumes, by name.
    pub async fn list_volumes(&self) -> Result<Vec<Volume>> {
        let list: VolumeList = self
            .call(self.request(Method::GET, "/v1/volumes").timeout(QUICK))
            .await?;
        Ok(list.volumes)
    }

    /// `GET /v1/volumes/{name}`.
    pub async fn get_volume(&self, name: &str) -> Result<Volume> {
        let path = format!("/v1/volumes/{}", encode(name));
        self.call(self.request(Method::GET, &path).timeout(QUICK))
            .await
    }

    /// `DELETE /v1/volumes/{name}`: the volume and every file in it.
    pub async fn delete_volume(&self, name: &str) -> Result<()> {
        let path = format!("/v1/volumes/{}", encode(name));
        self.call_empty(self.request(Method::DELETE, &path).timeout(QUICK))
            .await
    }

    /// `POST /v1/volumes/{name}/snapshots`: a read-only snapshot of a
    /// volume, taken at once.
    pub async fn create_volume_snapshot(
        &self,
        name: &str,
        snapshot: &str,
    ) -> Result<VolumeSnapshot> {
        let path = format!("/v1/volumes/{}/snapshots", encode(name));
        let body = CreateVolumeSnapshot {
            name: snapshot.to_string(),
        };
        self.call(self.request(Method::POST, &path).json(&body).timeout(QUICK))
            .await
    }

    /// `GET /v1/volumes/{name}/snapshots`.
    pub async fn list_volume_snapshots(&self, name: &str) -> Result<Vec<VolumeSnapshot>> {
        let path = format!("/v1/volumes/{}/snapshots", encode(name));
        let list: VolumeSnapshotList = self
            .call(self.request(Method::GET, &path).timeout(QUICK))
            .await?;
        Ok(list.snapshots)
    }

    /// `DELETE /v1/volumes/{name}/snapshots/{snapshot}`.
    pub async fn delete_volume_snapshot(&self, name: &str, snapshot: &str) -> Result<()> {
        let path = format!(
            "/v1/volumes/{}/snapshots/{}",
            encode(name),
            encode(snapshot)
        );
        self.call_empty(self.request(Method::DELETE, &path).timeout(QUICK))
            .await
    }

    /// A request on a volume's file (`/v1/volumes/{name}/files/{path}`).
    /// A `..` segment is refused here as the hub refuses it: sent, the URL
    /// would resolve it before the hub saw it, climbing out of `/files/`.
    fn volume_file(
        &self,
        method: Method,
        name: &str,
        path: &str,
        query: &str,
    ) -> Result<RequestBuilder> {
        if path.split('/').any(|s| s == "..") {
            return Err(Error::invalid(format!(
                "volume path {path:?}: `..` is not allowed"
            )));
        }
        let rest = format!(
            "/v1/volumes/{}/files/{}{query}",
            encode(name),
            encode_path(path)
        );
        Ok(self.request(method, &rest))
    }

    /// `GET /v1/volumes/{name}/files/{path}?type=file`: a volume's file,
    /// streamed, with no sandbox running (a directory is CONFLICT).
    pub async fn read_volume_file(&self, name: &str, path: &str) -> Result<ByteStream> {
        let response = self
            .send_streaming(self.volume_file(Method::GET, name, path, "?type=file")?)
            .await?;
        Ok(Box::pin(response.bytes_stream().map_err(transport_error)))
    }

    /// `PUT /v1/volumes/{name}/files/{path}`: writes a volume's file whole
    /// (parents made), with no sandbox running. `append` is refused.
    pub async fn write_volume_file(
        &self,
        name: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        let builder = self
            .volume_file(Method::PUT, name, path, &write_query(options))?
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(data));
        self.call_empty(builder).await
    }

    /// `GET /v1/volumes/{name}/files/{path}?type=directory`.
    pub async fn list_volume_files(&self, name: &str, path: &str) -> Result<DirectoryListing> {
        self.call(
            self.volume_file(Method::GET, name, path, "?type=directory")?
                .timeout(QUICK),
        )
        .await
    }

    /// A volume's file or directory; `None` when nothing is at `path`
    /// (a missing volume stays an error). As [`Sandboxes::stat`]: `HEAD`,
    /// then the parent's listing.
    pub async fn stat_volume_file(&self, name: &str, path: &str) -> Result<Option<FileEntry>> {
        match self
            .send(
                self.volume_file(Method::HEAD, name, path, "")?
                    .timeout(QUICK),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == Code::NotFound => {
                self.get_volume(name).await?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let Some((parent, file)) = split_parent(path) else {
            return Ok(Some(root_entry()));
        };
        match self.list_volume_files(name, &parent).await {
            Ok(listing) => Ok(listing.entries.into_iter().find(|e| e.name == file)),
            Err(e) if e.code == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `DELETE /v1/volumes/{name}/files/{path}`: a file, a link itself, or
    /// a directory (with contents only with `recursive`).
    pub async fn delete_volume_file(&self, name: &str, path: &str, recursive: bool) -> Result<()> {
        let query = if recursive { "?recursive=true" } else { "" };
        self.call_empty(
            self.volume_file(Method::DELETE, name, path, query)?
                .timeout(QUICK),
        )
        .await
    }

    /// `GET /v1/images`: the hub's image store (local backend).
    pub async fn list_images(&self) -> Result<Vec<Image>> {
        let list: ImageList = self
            .call(self.request(Method::GET, "/v1/images").timeout(QUICK))
            .await?;
        Ok(list.items)
    }

    /// `POST /v1/images/import`: an OCI layout or `docker save` archive
    /// (uncompressed tar), streamed; `tag` names it.
    /// `pick` names one image of an OCI layout that holds several (its
    /// `org.opencontainers.image.ref.name`).
    pub async fn import_image(
        &self,
        archive: reqwest::Body,
        tag: Option<&str>,
        pick: Option<&str>,
    ) -> Result<Image> {
        let mut builder = self
            .request(Method::POST, "/v1/images/import")
            .header(header::CONTENT_TYPE, "application/x-tar")
            .body(archive);
        if let Some(tag) = tag {
            builder = builder.query(&[("tag", tag)]);
        }
        if let Some(pick) = pick {
            builder = builder.query(&[("ref", pick)]);
        }
        self.call(builder).await
    }

    /// `POST /v1/images/pull`: the hub pulls from a registry; its progress
    /// events, ending with `done` (an `error` event is the stream's `Err`).
    pub async fn pull_image(
        &self,
        request: &PullRequest,
    ) -> Result<futures::stream::BoxStream<'static, Result<PullEvent>>> {
        let builder = self
            .request(Method::POST, "/v1/images/pull")
            .header(header::ACCEPT, "application/x-ndjson")
            .json(request);
        let response = self.send_streaming(builder).await?;
        let body = Box::pin(response.bytes_stream().map_err(transport_error));
        Ok(Box::pin(lines::decode(body, pull::PullLines::default())))
    }

    /// [`Self::pull_image`] to the end: `on_event` sees each event; the
    /// pulled image.
    pub async fn pull_image_with(
        &self,
        request: &PullRequest,
        mut on_event: impl FnMut(&PullEvent),
    ) -> Result<Image> {
        use futures::StreamExt;
        let mut events = self.pull_image(request).await?;
        while let Some(event) = events.next().await {
            let event = event?;
            on_event(&event);
            if let PullEvent::Done { image } = event {
                return Ok(image);
            }
        }
        Err(Error::unavailable(
            "the pull stream ended before its last event",
        ))
    }

    /// `POST /v1/images/prepull`: the hub pulls each reference; one item
    /// per reference. Waits as long as the pulls take.
    pub async fn prepull_images(&self, references: &[String]) -> Result<PrepullResult> {
        self.prepull(&PrepullRequest {
            references: references.to_vec(),
            ..Default::default()
        })
        .await
    }

    /// [`Self::prepull_images`] with every field of the request (a template
    /// whose placement the pulls follow, images per DaemonSet, ...).
    pub async fn prepull(&self, request: &PrepullRequest) -> Result<PrepullResult> {
        self.call(
            self.request(Method::POST, "/v1/images/prepull")
                .json(request),
        )
        .await
    }

    /// `DELETE /v1/images/{reference}`.
    pub async fn remove_image(&self, reference: &str) -> Result<Image> {
        let path = format!(
            "/v1/images/{}",
            percent_encoding::utf8_percent_encode(reference, percent_encoding::NON_ALPHANUMERIC)
        );
        self.call(self.request(Method::DELETE, &path).timeout(QUICK))
            .await
    }

    /// `POST /v1/images/prune`.
    pub async fn prune_images(&self) -> Result<PruneResult> {
        self.call(self.request(Method::POST, "/v1/images/prune"))
            .await
    }

    /// Sends and checks the status; non-2xx becomes the body's error.
    async fn send(&self, builder: RequestBuilder) -> Result<Response> {
        let response = builder.send().await.map_err(transport_error)?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap_or_default();
        Err(Error::from_http(status, &body))
    }

    /// For streamed answers: only the wait for the response head is
    /// bounded, never the stream itself.
    async fn send_streaming(&self, builder: RequestBuilder) -> Result<Response> {
        tokio::time::timeout(QUICK, self.send(builder))
            .await
            .map_err(|_| Error::new(Code::DeadlineExceeded, "the hub did not answer in time"))?
    }

    async fn call<T: DeserializeOwned>(&self, builder: RequestBuilder) -> Result<T> {
        let body = self
            .send(builder)
            .await?
            .bytes()
            .await
            .map_err(transport_error)?;
        serde_json::from_slice(&body).map_err(|e| {
            Error::internal(format!(
                "the hub sent a body that is not the expected JSON: {e}"
            ))
        })
    }

    async fn call_empty(&self, builder: RequestBuilder) -> Result<()> {
        self.send(builder).await.map(drop)
    }

    fn sandbox(&self, method: Method, id: &str, rest: &str) -> RequestBuilder {
        self.request(method, &format!("/v1/sandboxes/{}{rest}", encode(id)))
    }

    fn process(&self, id: &str, pid: i32, action: &str) -> RequestBuilder {
        self.sandbox(Method::POST, id, &format!("/processes/{pid}/{action}"))
            .timeout(QUICK)
    }

    /// `/v1/sandboxes/{id}/files/{path}`; the root is `.../files/`.
    fn file(&self, method: Method, id: &str, path: &str, query: &str) -> RequestBuilder {
        let rest = format!("/files/{}{query}", encode_path(path));
        self.sandbox(method, id, &rest)
    }
}

/// `k=v,k2=v2` with each key and value percent-encoded, so the separators
/// stay unambiguous whatever the labels hold.
fn labels_query(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    format!("?labels={}", pairs.join(","))
}

fn signal_name(signal: Signal) -> &'static str {
    match signal {
        Signal::Sigint => "SIGINT",
        Signal::Sigterm => "SIGTERM",
        Signal::Sigkill => "SIGKILL",
    }
}

/// A request that got no HTTP answer. An upload stream's own error comes
/// back as it was; a hub out of reach is UNAVAILABLE.
fn transport_error(e: reqwest::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut chain = Vec::new();
    while let Some(err) = source {
        if let Some(ours) = err.downcast_ref::<Error>() {
            return ours.clone();
        }
        chain.push(err.to_string());
        source = err.source();
    }
    let message = format!("hub request failed: {}", chain.join(": "));
    let code = if e.is_timeout() {
        Code::DeadlineExceeded
    } else if e.is_builder() {
        Code::InvalidArgument
    } else if e.is_decode() {
        Code::Internal
    } else {
        Code::Unavailable
    };
    Error::new(code, message)
}

#[async_trait]
impl Sandboxes for HubClient {
    fn hub_url(&self) -> Option<String> {
        Some(self.base.to_string())
    }

    async fn create(&self, request: CreateSandbox) -> Result<Sandbox> {
        self.call(
            self.request(Method::POST, "/v1/sandboxes")
                .json(&request)
                .timeout(SLOW),
        )
        .await
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        self.call(self.sandbox(Method::GET, id, "").timeout(QUICK))
            .await
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        let path = format!("/v1/sandboxes{}", labels_query(labels));
        let list: SandboxList = self
            .call(self.request(Method::GET, &path).timeout(QUICK))
            .await?;
        Ok(list.sandboxes)
    }

    async fn delete(&self, id: &str) -> Result<()> {
        self.call_empty(self.sandbox(Method::DELETE, id, "").timeout(SLOW))
            .await
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult> {
        let mut builder = self.sandbox(Method::POST, id, "/exec").json(&request);
        // A command without a timeout may run as long as it likes.
        if let Some(t) = request
            .timeout_seconds
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
        {
            builder = builder.timeout(t.saturating_add(EXEC_MARGIN));
        }
        self.call(builder).await
    }

    async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents> {
        let builder = self
            .sandbox(Method::POST, id, "/processes")
            .header(header::ACCEPT, "application/x-ndjson")
            .json(&request);
        let response = self.send_streaming(builder).await?;
        let body = Box::pin(response.bytes_stream().map_err(transport_error));
        Ok(Box::pin(lines::decode(
            body,
            ndjson::ProcessLines::default(),
        )))
    }

    async fn run_code(
        &self,
        id: &str,
        request: sandhub_api::code::ExecuteCode,
    ) -> Result<crate::CodeEvents> {
        HubClient::run_code(self, id, &request).await
    }

    async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()> {
        let mut data = match input {
            StdinInput::Data(data) => data,
            StdinInput::Eof => {
                let rest = format!("/processes/{pid}/stdin?eof=true");
                return self
                    .call_empty(self.sandbox(Method::POST, id, &rest).timeout(QUICK))
                    .await;
            }
        };
        // The hub takes at most 1 MiB per write; a pipe does not care how
        // its bytes were split.
        loop {
            let chunk = data.split_to(data.len().min(STDIN_CHUNK));
            self.call_empty(
                self.process(id, pid, "stdin")
                    .header(header::CONTENT_TYPE, "application/octet-stream")
                    .body(chunk),
            )
            .await?;
            if data.is_empty() {
                return Ok(());
            }
        }
    }

    async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()> {
        let body = SignalRequest {
            signal: signal_name(signal).into(),
        };
        self.call_empty(self.process(id, pid, "signal").json(&body))
            .await
    }

    async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()> {
        let body = ResizeRequest {
            cols: size.cols,
            rows: size.rows,
        };
        self.call_empty(self.process(id, pid, "resize").json(&body))
            .await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream> {
        // `type=file`: a directory is CONFLICT, not its listing as content
        // (the hub hands the query to sandboxd as it is).
        let response = self
            .send_streaming(self.file(Method::GET, id, path, "?type=file"))
            .await?;
        Ok(Box::pin(response.bytes_stream().map_err(transport_error)))
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        // No timeout: an upload takes as long as its stream does.
        let builder = self
            .file(Method::PUT, id, path, &write_query(options))
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(data));
        self.call_empty(builder).await
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing> {
        self.call(
            self.file(Method::GET, id, path, "?type=directory")
                .timeout(QUICK),
        )
        .await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        match self
            .send(self.file(Method::HEAD, id, path, "").timeout(QUICK))
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == Code::NotFound => {
                // A HEAD answer has no body to say what was not found: a
                // missing sandbox must stay an error, a missing file is None.
                self.get(id).await?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let Some((parent, name)) = split_parent(path) else {
            return Ok(Some(root_entry()));
        };
        match self.list_files(id, &parent).await {
            Ok(listing) => Ok(listing.entries.into_iter().find(|e| e.name == name)),
            Err(e) if e.code == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        let query = if recursive { "?recursive=true" } else { "" };
        self.call_empty(self.file(Method::DELETE, id, path, query).timeout(QUICK))
            .await
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents> {
        let rest = format!("/watch?path={}&recursive={recursive}", encode(path));
        let builder = self
            .sandbox(Method::GET, id, &rest)
            .header(header::ACCEPT, "text/event-stream");
        let response = self.send_streaming(builder).await?;
        let body = Box::pin(response.bytes_stream().map_err(transport_error));
        Ok(Box::pin(lines::decode(body, sse::WatchSse::default())))
    }

    async fn suspend(&self, id: &str) -> Result<Sandbox> {
        self.call(self.sandbox(Method::POST, id, "/suspend").timeout(SLOW))
            .await
    }

    async fn pause(&self, id: &str) -> Result<Sandbox> {
        self.call(self.sandbox(Method::POST, id, "/pause").timeout(SLOW))
            .await
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        self.call(self.sandbox(Method::POST, id, "/resume").timeout(SLOW))
            .await
    }

    async fn snapshot(&self, id: &str) -> Result<Snapshot> {
        self.call(self.sandbox(Method::POST, id, "/snapshots").timeout(SLOW))
            .await
    }

    async fn delete_snapshot(&self, id: &str, snapshot: &str) -> Result<()> {
        let rest = format!("/snapshots/{}", encode(snapshot));
        self.call_empty(self.sandbox(Method::DELETE, id, &rest).timeout(SLOW))
            .await
    }

    async fn reset(&self, id: &str) -> Result<Sandbox> {
        self.call(self.sandbox(Method::POST, id, "/reset").timeout(SLOW))
            .await
    }

    async fn fork(&self, id: &str, request: ForkRequest) -> Result<Sandbox> {
        self.call(
            self.sandbox(Method::POST, id, "/fork")
                .json(&request)
                .timeout(SLOW),
        )
        .await
    }

    async fn metrics(
        &self,
        id: &str,
        query: sandhub_api::usage::MetricsQuery,
    ) -> Result<sandhub_api::usage::SandboxMetrics> {
        let mut q = Vec::new();
        if let Some(s) = query.since {
            q.push(format!("since={s}"));
        }
        if let Some(s) = query.step {
            q.push(format!("step={s}"));
        }
        let rest = if q.is_empty() {
            "/metrics".to_string()
        } else {
            format!("/metrics?{}", q.join("&"))
        };
        self.call(self.sandbox(Method::GET, id, &rest).timeout(QUICK))
            .await
    }

    async fn set_network(&self, id: &str, network: NetworkSpec) -> Result<Sandbox> {
        self.call(
            self.sandbox(Method::PATCH, id, "/network")
                // A body is always an object (`{"mode": "none"}`).
                .json(&sandhub_api::network::AsObject(&network))
                .timeout(QUICK),
        )
        .await
    }

    async fn put_template(&self, name: &str, template: Template) -> Result<NamedTemplate> {
        let path = format!("/v1/templates/{}", encode(name));
        self.call(
            self.request(Method::PUT, &path)
                .json(&template)
                .timeout(QUICK),
        )
        .await
    }

    async fn get_template(&self, name: &str) -> Result<NamedTemplate> {
        let path = format!("/v1/templates/{}", encode(name));
        self.call(self.request(Method::GET, &path).timeout(QUICK))
            .await
    }

    async fn list_templates(&self) -> Result<Vec<NamedTemplate>> {
        let list: TemplateList = self
            .call(self.request(Method::GET, "/v1/templates").timeout(QUICK))
            .await?;
        Ok(list.templates)
    }

    async fn delete_template(&self, name: &str) -> Result<()> {
        let path = format!("/v1/templates/{}", encode(name));
        self.call_empty(self.request(Method::DELETE, &path).timeout(QUICK))
            .await
    }

    async fn put_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool> {
        let path = format!("/v1/pools/{}", encode(name));
        self.call(self.request(Method::PUT, &path).json(&spec).timeout(QUICK))
            .await
    }

    async fn get_pool(&self, name: &str) -> Result<Pool> {
        let path = format!("/v1/pools/{}", encode(name));
        self.call(self.request(Method::GET, &path).timeout(QUICK))
            .await
    }

    async fn list_pools(&self) -> Result<Vec<Pool>> {
        let list: PoolList = self
            .call(self.request(Method::GET, "/v1/pools").timeout(QUICK))
            .await?;
        Ok(list.pools)
    }

    async fn delete_pool(&self, name: &str) -> Result<()> {
        let path = format!("/v1/pools/{}", encode(name));
        // Draining a pool stops its warm sandboxes.
        self.call_empty(self.request(Method::DELETE, &path).timeout(SLOW))
            .await
    }

    async fn volumes(&self) -> Result<Vec<Volume>> {
        self.list_volumes().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_queries() {
        assert_eq!(labels_query(&BTreeMap::new()), "");
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("team/x".to_string(), "a b,c".to_string()),
        ]);
        assert_eq!(labels_query(&labels), "?labels=app=web,team%2Fx=a%20b%2Cc");
    }

    #[test]
    fn urls_must_be_http() {
        assert!(HubClient::new("http://127.0.0.1:1/", None).is_ok());
        assert_eq!(
            HubClient::new("127.0.0.1:1", None).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            HubClient::new("ftp://x", None).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            HubClient::new("http://x/", None).unwrap().base_url(),
            "http://x"
        );
    }
}
