//! A response body read straight off an upstream connection, decoded by
//! its framing (length, chunked, or until close) as the client reads it;
//! the connection goes to its [`Keep`] when the body ends cleanly.

use std::{
    io,
    pin::Pin,
    task::{ready, Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;

use super::{ExchangeError, Keep, MAX_HEAD};
use crate::{count::ByteCount, pool::Idle, wire::poll_read_into};

#[derive(Debug, Clone, Copy)]
pub(super) enum Chunk {
    /// Reading a chunk-size line.
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines until the empty one.
    Trailers,
}

/// How a response body ends.
#[derive(Debug, Clone, Copy)]
pub(super) enum Framing {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

#[derive(Clone, Copy)]
pub struct FramingState {
    pub(super) framing: Framing,
    keep_alive: bool,
}

impl Framing {
    pub(super) fn with_keep_alive(self, keep_alive: bool) -> FramingState {
        FramingState {
            framing: self,
            keep_alive,
        }
    }
}

/// A response body read straight from the upstream connection; the
/// connection goes to `keep` when the body ends cleanly.
pub struct DirectBody<K> {
    stream: Option<TcpStream>,
    /// Taken when the body ends, whichever way.
    keep: Option<K>,
    buf: BytesMut,
    state: FramingState,
    done: bool,
    count: ByteCount,
}

impl<K: Keep> DirectBody<K> {
    pub(super) fn new(
        stream: TcpStream,
        keep: K,
        buf: BytesMut,
        state: FramingState,
        rx: Option<&Counter>,
    ) -> Self {
        let done = matches!(state.framing, Framing::Length(0));
        let mut b = Self {
            stream: Some(stream),
            keep: Some(keep),
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
        let keep = self.keep.take();
        if let (Some(stream), Some(keep)) = (self.stream.take(), keep) {
            if self.state.keep_alive && self.buf.is_empty() {
                let buf = std::mem::take(&mut self.buf);
                keep.keep(Idle { stream, buf });
            }
        }
    }

    /// Ends the body early: the connection is closed, not kept.
    fn fail(&mut self) {
        self.done = true;
        self.stream = None;
        self.keep = None;
    }

    /// The next piece of body already read from the sandbox, counted; no I/O.
    pub fn next_buffered(&mut self) -> Result<Option<Bytes>, ExchangeError> {
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

impl<K: Keep> Body for DirectBody<K> {
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
                    this.fail();
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let Some(stream) = this.stream.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(poll_read_into(stream, &mut this.buf, cx)) {
                Ok(0) => {
                    this.fail();
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
                    this.fail();
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

impl<K> DirectBody<K> {
    fn count_add(&mut self, n: usize) {
        self.count.add(n);
    }
}
