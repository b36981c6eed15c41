//! The direct exchange with an upstream: the request written and the
//! response read by the task serving the client, over a connection its
//! caller keeps idle between requests. No connection task, no channels
//! between tasks, no locks: a request costs about what it costs nginx
//! (two reads, two writes).
//!
//! - `head`: reading the upstream's response head.
//! - [`body`]: the response body read straight off the connection.

pub mod body;
mod head;

use std::{future::Future, io, time::Duration};

use bytes::BytesMut;
use prometheus_client::metrics::counter::Counter;
use tokio::{io::AsyncWriteExt, net::TcpStream};

pub use body::DirectBody;
pub use head::ResponseHead;

use crate::{pool::Idle, wire::READ_CHUNK};
use head::read_head;

/// Largest response head (and chunk-size or trailer line) read from upstream.
const MAX_HEAD: usize = 64 * 1024;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// No connection: the caller's dial failed (its own error inside).
    #[error("{0}")]
    Dial(#[source] BoxError),
    #[error("request body: {0}")]
    Body(BoxError),
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    #[error("bad response from upstream: {0}")]
    Protocol(&'static str),
}

/// Where an answer's connection goes once its body has ended cleanly
/// (the caller's pool), and whatever must live exactly as long as the
/// body, such as a slot under a cap on requests in flight: it is dropped
/// when the body ends, whichever way.
pub trait Keep: Send + Unpin + 'static {
    fn keep(self, idle: Idle);
}

/// A request on its way upstream: its head (written into the connection's
/// buffer, so one write carries it) and then its body.
// Callers use it with concrete types, whose futures' `Send` is then known.
#[allow(async_fn_in_trait)]
pub trait Outgoing {
    /// Whether no body follows the head.
    fn bodyless(&self) -> bool;
    /// Writes the head (and any body bytes that travel with it) into `buf`.
    /// Called again, unchanged, if a stale kept connection is replaced.
    fn head(&self, buf: &mut BytesMut);
    /// Sends the rest of the body after the head.
    async fn send_body(&mut self, s: &mut TcpStream) -> Result<(), ExchangeError>;
}

/// The upstream's answer: its parsed head, and the connection its body
/// will be read from.
pub struct Answer<K> {
    pub head: ResponseHead,
    stream: TcpStream,
    buf: BytesMut,
    keep: K,
    /// The longest wait for the next piece of the body before the relay
    /// gives up on it (`None`: no bound).
    pub idle_timeout: Option<Duration>,
}

impl<K: Keep> Answer<K> {
    /// The body, read from the connection as it is polled, its bytes
    /// counted into `rx`.
    pub fn into_body(self, rx: Option<&Counter>) -> (ResponseHead, DirectBody<K>) {
        let body = DirectBody::new(self.stream, self.keep, self.buf, self.head.state, rx);
        (self.head, body)
    }
}

/// Sends `req` over `idle` (a kept connection, if the caller has one) or
/// a connection from `dial`, and reads the response head. A kept
/// connection the upstream closed while idle fails on first use; then one
/// fresh dial is tried, as long as no body byte was consumed. The answer's
/// connection goes to `keep` when its body ends cleanly.
pub async fn send<K, D, F>(
    mut idle: Option<Idle>,
    mut dial: D,
    keep: K,
    req: &mut impl Outgoing,
    is_head: bool,
) -> Result<Answer<K>, ExchangeError>
where
    D: FnMut() -> F,
    F: Future<Output = Result<TcpStream, ExchangeError>>,
{
    let bodyless = req.bodyless();
    loop {
        let reused = idle.is_some();
        let (mut s, mut buf) = match idle.take() {
            Some(i) => (i.stream, i.buf),
            None => (dial().await?, BytesMut::with_capacity(READ_CHUNK)),
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
                    keep,
                    idle_timeout: None,
                })
            }
            Err(ExchangeError::Io(e)) if reused && bodyless && buf.is_empty() => {
                tracing::debug!(error = %e, "kept connection was closed; redialing");
                continue;
            }
            Err(e) => return Err(e),
        }
    }
}
