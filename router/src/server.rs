//! Listeners and lifecycle: the proxy on HTTP (HTTP/1.1 + h2c) and optional
//! TLS, metrics and probes on their own ports, and a graceful drain on
//! SIGTERM/SIGINT.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use http::{Request, Response, StatusCode};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::{net::TcpListener, sync::watch};

use crate::{
    authz::{Authorizer, ScopedTokens, TokenReviewer},
    body::ProxyBody,
    cache::PodCache,
    config::{parse_bind, Args, AuthzMode},
    error::json_response,
    metrics::Metrics,
    proxy::{Conn, Proxy, Settings},
    tls::{self, TlsFiles, TlsState},
    upstream::{DialPolicy, Dialer, Upstreams},
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

/// Everything bound and wired, not yet serving.
pub struct Router {
    proxy: Arc<Proxy>,
    cache: Option<Arc<PodCache>>,
    metrics: Arc<Metrics>,
    http: Option<TcpListener>,
    https: Option<(TcpListener, Arc<TlsState>)>,
    metrics_l: Option<TcpListener>,
    health_l: Option<TcpListener>,
    shutdown_timeout: Duration,
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

impl Router {
    pub async fn build(args: &Args) -> anyhow::Result<Self> {
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
                Authorizer::Scoped(ScopedTokens::from_file(path)?)
            }
            AuthzMode::Tokenreview => Authorizer::TokenReview {
                reviewer: TokenReviewer::new(
                    kube.clone().expect("built above"),
                    args.authz_tokenreview_audiences.clone(),
                    args.authz_tokenreview_ttl,
                    args.authz_tokenreview_cache_size,
                ),
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
        let dialer = Dialer::new(
            DialPolicy {
                max_retries: args.upstream_max_retries,
                initial_delay: args.upstream_retry_initial_delay,
                max_delay: args.upstream_retry_max_delay,
                attempt_timeout: args.upstream_dial_timeout,
            },
            metrics.clone(),
        );
        let proxy = Arc::new(Proxy {
            settings: Settings::from_args(args),
            upstreams: Upstreams::new(dialer),
            authz,
            cache: cache.clone(),
            metrics: metrics.clone(),
        });
        let https = match bind("https-bind-address", &args.https_bind_address).await? {
            None => None,
            Some(l) => {
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
                Some((l, tls::start(files, metrics.clone())?))
            }
        };
        Ok(Self {
            proxy,
            cache,
            metrics,
            http: bind("http-bind-address", &args.http_bind_address).await?,
            https,
            metrics_l: bind("metrics-bind-address", &args.metrics_bind_address).await?,
            health_l: bind("health-probe-bind-address", &args.health_probe_bind_address).await?,
            shutdown_timeout: args.shutdown_timeout,
        })
    }

    /// Serves until SIGTERM/SIGINT, then drains open connections for up to
    /// `--shutdown-timeout`.
    pub async fn run(self) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        if let Some(l) = self.http {
            tasks.push(tokio::spawn(serve_proxy(
                l,
                self.proxy.clone(),
                None,
                stop_rx.clone(),
                self.shutdown_timeout,
            )));
        }
        if let Some((l, tls)) = self.https {
            tasks.push(tokio::spawn(serve_proxy(
                l,
                self.proxy.clone(),
                Some(tls),
                stop_rx.clone(),
                self.shutdown_timeout,
            )));
        }
        if let Some(l) = self.metrics_l {
            let m = self.metrics.clone();
            tasks.push(tokio::spawn(serve_small(l, stop_rx.clone(), move |req| {
                metrics_endpoint(&m, req)
            })));
        }
        if let Some(l) = self.health_l {
            let cache = self.cache.clone();
            tasks.push(tokio::spawn(serve_small(l, stop_rx.clone(), move |req| {
                health_endpoint(cache.as_deref(), req)
            })));
        }
        wait_for_signal().await?;
        tracing::info!("shutting down: no new connections; draining");
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = t.await;
        }
        tracing::info!("sandhub-router stopped");
        Ok(())
    }
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    Ok(())
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
        let conn = Conn {
            remote,
            tls: tls.is_some(),
        };
        let p = proxy.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let p = p.clone();
            async move { Ok::<_, Infallible>(p.handle(req, conn).await) }
        });
        match &tls {
            None => {
                let c = graceful.watch(
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .into_owned(),
                );
                tokio::spawn(async move {
                    if let Err(e) = c.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            Some(tls) => {
                // The handshake runs in its own task so a slow client cannot
                // hold up the accept loop.
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                let builder = builder.clone();
                let watcher = graceful.watcher();
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
                    let c = watcher.watch(
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .into_owned(),
                    );
                    if let Err(e) = c.await {
                        tracing::debug!(error = %e, "TLS connection ended with an error");
                    }
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
