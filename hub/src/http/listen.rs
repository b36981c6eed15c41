//! The hub's listener. With the fast path on, each accepted connection is
//! served on one of a few single-threaded event loops (one per core, as
//! `sandhub-router` runs): a request, its upstream connection and its
//! answer then live on one thread, with no wake-ups between threads. From
//! the first request the fast path does not take, the connection goes back
//! to the main runtime, to hyper's server and the axum app, with the bytes
//! already read. Shutdown: no new connections, the fast path closes its
//! connections between requests, hyper's finish their requests in flight;
//! this returns when every connection has closed.

use std::{
    future::Future,
    io,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::Router;
use bytes::BytesMut;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{
        conn::auto,
        graceful::{GracefulShutdown, Watcher},
    },
    service::TowerToHyperService,
};
use sandhub_http1::inbound::{self, Prefixed};
use tokio::{
    net::{TcpListener, TcpStream},
    runtime::Handle,
    sync::watch,
};

use super::fast;

/// Serves `app` (and `fast`, if on) on `listener` until `shutdown`
/// completes, then until the open connections have closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    fast: Option<Arc<fast::Ports>>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    // hyper's defaults for HTTP/1.1 and HTTP/2 (h2c), as `axum::serve` has them.
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let (stop_tx, stop) = watch::channel(false);
    let loops = match fast {
        Some(_) => Some(Loops::start()?),
        None => None,
    };
    let main = Handle::current();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Small requests and answers must not wait on Nagle.
        let _ = stream.set_nodelay(true);
        let conn = Connection {
            app: app.clone(),
            main: main.clone(),
            stop: stop.clone(),
            watcher: graceful.watcher(),
            builder: builder.clone(),
        };
        match (&fast, &loops) {
            (Some(ports), Some(loops)) => {
                // A socket belongs to the event loop it is registered with.
                let Ok(stream) = stream.into_std() else {
                    continue;
                };
                let ports = ports.clone();
                loops.next().spawn(async move {
                    if let Ok(stream) = TcpStream::from_std(stream) {
                        conn.fast(stream, &ports).await;
                    }
                });
            }
            _ => {
                tokio::spawn(conn.hyper(BytesMut::new(), stream));
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// The fast path's event loops: one single-threaded runtime per core,
/// each on a thread of its own for the life of the process, connections
/// dealt out in turn.
struct Loops {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

impl Loops {
    fn start() -> io::Result<Self> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            std::thread::Builder::new()
                .name(format!("sandhub-fast-{i}"))
                .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
        }
        Ok(Loops {
            handles,
            next: AtomicUsize::new(0),
        })
    }

    fn next(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &self.handles[i]
    }
}

/// What serving one accepted connection needs.
struct Connection {
    app: Router,
    /// The main runtime, where hyper's server and the app run.
    main: Handle,
    /// Tells the fast path to close between requests.
    stop: watch::Receiver<bool>,
    /// Keeps shutdown waiting for this connection, whoever serves it.
    watcher: Watcher,
    builder: auto::Builder<TokioExecutor>,
}

impl Connection {
    /// The fast path while it takes the requests; then back to the main
    /// runtime, for hyper.
    async fn fast(self, stream: TcpStream, ports: &fast::Ports) {
        let stop = self.stop.clone();
        let (prefix, stream) = match inbound::serve(stream, &fast::Conn(ports), stop).await {
            inbound::Outcome::Closed => return,
            inbound::Outcome::Fallback(io) => io.into_parts(),
        };
        let Ok(stream) = stream.into_std() else {
            return;
        };
        let main = self.main.clone();
        main.spawn(async move {
            if let Ok(stream) = TcpStream::from_std(stream) {
                self.hyper(prefix, stream).await;
            }
        });
    }

    /// hyper's server and the app, after `prefix` (bytes already read).
    async fn hyper(self, prefix: BytesMut, stream: TcpStream) {
        let io = Prefixed::new(prefix, stream);
        let service = TowerToHyperService::new(self.app);
        let conn = self.watcher.watch(
            self.builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned(),
        );
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}
