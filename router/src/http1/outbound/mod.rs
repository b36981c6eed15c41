//! The router's outbound side: reaching sandboxes.
//!
//! The hot path for plain HTTP/1.1 to a Pod IP: the request is written and
//! the response read by the task serving the client, over a connection from
//! this worker thread's own pool (`http1::pool`). No connection task, no
//! channels between tasks, no locks: a request costs about what it costs
//! nginx (two reads, two writes). Upgrades, gRPC and DNS-named upstreams use
//! hyper's pooled clients ([`clients`]).
//!
//! - [`dial`](mod@dial): dialing with retries and backoff (every outbound connection).
//! - [`clients`]: hyper's pooled HTTP/1.1 and h2c clients over that dialer.
//! - `head`: reading the sandbox's response head.
//! - [`body`]: the response body read straight off the connection.

pub mod body;
pub mod clients;
pub mod dial;
mod head;

use std::{io, net::SocketAddr};

use bytes::{BufMut, BytesMut};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Body;
use prometheus_client::metrics::counter::Counter;
use tokio::{io::AsyncWriteExt, net::TcpStream};

pub use body::DirectBody;
pub use clients::Upstreams;
pub use dial::{dial, DialError, DialFailure, DialPolicy, Dialer};
pub(crate) use head::ResponseHead;

use crate::{
    body::{BodyTooLarge, BoxError, RequestBody},
    http1::{
        pool,
        wire::{put_header, write_piece, LAST_CHUNK, READ_CHUNK},
    },
    metrics::Metrics,
};
use head::read_head;

/// Largest response head (and chunk-size or trailer line) read from a sandbox.
const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error(transparent)]
    Dial(#[from] DialError),
    #[error("request body: {0}")]
    Body(BoxError),
    #[error("sandbox connection: {0}")]
    Io(#[from] io::Error),
    #[error("bad response from the sandbox: {0}")]
    Protocol(&'static str),
}

impl ExchangeError {
    pub fn body_too_large(&self) -> bool {
        matches!(self, Self::Body(e) if e.is::<BodyTooLarge>())
    }
}

/// Whether the request can take the direct path: HTTP/1.x framing only
/// (its body, if any, is re-framed below) and nothing hop-specific left.
pub fn eligible<B>(req: &Request<B>) -> bool {
    !req.headers().contains_key(header::UPGRADE) && req.method() != Method::CONNECT
}

/// A request on its way to the sandbox: its head (written into the pooled
/// connection's buffer, so one write carries it) and then its body.
pub(crate) trait Outgoing {
    /// Whether no body follows the head.
    fn bodyless(&self) -> bool;
    /// Writes the head (and any body bytes that travel with it) into `buf`.
    /// Called again, unchanged, if a stale pooled connection is replaced.
    fn head(&self, buf: &mut BytesMut);
    /// Sends the rest of the body after the head.
    async fn send_body(&mut self, s: &mut TcpStream) -> Result<(), ExchangeError>;
}

/// A hyper request (the fallback path) as an [`Outgoing`].
struct HyperRequest<'a> {
    parts: &'a http::request::Parts,
    body: RequestBody,
    chunked: bool,
}

impl Outgoing for HyperRequest<'_> {
    fn bodyless(&self) -> bool {
        self.body.is_end_stream()
    }

    fn head(&self, buf: &mut BytesMut) {
        let req = self.parts;
        let host = req.uri.authority().map_or("", |a| a.as_str());
        buf.put_slice(req.method.as_str().as_bytes());
        buf.put_u8(b' ');
        buf.put_slice(
            req.uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .as_bytes(),
        );
        buf.put_slice(b" HTTP/1.1\r\nhost: ");
        buf.put_slice(host.as_bytes());
        buf.put_slice(b"\r\n");
        for (name, value) in &req.headers {
            put_header(buf, name.as_str().as_bytes(), value.as_bytes());
        }
        if self.chunked {
            buf.put_slice(b"transfer-encoding: chunked\r\n");
        }
        buf.put_slice(b"\r\n");
    }

    async fn send_body(&mut self, s: &mut TcpStream) -> Result<(), ExchangeError> {
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(ExchangeError::Body)?;
            if let Ok(data) = frame.into_data() {
                if !data.is_empty() {
                    write_piece(s, &data, self.chunked).await?;
                }
            }
        }
        if self.chunked {
            s.write_all(LAST_CHUNK).await?;
        }
        Ok(())
    }
}

/// The sandbox's answer: its parsed head, and the connection its body
/// will be read from.
pub(crate) struct Answer {
    pub head: ResponseHead,
    stream: TcpStream,
    buf: BytesMut,
    addr: SocketAddr,
}

impl Answer {
    /// The body, read from the connection as it is polled.
    pub fn into_body(self, rx: &Counter) -> (ResponseHead, DirectBody) {
        let body = DirectBody::new(self.stream, self.addr, self.buf, self.head.state, rx);
        (self.head, body)
    }
}

/// Sends the request through the hyper fallback's direct path and reads the
/// response head; the body streams from the connection as the client reads.
/// `parts.headers` must already be rewritten for the sandbox.
pub async fn exchange(
    addr: SocketAddr,
    parts: &http::request::Parts,
    body: RequestBody,
    policy: &DialPolicy,
    metrics: &Metrics,
) -> Result<Response<DirectBody>, ExchangeError> {
    let chunked = !body.is_end_stream() && !parts.headers.contains_key(header::CONTENT_LENGTH);
    let mut req = HyperRequest {
        parts,
        body,
        chunked,
    };
    let answer = send(
        addr,
        &mut req,
        parts.method == Method::HEAD,
        policy,
        metrics,
    )
    .await?;
    let headers = answer.head.header_map()?;
    let status = StatusCode::from_u16(answer.head.status)
        .map_err(|_| ExchangeError::Protocol("status code"))?;
    let (_, body) = answer.into_body(&metrics.rx_bytes);
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// Sends `req` over a pooled (or new) connection and reads the response head.
pub(crate) async fn send(
    addr: SocketAddr,
    req: &mut impl Outgoing,
    is_head: bool,
    policy: &DialPolicy,
    metrics: &Metrics,
) -> Result<Answer, ExchangeError> {
    let bodyless = req.bodyless();
    // A pooled connection the sandbox closed while idle fails on first use;
    // then one fresh dial is tried, as long as no body byte was consumed.
    let mut idle = pool::take_idle(addr);
    loop {
        let reused = idle.is_some();
        let (mut s, mut buf) = match idle.take() {
            Some(i) => (i.stream, i.buf),
            None => (
                dial(&addr.ip().to_string(), addr.port(), policy, metrics).await?,
                BytesMut::with_capacity(READ_CHUNK),
            ),
        };
        // The connection's own buffer carries the request head out, then the response in.
        buf.clear();
        req.head(&mut buf);
        if let Err(e) = s.write_all(&buf).await {
            if reused {
                continue;
            }
            return Err(e.into());
        }
        if !bodyless {
            req.send_body(&mut s).await?;
        }
        buf.clear();
        match read_head(&mut s, &mut buf, is_head).await {
            Ok(head) => {
                return Ok(Answer {
                    head,
                    stream: s,
                    buf,
                    addr,
                })
            }
            Err(ExchangeError::Io(e)) if reused && bodyless && buf.is_empty() => {
                tracing::debug!(error = %e, "pooled connection was closed; redialing");
                continue;
            }
            Err(e) => return Err(e),
        }
    }
}
