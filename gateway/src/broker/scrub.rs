//! Masking a secret's value in what the gateway relays back to the
//! sandbox: a server that echoes the request (a debugging endpoint, an
//! error message quoting the header) would otherwise hand the value to
//! the workload.
//!
//! Each occurrence becomes as many `*` as it has bytes, so lengths (and
//! `Content-Length`) stay right. Bodies are scanned as they stream, with
//! the last `len - 1` bytes of a chunk held back until the next one, so
//! an occurrence split across chunks is found too. A compressed body is
//! scanned as the bytes it is (the value would not appear in it as
//! such): a limit written in docs/security.md.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// Masks every value in `headers`.
pub fn headers(headers: &mut HeaderMap, values: &[String]) {
    for v in headers.values_mut() {
        let mut bytes = v.as_bytes().to_vec();
        if mask(&mut bytes, values) {
            if let Ok(n) = HeaderValue::from_bytes(&bytes) {
                *v = n;
            }
        }
    }
}

/// Masks every occurrence of every value in `buf`; whether any was.
fn mask(buf: &mut [u8], values: &[String]) -> bool {
    let mut hit = false;
    for v in values
        .iter()
        .map(String::as_bytes)
        .filter(|v| !v.is_empty())
    {
        let mut i = 0;
        while i + v.len() <= buf.len() {
            if &buf[i..i + v.len()] == v {
                buf[i..i + v.len()].fill(b'*');
                hit = true;
                i += v.len();
            } else {
                i += 1;
            }
        }
    }
    hit
}

/// A body with every value masked.
pub struct Body<B> {
    inner: B,
    values: Arc<Vec<String>>,
    /// Bytes held back: the start of a value may be at their end.
    held: BytesMut,
    keep: usize,
    done: bool,
}

impl<B> Body<B> {
    pub fn new(inner: B, values: Arc<Vec<String>>) -> Self {
        let keep = values
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(0)
            .saturating_sub(1);
        Body {
            inner,
            values,
            held: BytesMut::new(),
            keep,
            done: false,
        }
    }
}

impl<B> HttpBody for Body<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.values.is_empty() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        loop {
            if this.done {
                if this.held.is_empty() {
                    return Poll::Ready(None);
                }
                let mut rest = std::mem::take(&mut this.held);
                mask(&mut rest, &this.values);
                return Poll::Ready(Some(Ok(Frame::data(rest.freeze()))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.done = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.held.extend_from_slice(&data);
                        mask(&mut this.held, &this.values);
                        let out = this.held.len().saturating_sub(this.keep);
                        if out > 0 {
                            let chunk = this.held.split_to(out).freeze();
                            return Poll::Ready(Some(Ok(Frame::data(chunk))));
                        }
                    }
                    Err(frame) => {
                        // Trailers: masked like headers, after what is held.
                        let mut frame = frame;
                        if let Some(t) = frame.trailers_mut() {
                            headers(t, &this.values);
                        }
                        if !this.held.is_empty() {
                            // Rare (trailers): the held bytes go first.
                            let mut rest = std::mem::take(&mut this.held);
                            mask(&mut rest, &this.values);
                            this.done = true;
                            return Poll::Ready(Some(Ok(Frame::data(rest.freeze()))));
                        }
                        return Poll::Ready(Some(Ok(frame)));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.held.is_empty() || (self.held.is_empty() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // Masking keeps lengths.
        let mut h = self.inner.size_hint();
        let held = self.held.len() as u64;
        h.set_lower(h.lower() + held);
        if let Some(u) = h.upper() {
            h.set_upper(u + held);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::collections::VecDeque;

    /// Chunks as a body.
    struct Chunks(VecDeque<Bytes>);

    impl HttpBody for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }

    #[tokio::test]
    async fn a_value_split_across_chunks_is_masked_and_lengths_kept() {
        let chunks = ["echo: Bearer sk-re", "al-key and sk-", "real-key", "!"];
        let inner = Chunks(chunks.iter().map(|c| Bytes::from(*c)).collect());
        let body = Body::new(inner, Arc::new(vec!["sk-real-key".into()]));
        let out = body.collect().await.unwrap().to_bytes();
        assert_eq!(&out[..], b"echo: Bearer *********** and ***********!");
        let mut h = HeaderMap::new();
        h.insert("x-echo", "Bearer sk-real-key".parse().unwrap());
        headers(&mut h, &["sk-real-key".into()]);
        assert_eq!(h["x-echo"], "Bearer ***********");
    }
}
