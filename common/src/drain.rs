//! Reading the rest of a refused request body, once for every binary.
//!
//! A server that refuses an upload early (too large, no space left, a bad
//! path) answers before the client finished sending. Closing the
//! connection then makes the client's next write fail with a broken pipe
//! or a reset, and it never reads the answer; so the rest of the body is
//! read and dropped first. Always bounded, in bytes and in time, so a huge
//! or endless body still ends the connection: each caller names its own
//! bound next to the place it drains.
//!
//! A leaf: it knows streams and bytes, nothing of HTTP or of any crate of
//! the workspace.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;

/// Reads and drops `body` until its end, an error, `max_bytes` read or
/// `timeout` passed, whichever comes first.
pub async fn drain<S, B, E>(body: S, max_bytes: u64, timeout: Duration)
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    let mut body = std::pin::pin!(body);
    let mut draining = Draining::new(max_bytes, timeout);
    std::future::poll_fn(|cx| {
        draining.poll(cx, |cx| match body.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => Poll::Ready(Some(chunk.as_ref().len() as u64)),
            Poll::Ready(_) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
    })
    .await
}

/// [`drain`] as a state to poll, for a body that is itself polled (a
/// proxy's request body on its way upstream) rather than awaited.
#[derive(Debug)]
pub struct Draining {
    left: u64,
    timeout: Duration,
    /// Started on the first poll, so that a `Draining` can be made outside
    /// a runtime.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Draining {
    pub fn new(max_bytes: u64, timeout: Duration) -> Self {
        Self {
            left: max_bytes,
            timeout,
            deadline: None,
        }
    }

    /// Polls `next` (the length of the next chunk read, `None` at the
    /// body's end or on an error) until the drain is over: `Ready` once
    /// the body ended or failed, more than `max_bytes` were read, or the
    /// timeout passed.
    pub fn poll(
        &mut self,
        cx: &mut Context<'_>,
        mut next: impl FnMut(&mut Context<'_>) -> Poll<Option<u64>>,
    ) -> Poll<()> {
        let timeout = self.timeout;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        loop {
            match next(cx) {
                Poll::Ready(Some(n)) if n <= self.left => self.left -= n,
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A body handed on to a receiver, and what the receiver left of it:
/// `split(body)` gives the receiver's end and an [`Unread`] to
/// [`drain`](Unread::drain) once the receiver has answered.
pub fn split<S>(body: S) -> (Shared<S>, Unread<S>) {
    let shared = Shared(Arc::new(Mutex::new(Box::pin(body))));
    (shared.clone(), Unread(shared))
}

/// One end of a [`split`] body. Never contended: the two ends poll one
/// after the other.
pub struct Shared<S>(Arc<Mutex<Pin<Box<S>>>>);

impl<S> Clone for Shared<S> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<S: Stream> Stream for Shared<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        inner.as_mut().poll_next(cx)
    }
}

/// What a receiver left of a [`split`] body.
pub struct Unread<S>(Shared<S>);

impl<S, B, E> Unread<S>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    /// Reads and drops the rest: see [`drain`].
    pub async fn drain(self, max_bytes: u64, timeout: Duration) {
        drain(self.0, max_bytes, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use futures::{stream, StreamExt};

    use super::*;

    type Chunk = Result<Vec<u8>, ()>;

    fn chunks(sizes: &[usize]) -> Vec<Chunk> {
        sizes.iter().map(|n| Ok(vec![b'x'; *n])).collect()
    }

    /// How many items of `items` a drain with `max_bytes` pulls.
    async fn pulled(items: Vec<Chunk>, max_bytes: u64) -> usize {
        let n = Arc::new(Mutex::new(0));
        let counted = n.clone();
        let body = stream::iter(items).inspect(move |_| *counted.lock().unwrap() += 1);
        drain(body, max_bytes, Duration::from_secs(5)).await;
        let pulled = *n.lock().unwrap();
        pulled
    }

    #[tokio::test]
    async fn a_body_within_the_bound_is_read_to_its_end() {
        assert_eq!(pulled(chunks(&[4, 4, 2]), 10).await, 3);
    }

    #[tokio::test]
    async fn a_body_past_the_bound_is_read_no_further() {
        // 4 + 4, then the third chunk passes 10: nothing after it is read.
        assert_eq!(pulled(chunks(&[4, 4, 4, 4, 4]), 10).await, 3);
    }

    #[tokio::test]
    async fn an_error_ends_the_drain() {
        let items = vec![Ok(vec![1]), Err(()), Ok(vec![2])];
        assert_eq!(pulled(items, 10).await, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_body_is_given_up_after_the_timeout() {
        let body = stream::pending::<Chunk>();
        let started = tokio::time::Instant::now();
        drain(body, 10, Duration::from_secs(3)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test]
    async fn the_receiver_reads_part_and_the_rest_is_drained() {
        let n = Arc::new(Mutex::new(0));
        let counted = n.clone();
        let body =
            stream::iter(chunks(&[1, 1, 1, 1])).inspect(move |_| *counted.lock().unwrap() += 1);
        let (mut theirs, rest) = split(body);
        assert!(theirs.next().await.is_some());
        rest.drain(10, Duration::from_secs(5)).await;
        assert_eq!(*n.lock().unwrap(), 4);
        assert!(theirs.next().await.is_none());
    }
}
