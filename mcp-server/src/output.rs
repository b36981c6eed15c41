//! Bounding what reaches the model: command output is cut to a cap, and a
//! background process's output waits in a bounded buffer until it is read.
//!
//! Both keep text valid UTF-8 across cuts: a chunk boundary or a cap may fall
//! inside a multi-byte character, and a replacement character there would
//! read as corrupted output.

use std::collections::VecDeque;

/// `s` cut to at most `max` bytes, keeping its head and its tail (a
/// command's last lines usually say why it failed), with a marker where
/// bytes were left out. `None` when `s` already fits.
pub fn truncate_middle(s: &str, max: usize) -> Option<String> {
    if s.len() <= max {
        return None;
    }
    let budget = max.saturating_sub(MARKER_MAX);
    let head_end = floor_char_boundary(s, budget / 2);
    let tail_start = ceil_char_boundary(s, s.len() - (budget - budget / 2));
    let omitted = tail_start - head_end;
    Some(format!(
        "{}\n[... {omitted} bytes omitted ...]\n{}",
        &s[..head_end],
        &s[tail_start..]
    ))
}

/// The longest marker `truncate_middle` writes (a 20-digit count).
const MARKER_MAX: usize = "\n[...  bytes omitted ...]\n".len() + 20;

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Output of one stream of a running process that nobody has read yet.
/// Holds at most `capacity` bytes: when the process writes faster than it
/// is read, the oldest bytes go (the newest say most about where it is now)
/// and the next read reports how many were dropped.
#[derive(Debug)]
pub struct OutputBuffer {
    data: VecDeque<u8>,
    capacity: usize,
    dropped: u64,
}

/// One read from an [`OutputBuffer`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Taken {
    pub text: String,
    /// Bytes dropped unread since the previous read.
    pub dropped: u64,
    /// Bytes still buffered after this read (it hit its `max`).
    pub remaining: usize,
}

impl OutputBuffer {
    pub fn new(capacity: usize) -> Self {
        OutputBuffer {
            data: VecDeque::new(),
            capacity: capacity.max(4),
            dropped: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        // A single chunk larger than the whole buffer: only its tail can stay.
        let bytes = if bytes.len() > self.capacity {
            let cut = bytes.len() - self.capacity;
            self.dropped += cut as u64;
            &bytes[cut..]
        } else {
            bytes
        };
        let overflow = (self.data.len() + bytes.len()).saturating_sub(self.capacity);
        self.drop_front(overflow);
        self.data.extend(bytes);
        // Dropping may have cut a character in half; its tail is noise.
        let continuation = self
            .data
            .iter()
            .take_while(|b| is_continuation(**b))
            .count();
        self.drop_front(continuation.min(3));
    }

    fn drop_front(&mut self, n: usize) {
        if n > 0 {
            self.data.drain(..n);
            self.dropped += n as u64;
        }
    }

    /// True when a read would return something.
    pub fn has_unread(&self) -> bool {
        !self.data.is_empty() || self.dropped > 0
    }

    /// Up to `max` bytes from the front as text. Unless `finished`, an
    /// incomplete character at the end stays for the next read, when the
    /// rest of it will have arrived.
    pub fn take(&mut self, max: usize, finished: bool) -> Taken {
        let mut n = self.data.len().min(max);
        if !finished || n < self.data.len() {
            n = complete_prefix(self.data.range(..n), n);
        }
        let bytes: Vec<u8> = self.data.drain(..n).collect();
        Taken {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            dropped: std::mem::take(&mut self.dropped),
            remaining: self.data.len(),
        }
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0b1100_0000 == 0b1000_0000
}

/// `n`, or less so that the first `n` bytes do not end inside a UTF-8
/// sequence. Bytes that are not UTF-8 at all are passed through (lossily)
/// rather than held back forever.
fn complete_prefix<'a>(bytes: impl DoubleEndedIterator<Item = &'a u8>, n: usize) -> usize {
    let tail: Vec<u8> = bytes.rev().take(4).copied().collect();
    // tail[i] is the byte at n - 1 - i.
    for (i, &b) in tail.iter().enumerate() {
        if is_continuation(b) {
            continue;
        }
        let needed = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return n, // ASCII or invalid: nothing to wait for.
        };
        let have = i + 1;
        return if have < needed { n - have } else { n };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_untouched() {
        assert_eq!(truncate_middle("hello", 5), None);
        assert_eq!(truncate_middle("", 0), None);
    }

    #[test]
    fn long_text_keeps_head_and_tail_within_the_cap() {
        let s: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
        let t = truncate_middle(&s, 1000).unwrap();
        assert!(t.len() <= 1000, "{} bytes", t.len());
        assert!(t.starts_with("line 0\nline 1\n"));
        assert!(t.ends_with("line 9999\n"));
        assert!(t.contains("bytes omitted"));
    }

    #[test]
    fn long_text_fits_the_cap_exactly() {
        let s = "x".repeat(100_000);
        for max in [100, 1000, 65_536] {
            assert!(truncate_middle(&s, max).unwrap().len() <= max);
        }
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        let s = "é".repeat(1000); // 2 bytes each
        for max in [100, 101, 102, 103] {
            let t = truncate_middle(&s, max).unwrap();
            let omitted: usize = t
                .split("[... ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .unwrap()
                .parse()
                .unwrap();
            let kept = t.chars().filter(|c| *c == 'é').count();
            assert_eq!(kept * 2 + omitted, s.len(), "max {max}");
        }
    }

    #[test]
    fn buffer_returns_output_since_the_last_read() {
        let mut b = OutputBuffer::new(1024);
        b.push(b"one\n");
        b.push(b"two\n");
        assert_eq!(b.take(1024, false).text, "one\ntwo\n");
        assert!(!b.has_unread());
        b.push(b"three\n");
        assert_eq!(b.take(1024, false).text, "three\n");
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_says_so() {
        let mut b = OutputBuffer::new(8);
        b.push(b"0123456789");
        b.push(b"ab");
        let t = b.take(100, false);
        assert_eq!(t.text, "456789ab");
        assert_eq!(t.dropped, 4);
        // The count is reported once.
        b.push(b"c");
        assert_eq!(b.take(100, false).dropped, 0);
    }

    #[test]
    fn reads_are_capped_and_the_rest_waits() {
        let mut b = OutputBuffer::new(100);
        b.push(b"abcdefghij");
        let t = b.take(4, false);
        assert_eq!((t.text.as_str(), t.remaining), ("abcd", 6));
        assert_eq!(b.take(100, false).text, "efghij");
    }

    #[test]
    fn a_character_split_across_chunks_is_held_until_complete() {
        let euro = "€".as_bytes(); // 3 bytes
        let mut b = OutputBuffer::new(100);
        b.push(b"price: ");
        b.push(&euro[..2]);
        assert_eq!(b.take(100, false).text, "price: ");
        b.push(&euro[2..]);
        assert_eq!(b.take(100, false).text, "€");
    }

    #[test]
    fn a_finished_stream_flushes_an_incomplete_character() {
        let mut b = OutputBuffer::new(100);
        b.push(&"€".as_bytes()[..2]);
        assert_eq!(b.take(100, true).text, "\u{FFFD}");
        assert!(!b.has_unread());
    }

    #[test]
    fn dropping_never_leaves_half_a_character_in_front() {
        let mut b = OutputBuffer::new(6);
        b.push("ab€€".as_bytes()); // 8 bytes: "ab" goes
        b.push("€".as_bytes()); // the oldest € goes
        let t = b.take(100, false);
        assert_eq!(t.text, "€€");
        let mut b = OutputBuffer::new(5);
        b.push("€€".as_bytes()); // 6 bytes; cut 1 byte into the first €
        let t = b.take(100, false);
        assert_eq!(t.text, "€");
        assert_eq!(t.dropped, 3);
    }

    #[test]
    fn binary_output_is_not_held_back_forever() {
        let mut b = OutputBuffer::new(100);
        b.push(&[0xff, 0xfe, b'x']);
        assert_eq!(b.take(100, false).text, "\u{FFFD}\u{FFFD}x");
        b.push(&[0xC3]); // a lone lead byte at the end: wait for more
        assert_eq!(b.take(100, false).text, "");
        b.push(b"z"); // it was not a character after all
        assert_eq!(b.take(100, false).text, "\u{FFFD}z");
    }
}
