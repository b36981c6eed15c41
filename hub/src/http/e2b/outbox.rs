//! A byte-bounded queue of enveloped frames from a process's pump to one
//! server stream (the starting call, or one `Connect`ed watcher).
//!
//! The budget is in bytes, not messages: output chunks vary in size, and a
//! bound in messages lets one stalled reader pin messages × largest chunk.
//! The queue belongs to both ends, so the pump can empty it (a watcher cut
//! off, a sandbox deleted) while its reader is stalled and never polled:
//! what a reader pins is freed when the pump says so, not when the
//! reader's connection finally goes away.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use futures::Stream;
use sandhub_api::error::Code;
use sandhub_client::Error;
use tokio::sync::Notify;

/// The pump's end of one outbox.
pub struct Writer {
    shared: Arc<Shared>,
}

/// The stream's end of one outbox (see [`Reader::into_stream`]).
pub struct Reader {
    shared: Arc<Shared>,
}

struct Shared {
    budget: usize,
    state: Mutex<State>,
    /// A frame or the end is there (one reader: a stored permit is enough).
    readable: Notify,
    /// Room was made, or the reader left (one writer, likewise).
    writable: Notify,
}

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    bytes: usize,
    /// Set once: how the stream ends after its queued frames
    /// (`Some(None)`: cleanly).
    end: Option<Option<Error>>,
    reader_gone: bool,
}

impl State {
    fn open(&self) -> bool {
        self.end.is_none() && !self.reader_gone
    }

    /// Whether `len` more bytes stay within `budget`. One frame larger than
    /// the whole budget still goes into an empty queue, or it never could.
    fn fits(&self, len: usize, budget: usize) -> bool {
        self.frames.is_empty() || self.bytes + len <= budget
    }

    fn push(&mut self, frame: Bytes) {
        self.bytes += frame.len();
        self.frames.push_back(frame);
    }

    fn clear(&mut self) {
        self.frames = VecDeque::new();
        self.bytes = 0;
    }
}

/// A new outbox that holds at most `budget` bytes of queued frames.
pub fn outbox(budget: usize) -> (Writer, Reader) {
    let shared = Arc::new(Shared {
        budget,
        state: Mutex::new(State::default()),
        readable: Notify::new(),
        writable: Notify::new(),
    });
    (
        Writer {
            shared: shared.clone(),
        },
        Reader { shared },
    )
}

/// The error a watcher that fell behind its budget ends with.
pub fn fell_behind(budget: usize) -> Error {
    Error::new(
        Code::ResourceExhausted,
        format!(
            "this stream fell more than {budget} bytes behind the process's output; connect again"
        ),
    )
}

impl Writer {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another holder panicked between two
        // plain field updates; the queue is still consistent.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Queues `frame` if it fits. One that would not ends the stream at
    /// once instead (what is queued is dropped, the reader gets
    /// `resource_exhausted`): a reader that fell this far behind is cut
    /// off rather than allowed to hold the pump or the hub's memory.
    /// Whether the reader is still fed.
    pub fn offer(&self, frame: Bytes) -> bool {
        let mut state = self.state();
        if !state.open() {
            return false;
        }
        if !state.fits(frame.len(), self.shared.budget) {
            state.clear();
            state.end = Some(Some(fell_behind(self.shared.budget)));
            drop(state);
            self.shared.readable.notify_one();
            return false;
        }
        state.push(frame);
        drop(state);
        self.shared.readable.notify_one();
        true
    }

    /// Queues `frame`, waiting for room (backpressure on the pump).
    /// `false` once the reader is gone or the stream has ended.
    pub async fn push(&self, frame: Bytes) -> bool {
        loop {
            {
                let mut state = self.state();
                if !state.open() {
                    return false;
                }
                if state.fits(frame.len(), self.shared.budget) {
                    state.push(frame);
                    drop(state);
                    self.shared.readable.notify_one();
                    return true;
                }
            }
            self.shared.writable.notified().await;
        }
    }

    /// Ends the stream after the frames already queued.
    pub fn finish(&self, error: Option<Error>) {
        let mut state = self.state();
        if state.end.is_none() {
            state.end = Some(error);
        }
        drop(state);
        self.shared.readable.notify_one();
    }

    /// Ends the stream now: queued frames are dropped unsent.
    pub fn abort(&self, error: Error) {
        let mut state = self.state();
        state.clear();
        if state.end.is_none() {
            state.end = Some(Some(error));
        }
        drop(state);
        self.shared.readable.notify_one();
    }
}

impl Drop for Writer {
    /// A pump that ends without saying how (a panic, an aborted task)
    /// still ends its reader's stream, with an error.
    fn drop(&mut self) {
        if self.state().end.is_none() {
            self.finish(Some(Error::internal(
                "the process's output stopped without an end",
            )));
        }
    }
}

impl Reader {
    /// The queued frames as they come, then `Err` if the stream ended with
    /// an error. Dropping the stream tells the pump the reader left.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, Error>> + Send + 'static {
        async_stream::stream! {
            loop {
                let next = self.take();
                match next {
                    Some(Some(item)) => yield item,
                    Some(None) => return,
                    None => self.shared.readable.notified().await,
                }
            }
        }
    }

    /// The next frame or end: `Some(Some(_))` to yield, `Some(None)` to
    /// stop, `None` to wait.
    fn take(&self) -> Option<Option<Result<Bytes, Error>>> {
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(frame) = state.frames.pop_front() {
            state.bytes -= frame.len();
            drop(state);
            self.shared.writable.notify_one();
            return Some(Some(Ok(frame)));
        }
        state.end.as_mut().map(|end| end.take().map(Err))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        state.reader_gone = true;
        state.clear();
        drop(state);
        self.shared.writable.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    fn frame(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    #[tokio::test]
    async fn frames_arrive_in_order_then_the_clean_end() {
        let (w, r) = outbox(100);
        assert!(w.offer(frame(10)));
        assert!(w.push(frame(20)).await);
        w.finish(None);
        let got: Vec<_> = r.into_stream().collect().await;
        let lens: Vec<_> = got.iter().map(|f| f.as_ref().unwrap().len()).collect();
        assert_eq!(lens, [10, 20]);
    }

    #[tokio::test]
    async fn a_watcher_past_its_budget_is_cut_with_resource_exhausted_and_emptied() {
        let (w, r) = outbox(100);
        assert!(w.offer(frame(60)));
        assert!(!w.offer(frame(60)), "the second frame overflows");
        assert_eq!(w.state().bytes, 0, "what it held is freed at once");
        assert!(!w.offer(frame(1)), "a cut reader is fed no more");
        let got: Vec<_> = r.into_stream().collect().await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err().code, Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn one_frame_over_the_budget_still_goes_into_an_empty_queue() {
        let (w, r) = outbox(10);
        assert!(w.offer(frame(50)));
        w.finish(None);
        let got: Vec<_> = r.into_stream().collect().await;
        assert_eq!(got.len(), 1);
        assert!(got[0].is_ok());
    }

    #[tokio::test]
    async fn push_waits_for_room_and_gives_up_when_the_reader_leaves() {
        let (w, r) = outbox(100);
        assert!(w.push(frame(80)).await);
        let blocked = tokio::time::timeout(Duration::from_millis(50), w.push(frame(80))).await;
        assert!(blocked.is_err(), "no room: the pump waits");
        let mut stream = Box::pin(r.into_stream());
        assert_eq!(stream.next().await.unwrap().unwrap().len(), 80);
        assert!(w.push(frame(80)).await, "room again once read");
        drop(stream);
        assert_eq!(w.state().bytes, 0, "a reader that left frees its queue");
        assert!(!w.push(frame(80)).await);
    }

    #[tokio::test]
    async fn abort_drops_the_queue_and_ends_with_the_error() {
        let (w, r) = outbox(100);
        assert!(w.offer(frame(50)));
        w.abort(Error::new(Code::NotFound, "deleted"));
        assert_eq!(w.state().bytes, 0);
        let got: Vec<_> = r.into_stream().collect().await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].as_ref().unwrap_err().code, Code::NotFound);
    }

    #[tokio::test]
    async fn a_writer_dropped_without_an_end_ends_the_stream_with_an_error() {
        let (w, r) = outbox(100);
        drop(w);
        let got: Vec<_> = r.into_stream().collect().await;
        assert_eq!(got[0].as_ref().unwrap_err().code, Code::Internal);
    }
}
