//! Listeners and lifecycle: binds every port (or Unix socket), serves until
//! SIGTERM, then drains: health turns 503, running work gets
//! `--shutdown-timeout` to finish, the remaining process groups are killed.

use std::{future::Future, net::SocketAddr, path::Path, sync::Arc, time::Duration};

use anyhow::Context;
use axum::Router;
use bytes::BytesMut;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use sandhub_http1::inbound::Prefixed;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::{config::Config, fast_get, legacy, rest, Daemon};

/// How long open connections get to finish after the listeners close.
const CONNECTION_GRACE: Duration = Duration::from_secs(2);

/// HTTP/2 streams of one connection beyond every long-lived call the daemon
/// bounds itself: calls that answer at once (signals, resizes, reflection,
/// refusals) and a client's own unread, already-finished streams.
const SPARE_STREAMS: usize = 256;

/// The per-connection HTTP/2 stream limit. A client over it is not refused
/// but made to wait, silently, for a free stream; so it must sit above
/// everything that can hold a stream for long (running processes, watches,
/// blocked stdin writes). Then each of those limits answers
/// RESOURCE_EXHAUSTED before the connection can run out of streams.
pub fn max_concurrent_streams(config: &Config) -> u32 {
    let long_lived = config
        .max_processes
        .saturating_add(config.max_watches)
        .saturating_add(crate::process::MAX_STDIN_WRITERS)
        .saturating_add(SPARE_STREAMS);
    // 1024 was the fixed limit before it was derived: never go below it.
    u32::try_from(long_lived.max(1024)).unwrap_or(u32::MAX)
}

/// Runs sandboxd until SIGTERM or SIGINT, then shuts down cleanly.
pub async fn run(daemon: Arc<Daemon>) -> anyhow::Result<()> {
    run_with(daemon, Router::new()).await
}

/// [`run`] with extra REST routes.
pub async fn run_with(daemon: Arc<Daemon>, extra: Router<Arc<Daemon>>) -> anyhow::Result<()> {
    // Before binding: a SIGTERM once we listen must drain, not kill.
    let signals = crate::stop::Stop::install()?;
    crate::process::reap_as_init().context("reaping orphans as PID 1")?;
    let stop = CancellationToken::new();
    let servers = serve(daemon.clone(), stop.clone(), extra).await?;
    serve_until_signal(daemon, signals, stop, servers).await
}

/// REST and gRPC listeners bound by someone else and handed over, e.g. by
/// the hub's local backend, which binds them on the host where the
/// sandbox's workload can neither see nor replace them.
#[derive(Debug)]
pub struct UnixListeners {
    pub rest: std::os::unix::net::UnixListener,
    pub grpc: std::os::unix::net::UnixListener,
}

/// [`run_with`] on listeners bound elsewhere, with the gRPC services that
/// need no daemon built ahead ([`rest::grpc_base`]); `ready` runs once
/// the listeners are being served.
pub async fn run_on(
    daemon: Arc<Daemon>,
    extra: Router<Arc<Daemon>>,
    listeners: UnixListeners,
    grpc_base: rest::GrpcBase,
    ready: impl FnOnce(),
) -> anyhow::Result<()> {
    let signals = crate::stop::Stop::install()?;
    crate::process::reap_as_init().context("reaping orphans as PID 1")?;
    let stop = CancellationToken::new();
    let idle = daemon.config.http_idle_timeout;
    let streams = max_concurrent_streams(&daemon.config);
    let tokio_listener = |l: std::os::unix::net::UnixListener| -> anyhow::Result<UnixListener> {
        l.set_nonblocking(true)?;
        Ok(UnixListener::from_std(l)?)
    };
    let servers = vec![
        spawn_unix(
            tokio_listener(listeners.rest).context("REST listener")?,
            rest::router_with(daemon.clone(), extra),
            Serving::rest(&daemon, idle, streams, stop.clone()),
        ),
        spawn_unix(
            tokio_listener(listeners.grpc).context("gRPC listener")?,
            rest::grpc_router_on(grpc_base, daemon.clone()),
            Serving::other(idle, streams, stop.clone()),
        ),
    ];
    ready();
    serve_until_signal(daemon, signals, stop, servers).await
}

async fn serve_until_signal(
    daemon: Arc<Daemon>,
    signals: crate::stop::Stop,
    stop: CancellationToken,
    servers: Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<()> {
    let signal = signals.recv().await;
    tracing::info!("{signal} received");
    drain(&daemon).await;
    stop.cancel();
    for server in servers {
        let _ = server.await;
    }
    tracing::info!("sandboxd stopped");
    Ok(())
}

/// Binds every listener and starts serving; returns the serving tasks.
/// Binding happens before this returns, so a caller may connect at once.
pub async fn serve(
    daemon: Arc<Daemon>,
    stop: CancellationToken,
    extra: Router<Arc<Daemon>>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let config = &daemon.config;
    let rest_app = rest::router_with(daemon.clone(), extra);
    let grpc_app = rest::grpc_router(daemon.clone());
    let idle = config.http_idle_timeout;
    let streams = max_concurrent_streams(config);
    let mut tasks = Vec::new();
    match &config.unix_socket {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating socket dir {}", dir.display()))?;
            let rest_l = bind_unix(&dir.join(sandhub_api::sandboxd::REST_SOCKET))?;
            let grpc_l = bind_unix(&dir.join(sandhub_api::sandboxd::GRPC_SOCKET))?;
            tracing::info!(dir = %dir.display(), "serving REST and gRPC on unix sockets");
            let rest = Serving::rest(&daemon, idle, streams, stop.clone());
            tasks.push(spawn_unix(rest_l, rest_app, rest));
            let grpc = Serving::other(idle, streams, stop.clone());
            tasks.push(spawn_unix(grpc_l, grpc_app, grpc));
        }
        None => {
            let rest_l = bind_tcp(&config.listen_host, config.rest_port).await?;
            let grpc_l = bind_tcp(&config.listen_host, config.grpc_port).await?;
            tracing::info!(addr = %rest_l.local_addr()?, "serving REST");
            tracing::info!(addr = %grpc_l.local_addr()?, "serving gRPC");
            let rest = Serving::rest(&daemon, idle, streams, stop.clone());
            tasks.push(spawn_tcp(rest_l, rest_app, rest));
            let grpc = Serving::other(idle, streams, stop.clone());
            tasks.push(spawn_tcp(grpc_l, grpc_app, grpc));
        }
    }
    if config.legacy_port != 0 {
        let legacy_l = bind_tcp(&config.listen_host, config.legacy_port).await?;
        tracing::info!(addr = %legacy_l.local_addr()?, "serving legacy runtime API");
        tasks.push(spawn_tcp(
            legacy_l,
            legacy::router(daemon.clone()),
            Serving::other(idle, streams, stop.clone()),
        ));
    }
    Ok(tasks)
}

/// Health answers 503 from here on; running processes get the shutdown
/// timeout to finish before their process groups are killed.
pub async fn drain(daemon: &Daemon) {
    daemon.start_draining();
    let timeout = daemon.config.shutdown_timeout;
    tracing::info!(
        running = daemon.processes.active(),
        ?timeout,
        "draining before shutdown"
    );
    // Kernels idle forever: they never count as work to wait for.
    daemon.code.clear().await;
    if !daemon.processes.wait_idle(timeout).await {
        tracing::warn!(
            running = daemon.processes.active(),
            "shutdown timeout reached; killing remaining process groups"
        );
        daemon.processes.kill_all();
    }
}

async fn bind_tcp(host: &str, port: u16) -> anyhow::Result<TcpListener> {
    let addr: SocketAddr = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host, port))
            .await?
            .next()
            .with_context(|| format!("{host} resolves to no address"))?,
    };
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
}

fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    // A socket left by a previous run would make bind fail with EADDRINUSE.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale {}", path.display())),
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// How a listener's connections are served.
struct Serving {
    /// The fast download path's daemon, on the REST listeners while it is on.
    fast: Option<Arc<Daemon>>,
    idle: Duration,
    streams: u32,
    stop: CancellationToken,
}

impl Serving {
    fn rest(daemon: &Arc<Daemon>, idle: Duration, streams: u32, stop: CancellationToken) -> Self {
        Serving {
            fast: fast_get::enabled().then(|| daemon.clone()),
            ..Serving::other(idle, streams, stop)
        }
    }

    fn other(idle: Duration, streams: u32, stop: CancellationToken) -> Self {
        Serving {
            fast: None,
            idle,
            streams,
            stop,
        }
    }
}

fn spawn_tcp(listener: TcpListener, app: Router, serving: Serving) -> tokio::task::JoinHandle<()> {
    let listener = Arc::new(listener);
    tokio::spawn(accept_loop(
        move || {
            let l = listener.clone();
            async move {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok(s)
            }
        },
        app,
        serving,
    ))
}

fn spawn_unix(
    listener: UnixListener,
    app: Router,
    serving: Serving,
) -> tokio::task::JoinHandle<()> {
    let listener = Arc::new(listener);
    tokio::spawn(accept_loop(
        move || {
            let l = listener.clone();
            async move { Ok(l.accept().await?.0) }
        },
        app,
        serving,
    ))
}

/// Serves HTTP/1.1 and h2c (gRPC) on every accepted connection until `stop`,
/// then gives open connections a short grace period. With the fast download
/// path on, a connection starts there and moves to hyper, with the bytes
/// already read, at its first request the fast path does not take.
async fn accept_loop<A, F, IO>(mut accept: A, app: Router, serving: Serving)
where
    A: FnMut() -> F,
    F: Future<Output = std::io::Result<IO>>,
    IO: fast_get::Socket,
{
    let Serving {
        fast,
        idle,
        streams,
        stop,
    } = serving;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // Also bounds how long a kept-alive connection may sit idle.
        .header_read_timeout(idle);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .max_concurrent_streams(streams);
    let graceful = GracefulShutdown::new();
    loop {
        let io = tokio::select! {
            _ = stop.cancelled() => break,
            res = accept() => match res {
                Ok(io) => io,
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let service = TowerToHyperService::new(app.clone());
        let (builder, watcher, fast, stop) = (
            builder.clone(),
            graceful.watcher(),
            fast.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let io = match fast {
                Some(daemon) => match fast_get::serve(io, &daemon, &stop).await {
                    fast_get::Outcome::Closed => return,
                    fast_get::Outcome::Fallback(io) => io,
                },
                None => Prefixed::new(BytesMut::new(), io),
            };
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    let _ = tokio::time::timeout(CONNECTION_GRACE, graceful.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn config(flags: &[&str]) -> Config {
        Config::parse_from(std::iter::once("sandboxd").chain(flags.iter().copied()))
    }

    #[test]
    fn the_stream_limit_stays_above_everything_that_holds_a_stream() {
        for flags in [
            &[][..],
            &["--max-processes", "1"],
            &["--max-processes", "1100"],
            &["--max-processes", "5000", "--max-watches", "900"],
        ] {
            let c = config(flags);
            let streams = max_concurrent_streams(&c) as usize;
            assert!(
                streams > c.max_processes + c.max_watches + crate::process::MAX_STDIN_WRITERS,
                "{flags:?}: {streams}"
            );
            assert!(streams >= 1024, "{flags:?}: {streams}");
        }
    }

    #[test]
    fn absurd_limits_saturate_instead_of_overflowing() {
        let c = config(&["--max-watches", &usize::MAX.to_string()]);
        assert_eq!(max_concurrent_streams(&c), u32::MAX);
    }

    #[test]
    fn max_processes_must_be_positive_and_bounded() {
        for bad in ["0", "-1", "lots", "2000000"] {
            assert!(
                Config::try_parse_from(["sandboxd", "--max-processes", bad]).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            config(&[]).max_processes,
            crate::config::DEFAULT_MAX_PROCESSES
        );
    }
}
