//! Listeners and lifecycle: the proxy on HTTP (HTTP/1.1 + h2c) and optional
//! TLS, metrics and probes on their own ports, and a graceful drain on
//! SIGTERM/SIGINT.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use http::{Request, Response, StatusCode};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{
        conn::auto,
        graceful::{GracefulShutdown, Watcher},
    },
};
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::watch,
};

use crate::{
    authz::{scoped, Authorizer, TokenReviewer},
    cache::PodCache,
    config::{parse_bind, Args, AuthzMode},
    http1::{
        inbound,
        outbound::{DialPolicy, Dialer, Upstreams},
    },
    metrics::Metrics,
    proxy::{Conn, FastProxy, Proxy, Settings},
    response::{json_response, ProxyBody},
    tls::{self, TlsFiles, TlsState},
};

/// How long an idle HTTP/1.1 client connection may wait between requests.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(120);

async fn kube_client(args: &Args) -> anyhow::Result<kube::Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("loading kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster config and no kubeconfig")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// What every proxy worker shares.
struct Shared {
    settings: Settings,
    authz: Arc<Authorizer>,
    cache: Option<Arc<PodCache>>,
    metrics: Arc<Metrics>,
    dial: DialPolicy,
}

/// Everything bound and wired, not yet serving.
pub struct Router {
    shared: Shared,
    workers: usize,
    http: Vec<std::net::TcpListener>,
    https: Option<(Vec<std::net::TcpListener>, Arc<TlsState>)>,
    metrics_l: Option<TcpListener>,
    health_l: Option<TcpListener>,
    shutdown_timeout: Duration,
    /// Installed before binding, so a SIGTERM once listening drains.
    signals: sandhub_common::StopSignals,
}

async fn bind(flag: &str, value: &str) -> anyhow::Result<Option<TcpListener>> {
    match parse_bind(value).with_context(|| format!("--{flag}"))? {
        None => Ok(None),
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("--{flag}: binding {addr}"))?;
            tracing::info!(addr = %l.local_addr()?, "listening ({flag})");
            Ok(Some(l))
        }
    }
}

/// One listening socket per worker on the same address (SO_REUSEPORT): the
/// kernel spreads connections over the workers, none of them contend on accept.
async fn bind_workers(
    flag: &str,
    value: &str,
    n: usize,
) -> anyhow::Result<Vec<std::net::TcpListener>> {
    let Some(mut addr) = parse_bind(value).with_context(|| format!("--{flag}"))? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket
            .bind(addr)
            .with_context(|| format!("--{flag}: binding {addr}"))?;
        let l = socket.listen(4096)?;
        // Port 0: the first socket picks the port, the others join it.
        addr = l.local_addr()?;
        out.push(l.into_std()?);
    }
    tracing::info!(%addr, workers = n, "listening ({flag})");
    Ok(out)
}

impl Router {
    pub async fn build(args: &Args) -> anyhow::Result<Self> {
        let signals = sandhub_common::StopSignals::install().context("SIGTERM/SIGINT handler")?;
        if args.enable_tracing || args.enable_otel_metrics {
            tracing::warn!("--enable-tracing/--enable-otel-metrics: this build exports no OpenTelemetry data; flags ignored");
        }
        let metrics = Arc::new(Metrics::new());
        let needs_kube = args.cache_enabled || args.authz_mode == AuthzMode::Tokenreview;
        let kube = if needs_kube {
            Some(kube_client(args).await?)
        } else {
            None
        };
        let authz = match args.authz_mode {
            AuthzMode::AllowAll => Authorizer::AllowAll,
            AuthzMode::ScopedToken => {
                let path = args
                    .authz_scoped_token_secret_file
                    .as_ref()
                    .context("--authz-mode=scoped-token needs --authz-scoped-token-secret-file")?;
                Authorizer::Scoped(scoped::load(path)?)
            }
            AuthzMode::Tokenreview => Authorizer::TokenReview {
                reviewer: Box::new(TokenReviewer::new(
                    kube.clone().expect("built above"),
                    args.authz_tokenreview_audiences.clone(),
                    args.authz_tokenreview_ttl,
                    args.authz_tokenreview_cache_size,
                )),
                require_token: args.authz_tokenreview_require_token,
            },
        };
        let cache = match (&kube, args.cache_enabled) {
            (Some(client), true) => {
                let cache = Arc::new(PodCache::new(metrics.clone()));
                let ns = (!args.cache_namespace.is_empty()).then(|| args.cache_namespace.clone());
                tokio::spawn(cache.clone().run(client.clone(), ns));
                Some(cache)
            }
            _ => None,
        };
        let dial = DialPolicy {
            max_retries: args.upstream_max_retries,
            initial_delay: args.upstream_retry_initial_delay,
            max_delay: args.upstream_retry_max_delay,
            attempt_timeout: args.upstream_dial_timeout,
        };
        let workers = match args.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let https = match parse_bind(&args.https_bind_address).context("--https-bind-address")? {
            None => None,
            Some(_) => {
                let files = TlsFiles {
                    cert: args
                        .tls_cert_file
                        .clone()
                        .context("--https-bind-address needs --tls-cert-file")?,
                    key: args
                        .tls_key_file
                        .clone()
                        .context("--https-bind-address needs --tls-key-file")?,
                    client_ca: args.tls_client_ca_file.clone(),
                    mode: args.mtls_mode,
                };
                let state = tls::start(files, metrics.clone())?;
                Some((
                    bind_workers("https-bind-address", &args.https_bind_address, workers).await?,
                    state,
                ))
            }
        };
        Ok(Self {
            shared: Shared {
                settings: Settings::from_args(args),
                authz: Arc::new(authz),
                cache,
                metrics,
                dial,
            },
            workers,
            http: bind_workers("http-bind-address", &args.http_bind_address, workers).await?,
            https,
            metrics_l: bind("metrics-bind-address", &args.metrics_bind_address).await?,
            health_l: bind("health-probe-bind-address", &args.health_probe_bind_address).await?,
            shutdown_timeout: args.shutdown_timeout,
            signals,
        })
    }

    /// Serves until SIGTERM/SIGINT, then drains open connections for up to
    /// `--shutdown-timeout`.
    pub async fn run(mut self) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut threads = Vec::new();
        for i in 0..self.workers {
            let http = self.http.pop();
            let https = self
                .https
                .as_mut()
                .and_then(|(ls, state)| ls.pop().map(|l| (l, state.clone())));
            let s = &self.shared;
            let proxy = Arc::new(Proxy {
                settings: s.settings.clone(),
                upstreams: Upstreams::new(Dialer::new(s.dial.clone(), s.metrics.clone())),
                authz: s.authz.clone(),
                cache: s.cache.clone(),
                metrics: s.metrics.clone(),
            });
            let stop = stop_rx.clone();
            let drain = self.shutdown_timeout;
            let thread = std::thread::Builder::new()
                .name(format!("router-worker-{i}"))
                .spawn(move || worker(proxy, http, https, stop, drain))
                .context("starting a worker thread")?;
            threads.push(thread);
        }
        let mut tasks = Vec::new();
        if let Some(l) = self.metrics_l {
            let m = self.shared.metrics.clone();
            tasks.push(tokio::spawn(serve_small(l, stop_rx.clone(), move |req| {
                metrics_endpoint(&m, req)
            })));
        }
        if let Some(l) = self.health_l {
            let cache = self.shared.cache.clone();
            tasks.push(tokio::spawn(serve_small(l, stop_rx.clone(), move |req| {
                health_endpoint(cache.as_deref(), req)
            })));
        }
        self.signals.recv().await;
        tracing::info!("shutting down: no new connections; draining");
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await?;
        tracing::info!("sandhub-router stopped");
        Ok(())
    }
}

/// One proxy worker: its own single-threaded event loop, so a request, its
/// upstream connection's task and its body all live on one thread, with no
/// cross-thread wake-ups on the hot path.
fn worker(
    proxy: Arc<Proxy>,
    http: Option<std::net::TcpListener>,
    https: Option<(std::net::TcpListener, Arc<TlsState>)>,
    stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "worker runtime failed to start");
            return;
        }
    };
    runtime.block_on(async move {
        let mut tasks = Vec::new();
        for (l, tls) in http
            .map(|l| (l, None))
            .into_iter()
            .chain(https.map(|(l, s)| (l, Some(s))))
        {
            match TcpListener::from_std(l) {
                Ok(l) => tasks.push(tokio::spawn(serve_proxy(
                    l,
                    proxy.clone(),
                    tls,
                    stop.clone(),
                    drain,
                ))),
                Err(e) => tracing::error!(error = %e, "worker could not take its listener"),
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

fn conn_builder() -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .max_concurrent_streams(1024);
    b
}

async fn accept(l: &TcpListener) -> Option<(tokio::net::TcpStream, SocketAddr)> {
    match l.accept().await {
        Ok((s, addr)) => {
            let _ = s.set_nodelay(true);
            Some((s, addr))
        }
        Err(e) => {
            // EMFILE and friends: back off rather than spin.
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

async fn serve_proxy(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    tls: Option<Arc<TlsState>>,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let builder = conn_builder();
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, remote) = tokio::select! {
            _ = stop.changed() => break,
            accepted = accept(&listener) => match accepted { Some(a) => a, None => continue },
        };
        let conn = Conn::new(remote, tls.is_some());
        let client = Handoff {
            conn,
            proxy: proxy.clone(),
            stop: stop.clone(),
            watcher: graceful.watcher(),
            builder: builder.clone(),
        };
        match &tls {
            None => {
                let fast = proxy.settings.fast_path;
                tokio::spawn(client.serve(stream, fast));
            }
            Some(tls) => {
                // The handshake runs in its own task so a slow client cannot
                // hold up the accept loop.
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(
                        Duration::from_secs(10),
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    // HTTP/2 negotiated by ALPN is hyper's from the first byte.
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    let fast = client.proxy.settings.fast_path && !h2;
                    client.serve(stream, fast).await;
                });
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("--shutdown-timeout passed with connections still open; closing them");
    }
}

/// What serving one accepted client connection needs.
struct Handoff {
    conn: Conn,
    proxy: Arc<Proxy>,
    stop: watch::Receiver<bool>,
    /// Keeps shutdown waiting for this connection, whoever serves it.
    watcher: Watcher,
    builder: auto::Builder<TokioExecutor>,
}

impl Handoff {
    /// Serves the connection on the fast path while it can (`fast`), then
    /// with hyper (HTTP/1.1 with upgrades, h2c or h2) until it closes.
    async fn serve<S>(self, io: S, fast: bool)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Self {
            conn,
            proxy,
            stop,
            watcher,
            builder,
        } = self;
        let io = if fast {
            let handler = FastProxy {
                proxy: &proxy,
                conn: &conn,
            };
            match inbound::serve(io, &handler, stop).await {
                inbound::Outcome::Closed => return,
                inbound::Outcome::Fallback(io) => io,
            }
        } else {
            inbound::Prefixed::new(Default::default(), io)
        };
        let service = service_fn(move |req: Request<Incoming>| {
            let p = proxy.clone();
            let conn = conn.clone();
            async move { Ok::<_, Infallible>(p.handle(req, &conn).await) }
        });
        let c = watcher.watch(
            builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned(),
        );
        if let Err(e) = c.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}

type Small = Response<ProxyBody>;

async fn serve_small<F>(listener: TcpListener, mut stop: watch::Receiver<bool>, handler: F)
where
    F: Fn(&Request<Incoming>) -> Small + Clone + Send + Sync + 'static,
{
    let builder = conn_builder();
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.changed() => break,
            accepted = accept(&listener) => match accepted { Some(a) => a, None => continue },
        };
        let h = handler.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let resp = h(&req);
            async move { Ok::<_, Infallible>(resp) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

fn metrics_endpoint(m: &Metrics, req: &Request<Incoming>) -> Small {
    if req.uri().path() != "/metrics" {
        return json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"detail": "Not found."}),
        );
    }
    let mut resp = Response::new(ProxyBody::full(m.encode().into()));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    resp
}

fn health_endpoint(cache: Option<&PodCache>, req: &Request<Incoming>) -> Small {
    match req.uri().path() {
        "/healthz" => json_response(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        // Ready once the Pod cache (if any) has its first full list.
        "/readyz" if cache.is_none_or(PodCache::is_synced) => {
            json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
        }
        "/readyz" => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"detail": "Pod cache not synced yet."}),
        ),
        _ => json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"detail": "Not found."}),
        ),
    }
}
