//! The hot path for plain HTTP/1.1 to a Pod IP: the request is written and
//! the response read by the task serving the client, over a connection from
//! this worker thread's own pool. No connection task, no channels between
//! tasks, no locks: a request costs about what it costs nginx (two reads,
//! two writes). Upgrades, gRPC and DNS-named upstreams use hyper's client.

use std::{
    cell::RefCell,
    collections::HashMap,
    io,
    net::SocketAddr,
    pin::Pin,
    task::{ready, Context, Poll},
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::{
    io::{AsyncRead, AsyncWriteExt, ReadBuf},
    net::TcpStream,
};

use crate::{
    body::{BodyTooLarge, BoxError, ByteCount, RequestBody},
    metrics::Metrics,
    upstream::{dial, DialError, DialPolicy},
};

/// Idle connections kept per Pod address and worker thread.
const MAX_IDLE_PER_ADDR: usize = 256;
const MAX_HEAD: usize = 64 * 1024;
const READ_CHUNK: usize = 16 * 1024;

thread_local! {
    static IDLE: RefCell<HashMap<SocketAddr, Vec<Idle>>> = RefCell::new(HashMap::new());
}

/// A kept-alive connection and its read buffer (reused, so a request
/// allocates no fresh 16 KiB).
struct Idle {
    stream: TcpStream,
    buf: BytesMut,
}

fn take_idle(addr: SocketAddr) -> Option<Idle> {
    IDLE.with(|p| p.borrow_mut().get_mut(&addr).and_then(Vec::pop))
}

fn put_idle(addr: SocketAddr, s: Idle) {
    IDLE.with(|p| {
        let mut p = p.borrow_mut();
        let v = p.entry(addr).or_default();
        if v.len() < MAX_IDLE_PER_ADDR {
            v.push(s);
        }
    });
}

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

fn write_head(buf: &mut BytesMut, req: &http::request::Parts, host: &str, chunked: bool) {
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
        buf.put_slice(name.as_str().as_bytes());
        buf.put_slice(b": ");
        buf.put_slice(value.as_bytes());
        buf.put_slice(b"\r\n");
    }
    if chunked {
        buf.put_slice(b"transfer-encoding: chunked\r\n");
    }
    buf.put_slice(b"\r\n");
}

/// Sends the request over a pooled (or new) connection and reads the
/// response head; the body streams from the connection as the client reads.
/// `parts.headers` must already be rewritten for the sandbox.
pub async fn exchange(
    addr: SocketAddr,
    parts: &http::request::Parts,
    body: RequestBody,
    policy: &DialPolicy,
    metrics: &Metrics,
) -> Result<Response<DirectBody>, ExchangeError> {
    let host = parts.uri.authority().map_or("", |a| a.as_str());
    let declared = parts.headers.contains_key(header::CONTENT_LENGTH);
    let no_body = body.is_end_stream();
    let chunked = !no_body && !declared;
    let is_head = parts.method == Method::HEAD;

    // A pooled connection the sandbox closed while idle fails on first use;
    // then one fresh dial is tried, as long as no body byte was consumed.
    let mut idle = take_idle(addr);
    let mut body = body;
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
        write_head(&mut buf, parts, host, chunked);
        if let Err(e) = s.write_all(&buf).await {
            if reused {
                continue;
            }
            return Err(e.into());
        }
        if !no_body {
            send_body(&mut s, &mut body, chunked).await?;
        }
        buf.clear();
        match read_head(&mut s, &mut buf, is_head, metrics).await {
            Ok(resp) => {
                return Ok(resp.map(|state| DirectBody::new(s, addr, buf, state, &metrics.rx_bytes)))
            }
            Err(ExchangeError::Io(e)) if reused && no_body && buf.is_empty() => {
                tracing::debug!(error = %e, "pooled connection was closed; redialing");
                continue;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn send_body(
    s: &mut TcpStream,
    body: &mut RequestBody,
    chunked: bool,
) -> Result<(), ExchangeError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ExchangeError::Body)?;
        if let Ok(data) = frame.into_data() {
            if data.is_empty() {
                continue;
            }
            if chunked {
                s.write_all(format!("{:x}\r\n", data.len()).as_bytes())
                    .await?;
                s.write_all(&data).await?;
                s.write_all(b"\r\n").await?;
            } else {
                s.write_all(&data).await?;
            }
        }
    }
    if chunked {
        s.write_all(b"0\r\n\r\n").await?;
    }
    Ok(())
}

/// Reads until a full response head is parsed (skipping 1xx interim answers).
async fn read_head(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    is_head: bool,
    _metrics: &Metrics,
) -> Result<Response<FramingState>, ExchangeError> {
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; 96];
            let mut parsed = httparse::Response::new(&mut headers);
            match parsed.parse(buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let code = parsed.code.unwrap_or(502);
                    if (100..200).contains(&code) && code != 101 {
                        buf.advance(len);
                        continue;
                    }
                    let status = StatusCode::from_u16(code)
                        .map_err(|_| ExchangeError::Protocol("status code"))?;
                    let version_11 = parsed.version == Some(1);
                    // Header values become slices of the head's bytes: no copy each.
                    let base = buf.as_ptr() as usize;
                    let mut spans = [(0usize, 0usize, 0usize, 0usize); 96];
                    let n = parsed.headers.len();
                    for (span, h) in spans.iter_mut().zip(parsed.headers.iter()) {
                        *span = (
                            h.name.as_ptr() as usize - base,
                            h.name.len(),
                            h.value.as_ptr() as usize - base,
                            h.value.len(),
                        );
                    }
                    let head = buf.split_to(len).freeze();
                    let mut map = HeaderMap::with_capacity(n);
                    let mut framing = Framing::UntilClose;
                    let mut keep_alive = version_11;
                    for &(ns, nl, vs, vl) in &spans[..n] {
                        let name = HeaderName::from_bytes(&head[ns..ns + nl])
                            .map_err(|_| ExchangeError::Protocol("header name"))?;
                        let raw = &head[vs..vs + vl];
                        if name == header::TRANSFER_ENCODING {
                            if raw.eq_ignore_ascii_case(b"chunked") || raw.ends_with(b"chunked") {
                                framing = Framing::Chunked(Chunk::Size);
                            }
                            continue;
                        }
                        if name == header::CONNECTION {
                            if raw.eq_ignore_ascii_case(b"close") {
                                keep_alive = false;
                            }
                            continue;
                        }
                        // Per-hop headers stay on this hop (HTTP/2 clients reject them).
                        if name == header::UPGRADE
                            || name == header::TRAILER
                            || name.as_str() == "keep-alive"
                            || name.as_str() == "proxy-connection"
                        {
                            continue;
                        }
                        if name == header::CONTENT_LENGTH && !matches!(framing, Framing::Chunked(_))
                        {
                            let n = std::str::from_utf8(raw)
                                .ok()
                                .and_then(|v| v.trim().parse::<u64>().ok())
                                .ok_or(ExchangeError::Protocol("content-length"))?;
                            framing = Framing::Length(n);
                        }
                        let value = HeaderValue::from_maybe_shared(head.slice(vs..vs + vl))
                            .map_err(|_| ExchangeError::Protocol("header value"))?;
                        map.append(name, value);
                    }
                    if is_head || code == 204 || code == 304 {
                        framing = Framing::Length(0);
                        // A HEAD answer's Content-Length describes the GET body.
                    } else if matches!(framing, Framing::UntilClose) {
                        keep_alive = false;
                    }
                    let mut resp = Response::new(Framing::with_keep_alive(framing, keep_alive));
                    *resp.status_mut() = status;
                    *resp.headers_mut() = map;
                    return Ok(resp);
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
                Ok(httparse::Status::Partial) => {
                    return Err(ExchangeError::Protocol("response head too large"))
                }
                Err(_) => return Err(ExchangeError::Protocol("unparsable response head")),
            }
        }
        buf.reserve(READ_CHUNK);
        let n = read_some(s, buf).await?;
        if n == 0 {
            return Err(
                io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a response").into(),
            );
        }
    }
}

async fn read_some(s: &mut TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| poll_read_into(s, buf, cx)).await
}

fn poll_read_into(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(READ_CHUNK);
    }
    let spare = buf.spare_capacity_mut();
    let mut rb = ReadBuf::uninit(spare);
    ready!(Pin::new(s).poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: poll_read initialised and filled the first n spare bytes.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Reading a chunk-size line.
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines until the empty one.
    Trailers,
}

#[derive(Debug, Clone, Copy)]
enum Framing {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

pub(crate) struct FramingState {
    framing: Framing,
    keep_alive: bool,
}

impl Framing {
    fn with_keep_alive(self, keep_alive: bool) -> FramingState {
        FramingState {
            framing: self,
            keep_alive,
        }
    }
}

/// A response body read straight from the sandbox connection; the
/// connection goes back to the pool when the body ends cleanly.
pub struct DirectBody {
    stream: Option<TcpStream>,
    addr: SocketAddr,
    buf: BytesMut,
    state: FramingState,
    done: bool,
    count: ByteCount,
}

impl DirectBody {
    fn new(
        stream: TcpStream,
        addr: SocketAddr,
        buf: BytesMut,
        state: FramingState,
        rx: &Counter,
    ) -> Self {
        let done = matches!(state.framing, Framing::Length(0));
        let mut b = Self {
            stream: Some(stream),
            addr,
            buf,
            state,
            done,
            count: ByteCount::new(rx),
        };
        if done {
            b.finish();
        }
        b
    }

    fn finish(&mut self) {
        self.done = true;
        if let Some(stream) = self.stream.take() {
            if self.state.keep_alive && self.buf.is_empty() {
                let buf = std::mem::take(&mut self.buf);
                put_idle(self.addr, Idle { stream, buf });
            }
        }
    }

    /// Next piece of body from what is buffered, if a whole piece is there.
    fn next_from_buf(&mut self) -> Result<Option<Bytes>, ExchangeError> {
        loop {
            match self.state.framing {
                Framing::Length(0) => {
                    self.finish();
                    return Ok(None);
                }
                Framing::Length(n) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let take = (self.buf.len() as u64).min(n) as usize;
                    self.state.framing = Framing::Length(n - take as u64);
                    let out = self.buf.split_to(take).freeze();
                    if n == take as u64 {
                        self.finish();
                    }
                    return Ok(Some(out));
                }
                Framing::UntilClose => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(self.buf.split().freeze()));
                }
                Framing::Chunked(Chunk::Size) => {
                    let Some(eol) = find_crlf(&self.buf) else {
                        return self.line_too_long();
                    };
                    let line = &self.buf[..eol];
                    let hex = line.split(|&b| b == b';').next().unwrap_or_default();
                    let hex = std::str::from_utf8(hex)
                        .map_err(|_| ExchangeError::Protocol("chunk size"))?;
                    let size = u64::from_str_radix(hex.trim(), 16)
                        .map_err(|_| ExchangeError::Protocol("chunk size"))?;
                    self.buf.advance(eol + 2);
                    self.state.framing = Framing::Chunked(if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    });
                }
                Framing::Chunked(Chunk::Data(n)) => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    let take = (self.buf.len() as u64).min(n) as usize;
                    let out = self.buf.split_to(take).freeze();
                    self.state.framing = Framing::Chunked(if n == take as u64 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(n - take as u64)
                    });
                    return Ok(Some(out));
                }
                Framing::Chunked(Chunk::DataEnd) => {
                    if self.buf.len() < 2 {
                        return Ok(None);
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return Err(ExchangeError::Protocol("chunk end"));
                    }
                    self.buf.advance(2);
                    self.state.framing = Framing::Chunked(Chunk::Size);
                }
                Framing::Chunked(Chunk::Trailers) => {
                    let Some(eol) = find_crlf(&self.buf) else {
                        return self.line_too_long();
                    };
                    self.buf.advance(eol + 2);
                    if eol == 0 {
                        self.finish();
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn line_too_long(&self) -> Result<Option<Bytes>, ExchangeError> {
        if self.buf.len() > MAX_HEAD {
            Err(ExchangeError::Protocol("chunk line too long"))
        } else {
            Ok(None)
        }
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

impl Body for DirectBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match this.next_from_buf() {
                Ok(Some(data)) => {
                    this.count_add(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if this.done => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => {
                    this.done = true;
                    this.stream = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let Some(stream) = this.stream.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(poll_read_into(stream, &mut this.buf, cx)) {
                Ok(0) => {
                    this.stream = None;
                    this.done = true;
                    return if matches!(this.state.framing, Framing::UntilClose) {
                        Poll::Ready(None)
                    } else {
                        Poll::Ready(Some(Err(ExchangeError::Io(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "sandbox closed the connection mid-body",
                        )))))
                    };
                }
                Ok(_) => {}
                Err(e) => {
                    this.stream = None;
                    this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.state.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

impl DirectBody {
    fn count_add(&mut self, n: usize) {
        self.count.add(n);
    }
}
