//! The HTTP/1.1 fast path, on the plain listener and on TLS connections
//! that did not negotiate h2.
//!
//! A keep-alive client sending header-routed requests to a known Pod address
//! (the router's bread and butter) is served here without hyper's server:
//! the request head is parsed in place, rewritten straight into the pooled
//! sandbox connection's buffer, and the response head is copied back with
//! its per-hop headers dropped. No `HeaderMap`, no per-request task or
//! allocation beyond the target's names, two reads and two writes.
//!
//! Everything else hands the connection, with the bytes already read, to
//! hyper for the rest of its life: upgrades, h2c, chunked request bodies,
//! `Expect`, path routing, DNS-named targets, HTTP/1.0, requests without a
//! Host or an `X-Sandbox-ID`, and anything malformed (hyper then gives the
//! client its usual error). Routing, authorization, metrics, the access log
//! and the errors themselves are the same code as on the hyper path.

mod plan;
mod prefixed;
mod wire;

use std::{
    future::Future,
    io,
    pin::Pin,
    task::Poll,
    time::{Duration, Instant},
};

use bytes::{Buf, BufMut, BytesMut};
use http::Method;
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
    sync::watch,
    time::Sleep,
};

use crate::{
    error::ProxyError,
    h1::{self, ExchangeError, Outgoing},
    metrics::{InflightGuard, MethodLabel},
    proxy::{Conn, Proxy, Served},
};
use h1::write_piece;
use plan::{plan, Parsed, Plan};
pub use prefixed::Prefixed;
use wire::{put_date, put_piece, status_line, write_small};

/// Largest request head read here; a longer one goes to hyper, which decides.
const MAX_HEAD: usize = 64 * 1024;
const READ_CHUNK: usize = 8 * 1024;
/// A response body piece at most this large is copied behind the head so
/// both leave in one write.
const COALESCE: usize = 16 * 1024;
/// How long a client may take to send a request head, idle time included
/// (hyper's `header_read_timeout` on the fallback path).
const HEAD_TIMEOUT: Duration = Duration::from_secs(120);
/// After an error, a request body up to this size is read and dropped to
/// keep the connection; a larger one closes it.
const DRAIN_MAX: u64 = 1 << 20;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A client connection's stream: plain TCP or TLS.
pub trait ClientIo: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> ClientIo for T {}

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
}

/// Serves `stream` until it closes or needs hyper.
pub async fn serve<S: ClientIo>(
    stream: S,
    conn: &Conn,
    proxy: &Proxy,
    mut stop: watch::Receiver<bool>,
) -> Outcome<S> {
    let mut c = Client {
        stream,
        inbuf: BytesMut::with_capacity(READ_CHUNK),
        out: BytesMut::with_capacity(READ_CHUNK),
        up_head: BytesMut::with_capacity(1024),
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
            match plan(&c.inbuf, &mut c.up_head, conn, proxy) {
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
        match c.serve(*plan, conn, proxy).await {
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
            if let Poll::Ready(n) = h1::poll_read_into(&mut self.stream, &mut self.inbuf, cx) {
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
    async fn serve(&mut self, plan: Plan, conn: &Conn, proxy: &Proxy) -> io::Result<bool> {
        let start = Instant::now();
        let _inflight = InflightGuard::new(&proxy.metrics.inflight);
        self.inbuf.advance(plan.head_len);
        let is_head = plan.method == Method::HEAD;
        let mut req = FastRequest {
            head: &self.up_head,
            inbuf: &mut self.inbuf,
            client: &mut self.stream,
            buffered: 0,
            remaining: plan.content_length,
            sent: 0,
        };
        let buffered = (req.inbuf.len() as u64).min(plan.content_length) as usize;
        req.buffered = buffered;
        req.remaining -= buffered as u64;
        let answer = exchange(proxy, &plan, &mut req, is_head)
            .await
            .and_then(|a| {
                // Only an Upgrade (hyper's path) may switch protocols.
                if a.head.status == 101 {
                    proxy
                        .metrics
                        .upstream_error(&plan.target.namespace, "other");
                    return Err(ProxyError::Upstream(plan.target.id.clone()));
                }
                Ok(a)
            });
        req.settle();
        let (buffered, remaining) = (req.buffered, req.remaining);
        let mut consumed = req.consumed();
        let status = match &answer {
            Ok(a) => a.head.status,
            Err(e) => e.status().as_u16(),
        };
        // Counted once the head is known, before it is sent (as on hyper's
        // path): a client that reads the metrics next sees its request.
        proxy.record(&Served {
            start,
            method: MethodLabel::from(&plan.method),
            logged: plan.logged,
            status,
            grpc_status: None,
            namespace: &plan.target.namespace,
            id: &plan.target.id,
            remote: conn.remote,
        });
        let keep_alive = match answer {
            Ok(answer) => {
                // An answer means the whole body went to the sandbox.
                let complete = self.relay(answer, plan.keep_alive, proxy).await?;
                plan.keep_alive && complete
            }
            Err(e) => {
                // Answered before the body was read: a small body is read
                // past afterwards, so the connection can carry the next
                // request; a large one closes it.
                let drain = !consumed && remaining <= DRAIN_MAX;
                let announce_close = !plan.keep_alive || !(consumed || drain);
                write_small(&mut self.out, e.to_http(), !announce_close);
                self.stream.write_all(&self.out).await?;
                if drain {
                    consumed = self.discard(buffered, remaining).await;
                }
                plan.keep_alive && consumed
            }
        };
        if !consumed {
            self.linger().await;
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
                    let n = h1::read_some(&mut self.stream, &mut self.inbuf).await?;
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
                match h1::read_some(&mut self.stream, &mut self.inbuf).await {
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
    async fn relay(
        &mut self,
        answer: h1::Answer,
        keep_alive: bool,
        proxy: &Proxy,
    ) -> io::Result<bool> {
        let (head, mut body) = answer.into_body(&proxy.metrics.rx_bytes);
        let out = &mut self.out;
        out.clear();
        status_line(out, head.status);
        let mut has_date = false;
        for (name, value) in head.headers() {
            has_date |= name.eq_ignore_ascii_case(b"date");
            h1::put_header(out, name, value);
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
            out.put_slice(h1::LAST_CHUNK);
        }
        self.stream.write_all(out).await?;
        if finished {
            return Ok(true);
        }
        if let Some(data) = pending {
            write_piece(&mut self.stream, &data, chunked).await?;
        }
        loop {
            match body.frame().await {
                None => {
                    if chunked {
                        self.stream.write_all(h1::LAST_CHUNK).await?;
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

/// Authorizes the planned request, then sends it to the sandbox within
/// the proxy budget and reads the response head.
async fn exchange(
    proxy: &Proxy,
    plan: &Plan,
    req: &mut FastRequest<'_, impl ClientIo>,
    is_head: bool,
) -> Result<h1::Answer, ProxyError> {
    let t = &plan.target;
    proxy.check_access(plan.token.as_deref(), t).await?;
    let limit = proxy.settings.max_request_body_bytes;
    if limit > 0 && plan.content_length > limit {
        return Err(ProxyError::BodyTooLarge);
    }
    let policy = proxy.upstreams.dial_policy();
    let sent = h1::send(plan.addr, req, is_head, policy, &proxy.metrics);
    let result = proxy.within(proxy.budget(t), t, sent).await?;
    // A request that got an answer went out whole; a failed one as far as it got.
    let tx = if result.is_ok() {
        plan.content_length
    } else {
        req.sent
    };
    if tx > 0 {
        proxy.metrics.tx_bytes.inc_by(tx);
    }
    result.map_err(|e| proxy.exchange_failure(e, t, plan.cached_uid.as_deref()))
}

/// The request as it goes to the sandbox: the rewritten head, followed by
/// the Content-Length body, partly already read (`buffered` bytes at the
/// front of `inbuf`) and partly (`remaining`) still on the client socket.
struct FastRequest<'a, S> {
    head: &'a [u8],
    inbuf: &'a mut BytesMut,
    client: &'a mut S,
    buffered: usize,
    remaining: u64,
    /// Body bytes streamed after the head.
    sent: u64,
}

impl<S> FastRequest<'_, S> {
    /// Takes a body that travelled whole with the head off the client's bytes.
    fn settle(&mut self) {
        if self.remaining == 0 {
            self.inbuf.advance(self.buffered);
            self.buffered = 0;
        }
    }

    /// Whether the whole body has been taken from the client.
    fn consumed(&self) -> bool {
        self.buffered == 0 && self.remaining == 0
    }
}

impl<S: ClientIo> Outgoing for FastRequest<'_, S> {
    /// A body already read travels with the head, so only one still on the
    /// client socket counts: until then a stale pooled connection can be
    /// replaced and the head (body included) written again.
    fn bodyless(&self) -> bool {
        self.remaining == 0
    }

    fn head(&self, buf: &mut BytesMut) {
        buf.put_slice(self.head);
        buf.put_slice(&self.inbuf[..self.buffered]);
    }

    async fn send_body(&mut self, s: &mut TcpStream) -> Result<(), ExchangeError> {
        self.inbuf.advance(self.buffered);
        self.sent += self.buffered as u64;
        self.buffered = 0;
        while self.remaining > 0 {
            if self.inbuf.is_empty() {
                let n = h1::read_some(self.client, self.inbuf).await?;
                if n == 0 {
                    return Err(ExchangeError::Body("client closed mid-body".into()));
                }
            }
            let take = (self.inbuf.len() as u64).min(self.remaining) as usize;
            s.write_all(&self.inbuf[..take]).await?;
            self.inbuf.advance(take);
            self.remaining -= take as u64;
            self.sent += take as u64;
        }
        Ok(())
    }
}
