//! The HTTP/1.1 wire codec both sides share: reading into a buffer's spare
//! room, and writing status lines, header lines, dates and chunks. Only
//! bytes and buffers here; parsing a response head is the outbound side's
//! (`outbound::head`), a request head the handler's.

use std::{
    io,
    pin::Pin,
    task::{ready, Context, Poll},
    time::SystemTime,
};

use bytes::{BufMut, BytesMut};
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

/// How much room a read gets when a buffer runs short.
pub const READ_CHUNK: usize = 16 * 1024;

/// Reads what is there into `buf`'s spare capacity; `Ok(0)`: end of stream.
pub async fn read_some(s: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| poll_read_into(s, buf, cx)).await
}

/// One `name: value` header line.
pub fn put_header(buf: &mut BytesMut, name: &[u8], value: &[u8]) {
    buf.put_slice(name);
    buf.put_slice(b": ");
    buf.put_slice(value);
    buf.put_slice(b"\r\n");
}

/// The chunk that ends a chunked body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// A chunk's size line.
pub fn put_chunk_size(buf: &mut BytesMut, n: usize) {
    use std::fmt::Write;
    let _ = write!(buf, "{n:x}\r\n");
}

/// Writes `data` as it is, or as one chunk of a chunked body.
pub async fn write_piece(
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

/// Polls one read into `buf`'s spare capacity (growing it when short);
/// `Ok(0)`: end of stream.
pub fn poll_read_into(
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

/// `HTTP/1.1 <code> <reason>\r\n`.
pub fn status_line(out: &mut BytesMut, code: u16) {
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
pub fn put_date(out: &mut BytesMut) {
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

/// `data` as it is, or as one chunk of a chunked body, into `out`.
pub fn put_piece(out: &mut BytesMut, data: &[u8], chunked: bool) {
    if chunked {
        put_chunk_size(out, data.len());
        out.put_slice(data);
        out.put_slice(b"\r\n");
    } else {
        out.put_slice(data);
    }
}
