//! What the router answers with: [`ProxyBody`] (a streamed upstream body,
//! a body read straight off a pooled sandbox connection, a small body of its
//! own, or a gRPC body bounded by the RPC's deadline) and the router's own
//! small answers, JSON and gRPC trailers-only.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::time::Sleep;

use crate::{
    body::{BoxError, ByteCount},
    grpc_status,
    http1::outbound::DirectBody,
};

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
    /// Read straight from a pooled sandbox connection (see [`crate::http1::outbound`]).
    Direct(DirectBody),
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
            count: ByteCount::new(Some(rx)),
        }
    }
    pub fn grpc(inner: Incoming, rx: &Counter, deadline: Option<Duration>) -> Self {
        Self::Grpc {
            inner,
            count: ByteCount::new(Some(rx)),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep(d))),
            done: false,
        }
    }
}

fn deadline_trailers() -> HeaderMap {
    let mut t = HeaderMap::with_capacity(2);
    grpc_status::put(
        &mut t,
        grpc_status::code::DEADLINE_EXCEEDED,
        "Deadline exceeded (router)",
    );
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

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(ProxyBody::full(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A gRPC answer with no messages: HTTP 200 and the status in the one
/// HEADERS frame (which then ends the stream).
pub fn grpc_trailers_only(code: u8, message: &str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::empty());
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    grpc_status::put(h, code, message);
    resp
}
