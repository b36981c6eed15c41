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
use sandhub_common::drain::Draining;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The client's request body on its way upstream, with the optional
/// `--max-request-body-bytes` limit enforced as it streams.
pub struct RequestBody {
    inner: Incoming,
    remaining: u64,
    count: ByteCount,
    /// Past the limit: the rest being read and dropped (see [`DRAIN_CAP`]).
    draining: Option<Draining>,
}

/// The bound on reading a refused request body, the same on the fast
/// path and hyper's (see [`sandhub_http1::count`]).
pub use sandhub_http1::{ByteCount, DRAIN_CAP, DRAIN_TIMEOUT};

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
            count: ByteCount::new(Some(tx)),
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
        if let Some(draining) = this.draining.as_mut() {
            // Whatever ends the drain (the body's end, an error, the cap,
            // the timeout), the answer is the same: too large.
            let inner = &mut this.inner;
            return match draining.poll(cx, |cx| match Pin::new(&mut *inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    Poll::Ready(Some(frame.data_ref().map_or(0, |d| d.len() as u64)))
                }
                Poll::Ready(_) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTooLarge)))),
                Poll::Pending => Poll::Pending,
            };
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > this.remaining {
                        this.draining = Some(Draining::new(DRAIN_CAP, DRAIN_TIMEOUT));
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
