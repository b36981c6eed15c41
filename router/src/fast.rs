//! The plain listener's HTTP/1.1 fast path.
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

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime},
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::TcpStream,
    sync::watch,
    time::Sleep,
};

use crate::{
    authz::bearer_value,
    body::ProxyBody,
    error::ProxyError,
    h1::{self, ExchangeError, Outgoing},
    metrics::{InflightGuard, MethodLabel},
    proxy::{Conn, Proxy, Resolved, Served},
    routing::{parse_headers, parse_path, visible_ascii, HeaderRules, HeaderSource, Target},
};

/// Largest request head read here; a longer one goes to hyper, which decides.
const MAX_HEAD: usize = 64 * 1024;
/// hyper's default limit; more headers go to hyper for its 431.
const MAX_HEADERS: usize = 100;
const READ_CHUNK: usize = 8 * 1024;
/// A response body piece at most this large is copied behind the head so
/// both leave in one write.
const COALESCE: usize = 16 * 1024;
/// How long a client may take to send a request head, idle time included
/// (hyper's `header_read_timeout` on the fallback path).
const HEAD_TIMEOUT: Duration = Duration::from_secs(120);

/// Request headers that never reach the sandbox: per-hop ones (RFC 9110
/// §7.6.1), credentials meant for the router, and the ones it sets itself.
const DROPPED: [&str; 14] = [
    "host",
    "authorization",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "trailer",
    "transfer-encoding",
    "te",
    "upgrade",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
];

/// How a connection left the fast path.
pub enum Outcome {
    /// Done: closed by the client, after an error, on timeout or shutdown.
    Closed,
    /// For hyper from here on; the stream replays what was read but not served.
    Fallback(Prefixed),
}

/// A client connection on the fast path.
struct Client {
    stream: TcpStream,
    /// Bytes read from the client and not yet served.
    inbuf: BytesMut,
    /// The response on its way to the client.
    out: BytesMut,
    /// The current request's head, rewritten for the sandbox.
    up_head: BytesMut,
}

/// One request the fast path will serve, decided from its head alone.
struct Plan {
    head_len: usize,
    method: Method,
    /// The method and path, when the access log is on.
    logged: Option<(Method, String)>,
    target: Target,
    addr: SocketAddr,
    cached_uid: Option<String>,
    /// The Bearer token, read only when authorization needs it.
    token: Option<String>,
    content_length: u64,
    keep_alive: bool,
}

enum Parsed {
    Partial,
    Fallback,
    Serve(Box<Plan>),
}

/// Serves `stream` until it closes or needs hyper.
pub async fn serve(
    stream: TcpStream,
    conn: &Conn,
    proxy: &Proxy,
    mut stop: watch::Receiver<bool>,
) -> Outcome {
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

impl Client {
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

    fn fallback(self) -> Outcome {
        Outcome::Fallback(Prefixed {
            prefix: self.inbuf,
            inner: self.stream,
        })
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
            consumed: plan.content_length == 0,
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
        let consumed = req.consumed;
        // Body bytes still unread would be taken for the next request.
        let keep = plan.keep_alive && consumed;
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
                let complete = self.relay(answer, keep, proxy).await?;
                keep && complete
            }
            Err(e) => {
                write_small(&mut self.out, e.to_http(), keep);
                self.stream.write_all(&self.out).await?;
                keep
            }
        };
        if !consumed {
            self.linger().await;
        }
        Ok(keep_alive)
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
                match std::future::poll_fn(|cx| {
                    h1::poll_read_into(&mut self.stream, &mut self.inbuf, cx)
                })
                .await
                {
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
            out.put_slice(name);
            out.put_slice(b": ");
            out.put_slice(value);
            out.put_slice(b"\r\n");
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
            out.put_slice(b"0\r\n\r\n");
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
                        self.stream.write_all(b"0\r\n\r\n").await?;
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
    req: &mut FastRequest<'_>,
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
    let result = match proxy.budget(t) {
        Some(b) => match tokio::time::timeout(b, sent).await {
            Ok(r) => r,
            Err(_) => {
                proxy.metrics.upstream_error(&t.namespace, "timeout");
                return Err(ProxyError::Timeout(t.id.clone()));
            }
        },
        None => sent.await,
    };
    if req.sent > 0 {
        proxy.metrics.tx_bytes.inc_by(req.sent);
    }
    result.map_err(|e| proxy.exchange_failure(e, t, plan.cached_uid.as_deref()))
}

/// The request as it goes to the sandbox: the rewritten head, followed by
/// the Content-Length body, partly already read (`buffered` bytes at the
/// front of `inbuf`) and partly still on the client socket.
struct FastRequest<'a> {
    head: &'a [u8],
    inbuf: &'a mut BytesMut,
    client: &'a mut TcpStream,
    buffered: usize,
    remaining: u64,
    /// Whether the whole body has been taken from the client.
    consumed: bool,
    /// Body bytes sent.
    sent: u64,
}

impl Outgoing for FastRequest<'_> {
    fn bodyless(&self) -> bool {
        self.buffered == 0 && self.remaining == 0
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
                let n = std::future::poll_fn(|cx| h1::poll_read_into(self.client, self.inbuf, cx))
                    .await?;
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
        self.consumed = true;
        Ok(())
    }
}

/// Decides, from the bytes so far, whether the next request is served here
/// (and if so writes its head for the sandbox into `up_head`).
fn plan(buf: &[u8], up_head: &mut BytesMut, conn: &Conn, proxy: &Proxy) -> Parsed {
    if buf.is_empty() {
        return Parsed::Partial;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Fallback,
    };
    let (Some(method), Some(path), Some(1)) = (req.method, req.path, req.version) else {
        return Parsed::Fallback;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Fallback;
    };
    if method == Method::CONNECT
        || !path.starts_with('/')
        || !path.bytes().all(|b| (0x21..0x7f).contains(&b))
    {
        return Parsed::Fallback;
    }
    let s = &proxy.settings;
    if let Some(prefix) = &s.path_prefix {
        let bare = path.split_once('?').map_or(path, |(p, _)| p);
        if parse_path(prefix, bare).is_some() {
            return Parsed::Fallback;
        }
    }
    let headers: &[httparse::Header] = req.headers;
    let Some(fields) = Fields::read(headers) else {
        return Parsed::Fallback;
    };
    let rules = HeaderRules {
        grpc: false,
        allow_loopback: s.allow_loopback_pod_ip,
    };
    // A bad routing header gets hyper's path and its 400, word for word.
    let Ok(target) = parse_headers(headers, rules) else {
        return Parsed::Fallback;
    };
    let Ok(Resolved {
        authority,
        addr: Some(addr),
        cached_uid,
    }) = proxy.resolve(&target)
    else {
        return Parsed::Fallback;
    };
    let token = if proxy.authz.is_allow_all() {
        None
    } else {
        HeaderSource::first(headers, "authorization")
            .and_then(visible_ascii)
            .and_then(bearer_value)
            .map(str::to_owned)
    };

    up_head.clear();
    up_head.put_slice(method.as_str().as_bytes());
    up_head.put_u8(b' ');
    up_head.put_slice(path.as_bytes());
    up_head.put_slice(b" HTTP/1.1\r\nhost: ");
    up_head.put_slice(authority.as_str().as_bytes());
    up_head.put_slice(b"\r\n");
    for h in headers {
        let name = h.name;
        if DROPPED.iter().any(|d| name.eq_ignore_ascii_case(d)) || fields.connection_names(name) {
            continue;
        }
        up_head.put_slice(name.as_bytes());
        up_head.put_slice(b": ");
        up_head.put_slice(h.value);
        up_head.put_slice(b"\r\n");
    }
    up_head.put_slice(b"x-forwarded-for: ");
    if let Some(prior) = fields.forwarded_for {
        up_head.put_slice(prior);
        up_head.put_slice(b", ");
    }
    up_head.put_slice(conn.client_ip.as_bytes());
    up_head.put_slice(b"\r\nx-forwarded-host: ");
    up_head.put_slice(fields.host);
    up_head.put_slice(b"\r\nx-forwarded-proto: ");
    let https = s.trust_forwarded_proto && fields.forwarded_https;
    up_head.put_slice(if conn.tls || https { b"https" } else { b"http" });
    up_head.put_slice(b"\r\n\r\n");

    let logged = s.access_log.then(|| {
        let bare = path.split_once('?').map_or(path, |(p, _)| p);
        (method.clone(), bare.to_owned())
    });
    Parsed::Serve(Box::new(Plan {
        head_len,
        method,
        logged,
        target,
        addr,
        cached_uid,
        token,
        content_length: fields.content_length,
        keep_alive: fields.keep_alive,
    }))
}

/// What the fast path needs from a request's headers, read in one pass;
/// `None` when the request is one for hyper.
struct Fields<'a> {
    host: &'a [u8],
    content_length: u64,
    keep_alive: bool,
    forwarded_for: Option<&'a [u8]>,
    forwarded_https: bool,
    /// The Connection header's tokens (headers it names stay on this hop).
    connection: [&'a [u8]; 8],
    connection_len: usize,
}

impl<'a> Fields<'a> {
    fn read(headers: &'a [httparse::Header<'a>]) -> Option<Self> {
        let mut f = Fields {
            host: b"",
            content_length: 0,
            keep_alive: true,
            forwarded_for: None,
            forwarded_https: false,
            connection: [b""; 8],
            connection_len: 0,
        };
        let (mut host, mut length, mut id, mut xff, mut xfp) = (false, false, false, false, false);
        for h in headers {
            let name = h.name;
            let is = |n: &str| name.eq_ignore_ascii_case(n);
            if is("host") {
                if !host {
                    f.host = h.value;
                    host = true;
                }
            } else if is("content-length") {
                // Two lengths, or one that is not plain digits: hyper's to judge.
                if length || h.value.is_empty() || !h.value.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                f.content_length = std::str::from_utf8(h.value).ok()?.parse().ok()?;
                length = true;
            } else if is("transfer-encoding") || is("upgrade") || is("expect") {
                return None;
            } else if is("connection") {
                for token in h.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        f.keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return None;
                    } else if !token.is_empty() {
                        *f.connection.get_mut(f.connection_len)? = token;
                        f.connection_len += 1;
                    }
                }
            } else if is("x-sandbox-id") {
                id = true;
            } else if is("x-forwarded-for") {
                if !xff {
                    xff = true;
                    f.forwarded_for = Some(h.value).filter(|v| !v.is_empty());
                }
            } else if is("x-forwarded-proto") && !xfp {
                xfp = true;
                f.forwarded_https = h.value.trim_ascii().eq_ignore_ascii_case(b"https");
            }
        }
        // The Host is forwarded as X-Forwarded-Host; values it could not be are hyper's.
        (host && id && visible_ascii(f.host).is_some()).then_some(f)
    }

    fn connection_names(&self, name: &str) -> bool {
        self.connection[..self.connection_len]
            .iter()
            .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
    }
}

fn status_line(out: &mut BytesMut, code: u16) {
    out.put_slice(b"HTTP/1.1 ");
    let mut digits = [0u8; 3];
    digits[0] = b'0' + (code / 100 % 10) as u8;
    digits[1] = b'0' + (code / 10 % 10) as u8;
    digits[2] = b'0' + (code % 10) as u8;
    out.put_slice(&digits);
    out.put_u8(b' ');
    let reason = StatusCode::from_u16(code)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("<none>");
    out.put_slice(reason.as_bytes());
    out.put_slice(b"\r\n");
}

/// `date: <IMF-fixdate>\r\n`, formatted once a second per worker thread.
fn put_date(out: &mut BytesMut) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((0, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                d.1.copy_from_slice(text.as_bytes());
                d.0 = secs;
            }
        }
        out.put_slice(b"date: ");
        out.put_slice(&d.1);
        out.put_slice(b"\r\n");
    });
}

fn put_piece(out: &mut BytesMut, data: &[u8], chunked: bool) {
    if chunked {
        put_chunk_size(out, data.len());
        out.put_slice(data);
        out.put_slice(b"\r\n");
    } else {
        out.put_slice(data);
    }
}

fn put_chunk_size(out: &mut BytesMut, n: usize) {
    use std::fmt::Write;
    let _ = write!(out, "{n:x}\r\n");
}

async fn write_piece(s: &mut TcpStream, data: &Bytes, chunked: bool) -> io::Result<()> {
    if chunked {
        let mut size = BytesMut::with_capacity(18);
        put_chunk_size(&mut size, data.len());
        s.write_all(&size).await?;
        s.write_all(data).await?;
        s.write_all(b"\r\n").await
    } else {
        s.write_all(data).await
    }
}

/// One of the router's own answers (errors), whole, into `out`.
fn write_small(out: &mut BytesMut, resp: http::Response<ProxyBody>, keep_alive: bool) {
    use std::fmt::Write;
    out.clear();
    status_line(out, resp.status().as_u16());
    for (name, value) in resp.headers() {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    let body = match resp.into_body() {
        ProxyBody::Full(Some(b)) => b,
        _ => Bytes::new(),
    };
    let _ = write!(out, "content-length: {}\r\n", body.len());
    put_date(out);
    if !keep_alive {
        out.put_slice(b"connection: close\r\n");
    }
    out.put_slice(b"\r\n");
    out.put_slice(&body);
}

/// A client stream for hyper that first replays the bytes the fast path
/// read but did not serve.
pub struct Prefixed {
    prefix: BytesMut,
    inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
