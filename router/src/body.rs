//! Body pieces of the hot path: the client's request body on its way
//! upstream, and the byte counting every body does. Bodies stream frame by
//! frame; nothing is buffered. Byte counts are summed per body and added to
//! the shared counters once, on drop, so the hot loop touches no shared
//! cache line. A leaf: nothing of the proxy is imported here.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prometheus_client::metrics::counter::Counter;

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
    /// Past the limit: bytes read and dropped since (see [`DRAIN_CAP`]).
    draining: Option<u64>,
}

/// How much of a too-large body is still read (and dropped) before the 413.
/// A client still sending when the router answers and closes would get a
/// reset instead of the answer; reading the rest first lets it read the
/// 413. Bounded, so a huge or endless body still ends the connection.
pub const DRAIN_CAP: u64 = 1 << 20;

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
            draining: None,
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
        if let Some(drained) = this.draining.as_mut() {
            // Whatever ends the drain (the body's end, an error, the cap),
            // the answer is the same: too large.
            loop {
                match Pin::new(&mut this.inner).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        *drained += frame.data_ref().map_or(0, |d| d.len() as u64);
                        if *drained <= DRAIN_CAP {
                            continue;
                        }
                    }
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(_) => {}
                }
                return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > this.remaining {
                        this.draining = Some(0);
                        return self.poll_frame(cx);
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
