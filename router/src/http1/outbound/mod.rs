//! The router's outbound side: reaching sandboxes.
//!
//! The hot path for plain HTTP/1.1 to a Pod IP is `sandhub-http1`'s direct
//! exchange, over a connection from this worker thread's own pool
//! (`http1::pool`). Upgrades, gRPC and DNS-named upstreams use hyper's
//! pooled clients ([`clients`]).
//!
//! - [`dial`](mod@dial): dialing with retries and backoff (every outbound connection).
//! - [`clients`]: hyper's pooled HTTP/1.1 and h2c clients over that dialer.
//! - here: the direct exchange for a request hyper's server parsed.

pub mod clients;
pub mod dial;

use std::net::SocketAddr;

use bytes::{BufMut, BytesMut};
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::{io::AsyncWriteExt, net::TcpStream};

pub use clients::Upstreams;
pub use dial::{dial, DialError, DialFailure, DialPolicy, Dialer};
pub use sandhub_http1::outbound::{ExchangeError, Outgoing};

use super::pool::{self, ByAddr};
use crate::{
    body::{BodyTooLarge, RequestBody},
    http1::wire::{put_header, write_piece, LAST_CHUNK},
    metrics::Metrics,
};

/// The sandbox's answer on the direct path, its connection kept by Pod address.
pub type Answer = sandhub_http1::outbound::Answer<ByAddr>;
/// A response body read straight from a pooled sandbox connection.
pub type DirectBody = sandhub_http1::outbound::DirectBody<ByAddr>;

/// Whether a failed exchange was the client's body passing the limit.
pub fn body_too_large(e: &ExchangeError) -> bool {
    matches!(e, ExchangeError::Body(e) if e.is::<BodyTooLarge>())
}

/// Whether the request can take the direct path: HTTP/1.x framing only
/// (its body, if any, is re-framed below) and nothing hop-specific left.
pub fn eligible<B>(req: &Request<B>) -> bool {
    !req.headers().contains_key(header::UPGRADE) && req.method() != Method::CONNECT
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
    let (_, body) = answer.into_body(Some(&metrics.rx_bytes));
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Ok(resp)
}

/// Sends `req` over a pooled (or new) connection to `addr` and reads the
/// response head; the connection goes back to the pool when the body ends.
pub(crate) async fn send(
    addr: SocketAddr,
    req: &mut impl Outgoing,
    is_head: bool,
    policy: &DialPolicy,
    metrics: &Metrics,
) -> Result<Answer, ExchangeError> {
    let dial = || async {
        dial(&addr.ip().to_string(), addr.port(), policy, metrics)
            .await
            .map_err(|e| ExchangeError::Dial(Box::new(e)))
    };
    sandhub_http1::outbound::send(pool::take_idle(addr), dial, ByAddr(addr), req, is_head).await
}
