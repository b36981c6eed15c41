//! Turns a streamed response body into items, one text line at a time:
//! the shared half of the NDJSON and SSE decoders.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use crate::{Error, Result};

/// A line-oriented format. `line` gets each line without its `\n` or
/// `\r\n`; `end` runs once when the body ends cleanly.
pub(crate) trait LineDecoder: Send + 'static {
    type Item: Send + 'static;

    fn line(&mut self, line: &str, out: &mut VecDeque<Result<Self::Item>>);

    fn end(&mut self, out: &mut VecDeque<Result<Self::Item>>);

    /// True once the decoder has seen its last item (a terminal event or an
    /// error): the rest of the body is not read.
    fn finished(&self) -> bool;
}

/// Splits on `\n`, so a `\n` inside a line can never be mistaken for the
/// end of one and chunk boundaries never matter.
#[derive(Default)]
pub(crate) struct Lines {
    buf: BytesMut,
}

impl Lines {
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete line, if one is buffered.
    pub(crate) fn next_line(&mut self) -> Option<Result<String>> {
        let at = self.buf.iter().position(|&b| b == b'\n')?;
        let mut line = self.buf.split_to(at + 1);
        line.truncate(at);
        if line.last() == Some(&b'\r') {
            line.truncate(at - 1);
        }
        Some(utf8(line.freeze()))
    }

    /// What is left when the body ends without a final newline.
    pub(crate) fn rest(&mut self) -> Option<Result<String>> {
        if self.buf.is_empty() {
            return None;
        }
        let rest = self.buf.split().freeze();
        Some(utf8(rest))
    }
}

fn utf8(bytes: Bytes) -> Result<String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| Error::internal("the hub sent a line that is not UTF-8"))
}

/// Decodes `body` with `decoder`, item by item, reading no further than
/// the consumer asks.
pub(crate) fn decode<D, S>(body: S, decoder: D) -> impl Stream<Item = Result<D::Item>> + Send
where
    D: LineDecoder,
    S: Stream<Item = Result<Bytes>> + Send + Unpin + 'static,
{
    struct State<D: LineDecoder, S> {
        body: Option<S>,
        lines: Lines,
        decoder: D,
        out: VecDeque<Result<D::Item>>,
    }
    let state = State {
        body: Some(body),
        lines: Lines::default(),
        decoder,
        out: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.out.pop_front() {
                return Some((item, st));
            }
            if st.decoder.finished() {
                return None;
            }
            if let Some(line) = st.lines.next_line() {
                match line {
                    Ok(line) => st.decoder.line(&line, &mut st.out),
                    Err(e) => {
                        st.body = None;
                        return Some((Err(e), st));
                    }
                }
                continue;
            }
            let body = st.body.as_mut()?;
            match body.next().await {
                Some(Ok(chunk)) => st.lines.push(&chunk),
                Some(Err(e)) => {
                    st.body = None;
                    return Some((Err(e), st));
                }
                None => {
                    st.body = None;
                    match st.lines.rest() {
                        Some(Ok(line)) => st.decoder.line(&line, &mut st.out),
                        Some(Err(e)) => st.out.push_back(Err(e)),
                        None => {}
                    }
                    if !st.decoder.finished() {
                        st.decoder.end(&mut st.out);
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_survive_any_chunking() {
        let mut lines = Lines::default();
        lines.push(b"ab");
        assert!(lines.next_line().is_none());
        lines.push(b"c\r\nd\n\nlast");
        assert_eq!(lines.next_line().unwrap().unwrap(), "abc");
        assert_eq!(lines.next_line().unwrap().unwrap(), "d");
        assert_eq!(lines.next_line().unwrap().unwrap(), "");
        assert!(lines.next_line().is_none());
        assert_eq!(lines.rest().unwrap().unwrap(), "last");
        assert!(lines.rest().is_none());
    }
}
