//! The code interpreter (a Sandhub extension, issue #33): contexts, each a
//! Jupyter kernel started as a process of the sandbox, and executions
//! streamed as NDJSON [`CodeEvent`]s.
//!
//! Routes (same auth as the files API): `POST|GET` [`CONTEXTS_ROUTE`],
//! `POST {CONTEXTS_ROUTE}/{id}/restart`, `DELETE {CONTEXTS_ROUTE}/{id}`,
//! `POST` [`EXECUTE_ROUTE`].
//!
//! sandboxd speaks ZeroMQ to the kernel itself (`zeromq`, pure Rust), so an
//! image needs only a kernel (ipykernel), no Jupyter server.

mod kernel;
mod wire;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::{DefaultBodyLimit, Path, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Json, Router,
};
use futures::StreamExt;
use sandhub_api::code::{
    canonical_language, check_context_id, check_env, CodeEvent, Context, ContextList,
    CreateContext, ExecuteCode, BASH, CONTEXTS_ROUTE, DEFAULT_TIMEOUT_SECONDS, EXECUTE_ROUTE,
    MAX_CODE_BYTES, MAX_TIMEOUT_SECONDS,
};
use tokio::sync::{mpsc, Mutex};
use tokio_stream::wrappers::ReceiverStream;

pub use self::kernel::Bounds;
use self::kernel::Kernel;
use crate::{
    error::{Error, Result},
    Daemon,
};

/// Events queued between an execution and its HTTP response: a slow
/// reader makes the execution drop kernel output (counted in `end`), not
/// grow memory.
const EVENT_QUEUE: usize = 16;

/// Every context of this sandbox.
pub struct Contexts {
    max: usize,
    map: Mutex<BTreeMap<String, Arc<Entry>>>,
}

struct Entry {
    id: String,
    language: &'static str,
    cwd: Option<String>,
    env: HashMap<String, String>,
    /// None until its first start finishes, and while it restarts.
    kernel: Mutex<Option<Arc<Kernel>>>,
}

impl Contexts {
    pub fn new(max: usize) -> Self {
        Contexts {
            max,
            map: Mutex::default(),
        }
    }

    /// Kills every kernel (sandboxd's shutdown, a workspace reset).
    pub async fn clear(&self) {
        let entries = std::mem::take(&mut *self.map.lock().await);
        for e in entries.into_values() {
            if let Some(k) = e.kernel.lock().await.take() {
                k.kill();
            }
        }
    }

    async fn create(
        &self,
        daemon: &Daemon,
        id: String,
        language: &'static str,
        cwd: Option<String>,
        env: HashMap<String, String>,
    ) -> Result<Arc<Entry>> {
        let entry = {
            let mut map = self.map.lock().await;
            if let Some(e) = map.get(&id) {
                return Ok(e.clone());
            }
            if map.len() >= self.max {
                return Err(Error::ResourceExhausted(format!(
                    "this sandbox has {} code contexts, the most it may; delete one",
                    self.max
                )));
            }
            let entry = Arc::new(Entry {
                id: id.clone(),
                language,
                cwd,
                env,
                kernel: Mutex::default(),
            });
            map.insert(id.clone(), entry.clone());
            entry
        };
        if let Err(e) = entry.ensure(daemon).await {
            self.map.lock().await.remove(&id);
            return Err(e);
        }
        Ok(entry)
    }

    async fn get(&self, id: &str) -> Result<Arc<Entry>> {
        self.map
            .lock()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("no code context {id}")))
    }
}

/// How a kernel of `language` starts (its connection file is added after).
fn kernel_argv(python: &str, language: &str) -> Vec<String> {
    let mut argv = vec![python.to_string(), "-m".into()];
    if language == BASH {
        argv.push("bash_kernel".into());
    } else {
        argv.extend([
            "ipykernel_launcher".into(),
            // A plot's PNG is the figure's own size (the inline backend
            // would crop it to its drawn box).
            "--InlineBackend.print_figure_kwargs={'bbox_inches': None}".into(),
        ]);
    }
    argv
}

impl Entry {
    /// The running kernel, started if it is not.
    async fn ensure(&self, daemon: &Daemon) -> Result<Arc<Kernel>> {
        let mut slot = self.kernel.lock().await;
        if let Some(k) = &*slot {
            return Ok(k.clone());
        }
        let mut env = self.env.clone();
        // Python's plots as PNG results; an image's MPLBACKEND=Agg is for
        // scripts (bash runs scripts, so it keeps it).
        if self.language != BASH {
            env.entry("MPLBACKEND".into())
                .or_insert_with(|| "module://matplotlib_inline.backend_inline".into());
        }
        let argv = kernel_argv(&daemon.config.code_python, self.language);
        // The ports a kernel is given were free a moment before it binds
        // them; one taken meanwhile (another kernel starting) makes it exit
        // at once, and a second try with new ports is the cure.
        let mut tries = 0;
        let k = loop {
            tries += 1;
            match Kernel::start(daemon, argv.clone(), &env, self.cwd.as_deref()).await {
                Err(Error::FailedPrecondition(why)) if tries < 3 => {
                    tracing::debug!(why, "a kernel exited while starting; trying again");
                }
                other => break Arc::new(other?),
            }
        };
        *slot = Some(k.clone());
        Ok(k)
    }

    async fn restart(&self, daemon: &Daemon) -> Result<()> {
        // Dropping the old kernel kills it; a cell running in it ends
        // with KernelDied.
        if let Some(k) = self.kernel.lock().await.take() {
            k.kill();
        }
        self.ensure(daemon).await.map(drop)
    }

    async fn view(&self) -> Context {
        let (state, exit) = match &*self.kernel.lock().await {
            None => ("starting", None),
            Some(k) => match k.exited() {
                Some(why) => ("dead", Some(why)),
                None if k.is_busy() => ("busy", None),
                None => ("idle", None),
            },
        };
        Context {
            id: self.id.clone(),
            language: self.language.into(),
            cwd: self.cwd.clone().unwrap_or_default(),
            state: state.into(),
            exit,
        }
    }
}

pub fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route(CONTEXTS_ROUTE, post(create_context).get(list_contexts))
        .route(
            &format!("{CONTEXTS_ROUTE}/{{id}}/restart"),
            post(restart_context),
        )
        .route(&format!("{CONTEXTS_ROUTE}/{{id}}"), delete(delete_context))
        .route(
            EXECUTE_ROUTE,
            post(execute).layer(DefaultBodyLimit::max(MAX_CODE_BYTES + (1 << 20))),
        )
        .route(&format!("{CONTEXTS_ROUTE}/{{id}}"), get(get_context))
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| Error::InvalidArgument(format!("request body: {e}")))
}

fn env_map(env: BTreeMap<String, String>) -> Result<HashMap<String, String>> {
    check_env(&env).map_err(Error::InvalidArgument)?;
    Ok(env.into_iter().collect())
}

async fn create_context(State(daemon): State<Arc<Daemon>>, body: Bytes) -> Result<Response> {
    let req: CreateContext = parse(&body)?;
    let language = canonical_language(req.language.as_deref()).map_err(Error::InvalidArgument)?;
    let env = env_map(req.env)?;
    let cwd = req.cwd.filter(|c| !c.is_empty());
    let id = format!("ctx-{}", &wire::random_hex()[..16]);
    let entry = daemon.code.create(&daemon, id, language, cwd, env).await?;
    Ok((StatusCode::CREATED, Json(entry.view().await)).into_response())
}

async fn list_contexts(State(daemon): State<Arc<Daemon>>) -> Json<ContextList> {
    let entries: Vec<_> = daemon.code.map.lock().await.values().cloned().collect();
    let mut contexts = Vec::with_capacity(entries.len());
    for e in entries {
        contexts.push(e.view().await);
    }
    Json(ContextList { contexts })
}

async fn get_context(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
) -> Result<Json<Context>> {
    Ok(Json(daemon.code.get(&id).await?.view().await))
}

async fn restart_context(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
) -> Result<Json<Context>> {
    let entry = daemon.code.get(&id).await?;
    entry.restart(&daemon).await?;
    Ok(Json(entry.view().await))
}

async fn delete_context(
    State(daemon): State<Arc<Daemon>>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    let entry = daemon.code.map.lock().await.remove(&id);
    match entry {
        Some(e) => {
            if let Some(k) = e.kernel.lock().await.take() {
                k.kill();
            }
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(Error::NotFound(format!("no code context {id}"))),
    }
}

async fn execute(State(daemon): State<Arc<Daemon>>, body: Bytes) -> Result<Response> {
    let req: ExecuteCode = parse(&body)?;
    if req.code.len() > MAX_CODE_BYTES {
        return Err(Error::TooLarge(format!(
            "code: at most {MAX_CODE_BYTES} bytes"
        )));
    }
    let timeout = req.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(1..=MAX_TIMEOUT_SECONDS).contains(&timeout) {
        return Err(Error::InvalidArgument(format!(
            "timeout_seconds: between 1 and {MAX_TIMEOUT_SECONDS}"
        )));
    }
    let env = env_map(req.env)?;
    let entry = match req.context {
        Some(id) => {
            check_context_id(&id).map_err(Error::InvalidArgument)?;
            daemon.code.get(&id).await?
        }
        None => {
            // The language's default context, made on first use.
            let language =
                canonical_language(req.language.as_deref()).map_err(Error::InvalidArgument)?;
            let id = format!("default-{language}");
            daemon
                .code
                .create(&daemon, id, language, None, HashMap::new())
                .await?
        }
    };
    let kernel = entry.ensure(&daemon).await?;
    let bounds = Bounds {
        max_result_bytes: daemon.config.code_max_result_bytes,
        max_stream_bytes: sandhub_api::code::DEFAULT_MAX_STREAM_BYTES,
    };
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    tokio::spawn(async move {
        kernel
            .execute(&req.code, &env, Duration::from_secs(timeout), bounds, tx)
            .await;
    });
    let lines = ReceiverStream::new(rx).map(|e: CodeEvent| {
        let mut line = serde_json::to_vec(&e).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}
