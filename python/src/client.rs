//! `NativeClient`: every call of the Python face, sync or async (decided
//! at construction), over a hub or one sandboxd. Structured values cross
//! as JSON text, which the pure-Python face turns into dataclasses; bytes
//! cross as bytes.

use std::collections::BTreeMap;

use futures::StreamExt;
use pyo3::{exceptions::PyValueError, prelude::*};
use sandhub_api::{
    code::{CreateContext, ExecuteCode},
    gym::{BatchStep, CreateEnv, ResetRequest},
    hub::{
        CreateSandbox, ExecRequest, ForkRequest, NetworkSpec, PoolSpec, PrepullRequest,
        PullRequest, Template,
    },
    volumes::CreateVolume,
};
use sandhub_client::{
    http::HubClient, sandboxd::SandboxdClient, Error, ProcessEvent, PtySize, Result, Sandboxes,
    Signal, StartProcess, StdinInput, WriteOptions,
};
use serde::de::DeserializeOwned;

use crate::{
    backend::{retry_read, Backend},
    errors::Failure,
    runtime::{call, rt},
    streams::{
        json, next_chunk, value, EventStream, FileReader, FileWriter, ProcessStream, WatchStream,
    },
};

/// `NativeClient.events`' filter, as the Python face writes it.
#[derive(serde::Deserialize)]
struct EventFilterJson {
    #[serde(default)]
    sandbox: Option<String>,
    #[serde(default)]
    types: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    last_event_id: Option<u64>,
}

#[pyclass(module = "sandhub._sandhub", frozen)]
pub struct NativeClient {
    backend: Backend,
    asynchronous: bool,
}

fn parse<T: DeserializeOwned>(what: &str, text: &str) -> PyResult<T> {
    serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// The kinds `put_named` and its siblings know.
const KINDS: [&str; 3] = ["template", "pool", "volume"];

fn unknown_kind(kind: &str) -> PyErr {
    PyValueError::new_err(format!("unknown kind {kind:?}: one of {KINDS:?}"))
}

fn check_kind(kind: &str) -> PyResult<()> {
    if KINDS.contains(&kind) {
        Ok(())
    } else {
        Err(unknown_kind(kind))
    }
}

fn signal_of(name: &str) -> Result<Signal> {
    match name.to_ascii_uppercase().as_str() {
        "SIGINT" | "INT" | "2" => Ok(Signal::Sigint),
        "SIGTERM" | "TERM" | "15" => Ok(Signal::Sigterm),
        "SIGKILL" | "KILL" | "9" => Ok(Signal::Sigkill),
        other => Err(Error::invalid(format!(
            "signal {other}: expected SIGINT, SIGTERM or SIGKILL"
        ))),
    }
}

/// Runs `$body` (an async block using `b`, the backend) sync or async.
macro_rules! run {
    ($self:ident, $py:ident, |$b:ident| $body:expr) => {{
        let $b = $self.backend.clone();
        call($py, $self.asynchronous, async move { $body })
    }};
}

#[pymethods]
impl NativeClient {
    /// A client of the hub at `url`.
    #[staticmethod]
    #[pyo3(signature = (url, api_key=None, asynchronous=false))]
    fn hub(url: &str, api_key: Option<String>, asynchronous: bool) -> PyResult<Self> {
        let client = HubClient::new(url, api_key)
            .map_err(|e| Python::attach(|py| Failure::from(e).into_py(py)))?;
        Ok(NativeClient {
            backend: Backend::Hub(client),
            asynchronous,
        })
    }

    /// A client of one sandboxd: a directory holding its Unix sockets, or
    /// its REST and gRPC URLs.
    #[staticmethod]
    #[pyo3(signature = (rest, grpc=None, auth_token=None, asynchronous=false))]
    fn sandboxd(
        py: Python<'_>,
        rest: &str,
        grpc: Option<&str>,
        auth_token: Option<&str>,
        asynchronous: bool,
    ) -> PyResult<Self> {
        // The gRPC channel spawns its worker on the current runtime.
        let _guard = rt().enter();
        let built = if rest.starts_with("http://") || rest.starts_with("https://") {
            let grpc = grpc.map(str::to_string).unwrap_or_else(|| rest.to_string());
            SandboxdClient::tcp(rest, grpc)
        } else {
            let dir = rest.strip_prefix("unix:").unwrap_or(rest);
            Ok(SandboxdClient::unix(std::path::Path::new(dir)))
        };
        let built = match (built, auth_token) {
            (Ok(c), Some(t)) => c.with_token(t),
            (other, _) => other,
        };
        let client = built.map_err(|e| Failure::from(e).into_py(py))?;
        Ok(NativeClient {
            backend: Backend::Direct(Box::new(client)),
            asynchronous,
        })
    }

    #[getter]
    fn url(&self) -> String {
        match &self.backend {
            Backend::Hub(h) => h.base_url().to_string(),
            Backend::Direct(d) => format!("{d:?}"),
        }
    }

    #[getter]
    fn asynchronous(&self) -> bool {
        self.asynchronous
    }

    // ---------------------------------------------------------------- hub

    fn healthz<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b.hub()?.healthz().await?))
    }

    fn create<'py>(&self, py: Python<'py>, body: &str) -> PyResult<Bound<'py, PyAny>> {
        let request: CreateSandbox = parse("create", body)?;
        run!(self, py, |b| Ok(json(&b.hub()?.create(request).await?)?))
    }

    fn get<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(&retry_read(|| hub.get(&id)).await?)?)
        })
    }

    fn list<'py>(&self, py: Python<'py>, labels: &str) -> PyResult<Bound<'py, PyAny>> {
        let labels: BTreeMap<String, String> = parse("labels", labels)?;
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(&retry_read(|| hub.list(&labels)).await?)?)
        })
    }

    fn delete<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b.hub()?.delete(&id).await?))
    }

    /// `suspend`, `pause`, `resume` or `reset`: each answers the sandbox.
    fn lifecycle<'py>(
        &self,
        py: Python<'py>,
        id: String,
        action: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            let sandbox = match action.as_str() {
                "suspend" => hub.suspend(&id).await?,
                "pause" => hub.pause(&id).await?,
                "resume" => hub.resume(&id).await?,
                "reset" => hub.reset(&id).await?,
                other => return Err(Error::invalid(format!("no lifecycle action {other}")).into()),
            };
            Ok(json(&sandbox)?)
        })
    }

    /// `GET /v1/sandboxes/{id}/metrics`: the usage series as JSON.
    #[pyo3(signature = (id, since=None, step=None))]
    fn metrics<'py>(
        &self,
        py: Python<'py>,
        id: String,
        since: Option<u64>,
        step: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let query = sandhub_api::usage::MetricsQuery { since, step };
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(&retry_read(|| hub.metrics(&id, query)).await?)?)
        })
    }

    fn snapshot<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(&b.hub()?.snapshot(&id).await?)?))
    }

    fn set_network<'py>(
        &self,
        py: Python<'py>,
        id: String,
        body: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let network: NetworkSpec = parse("network", body)?;
        run!(self, py, |b| Ok(json(
            &b.hub()?.set_network(&id, network).await?
        )?))
    }

    fn fork<'py>(&self, py: Python<'py>, id: String, body: &str) -> PyResult<Bound<'py, PyAny>> {
        let request: ForkRequest = parse("fork", body)?;
        run!(self, py, |b| Ok(json(&b.hub()?.fork(&id, request).await?)?))
    }

    // ---------------------------------------------------------- processes

    fn exec<'py>(&self, py: Python<'py>, id: String, body: &str) -> PyResult<Bound<'py, PyAny>> {
        let request: ExecRequest = parse("run", body)?;
        run!(self, py, |b| {
            match b.exec(&id, request).await {
                Ok(result) => Ok(json(&result)?),
                Err(cause) if b.vanished(&id, &cause).await => Err(Failure::Lost { id, cause }),
                Err(cause) => Err(cause.into()),
            }
        })
    }

    /// Starts a process; answers its event stream once `Started` arrived.
    fn start<'py>(&self, py: Python<'py>, id: String, body: &str) -> PyResult<Bound<'py, PyAny>> {
        let request: StartProcess = parse("start", body)?;
        let asynchronous = self.asynchronous;
        run!(self, py, |b| {
            use futures::StreamExt;
            let mut events = b.start(&id, request).await?;
            let pid = match events.next().await {
                Some(Ok(ProcessEvent::Started { pid })) => pid,
                Some(Err(e)) => return Err(e.into()),
                _ => {
                    return Err(
                        Error::internal("the process stream did not start with its pid").into(),
                    )
                }
            };
            Ok(ProcessStream::new(b, id, pid, asynchronous, events))
        })
    }

    /// Writes to a process's stdin; `data=None` closes it.
    #[pyo3(signature = (id, pid, data=None))]
    fn write_stdin<'py>(
        &self,
        py: Python<'py>,
        id: String,
        pid: i32,
        data: Option<&[u8]>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let input = match data {
            Some(d) => StdinInput::Data(bytes::Bytes::copy_from_slice(d)),
            None => StdinInput::Eof,
        };
        run!(self, py, |b| Ok(b.write_stdin(&id, pid, input).await?))
    }

    fn signal<'py>(
        &self,
        py: Python<'py>,
        id: String,
        pid: i32,
        name: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let signal = signal_of(name);
        run!(self, py, |b| Ok(b.signal(&id, pid, signal?).await?))
    }

    fn resize<'py>(
        &self,
        py: Python<'py>,
        id: String,
        pid: i32,
        rows: u16,
        cols: u16,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b
            .resize(&id, pid, PtySize { cols, rows })
            .await?))
    }

    // -------------------------------------------------------------- files

    /// The whole file, refusing past `limit` bytes without keeping them.
    #[pyo3(signature = (id, path, limit=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        id: String,
        path: String,
        limit: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let stream = b.read_file(&id, &path).await?;
            let state = tokio::sync::Mutex::new((Some(stream), 0));
            let mut all = Vec::new();
            while let Some(chunk) = next_chunk(&state, &path, limit).await? {
                all.extend_from_slice(&chunk);
            }
            Ok(bytes::Bytes::from(all))
        })
    }

    #[pyo3(signature = (id, path, limit=None))]
    fn open_read<'py>(
        &self,
        py: Python<'py>,
        id: String,
        path: String,
        limit: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let asynchronous = self.asynchronous;
        run!(self, py, |b| {
            let stream = b.read_file(&id, &path).await?;
            Ok(FileReader::new(asynchronous, path, limit, stream))
        })
    }

    /// Starts an upload; the caller sends chunks and finishes it.
    #[pyo3(signature = (id, path, mode=None, append=false))]
    fn open_write(&self, id: String, path: String, mode: Option<u32>, append: bool) -> FileWriter {
        FileWriter::start(
            self.backend.clone(),
            id,
            path,
            WriteOptions { append, mode },
            self.asynchronous,
        )
    }

    fn list_files<'py>(
        &self,
        py: Python<'py>,
        id: String,
        path: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(&b.list_files(&id, &path).await?)?))
    }

    /// The entry as JSON, or None when nothing is at `path`.
    fn stat<'py>(&self, py: Python<'py>, id: String, path: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            match b.stat(&id, &path).await? {
                Some(entry) => Ok(Some(json(&entry)?)),
                None => Ok(None),
            }
        })
    }

    fn remove<'py>(
        &self,
        py: Python<'py>,
        id: String,
        path: String,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b
            .delete_file(&id, &path, recursive)
            .await?))
    }

    fn watch<'py>(
        &self,
        py: Python<'py>,
        id: String,
        path: String,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let asynchronous = self.asynchronous;
        run!(self, py, |b| Ok(WatchStream::new(
            asynchronous,
            b.watch(&id, &path, recursive).await?
        )))
    }

    /// `GET /v1/events`; `filter` is JSON: `sandbox`, `types`, `labels`,
    /// `last_event_id` (each optional).
    fn events<'py>(&self, py: Python<'py>, filter: &str) -> PyResult<Bound<'py, PyAny>> {
        let asynchronous = self.asynchronous;
        let filter: EventFilterJson = parse("event filter", filter)?;
        let filter = sandhub_client::http::EventFilter {
            sandbox: filter.sandbox,
            types: filter.types,
            labels: filter.labels,
            last_event_id: filter.last_event_id,
        };
        run!(self, py, |b| Ok(EventStream::new(
            asynchronous,
            b.hub()?.events(&filter).await?
        )))
    }

    // ------------------------------------------------------ direct sandboxd

    fn sandboxd_health<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let d = b.direct()?;
            Ok(json(&retry_read(|| d.health()).await?)?)
        })
    }

    fn sandboxd_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let d = b.direct()?;
            Ok(json(&retry_read(|| d.metadata()).await?)?)
        })
    }

    // ------------------------------------------------- templates and pools

    /// `kind` is `template`, `pool` or `volume`; `body` is its JSON spec
    /// (a volume's is the create request; `name` wins over its `name`).
    fn put_named<'py>(
        &self,
        py: Python<'py>,
        kind: String,
        name: String,
        body: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        match kind.as_str() {
            "template" => {
                let t: Template = parse("template", body)?;
                run!(self, py, |b| Ok(json(
                    &b.hub()?.put_template(&name, t).await?
                )?))
            }
            "pool" => {
                let spec: PoolSpec = parse("pool", body)?;
                run!(self, py, |b| Ok(json(
                    &b.hub()?.put_pool(&name, spec).await?
                )?))
            }
            "volume" => {
                let mut req: CreateVolume = parse("volume", body)?;
                req.name = name;
                run!(self, py, |b| Ok(json(
                    &b.hub()?.create_volume(&req).await?
                )?))
            }
            other => Err(unknown_kind(other)),
        }
    }

    fn get_named<'py>(
        &self,
        py: Python<'py>,
        kind: String,
        name: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_kind(&kind)?;
        run!(self, py, |b| {
            let hub = b.hub()?;
            match kind.as_str() {
                "template" => Ok(json(&retry_read(|| hub.get_template(&name)).await?)?),
                "pool" => Ok(json(&retry_read(|| hub.get_pool(&name)).await?)?),
                _ => Ok(json(&retry_read(|| hub.get_volume(&name)).await?)?),
            }
        })
    }

    fn list_named<'py>(&self, py: Python<'py>, kind: String) -> PyResult<Bound<'py, PyAny>> {
        check_kind(&kind)?;
        run!(self, py, |b| {
            let hub = b.hub()?;
            match kind.as_str() {
                "template" => Ok(json(&retry_read(|| hub.list_templates()).await?)?),
                "pool" => Ok(json(&retry_read(|| hub.list_pools()).await?)?),
                _ => Ok(json(&retry_read(|| hub.list_volumes()).await?)?),
            }
        })
    }

    fn delete_named<'py>(
        &self,
        py: Python<'py>,
        kind: String,
        name: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_kind(&kind)?;
        run!(self, py, |b| {
            let hub = b.hub()?;
            match kind.as_str() {
                "template" => Ok(hub.delete_template(&name).await?),
                "pool" => Ok(hub.delete_pool(&name).await?),
                _ => Ok(hub.delete_volume(&name).await?),
            }
        })
    }

    // ------------------------------------------- volume files and snapshots

    /// A volume's whole file, refusing past `limit` bytes without keeping
    /// them (no sandbox needed).
    #[pyo3(signature = (name, path, limit=None))]
    fn volume_read<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: String,
        limit: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let stream = b.hub()?.read_volume_file(&name, &path).await?;
            let state = tokio::sync::Mutex::new((Some(stream), 0));
            let mut all = Vec::new();
            while let Some(chunk) = next_chunk(&state, &path, limit).await? {
                all.extend_from_slice(&chunk);
            }
            Ok(bytes::Bytes::from(all))
        })
    }

    #[pyo3(signature = (name, path, limit=None))]
    fn volume_open_read<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: String,
        limit: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let asynchronous = self.asynchronous;
        run!(self, py, |b| {
            let stream = b.hub()?.read_volume_file(&name, &path).await?;
            Ok(FileReader::new(asynchronous, path, limit, stream))
        })
    }

    /// Starts an upload into a volume's file; the caller sends chunks and
    /// finishes it.
    #[pyo3(signature = (name, path, mode=None))]
    fn volume_open_write(&self, name: String, path: String, mode: Option<u32>) -> FileWriter {
        let backend = self.backend.clone();
        FileWriter::spawn(self.asynchronous, move |body| async move {
            let options = WriteOptions {
                append: false,
                mode,
            };
            backend
                .hub()?
                .write_volume_file(&name, &path, body, options)
                .await
        })
    }

    fn volume_list_files<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(
                &retry_read(|| hub.list_volume_files(&name, &path)).await?,
            )?)
        })
    }

    /// The entry as JSON, or None when nothing is at `path`.
    fn volume_stat<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            match b.hub()?.stat_volume_file(&name, &path).await? {
                Some(entry) => Ok(Some(json(&entry)?)),
                None => Ok(None),
            }
        })
    }

    fn volume_remove<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: String,
        recursive: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b
            .hub()?
            .delete_volume_file(&name, &path, recursive)
            .await?))
    }

    fn volume_snapshot<'py>(
        &self,
        py: Python<'py>,
        name: String,
        snapshot: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(
            &b.hub()?.create_volume_snapshot(&name, &snapshot).await?
        )?))
    }

    fn volume_snapshots<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(
                &retry_read(|| hub.list_volume_snapshots(&name)).await?,
            )?)
        })
    }

    fn volume_delete_snapshot<'py>(
        &self,
        py: Python<'py>,
        name: String,
        snapshot: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b
            .hub()?
            .delete_volume_snapshot(&name, &snapshot)
            .await?))
    }

    // --------------------------------------------------------------- images

    fn images_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(&retry_read(|| hub.list_images()).await?)?)
        })
    }

    /// Imports the OCI layout directory or archive file at `path`.
    #[pyo3(signature = (path, tag=None, pick=None))]
    fn images_import<'py>(
        &self,
        py: Python<'py>,
        path: std::path::PathBuf,
        tag: Option<String>,
        pick: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(
            &b.hub()?
                .import_image_path(&path, tag.as_deref(), pick.as_deref())
                .await?
        )?))
    }

    /// Pulls `reference` from its registry into the hub's store, named
    /// `tag` (default: the reference); the image once every layer is in.
    #[pyo3(signature = (reference, tag=None, username=None, password=None))]
    fn images_pull<'py>(
        &self,
        py: Python<'py>,
        reference: String,
        tag: Option<String>,
        username: Option<String>,
        password: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = PullRequest {
            reference,
            tag,
            username,
            password,
        };
        run!(self, py, |b| Ok(json(
            &b.hub()?.pull_image_with(&request, |_| {}).await?
        )?))
    }

    /// Pulls each reference where the caller's sandboxes run (on the local
    /// backend: into the store; on Kubernetes: onto the nodes `template`'s
    /// Pods reach); one item per reference, never an error for one image.
    #[pyo3(signature = (references, template=None))]
    fn images_prepull<'py>(
        &self,
        py: Python<'py>,
        references: Vec<String>,
        template: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = PrepullRequest {
            references,
            template,
            ..Default::default()
        };
        run!(self, py, |b| Ok(json(&b.hub()?.prepull(&request).await?)?))
    }

    fn images_remove<'py>(
        &self,
        py: Python<'py>,
        reference: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(
            &b.hub()?.remove_image(&reference).await?
        )?))
    }

    fn images_prune<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(&b.hub()?.prune_images().await?)?))
    }

    // ---------------------------------------------------------------- ports

    /// The URL reaching `port` inside sandbox `id` through the hub.
    fn port_url(&self, py: Python<'_>, id: &str, port: u16) -> PyResult<String> {
        let hub = self
            .backend
            .hub()
            .map_err(|e| Failure::from(e).into_py(py))?;
        Ok(hub.port_url(id, port))
    }

    fn list_ports<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(&retry_read(|| hub.list_ports(&id)).await?)?)
        })
    }

    /// Waits for a listener on `port`; returns its URL.
    fn wait_port<'py>(
        &self,
        py: Python<'py>,
        id: String,
        port: u16,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = std::time::Duration::try_from_secs_f64(timeout)
            .map_err(|e| PyValueError::new_err(format!("timeout: {e}")))?;
        run!(self, py, |b| Ok(b
            .hub()?
            .wait_port(&id, port, timeout)
            .await?))
    }

    // ------------------------------------------------------ code interpreter

    /// `POST /v1/sandboxes/{id}/code/contexts`; `body` is a `CreateContext`.
    fn code_create_context<'py>(
        &self,
        py: Python<'py>,
        id: String,
        body: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request: CreateContext = parse("context", body)?;
        run!(self, py, |b| Ok(json(
            &b.hub()?.create_context(&id, &request).await?
        )?))
    }

    fn code_list_contexts<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| {
            let hub = b.hub()?;
            Ok(json(&retry_read(|| hub.list_contexts(&id)).await?)?)
        })
    }

    fn code_restart_context<'py>(
        &self,
        py: Python<'py>,
        id: String,
        context: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(
            &b.hub()?.restart_context(&id, &context).await?
        )?))
    }

    fn code_delete_context<'py>(
        &self,
        py: Python<'py>,
        id: String,
        context: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b
            .hub()?
            .delete_context(&id, &context)
            .await?))
    }

    /// `POST /v1/sandboxes/{id}/code`; `body` is an `ExecuteCode`. The
    /// stream yields each event as JSON, ending with `end` (never retried:
    /// the code may have run).
    fn code_run<'py>(
        &self,
        py: Python<'py>,
        id: String,
        body: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let asynchronous = self.asynchronous;
        let request: ExecuteCode = parse("code", body)?;
        run!(self, py, |b| {
            let events = b.hub()?.run_code(&id, &request).await?;
            Ok(EventStream::new(
                asynchronous,
                events.map(|e| e.and_then(|e| value(&e))).boxed(),
            ))
        })
    }

    // ---------------------------------------------------------------- gym

    fn gym_make<'py>(&self, py: Python<'py>, body: &str) -> PyResult<Bound<'py, PyAny>> {
        let spec: CreateEnv = parse("gym spec", body)?;
        run!(self, py, |b| Ok(json(&b.hub()?.gym_create(&spec).await?)?))
    }

    fn gym_reset<'py>(
        &self,
        py: Python<'py>,
        env_id: String,
        body: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request: ResetRequest = parse("reset", body)?;
        run!(self, py, |b| Ok(json(
            &b.hub()?.gym_reset(&env_id, &request).await?
        )?))
    }

    fn gym_step<'py>(
        &self,
        py: Python<'py>,
        env_id: String,
        action: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(json(
            &b.hub()?.gym_step(&env_id, &action).await?
        )?))
    }

    fn gym_close<'py>(&self, py: Python<'py>, env_id: String) -> PyResult<Bound<'py, PyAny>> {
        run!(self, py, |b| Ok(b.hub()?.gym_close(&env_id).await?))
    }

    fn gym_step_many<'py>(&self, py: Python<'py>, body: &str) -> PyResult<Bound<'py, PyAny>> {
        let batch: BatchStep = parse("step_many", body)?;
        run!(self, py, |b| Ok(json(
            &b.hub()?.gym_step_many(&batch).await?
        )?))
    }
}
