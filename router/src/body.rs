//! Body types of the hot path. Bodies stream frame by frame; nothing is
//! buffered. Byte counts are summed per body and added to the shared
//! counters once, on drop, so the hot loop touches no shared cache line.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::time::Sleep;

use crate::error::{encode_grpc_message, grpc_code};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Adds its bytes to a counter when dropped.
pub struct ByteCount {
    n: u64,
    counter: Counter,
}

impl ByteCount {
    pub fn new(counter: &Counter) -> Self {
        Self {
            n: 0,
            counter: counter.clone(),
        }
    }
    pub fn add(&mut self, n: usize) {
        self.n += n as u64;
    }
}

impl Drop for ByteCount {
    fn drop(&mut self) {
        if self.n > 0 {
            self.counter.inc_by(self.n);
        }
    }
}

/// The client's request body on its way upstream, with the optional
/// `--max-request-body-bytes` limit enforced as it streams.
pub struct RequestBody {
    inner: Incoming,
    remaining: u64,
    count: ByteCount,
}

/// Returned (as the body error) when a streaming body passes the limit.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds --max-request-body-bytes")]
pub struct BodyTooLarge;

impl RequestBody {
    /// `limit == 0`: unlimited.
    pub fn new(inner: Incoming, limit: u64, tx: &Counter) -> Self {
        let remaining = if limit == 0 { u64::MAX } else { limit };
        Self {
            inner,
            remaining,
            count: ByteCount::new(tx),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > this.remaining {
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                    }
                    this.remaining -= n;
                    this.count.add(data.len());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What the router answers with: a streamed upstream body, a small body of
/// its own, or a gRPC response body bounded by the RPC's deadline.
pub enum ProxyBody {
    Empty,
    Full(Option<Bytes>),
    Upstream {
        inner: Incoming,
        count: ByteCount,
    },
    Grpc {
        inner: Incoming,
        count: ByteCount,
        deadline: Option<Pin<Box<Sleep>>>,
        done: bool,
    },
    /// Read straight from a pooled sandbox connection (see [`crate::h1`]).
    Direct(crate::h1::DirectBody),
}

impl ProxyBody {
    pub fn empty() -> Self {
        Self::Empty
    }
    pub fn full(bytes: Bytes) -> Self {
        Self::Full(Some(bytes))
    }
    pub fn upstream(inner: Incoming, rx: &Counter) -> Self {
        Self::Upstream {
            inner,
            count: ByteCount::new(rx),
        }
    }
    pub fn grpc(inner: Incoming, rx: &Counter, deadline: Option<Duration>) -> Self {
        Self::Grpc {
            inner,
            count: ByteCount::new(rx),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep(d))),
            done: false,
        }
    }
}

fn deadline_trailers() -> HeaderMap {
    let mut t = HeaderMap::with_capacity(2);
    t.insert(
        "grpc-status",
        HeaderValue::from(u16::from(grpc_code::DEADLINE_EXCEEDED)),
    );
    if let Ok(v) = HeaderValue::from_str(&encode_grpc_message("Deadline exceeded (router)")) {
        t.insert("grpc-message", v);
    }
    t
}

fn count_frame(count: &mut ByteCount, frame: &Frame<Bytes>) {
    if let Some(data) = frame.data_ref() {
        count.add(data.len());
    }
}

fn boxed<E: Into<BoxError>>(
    p: Poll<Option<Result<Frame<Bytes>, E>>>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    p.map(|o| o.map(|r| r.map_err(Into::into)))
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Direct(b) => boxed(Pin::new(b).poll_frame(cx)),
            Self::Empty => Poll::Ready(None),
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Self::Upstream { inner, count } => {
                let polled = Pin::new(inner).poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    count_frame(count, frame);
                }
                boxed(polled)
            }
            Self::Grpc {
                inner,
                count,
                deadline,
                done,
            } => {
                if *done {
                    return Poll::Ready(None);
                }
                if let Poll::Ready(polled) = Pin::new(inner).poll_frame(cx) {
                    match &polled {
                        Some(Ok(frame)) => count_frame(count, frame),
                        _ => *done = true,
                    }
                    return boxed(Poll::Ready(polled));
                }
                if let Some(sleep) = deadline {
                    if sleep.as_mut().poll(cx).is_ready() {
                        // The backend gets a RST_STREAM when `inner` drops.
                        *done = true;
                        return Poll::Ready(Some(Ok(Frame::trailers(deadline_trailers()))));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Full(b) => b.is_none(),
            Self::Upstream { inner, .. } => inner.is_end_stream(),
            Self::Grpc { inner, done, .. } => *done || inner.is_end_stream(),
            Self::Direct(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Upstream { inner, .. } => inner.size_hint(),
            Self::Grpc { .. } => SizeHint::default(),
            Self::Direct(b) => b.size_hint(),
        }
    }
}
