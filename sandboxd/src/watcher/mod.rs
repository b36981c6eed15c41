//! `watcher.v1.FileWatcherService`: inotify-backed directory watches.
//!
//! Each WatchDir stream owns one inotify instance, read by a spawned task
//! that translates raw events (`tree`), folds them into windows of about
//! 250 ms (`batch`) and sends each non-empty window as one response. The task
//! stops when the client goes away (tonic drops the response stream, which
//! closes the channel) or when the watched directory does; the inotify fd
//! closes with it. The concurrency permit lives in the response stream rather
//! than the task, so a slot is free again the moment the stream is dropped.

mod batch;
mod tree;

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt};
use inotify::EventStream;
use prometheus_client::metrics::gauge::Gauge;
use sandhub_api::proto::watcher::v1 as pb;
use tokio::{
    sync::{mpsc, OwnedSemaphorePermit},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, info_span, warn, Instrument};

use self::{
    batch::Batch,
    tree::{Step, Tree},
};
use crate::{confine::RelPath, error::Error, Daemon};

/// How long events gather before they are sent together.
const WINDOW: Duration = Duration::from_millis(250);

/// Room for a few hundred events per read(2); one event is at most 16 + 256
/// bytes, so a read never has to fail for lack of space.
const READ_BUFFER: usize = 16 * 1024;

/// Responses queued for a slow client. While they wait, the kernel keeps
/// queueing events, and past its limit says so with an overflow (an ERROR
/// event) instead of sandboxd buffering without bound.
const CHANNEL_DEPTH: usize = 4;

type Item = Result<pb::WatchDirResponse, Status>;

pub struct WatcherService {
    pub daemon: Arc<Daemon>,
}

#[tonic::async_trait]
impl pb::file_watcher_service_server::FileWatcherService for WatcherService {
    type WatchDirStream = Pin<Box<dyn Stream<Item = Item> + Send>>;

    async fn watch_dir(
        &self,
        request: Request<pb::WatchDirRequest>,
    ) -> Result<Response<Self::WatchDirStream>, Status> {
        let pb::WatchDirRequest { path, recursive } = request.into_inner();
        let rel = RelPath::parse(&path)?;
        let lease = self.lease()?;
        let shown = rel.display();

        // A recursive scan of a large tree is thousands of syscalls: keep
        // them off the async workers.
        let daemon = self.daemon.clone();
        let (tree, inotify, batch) = tokio::task::spawn_blocking(move || {
            let mut batch = Batch::default();
            let (tree, inotify) = Tree::open(&daemon.root(), rel, recursive, &mut batch)?;
            Ok::<_, Error>((tree, inotify, batch))
        })
        .await
        .map_err(|e| Status::internal(format!("watch setup failed: {e}")))??;
        let events = inotify
            .into_event_stream(vec![0u8; READ_BUFFER])
            .map_err(|e| Error::Internal(format!("{shown}: inotify: {e}")))?;

        let span = info_span!("watch", path = %shown, recursive);
        span.in_scope(|| debug!(watches = tree.watch_count(), "watch started"));
        let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
        tokio::spawn(pump(self.daemon.clone(), tree, events, batch, tx).instrument(span));
        Ok(Response::new(Box::pin(WatchStream {
            inner: ReceiverStream::new(rx),
            _lease: lease,
        })))
    }
}

impl WatcherService {
    fn lease(&self) -> Result<Lease, Error> {
        let permit = self
            .daemon
            .watches
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                Error::ResourceExhausted(format!(
                    "too many concurrent watches (at most {}); close one and retry",
                    self.daemon.config.max_watches
                ))
            })?;
        let gauge = self.daemon.metrics.active_watches.clone();
        gauge.inc();
        Ok(Lease {
            _permit: permit,
            gauge,
        })
    }
}

/// One slot of `Daemon::watches`, counted in the gauge while held.
struct Lease {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The response stream: the channel from the task, plus the slot it holds.
struct WatchStream {
    inner: ReceiverStream<Item>,
    _lease: Lease,
}

impl Stream for WatchStream {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

enum Wake {
    Flush,
    Event(Option<std::io::Result<inotify::EventOwned>>),
}

/// Reads inotify until the client leaves or the watched directory goes.
async fn pump(
    daemon: Arc<Daemon>,
    mut tree: Tree,
    mut events: EventStream<Vec<u8>>,
    mut batch: Batch,
    tx: mpsc::Sender<Item>,
) {
    // The window opens with its first event, so a lone change arrives
    // within WINDOW and a burst is never split by an unrelated tick.
    let mut deadline = (!batch.is_empty()).then(|| Instant::now() + WINDOW);
    loop {
        let wake = tokio::select! {
            // Flushing before reading keeps a steady stream of events from
            // holding a window open forever.
            biased;
            () = tx.closed() => {
                debug!("client went away");
                return;
            }
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)),
                if deadline.is_some() => Wake::Flush,
            ev = events.next() => Wake::Event(ev),
        };
        match wake {
            Wake::Flush => {
                deadline = None;
                if !flush(&mut batch, &tx).await {
                    return;
                }
            }
            Wake::Event(Some(Ok(ev))) => {
                if tree.handle(&daemon.root(), ev, &mut batch) == Step::End {
                    flush(&mut batch, &tx).await;
                    debug!("watched directory gone; stream closed");
                    return;
                }
                if batch.is_full() {
                    deadline = None;
                    if !flush(&mut batch, &tx).await {
                        return;
                    }
                } else if deadline.is_none() && !batch.is_empty() {
                    deadline = Some(Instant::now() + WINDOW);
                }
            }
            Wake::Event(Some(Err(e))) => {
                warn!(error = %e, "reading inotify events failed");
                if flush(&mut batch, &tx).await {
                    let _ = tx
                        .send(Err(Status::internal(format!("reading events: {e}"))))
                        .await;
                }
                return;
            }
            Wake::Event(None) => {
                flush(&mut batch, &tx).await;
                return;
            }
        }
    }
}

/// Sends the window if it holds anything; false once the client is gone.
async fn flush(batch: &mut Batch, tx: &mpsc::Sender<Item>) -> bool {
    if batch.is_empty() {
        return true;
    }
    let events = batch.take();
    tx.send(Ok(pb::WatchDirResponse { events })).await.is_ok()
}
