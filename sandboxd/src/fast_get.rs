//! The plain download, `GET /v1/files/{path}` of a whole regular file,
//! served without hyper: the head is written here, a small body is read
//! behind it and leaves in the same write, and a large one goes from the
//! page cache to the socket with `sendfile(2)` (Unix sockets) or in chunks
//! read one ahead (TCP; see [`Socket::SENDFILE`]). The hyper path
//! costs a blocking-pool round trip per 256 KiB and a task per connection
//! on top: a 4 KiB file took 5–7× as long that way.
//!
//! Only the 200 of a whole regular file is served here. Every other
//! request (a range, a conditional, a listing, HEAD, another route, h2c,
//! HTTP/1.0, a request with a body, a refused token, a missing file,
//! anything malformed) goes, with the bytes already read, to hyper and the
//! axum app for the rest of the connection's life, so every other answer
//! has one implementation (`files.rs`, `rest.rs`). The head written here
//! is the one hyper writes for the same request, header for header.
//!
//! The same checks as the axum path: the token (`rest::check_presented_values`),
//! the path's confinement and the open beneath the root
//! (`files::request_path`, `files::open_file`), the request metric. Off
//! while traces are exported, since this path opens no server span.

use std::{
    future::Future,
    io,
    os::fd::{AsFd, BorrowedFd},
    time::{Duration, SystemTime},
};

use bytes::{Buf, BufMut, BytesMut};
use futures::StreamExt;
use rustix::fs as rfs;
use sandhub_api::sandboxd::ROUTED_AUTH_HEADER;
use sandhub_http1::inbound::{request_head, Parsed, Prefixed, MAX_HEADERS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::{files, rest, Daemon};

/// Largest request head read here; a longer one goes to hyper, which decides.
const MAX_HEAD: usize = 64 * 1024;
const READ_CHUNK: usize = 8 * 1024;
/// A body at most this large is read behind the head and leaves with it in
/// one write: for a small file, one `sendfile` more costs more than the copy.
const COALESCE: u64 = 64 * 1024;
/// The most one `sendfile` call moves, so one large download does not hold
/// its runtime thread from the other connections for long.
const SENDFILE_MAX: usize = 4 << 20;

/// A connection's socket, as the fast path needs it: its descriptor for
/// `sendfile`, and tokio's readiness for it.
pub trait Socket: AsyncRead + AsyncWrite + AsFd + Unpin + Send + Sync + 'static {
    /// Whether large bodies go out with `sendfile` (else read by the
    /// blocking pool, one chunk ahead, as the hyper path does). Measured on 256 MiB downloads (docs/benchmarks.md):
    /// on a Unix socket (the hub's local backend) `sendfile` costs a third of
    /// the daemon's CPU of the hyper path for 1.2× its throughput; on TCP it
    /// was slower than the copy, which overlaps the file's reads with the
    /// sends on the second core, so TCP copies.
    const SENDFILE: bool;

    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Runs `f` (a write on the descriptor); `WouldBlock` clears readiness.
    fn try_write<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

impl Socket for tokio::net::TcpStream {
    const SENDFILE: bool = false;
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
        tokio::net::TcpStream::writable(self)
    }
    fn try_write<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(tokio::io::Interest::WRITABLE, f)
    }
}

impl Socket for tokio::net::UnixStream {
    const SENDFILE: bool = true;
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
        tokio::net::UnixStream::writable(self)
    }
    fn try_write<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(tokio::io::Interest::WRITABLE, f)
    }
}

/// How a connection left the fast path.
pub enum Outcome<S> {
    /// Done: closed by the client, on timeout, after an error or at shutdown.
    Closed,
    /// For hyper from here on; the stream replays what was read but not served.
    Fallback(Prefixed<S>),
}

/// Whether the fast path is on for this process's REST connections.
pub fn enabled() -> bool {
    !sandhub_telemetry::enabled()
}

/// Serves `stream`'s plain downloads until it closes or sends anything
/// else. Between requests it closes at `stop`, and after the daemon's
/// idle timeout without a whole head (hyper's `header_read_timeout`).
pub async fn serve<S: Socket>(
    mut stream: S,
    daemon: &Daemon,
    stop: &CancellationToken,
) -> Outcome<S> {
    let idle = daemon.config.http_idle_timeout;
    let mut inbuf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        let download = loop {
            match plan(&inbuf, daemon) {
                Parsed::Serve(download) => break download,
                Parsed::Partial if inbuf.len() < MAX_HEAD => {}
                Parsed::Partial | Parsed::Fallback => {
                    return Outcome::Fallback(Prefixed::new(inbuf, stream))
                }
            }
            let read = tokio::select! {
                () = stop.cancelled() => return Outcome::Closed,
                read = tokio::time::timeout(idle, stream.read_buf(&mut inbuf)) => read,
            };
            match read {
                Ok(Ok(1..)) => {}
                _ => return Outcome::Closed,
            }
        };
        inbuf.advance(download.head_len);
        daemon.metrics.count_http("GET".into(), 200);
        daemon.metrics.fast_downloads.inc();
        let keep_alive = download.keep_alive;
        match send(&mut stream, *download, idle).await {
            Ok(()) if keep_alive && !stop.is_cancelled() => {}
            Ok(()) => {
                let _ = stream.shutdown().await;
                return Outcome::Closed;
            }
            Err(e) => {
                // The head promised the whole file: a short body must end
                // the connection, so the client sees it was cut.
                tracing::debug!(error = %e, "download ended early");
                return Outcome::Closed;
            }
        }
    }
}

/// A request this path serves: the file, opened and statted.
struct Download {
    head_len: usize,
    file: std::fs::File,
    len: u64,
    modified: SystemTime,
    keep_alive: bool,
}

/// What the bytes so far say: a whole head for a plain download, not a
/// whole head yet, or anything else (hyper's).
fn plan(buf: &[u8], daemon: &Daemon) -> Parsed<Download> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let head = match request_head(buf, &mut headers) {
        Ok(head) => head,
        Err(parsed) => return parsed,
    };
    if head.method != "GET" || head.target.contains('#') {
        return Parsed::Fallback;
    }
    let (path, query) = match head.target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (head.target, None),
    };
    if !path.starts_with("/v1/files/") || !files::is_plain_read_query(query) {
        return Parsed::Fallback;
    }
    let (mut authorization, mut routed, mut keep_alive) = (None, None, true);
    for h in head.headers.iter() {
        let name = h.name;
        let is = |other: &str| name.eq_ignore_ascii_case(other);
        if is("range")
            || is("if-modified-since")
            || is("transfer-encoding")
            || is("expect")
            || is("upgrade")
            || (is("content-length") && h.value != b"0")
        {
            return Parsed::Fallback;
        } else if is("authorization") {
            authorization.get_or_insert(h.value);
        } else if is(ROUTED_AUTH_HEADER) {
            routed.get_or_insert(h.value);
        } else if is("connection") && names_close(h.value) {
            keep_alive = false;
        }
    }
    if let Some(auth) = &daemon.auth {
        if rest::check_presented_values(auth, authorization, routed).is_err() {
            return Parsed::Fallback;
        }
    }
    let Ok(rel) = files::request_path(path, files::PREFIX) else {
        return Parsed::Fallback;
    };
    let Ok((file, st)) = files::open_file(&daemon.root(), &rel) else {
        return Parsed::Fallback;
    };
    Parsed::Serve(Box::new(Download {
        head_len: head.len,
        file,
        len: st.st_size as u64,
        modified: files::mtime(&st),
        keep_alive,
    }))
}

fn names_close(value: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// Writes the head and the body.
async fn send<S: Socket>(stream: &mut S, d: Download, idle: Duration) -> io::Result<()> {
    let mut out = BytesMut::with_capacity(256);
    if d.len <= COALESCE {
        let mut body = vec![0u8; d.len as usize];
        let got = read_at(&d.file, &mut body, 0)?;
        write_head(&mut out, got as u64, &d);
        out.put_slice(&body[..got]);
        return with_deadline(idle, stream.write_all(&out)).await;
    }
    write_head(&mut out, d.len, &d);
    with_deadline(idle, stream.write_all(&out)).await?;
    if !S::SENDFILE {
        return stream_rest(stream, d.file, d.len, idle).await;
    }
    let mut offset = 0u64;
    while offset < d.len {
        let want = (d.len - offset).min(SENDFILE_MAX as u64) as usize;
        let sent = match with_deadline(idle, sendfile(stream, &d.file, &mut offset, want)).await {
            // A file system without sendfile for this file: copy the rest.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && offset == 0 => {
                return stream_rest(stream, d.file, d.len, idle).await
            }
            other => other?,
        };
        if sent == 0 {
            // The file shrank after the head announced its length.
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// hyper's head for the same answer: the same headers, in the same order,
/// lower case, `date` last.
fn write_head(out: &mut BytesMut, len: u64, d: &Download) {
    out.put_slice(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: ");
    out.put_slice(len.to_string().as_bytes());
    out.put_slice(b"\r\nlast-modified: ");
    out.put_slice(httpdate::fmt_http_date(d.modified).as_bytes());
    out.put_slice(b"\r\naccept-ranges: bytes\r\n");
    if !d.keep_alive {
        out.put_slice(b"connection: close\r\n");
    }
    out.put_slice(b"date: ");
    out.put_slice(httpdate::fmt_http_date(SystemTime::now()).as_bytes());
    out.put_slice(b"\r\n\r\n");
}

/// One `sendfile` of up to `want` bytes once the socket takes more.
async fn sendfile<S: Socket>(
    stream: &S,
    file: &std::fs::File,
    offset: &mut u64,
    want: usize,
) -> io::Result<usize> {
    loop {
        stream.writable().await?;
        let fd: BorrowedFd<'_> = stream.as_fd();
        match stream.try_write(|| Ok(rfs::sendfile(fd, file, Some(&mut *offset), want)?)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// The body as the hyper path reads it (`transfer::read_body`: the
/// blocking pool reads the next chunk while this one is written), for TCP
/// and for a file `sendfile` cannot read. On two cores the overlap of the
/// read with the send is worth more than the copy `sendfile` saves.
async fn stream_rest<S: Socket>(
    stream: &mut S,
    file: std::fs::File,
    len: u64,
    idle: Duration,
) -> io::Result<()> {
    let chunks = crate::transfer::read_body(file, 0, len);
    futures::pin_mut!(chunks);
    while let Some(chunk) = chunks.next().await {
        with_deadline(idle, stream.write_all(&chunk?)).await?;
    }
    Ok(())
}

/// Fills `buf` from `offset`, short only at the end of the file.
fn read_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::pread(file, &mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// A write that makes no progress for `idle` ends the connection: a client
/// that stops reading must not hold its descriptor and file for ever.
async fn with_deadline<T>(
    idle: Duration,
    write: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(idle, write)
        .await
        .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
}
