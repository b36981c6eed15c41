//! The hub's listener. Each accepted connection is served by the port
//! route's fast path first (`fast`, when on), and by hyper's server with
//! the axum app from the first request the fast path does not take, with
//! the bytes already read. Shutdown: no new connections, the fast path
//! closes its connections between requests, hyper's finish their requests
//! in flight; this returns when every connection has closed.

use std::{future::Future, sync::Arc, time::Duration};

use axum::Router;
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
) {
    // hyper's defaults for HTTP/1.1 and HTTP/2 (h2c), as `axum::serve` has them.
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let (stop_tx, stop) = watch::channel(false);
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
            fast: fast.clone(),
            stop: stop.clone(),
            watcher: graceful.watcher(),
            builder: builder.clone(),
        };
        tokio::spawn(conn.serve(stream));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    graceful.shutdown().await;
}

/// What serving one accepted connection needs.
struct Connection {
    app: Router,
    fast: Option<Arc<fast::Ports>>,
    /// Tells the fast path to close between requests.
    stop: watch::Receiver<bool>,
    /// Keeps shutdown waiting for this connection, whoever serves it.
    watcher: Watcher,
    builder: auto::Builder<TokioExecutor>,
}

impl Connection {
    async fn serve(self, stream: TcpStream) {
        let Self {
            app,
            fast,
            stop,
            watcher,
            builder,
        } = self;
        let io = match &fast {
            Some(ports) => match inbound::serve(stream, &fast::Conn(ports), stop).await {
                inbound::Outcome::Closed => return,
                inbound::Outcome::Fallback(io) => io,
            },
            None => Prefixed::new(Default::default(), stream),
        };
        let service = TowerToHyperService::new(app);
        let conn = watcher.watch(
            builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned(),
        );
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}
