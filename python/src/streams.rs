//! Handles on long-lived streams: a started process's events, a file being
//! read or written chunk by chunk, a watch. Each pulls one item per call,
//! so Python holds at most one chunk and a Ctrl-C or cancelled task
//! between items leaves the handle usable.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use pyo3::prelude::*;
use sandhub_client::{ByteStream, Error, ProcessEvent, ProcessEvents, Result, WatchEvents};
use tokio::sync::{mpsc, Mutex, Notify};

use crate::{
    backend::Backend,
    errors::Failure,
    runtime::{call, rt},
};

/// One event as Python sees it: `("stdout"|"stderr", bytes)` or
/// `("exit", code)`; `None` after the exit event.
#[derive(IntoPyObject)]
pub enum PyEvent {
    Output(&'static str, Bytes),
    Exit(&'static str, i32),
}

/// A started process's event stream (`ProcessHandle` wraps it).
#[pyclass(module = "sandhub._sandhub", frozen)]
pub struct ProcessStream {
    backend: Backend,
    id: String,
    #[pyo3(get)]
    pid: i32,
    asynchronous: bool,
    events: Arc<Mutex<Option<ProcessEvents>>>,
}

impl ProcessStream {
    pub fn new(
        backend: Backend,
        id: String,
        pid: i32,
        asynchronous: bool,
        events: ProcessEvents,
    ) -> Self {
        ProcessStream {
            backend,
            id,
            pid,
            asynchronous,
            events: Arc::new(Mutex::new(Some(events))),
        }
    }
}

#[pymethods]
impl ProcessStream {
    /// The next event, or None once the exit event was delivered.
    fn next_event<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let events = self.events.clone();
        let backend = self.backend.clone();
        let id = self.id.clone();
        call(py, self.asynchronous, async move {
            let mut guard = events.lock().await;
            let Some(stream) = guard.as_mut() else {
                return Ok(None);
            };
            let item = match stream.next().await {
                Some(item) => item,
                None => Err(Error::unavailable(
                    "the process stream ended before the exit event",
                )),
            };
            match item {
                Ok(ProcessEvent::Stdout { data }) => {
                    Ok(Some(PyEvent::Output("stdout", data.into())))
                }
                Ok(ProcessEvent::Stderr { data }) => {
                    Ok(Some(PyEvent::Output("stderr", data.into())))
                }
                Ok(ProcessEvent::Exited { exit_code }) => {
                    *guard = None;
                    Ok(Some(PyEvent::Exit("exit", exit_code)))
                }
                // Only the first event is `Started`, consumed by `start`.
                Ok(ProcessEvent::Started { .. }) => {
                    Ok(Some(PyEvent::Output("stdout", Bytes::new())))
                }
                Err(cause) => {
                    *guard = None;
                    if backend.vanished(&id, &cause).await {
                        Err(Failure::Lost { id, cause })
                    } else {
                        Err(cause.into())
                    }
                }
            }
        })
    }
}

/// A file being read, one chunk per call.
#[pyclass(module = "sandhub._sandhub", frozen)]
pub struct FileReader {
    asynchronous: bool,
    path: String,
    limit: Option<u64>,
    state: Arc<Mutex<(Option<ByteStream>, u64)>>,
}

impl FileReader {
    pub fn new(asynchronous: bool, path: String, limit: Option<u64>, stream: ByteStream) -> Self {
        FileReader {
            asynchronous,
            path,
            limit,
            state: Arc::new(Mutex::new((Some(stream), 0))),
        }
    }
}

/// Pulls the next chunk, counting against `limit`. Past the limit the
/// stream is dropped (closing the connection) and nothing more is read.
pub async fn next_chunk(
    state: &Mutex<(Option<ByteStream>, u64)>,
    path: &str,
    limit: Option<u64>,
) -> Result<Option<Bytes>, Failure> {
    let mut guard = state.lock().await;
    let (stream, seen) = &mut *guard;
    let Some(s) = stream.as_mut() else {
        return Ok(None);
    };
    match s.next().await {
        None => {
            *stream = None;
            Ok(None)
        }
        Some(Err(e)) => {
            *stream = None;
            Err(e.into())
        }
        Some(Ok(chunk)) => {
            *seen += chunk.len() as u64;
            if let Some(limit) = limit.filter(|l| *seen > *l) {
                *stream = None;
                return Err(Failure::TooLarge {
                    limit,
                    path: path.to_string(),
                });
            }
            Ok(Some(chunk))
        }
    }
}

#[pymethods]
impl FileReader {
    /// The next chunk of bytes, or None at the end.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.state.clone();
        let path = self.path.clone();
        let limit = self.limit;
        call(py, self.asynchronous, async move {
            next_chunk(&state, &path, limit).await
        })
    }
}

/// How many chunks may wait between Python and the request: bounds memory
/// at a few chunks however large the upload.
const UPLOAD_QUEUE: usize = 4;

/// A file being written: Python sends chunks, `finish` ends the body and
/// waits for the answer.
#[pyclass(module = "sandhub._sandhub", frozen)]
pub struct FileWriter {
    asynchronous: bool,
    sender: std::sync::Mutex<Option<mpsc::Sender<Result<Bytes>>>>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<Result<()>>>>>,
    /// Drops the request when `abort` cannot fail the body (its queue is full).
    stop: tokio::task::AbortHandle,
}

impl FileWriter {
    pub fn start(
        backend: Backend,
        id: String,
        path: String,
        options: sandhub_client::WriteOptions,
        asynchronous: bool,
    ) -> Self {
        Self::spawn(asynchronous, move |body| async move {
            backend.write_file(&id, &path, body, options).await
        })
    }

    /// An upload whose body `upload` sends wherever it writes (a sandbox's
    /// file, a volume's file), fed chunk by chunk as [`FileWriter::start`].
    pub fn spawn<F, Fut>(asynchronous: bool, upload: F) -> Self
    where
        F: FnOnce(ByteStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Result<Bytes>>(UPLOAD_QUEUE);
        let body: ByteStream = Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        let task = rt().spawn(upload(body));
        FileWriter {
            asynchronous,
            sender: std::sync::Mutex::new(Some(tx)),
            stop: task.abort_handle(),
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    fn sender(&self) -> Option<mpsc::Sender<Result<Bytes>>> {
        self.sender.lock().ok().and_then(|s| s.clone())
    }
}

/// The upload's own answer once it has ended (early, on a failure).
async fn outcome(task: &Mutex<Option<tokio::task::JoinHandle<Result<()>>>>) -> Result<(), Failure> {
    let Some(handle) = task.lock().await.take() else {
        return Ok(());
    };
    match handle.await {
        Ok(result) => result.map_err(Failure::from),
        Err(e) => Err(Error::internal(format!("the upload task failed: {e}")).into()),
    }
}

#[pymethods]
impl FileWriter {
    /// Queues one chunk; waits while the queue is full.
    fn send<'py>(&self, py: Python<'py>, chunk: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let chunk = Bytes::copy_from_slice(chunk);
        let sender = self.sender();
        let task = self.task.clone();
        call(py, self.asynchronous, async move {
            let Some(sender) = sender else {
                return Err(Error::invalid("the file writer is already finished").into());
            };
            if sender.send(Ok(chunk)).await.is_err() {
                // The request ended early: its answer says why.
                outcome(&task).await?;
                return Err(Error::unavailable("the upload ended before its body did").into());
            }
            Ok(())
        })
    }

    /// Ends the body and waits for the hub's answer.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(mut s) = self.sender.lock() {
            s.take();
        }
        let task = self.task.clone();
        call(py, self.asynchronous, async move { outcome(&task).await })
    }

    /// Fails the upload (nothing is written when the file was being replaced).
    /// The body ends in an error when its queue has room; when it has none,
    /// dropping the sender would end the body cleanly (the hub would commit
    /// what it got), so the request itself is dropped instead.
    fn abort(&self) {
        let sender = self.sender.lock().ok().and_then(|mut s| s.take());
        let failed = sender.is_some_and(|sender| {
            sender
                .try_send(Err(Error::new(
                    sandhub_api::error::Code::Internal,
                    "the upload was aborted by the caller",
                )))
                .is_ok()
        });
        if !failed {
            self.stop.abort();
        }
    }
}

/// A stream that `close()` ends from another thread or task: a read that
/// is waiting returns None, and the stream (with its connection) is
/// dropped. It is dropped too once it ends or fails.
struct Closable<S> {
    stream: Arc<Mutex<Option<S>>>,
    closed: Arc<Notify>,
}

impl<S, T> Closable<S>
where
    S: futures::Stream<Item = Result<T>> + Unpin + Send + 'static,
    T: Send + 'static,
{
    fn new(stream: S) -> Self {
        Closable {
            stream: Arc::new(Mutex::new(Some(stream))),
            closed: Arc::new(Notify::new()),
        }
    }

    /// The next item; None once the stream ended or was closed.
    fn next(
        &self,
    ) -> impl std::future::Future<Output = std::result::Result<Option<T>, Failure>> + Send + 'static
    {
        let stream = self.stream.clone();
        let closed = self.closed.clone();
        async move {
            let mut guard = stream.lock().await;
            let Some(s) = guard.as_mut() else {
                return Ok(None);
            };
            let item = tokio::select! {
                item = s.next() => item,
                () = closed.notified() => None,
            };
            match item {
                None => {
                    *guard = None;
                    Ok(None)
                }
                Some(Err(e)) => {
                    *guard = None;
                    Err(Failure::from(e))
                }
                Some(Ok(item)) => Ok(Some(item)),
            }
        }
    }

    fn close(&self) {
        // A stored permit if no read is waiting: the next read sees it.
        self.closed.notify_one();
        if let Ok(mut guard) = self.stream.try_lock() {
            *guard = None;
        }
    }
}

/// A watch: batches of events, as JSON lists.
#[pyclass(module = "sandhub._sandhub", frozen)]
pub struct WatchStream {
    asynchronous: bool,
    events: Closable<WatchEvents>,
}

impl WatchStream {
    pub fn new(asynchronous: bool, events: WatchEvents) -> Self {
        WatchStream {
            asynchronous,
            events: Closable::new(events),
        }
    }
}

#[pymethods]
impl WatchStream {
    /// The next batch as a JSON list, or None when the watch ended or was closed.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let next = self.events.next();
        call(py, self.asynchronous, async move {
            match next.await? {
                Some(batch) => Ok(Some(json(&batch)?)),
                None => Ok(None),
            }
        })
    }

    /// Stops the watch: a waiting read returns None, and the stream (with
    /// its connection) is dropped.
    fn close(&self) {
        self.events.close();
    }
}

/// A stream of JSON objects: lifecycle events (`GET /v1/events`), or an
/// execution's code events (`POST .../code`).
#[pyclass(module = "sandhub._sandhub", frozen)]
pub struct EventStream {
    asynchronous: bool,
    events: Closable<futures::stream::BoxStream<'static, Result<serde_json::Value>>>,
}

impl EventStream {
    pub fn new(
        asynchronous: bool,
        events: futures::stream::BoxStream<'static, Result<serde_json::Value>>,
    ) -> Self {
        EventStream {
            asynchronous,
            events: Closable::new(events),
        }
    }
}

#[pymethods]
impl EventStream {
    /// The next event as JSON, or None when the stream ended or was closed.
    fn next_event<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let next = self.events.next();
        call(py, self.asynchronous, async move {
            Ok(next.await?.map(|event| event.to_string()))
        })
    }

    /// Stops the stream: a waiting read returns None.
    fn close(&self) {
        self.events.close();
    }
}

pub fn json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::internal(format!("encoding JSON: {e}")))
}

pub fn value<T: serde::Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| Error::internal(format!("encoding JSON: {e}")))
}
