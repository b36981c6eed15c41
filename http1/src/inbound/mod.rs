//! The HTTP/1.1 fast path, on the plain listener and on TLS connections
//! that did not negotiate h2.
//!
//! A keep-alive client sending plain requests the handler takes (the
//! router's header-routed ones, the hub's port routes) is served here
//! without hyper's server: the request head is parsed in place, rewritten
//! straight into the upstream connection's buffer, and the response head is
//! copied back with its per-hop headers dropped. No `HeaderMap`, no
//! per-request task, two reads and two writes.
//!
//! Everything else hands the connection, with the bytes already read, to
//! hyper for the rest of its life: upgrades, h2c, chunked request bodies,
//! `Expect`, HTTP/1.0, whatever the handler does not take, and anything
//! malformed (hyper then gives the client its usual error).
//!
//! This module is the server: the client connection, its bytes, timeouts,
//! and the relay of the answer. Every decision (which requests it takes,
//! where they go, whether they may, what is counted and logged) is the
//! [`Handler`]'s, which its user implements with the same routing,
//! authorization, metrics and errors as its hyper path. So the arrows point
//! one way: the users import this module, never the reverse.

mod head;
mod prefixed;
mod request;

use std::{
    future::Future,
    io,
    pin::Pin,
    task::Poll,
    time::{Duration, Instant},
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Body;
use prometheus_client::metrics::counter::Counter;
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    sync::watch,
    time::Sleep,
};

use crate::count::{DRAIN_CAP, DRAIN_TIMEOUT};
use crate::{
    outbound::{Answer, Keep},
    wire::{
        poll_read_into, put_date, put_header, put_piece, read_some, status_line, write_piece,
        LAST_CHUNK,
    },
};
pub use head::{request_head, RequestHead, MAX_HEADERS};
pub use prefixed::Prefixed;
pub use request::FastRequest;

/// Largest request head read here; a longer one goes to hyper, which decides.
const MAX_HEAD: usize = 64 * 1024;
const READ_CHUNK: usize = 8 * 1024;
/// A response body piece at most this large is copied behind the head so
/// both leave in one write.
const COALESCE: usize = 16 * 1024;
/// How long a client may take to send a request head, idle time included
/// (hyper's `header_read_timeout` on the fallback path).
const HEAD_TIMEOUT: Duration = Duration::from_secs(120);
// After an error, a request body up to the drain bound
// (`count::DRAIN_CAP`, `count::DRAIN_TIMEOUT`) is read and dropped to keep
// the connection; a larger one closes it.

/// A client connection's stream: plain TCP or TLS.
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> ClientIo for T {}

/// What the fast path asks of the proxy behind it, for one client connection.
// Used with concrete types, whose futures' `Send` is then known.
#[allow(async_fn_in_trait)]
pub trait Handler {
    /// One request the handler takes, decided from its head alone.
    type Plan: Planned;
    /// Where an answer's connection goes when its body ends.
    type Keep: Keep;

    /// Decides, from the bytes so far, whether the next request is served
    /// here (and if so writes its head for the sandbox into `up_head`).
    fn plan(&self, buf: &[u8], up_head: &mut BytesMut) -> Parsed<Self::Plan>;

    /// Held while a request is in flight.
    fn in_flight(&self) -> impl Sized + '_;

    /// Authorizes the planned request, sends `req` upstream and reads
    /// the response head; then counts and logs the request (begun at
    /// `start`) by the status the client gets. `Err`: the handler's own
    /// answer, whole.
    async fn exchange<S: ClientIo>(
        &self,
        plan: Self::Plan,
        start: Instant,
        req: &mut FastRequest<'_, S>,
    ) -> Result<Answer<Self::Keep>, Response<Bytes>>;

    /// Counts the response body's bytes, if the handler counts them.
    fn rx_bytes(&self) -> Option<&Counter>;
}

/// What the server itself needs of a planned request: where its head ends,
/// how its body is framed, and whether the client keeps the connection.
pub trait Planned {
    fn head_len(&self) -> usize;
    fn content_length(&self) -> u64;
    fn keep_alive(&self) -> bool;
}

/// What the bytes so far say about the next request.
pub enum Parsed<P> {
    /// Not a whole head yet.
    Partial,
    /// A request for hyper: the connection goes there.
    Fallback,
    Serve(Box<P>),
}

/// How a connection left the fast path.
pub enum Outcome<S> {
    /// Done: closed by the client, after an error, on timeout or shutdown.
    Closed,
    /// For hyper from here on; the stream replays what was read but not served.
    Fallback(Prefixed<S>),
}

/// A client connection on the fast path.
struct Client<S> {
    stream: S,
    /// Bytes read from the client and not yet served.
    inbuf: BytesMut,
    /// The response on its way to the client.
    out: BytesMut,
    /// The current request's head, rewritten for the sandbox.
    up_head: BytesMut,
    /// Bytes the client sent while its request was with the upstream.
    ahead: BytesMut,
}

/// Resolves when the client hangs up (`true`: end of stream or an error)
/// or sends more (`false`: the bytes are in `ahead`).
async fn hang_up(stream: &mut impl ClientIo, ahead: &mut BytesMut) -> bool {
    !matches!(read_some(stream, ahead).await, Ok(1..))
}

/// Serves `stream` until it closes or needs hyper.
pub async fn serve<S: ClientIo, H: Handler>(
    stream: S,
    handler: &H,
    mut stop: watch::Receiver<bool>,
) -> Outcome<S> {
    let mut c = Client {
        stream,
        inbuf: BytesMut::with_capacity(READ_CHUNK),
        out: BytesMut::with_capacity(READ_CHUNK),
        up_head: BytesMut::with_capacity(1024),
        ahead: BytesMut::new(),
    };
    let deadline = tokio::time::sleep(HEAD_TIMEOUT);
    tokio::pin!(deadline);
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        // Re-arming the timer costs a timer-wheel update; a second of slack saves one per request.
        let now = tokio::time::Instant::now();
        if deadline.deadline() < now + HEAD_TIMEOUT - Duration::from_secs(1) {
            deadline.as_mut().reset(now + HEAD_TIMEOUT);
        }
        let plan = loop {
            match handler.plan(&c.inbuf, &mut c.up_head) {
                Parsed::Serve(plan) => break plan,
                Parsed::Fallback => return c.fallback(),
                Parsed::Partial if c.inbuf.len() >= MAX_HEAD => return c.fallback(),
                Parsed::Partial => {}
            }
            match c.fill(deadline.as_mut(), stopped.as_mut()).await {
                Ok(Fill::Data) => {}
                Ok(Fill::Eof | Fill::Timeout | Fill::Stop) | Err(_) => return Outcome::Closed,
            }
        };
        match c.serve(*plan, handler).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return Outcome::Closed,
        }
    }
}

enum Fill {
    Data,
    Eof,
    Timeout,
    Stop,
}

impl<S: ClientIo> Client<S> {
    /// Reads more of the client's bytes, unless the head timeout passes
    /// first or (between requests) the router shuts down.
    async fn fill(
        &mut self,
        mut deadline: Pin<&mut Sleep>,
        mut stopped: Pin<&mut impl Future>,
    ) -> io::Result<Fill> {
        let idle = self.inbuf.is_empty();
        std::future::poll_fn(|cx| {
            if let Poll::Ready(n) = poll_read_into(&mut self.stream, &mut self.inbuf, cx) {
                return Poll::Ready(n.map(|n| if n == 0 { Fill::Eof } else { Fill::Data }));
            }
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(Fill::Timeout));
            }
            // Only between requests: a request already begun is finished first.
            if idle && stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(Fill::Stop));
            }
            Poll::Pending
        })
        .await
    }

    fn fallback(self) -> Outcome<S> {
        Outcome::Fallback(Prefixed::new(self.inbuf, self.stream))
    }

    /// Serves one planned request; `Ok(true)`: the connection stays open.
    async fn serve<H: Handler>(&mut self, plan: H::Plan, handler: &H) -> io::Result<bool> {
        let start = Instant::now();
        let _inflight = handler.in_flight();
        let (head_len, keep_alive) = (plan.head_len(), plan.keep_alive());
        self.inbuf.advance(head_len);
        let content_length = plan.content_length();
        // A body that came whole with the head leaves the client socket
        // free, to notice a hang-up while the upstream thinks.
        let whole = self.inbuf.len() as u64 >= content_length;
        let mut req;
        // The handler counts the request once the head is known, before it
        // is sent (as on hyper's path): a client that reads the metrics next
        // sees its request.
        let answer = if whole {
            req = FastRequest::new(&self.up_head, &mut self.inbuf, None, content_length);
            // A client that hangs up before its answer takes the request
            // with it (as hyper's server does): whatever the handler holds
            // for it (an upstream connection, a slot under a cap) is freed
            // now, not when a silent upstream finally answers.
            let exchange = handler.exchange(plan, start, &mut req);
            tokio::pin!(exchange);
            let mut watching = true;
            loop {
                tokio::select! {
                    answer = &mut exchange => break answer,
                    gone = hang_up(&mut self.stream, &mut self.ahead), if watching => {
                        if gone {
                            return Ok(false);
                        }
                        // The next request, pipelined: kept for later, and
                        // the watch ends (reading on could hold too much).
                        watching = false;
                    }
                }
            }
        } else {
            req = FastRequest::new(
                &self.up_head,
                &mut self.inbuf,
                Some(&mut self.stream),
                content_length,
            );
            handler.exchange(plan, start, &mut req).await
        };
        req.settle();
        let (buffered, remaining) = (req.buffered, req.remaining);
        let mut consumed = req.consumed();
        let keep_alive = match answer {
            Ok(answer) => {
                // An answer means the whole body went to the sandbox.
                let complete = self.relay(answer, keep_alive, handler.rx_bytes()).await?;
                keep_alive && complete
            }
            Err(refusal) => {
                // Answered before the body was read: a small body is read
                // past afterwards, so the connection can carry the next
                // request; a large one closes it.
                let drain = !consumed && remaining <= DRAIN_CAP;
                let announce_close = !keep_alive || !(consumed || drain);
                write_small(&mut self.out, refusal, !announce_close);
                self.stream.write_all(&self.out).await?;
                if drain {
                    consumed = self.discard(buffered, remaining).await;
                }
                keep_alive && consumed
            }
        };
        if !consumed {
            self.linger().await;
        }
        // Bytes read while watching for a hang-up follow what was unserved.
        if !self.ahead.is_empty() {
            self.inbuf.extend_from_slice(&self.ahead);
            self.ahead.clear();
        }
        Ok(keep_alive)
    }

    /// Drops a request body the sandbox never got; `false` if the client
    /// did not send it in time.
    async fn discard(&mut self, buffered: usize, mut remaining: u64) -> bool {
        self.inbuf.advance(buffered);
        let read = async {
            while remaining > 0 {
                if self.inbuf.is_empty() {
                    let n = read_some(&mut self.stream, &mut self.inbuf).await?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                let take = (self.inbuf.len() as u64).min(remaining) as usize;
                self.inbuf.advance(take);
                remaining -= take as u64;
            }
            Ok::<_, io::Error>(())
        };
        matches!(tokio::time::timeout(DRAIN_TIMEOUT, read).await, Ok(Ok(())))
    }

    /// Closing with request bytes still unread would make the kernel send a
    /// reset, which can destroy the answer before the client reads it; so
    /// send FIN first and read (and drop) what the client still sends, for
    /// a bounded time and amount.
    async fn linger(&mut self) {
        const LINGER: Duration = Duration::from_secs(2);
        const LINGER_BYTES: usize = 4 << 20;
        if self.stream.shutdown().await.is_err() {
            return;
        }
        let mut drained = 0;
        let _ = tokio::time::timeout(LINGER, async {
            while drained < LINGER_BYTES {
                self.inbuf.clear();
                match read_some(&mut self.stream, &mut self.inbuf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => drained += n,
                }
            }
        })
        .await;
    }

    /// Copies the sandbox's response to the client: the head with its
    /// per-hop headers dropped, then the body, re-framed as chunked when the
    /// sandbox did not give its length. `Ok(false)`: the body ended early.
    async fn relay<K: Keep>(
        &mut self,
        answer: Answer<K>,
        keep_alive: bool,
        rx: Option<&Counter>,
    ) -> io::Result<bool> {
        let idle = answer.idle_timeout;
        let (head, mut body) = answer.into_body(rx);
        let out = &mut self.out;
        out.clear();
        status_line(out, head.status);
        let mut has_date = false;
        for (name, value) in head.headers() {
            has_date |= name.eq_ignore_ascii_case(b"date");
            put_header(out, name, value);
        }
        if !has_date {
            put_date(out);
        }
        let chunked = !head.length_framed();
        if chunked {
            out.put_slice(b"transfer-encoding: chunked\r\n");
        }
        if !keep_alive {
            out.put_slice(b"connection: close\r\n");
        }
        out.put_slice(b"\r\n");
        drop(head);
        let first = match body.next_buffered() {
            Ok(first) => first,
            Err(e) => {
                tracing::debug!(error = %e, "bad response body from the sandbox");
                return Ok(false);
            }
        };
        let mut pending = None;
        if let Some(data) = first {
            if data.len() <= COALESCE {
                put_piece(out, &data, chunked);
            } else {
                pending = Some(data);
            }
        }
        let finished = pending.is_none() && body.is_end_stream();
        if finished && chunked {
            out.put_slice(LAST_CHUNK);
        }
        self.stream.write_all(out).await?;
        if finished {
            return Ok(true);
        }
        if let Some(data) = pending {
            write_piece(&mut self.stream, &data, chunked).await?;
        }
        loop {
            let next = match idle {
                None => body.frame().await,
                Some(idle) => match tokio::time::timeout(idle, body.frame()).await {
                    Ok(next) => next,
                    Err(_) => {
                        tracing::debug!(?idle, "upstream sent nothing of its body for too long");
                        return Ok(false);
                    }
                },
            };
            match next {
                None => {
                    if chunked {
                        self.stream.write_all(LAST_CHUNK).await?;
                    }
                    return Ok(true);
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            write_piece(&mut self.stream, &data, chunked).await?;
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "sandbox response body ended early");
                    return Ok(false);
                }
            }
        }
    }
}

/// One of the handler's own answers (errors), whole, into `out`.
fn write_small(out: &mut BytesMut, resp: Response<Bytes>, keep_alive: bool) {
    use std::fmt::Write;
    out.clear();
    status_line(out, resp.status().as_u16());
    for (name, value) in resp.headers() {
        put_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let body = resp.into_body();
    let _ = write!(out, "content-length: {}\r\n", body.len());
    put_date(out);
    if !keep_alive {
        out.put_slice(b"connection: close\r\n");
    }
    out.put_slice(b"\r\n");
    out.put_slice(&body);
}
