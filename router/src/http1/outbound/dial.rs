//! Connections to sandboxes: a dialer that retries failed dials with
//! exponential backoff (and only dials: once a request may have reached the
//! sandbox, nothing is retried). The direct path calls [`dial`]; hyper's
//! pooled clients ([`super::clients`]) call it as their connector.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::metrics::Metrics;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialFailure {
    /// The host answered: nothing listens there (yet).
    Refused,
    /// No route, or no answer in time: the address is probably stale.
    Unreachable,
    /// The name did not resolve.
    Dns,
    Other,
}

#[derive(Debug, thiserror::Error)]
#[error("dial {target} failed after {attempts} attempt(s): {source}")]
pub struct DialError {
    pub target: String,
    pub attempts: u32,
    pub failure: DialFailure,
    #[source]
    pub source: io::Error,
}

impl DialError {
    /// Finds a dial failure anywhere in an error's source chain.
    pub fn find<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a DialError> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cur {
            if let Some(d) = e.downcast_ref::<DialError>() {
                return Some(d);
            }
            cur = e.source();
        }
        None
    }
}

#[derive(Debug, Clone)]
pub struct DialPolicy {
    pub max_retries: u32,
    pub initial_delay: Duration,
    pub max_delay: Duration,
    pub attempt_timeout: Duration,
}

/// The connector behind both clients (hyper calls it only for new connections).
#[derive(Clone)]
pub struct Dialer {
    pub(super) policy: Arc<DialPolicy>,
    metrics: Arc<Metrics>,
}

impl Dialer {
    pub fn new(policy: DialPolicy, metrics: Arc<Metrics>) -> Self {
        Self {
            policy: Arc::new(policy),
            metrics,
        }
    }
}

fn classify(e: &io::Error) -> DialFailure {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => DialFailure::Refused,
        io::ErrorKind::TimedOut
        | io::ErrorKind::HostUnreachable
        | io::ErrorKind::NetworkUnreachable
        | io::ErrorKind::AddrNotAvailable => DialFailure::Unreachable,
        _ => match e.raw_os_error() {
            Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) | Some(libc::EHOSTDOWN) => {
                DialFailure::Unreachable
            }
            _ => DialFailure::Other,
        },
    }
}

async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, io::Error> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    Ok(tokio::net::lookup_host((host, port)).await?.collect())
}

async fn dial_once(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<TcpStream, (DialFailure, io::Error)> {
    let addrs = resolve(host, port)
        .await
        .map_err(|e| (DialFailure::Dns, e))?;
    let mut last = (
        DialFailure::Dns,
        io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address")),
    );
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = (classify(&e), e),
            Err(_) => {
                last = (
                    DialFailure::Unreachable,
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connect to {addr} timed out"),
                    ),
                )
            }
        }
    }
    Err(last)
}

impl tower::Service<Uri> for Dialer {
    type Response = TokioIo<TcpStream>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let policy = self.policy.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().to_owned();
            let port = uri.port_u16().unwrap_or(80);
            dial(&host, port, &policy, &metrics).await.map(TokioIo::new)
        })
    }
}

/// Dials with retries and exponential backoff; TCP_NODELAY on success.
pub async fn dial(
    host: &str,
    port: u16,
    policy: &DialPolicy,
    metrics: &Metrics,
) -> Result<TcpStream, DialError> {
    let mut delay = policy.initial_delay;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match dial_once(host, port, policy.attempt_timeout).await {
            Ok(stream) => {
                // Small requests and responses must not wait on Nagle.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err((failure, source)) if attempt > policy.max_retries => {
                return Err(DialError {
                    target: format!("{host}:{port}"),
                    attempts: attempt,
                    failure,
                    source,
                });
            }
            Err((failure, source)) => {
                tracing::debug!(%host, port, attempt, ?failure, error = %source, "dial failed; retrying");
                metrics.upstream_retries.inc();
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(policy.max_delay);
            }
        }
    }
}
