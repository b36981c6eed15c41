//! Connections to one sandboxd: a pooled HTTP/1.1 client for REST and one
//! HTTP/2 channel for gRPC, each over a Unix socket or TCP.

use std::{
    future::Future,
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::Uri;
use hyper_util::{
    client::legacy::connect::{Connected, Connection},
    rt::TokioIo,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpStream, UnixStream},
};
use tonic::{
    metadata::{Ascii, AsciiMetadataKey, MetadataValue},
    service::Interceptor,
    transport::{Channel, Endpoint},
};

use crate::{Error, Result};

/// A sandboxd that does not accept within this long is not coming back
/// soon; failing fast lets the caller report UNAVAILABLE.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Below sandboxd's 60 s `--http-idle-timeout`, so the client closes an
/// idle pooled connection before the server can, and a request never
/// lands on a connection the server is just closing.
pub(super) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects REST requests: to a fixed Unix socket whatever the URI says
/// (its authority only fills the Host header), or to the URI's host over TCP.
#[derive(Clone)]
pub(super) struct Connector {
    unix: Option<Arc<Path>>,
}

impl Connector {
    pub(super) fn unix(path: PathBuf) -> Self {
        Connector {
            unix: Some(path.into()),
        }
    }

    pub(super) fn tcp() -> Self {
        Connector { unix: None }
    }
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Stream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let unix = self.unix.clone();
        Box::pin(async move {
            let connect = async {
                match unix {
                    Some(path) => Ok(Stream::Unix(UnixStream::connect(&*path).await?)),
                    None => {
                        let host = uri
                            .host()
                            .ok_or_else(|| io::Error::other(format!("{uri} has no host")))?;
                        // `[::1]` in a URI, `::1` for the resolver.
                        let host = host.trim_start_matches('[').trim_end_matches(']');
                        let port = uri.port_u16().unwrap_or(80);
                        let stream = TcpStream::connect((host, port)).await?;
                        // Small request/response pairs: Nagle only adds latency.
                        stream.set_nodelay(true)?;
                        Ok(Stream::Tcp(stream))
                    }
                }
            };
            match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                Ok(stream) => stream.map(TokioIo::new),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {CONNECT_TIMEOUT:?}"),
                )),
            }
        })
    }
}

/// A connected REST stream of either kind.
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Tcp($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::Unix($s) => {
                let $s = Pin::new($s);
                $e
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        // Both kinds implement writev; hyper then sends head and body in one call.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

/// A gRPC channel to a Unix socket. Lazy: nothing connects until the first
/// call, so constructing a client never blocks or fails.
pub(super) fn unix_channel(path: PathBuf) -> Channel {
    let path: Arc<Path> = path.into();
    Endpoint::from_static("http://sandboxd")
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(&*path).await?)) }
        }))
}

/// A lazy gRPC channel over TCP, e.g. `http://10.0.0.7:9090`.
pub(super) fn tcp_channel(uri: String) -> Result<Channel> {
    let endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| Error::invalid(format!("gRPC address {uri}: {e}")))?;
    Ok(endpoint
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy())
}

/// The gRPC channel with a client span per call while traces are on: the
/// span is named by the call's path (`/process.v1.ProcessService/Execute`)
/// and its context goes out as `traceparent` metadata. Off, calls pass
/// straight through.
#[derive(Clone)]
pub(crate) struct Traced(pub(crate) Channel);

impl tower::Service<http::Request<tonic::body::Body>> for Traced {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let span = crate::propagate::call_span(request.uri().path());
        if span.is_none() {
            return Box::pin(self.0.call(request));
        }
        span.in_scope(|| crate::propagate::apply(request.headers_mut()));
        Box::pin(tracing::Instrument::instrument(self.0.call(request), span))
    }
}

/// Adds fixed metadata (the bearer token, a router's `x-sandbox-*`) to
/// every gRPC call.
#[derive(Clone, Default)]
pub(crate) struct Metadata(Arc<Vec<(AsciiMetadataKey, MetadataValue<Ascii>)>>);

impl Metadata {
    /// These plus `headers`, which replace same-named entries. Headers that
    /// are not valid ASCII metadata cannot be sent and are left out.
    pub(crate) fn extended(&self, headers: http::HeaderMap) -> Self {
        let mut entries: Vec<_> = self.0.iter().cloned().collect();
        for (name, value) in headers.iter() {
            let (Ok(key), Ok(mut value)) = (
                AsciiMetadataKey::from_bytes(name.as_str().as_bytes()),
                MetadataValue::<Ascii>::try_from(value.as_bytes()),
            ) else {
                continue;
            };
            value.set_sensitive(name == http::header::AUTHORIZATION);
            entries.retain(|(k, _)| *k != key);
            entries.push((key, value));
        }
        Metadata(Arc::new(entries))
    }
}

impl Interceptor for Metadata {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        for (key, value) in self.0.iter() {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        Ok(request)
    }
}
