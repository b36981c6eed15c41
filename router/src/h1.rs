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
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf},
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

/// A pooled connection to `addr` that the sandbox has not closed meanwhile.
fn take_idle(addr: SocketAddr) -> Option<Idle> {
    IDLE.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.get_mut(&addr)?;
        while let Some(i) = idle.pop() {
            if still_open(&i.stream) {
                return Some(i);
            }
        }
        None
    })
}

/// Whether an idle connection is still usable. A sandbox that closes idle
/// connections (Node's 5 s keep-alive, for one) sends a FIN the reactor has
/// usually seen by now; catching it here matters for requests with a body,
/// which cannot be retried on a fresh connection once sent. Costs no
/// syscall unless the socket turned readable while idle.
fn still_open(s: &TcpStream) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match s.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            // Readable while idle: EOF, an error, or bytes nobody asked for.
            let mut probe = [0u8; 1];
            matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        }
    }
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
    let mut idle = take_idle(addr);
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

const MAX_HEADERS: usize = 96;

/// Where one header's name and value sit in [`ResponseHead::bytes`].
#[derive(Clone, Copy)]
struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

/// A response head from the sandbox, with the per-hop headers dropped.
pub(crate) struct ResponseHead {
    pub status: u16,
    bytes: Bytes,
    /// Heap-held: an inline array made every move of the head (several per
    /// request, through the exchange's futures) a memcpy of kilobytes.
    spans: Vec<Span>,
    state: FramingState,
}

impl ResponseHead {
    /// The headers that travel on to the client, in the sandbox's order.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|s| {
            (
                &self.bytes[s.name.0 as usize..s.name.1 as usize],
                &self.bytes[s.value.0 as usize..s.value.1 as usize],
            )
        })
    }

    /// Whether the body is framed by Content-Length (or absent); otherwise the
    /// client gets it re-framed.
    pub fn length_framed(&self) -> bool {
        matches!(self.state.framing, Framing::Length(_))
    }

    /// The headers as a `HeaderMap`, values as slices of the head (no copy each).
    fn header_map(&self) -> Result<HeaderMap, ExchangeError> {
        let mut map = HeaderMap::with_capacity(self.spans.len());
        for s in &self.spans {
            let name = HeaderName::from_bytes(&self.bytes[s.name.0 as usize..s.name.1 as usize])
                .map_err(|_| ExchangeError::Protocol("header name"))?;
            let value = HeaderValue::from_maybe_shared(
                self.bytes.slice(s.value.0 as usize..s.value.1 as usize),
            )
            .map_err(|_| ExchangeError::Protocol("header value"))?;
            map.append(name, value);
        }
        Ok(map)
    }
}

/// Reads until a full response head is parsed (skipping 1xx interim answers).
async fn read_head(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    is_head: bool,
) -> Result<ResponseHead, ExchangeError> {
    loop {
        if !buf.is_empty() {
            if let Some(head) = parse_head(buf, is_head)? {
                return Ok(head);
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

/// Parses a complete response head off the front of `buf`, if there is one.
fn parse_head(buf: &mut BytesMut, is_head: bool) -> Result<Option<ResponseHead>, ExchangeError> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut headers);
        let len = match parsed.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(None),
            Ok(httparse::Status::Partial) => {
                return Err(ExchangeError::Protocol("response head too large"))
            }
            Err(_) => return Err(ExchangeError::Protocol("unparsable response head")),
        };
        let code = parsed.code.unwrap_or(502);
        if (100..200).contains(&code) && code != 101 {
            buf.advance(len);
            continue;
        }
        if !(100..1000).contains(&code) {
            return Err(ExchangeError::Protocol("status code"));
        }
        let base = buf.as_ptr() as usize;
        let offset = |p: &[u8]| (p.as_ptr() as usize - base) as u32;
        let mut spans = Vec::with_capacity(parsed.headers.len());
        let mut framing = Framing::UntilClose;
        let mut keep_alive = parsed.version == Some(1);
        // Value spans of Connection headers: the headers they name stay on this hop.
        let mut named = Vec::new();
        let mut length = None;
        for h in parsed.headers.iter() {
            let name = h.name.as_bytes();
            let raw = h.value;
            let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
            if is("transfer-encoding") {
                // Chunked frames the body only as the final coding (RFC 9112 §6.1).
                let last = raw.rsplit(|&b| b == b',').next().unwrap_or_default();
                if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    framing = Framing::Chunked(Chunk::Size);
                }
                continue;
            }
            if is("connection") {
                if has_token(raw, b"close") {
                    keep_alive = false;
                }
                let vs = offset(raw) as usize;
                named.push(vs..vs + raw.len());
                continue;
            }
            // Per-hop headers stay on this hop (HTTP/2 clients reject them).
            if is("upgrade") || is("trailer") || is("keep-alive") || is("proxy-connection") {
                continue;
            }
            if is("content-length") {
                let n = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or(ExchangeError::Protocol("content-length"))?;
                // Two different lengths cannot be relayed safely (RFC 9112 §6.3);
                // a repeated one is passed on once.
                match length.replace(n) {
                    Some(m) if m != n => {
                        return Err(ExchangeError::Protocol("conflicting content-length"))
                    }
                    Some(_) => continue,
                    None => {}
                }
                if !matches!(framing, Framing::Chunked(_)) {
                    framing = Framing::Length(n);
                }
            }
            let (ns, vs) = (offset(name), offset(raw));
            spans.push(Span {
                name: (ns, ns + name.len() as u32),
                value: (vs, vs + raw.len() as u32),
            });
        }
        let chunked = matches!(framing, Framing::Chunked(_));
        if chunked || !named.is_empty() {
            let head = &buf[..len];
            spans.retain(|s| {
                let name = &head[s.name.0 as usize..s.name.1 as usize];
                if name.eq_ignore_ascii_case(b"content-length") {
                    // Framing is not the Connection header's to strip; and with
                    // chunked it must go (RFC 9112 §6.3), or the client would
                    // get a head announcing two framings.
                    return !chunked;
                }
                !named.iter().any(|v| has_token(&head[v.clone()], name))
            });
        }
        if is_head || code == 204 || code == 304 {
            // A HEAD answer's Content-Length describes the GET body.
            framing = Framing::Length(0);
        } else if matches!(framing, Framing::UntilClose) {
            keep_alive = false;
        }
        return Ok(Some(ResponseHead {
            status: code,
            bytes: buf.split_to(len).freeze(),
            spans,
            state: Framing::with_keep_alive(framing, keep_alive),
        }));
    }
}

/// Reads what is there into `buf`'s spare capacity; `Ok(0)`: end of stream.
pub(crate) async fn read_some(
    s: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
) -> io::Result<usize> {
    std::future::poll_fn(|cx| poll_read_into(s, buf, cx)).await
}

/// One `name: value` header line.
pub(crate) fn put_header(buf: &mut BytesMut, name: &[u8], value: &[u8]) {
    buf.put_slice(name);
    buf.put_slice(b": ");
    buf.put_slice(value);
    buf.put_slice(b"\r\n");
}

/// The chunk that ends a chunked body (no trailers).
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// A chunk's size line.
pub(crate) fn put_chunk_size(buf: &mut BytesMut, n: usize) {
    use std::fmt::Write;
    let _ = write!(buf, "{n:x}\r\n");
}

/// Writes `data` as it is, or as one chunk of a chunked body.
pub(crate) async fn write_piece(
    s: &mut (impl AsyncWrite + Unpin),
    data: &[u8],
    chunked: bool,
) -> io::Result<()> {
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

/// Whether a comma-separated header value lists `token` (case-insensitive).
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

pub(crate) fn poll_read_into(
    s: &mut (impl AsyncRead + Unpin),
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

#[derive(Clone, Copy)]
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

    /// The next piece of body already read from the sandbox, counted; no I/O.
    pub(crate) fn next_buffered(&mut self) -> Result<Option<Bytes>, ExchangeError> {
        if self.done {
            return Ok(None);
        }
        let next = self.next_from_buf()?;
        if let Some(data) = &next {
            self.count_add(data.len());
        }
        Ok(next)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Result<ResponseHead, ExchangeError> {
        let mut buf = BytesMut::from(head.as_bytes());
        parse_head(&mut buf, false).map(|h| h.expect("a whole head"))
    }

    fn names(h: &ResponseHead) -> Vec<String> {
        h.headers()
            .map(|(n, _)| String::from_utf8_lossy(n).to_ascii_lowercase())
            .collect()
    }

    #[test]
    fn chunked_wins_over_a_length_which_is_dropped() {
        for head in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n",
        ] {
            let h = parse(head).unwrap();
            assert!(!h.length_framed(), "{head}");
            assert!(!names(&h).contains(&"content-length".to_owned()), "{head}");
        }
        // Chunked that is not the final coding does not frame the body.
        let h = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n").unwrap();
        assert!(matches!(h.state.framing, Framing::UntilClose));
    }

    #[test]
    fn the_connection_header_cannot_strip_the_length() {
        let h = parse(
            "HTTP/1.1 200 OK\r\nConnection: content-length, X-Hop\r\nX-Hop: 1\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\n",
        )
        .unwrap();
        assert!(h.length_framed());
        assert_eq!(names(&h), ["x-kept", "content-length"]);
    }

    #[test]
    fn lengths_that_disagree_are_refused_and_repeats_passed_once() {
        assert!(
            parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n").is_err()
        );
        let h = parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n").unwrap();
        assert_eq!(names(&h), ["content-length"]);
        assert!(matches!(h.state.framing, Framing::Length(2)));
    }
}
