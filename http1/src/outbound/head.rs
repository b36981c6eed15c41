//! Reading the upstream's response head: parsed in place, 1xx interim
//! answers skipped, the body's framing decided (RFC 9112 §6), and the
//! per-hop headers dropped before anything reaches the client.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::net::TcpStream;

use super::{
    body::{Chunk, Framing, FramingState},
    ExchangeError, MAX_HEAD,
};
use crate::wire::{read_some, READ_CHUNK};

const MAX_HEADERS: usize = 96;

/// Where one header's name and value sit in [`ResponseHead::bytes`].
#[derive(Clone, Copy)]
struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

/// A response head from upstream, with the per-hop headers dropped.
pub struct ResponseHead {
    pub status: u16,
    bytes: Bytes,
    /// Heap-held: an inline array made every move of the head (several per
    /// request, through the exchange's futures) a memcpy of kilobytes.
    spans: Vec<Span>,
    /// Headers the caller added ([`ResponseHead::push`]), after the upstream's.
    added: Vec<(Bytes, Bytes)>,
    pub(super) state: FramingState,
}

impl ResponseHead {
    /// The headers that travel on to the client, in the upstream's order,
    /// then those the caller added.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans
            .iter()
            .map(|s| self.span(s))
            .chain(self.added.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    fn span(&self, s: &Span) -> (&[u8], &[u8]) {
        (
            &self.bytes[s.name.0 as usize..s.name.1 as usize],
            &self.bytes[s.value.0 as usize..s.value.1 as usize],
        )
    }

    /// Keeps only the upstream's headers `keep` says yes to (framing
    /// headers are not offered: the relay owns the framing).
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8], &[u8]) -> bool) {
        let bytes = &self.bytes;
        self.spans.retain(|s| {
            let name = &bytes[s.name.0 as usize..s.name.1 as usize];
            name.eq_ignore_ascii_case(b"content-length")
                || keep(name, &bytes[s.value.0 as usize..s.value.1 as usize])
        });
    }

    /// Adds a header after the upstream's.
    pub fn push(&mut self, name: Bytes, value: Bytes) {
        self.added.push((name, value));
    }

    /// The first value of header `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Whether the body is framed by Content-Length (or absent); otherwise the
    /// client gets it re-framed.
    pub fn length_framed(&self) -> bool {
        matches!(self.state.framing, Framing::Length(_))
    }

    /// The headers as a `HeaderMap`, values as slices of the head (no copy each).
    pub fn header_map(&self) -> Result<HeaderMap, ExchangeError> {
        let mut map = HeaderMap::with_capacity(self.spans.len() + self.added.len());
        for s in &self.spans {
            let name = HeaderName::from_bytes(&self.bytes[s.name.0 as usize..s.name.1 as usize])
                .map_err(|_| ExchangeError::Protocol("header name"))?;
            let value = HeaderValue::from_maybe_shared(
                self.bytes.slice(s.value.0 as usize..s.value.1 as usize),
            )
            .map_err(|_| ExchangeError::Protocol("header value"))?;
            map.append(name, value);
        }
        for (name, value) in &self.added {
            let name =
                HeaderName::from_bytes(name).map_err(|_| ExchangeError::Protocol("header name"))?;
            let value = HeaderValue::from_maybe_shared(value.clone())
                .map_err(|_| ExchangeError::Protocol("header value"))?;
            map.append(name, value);
        }
        Ok(map)
    }
}

/// Reads until a full response head is parsed (skipping 1xx interim answers).
pub(super) async fn read_head(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    is_head: bool,
) -> Result<ResponseHead, ExchangeError> {
    loop {
        if !buf.is_empty() {
            if let Some(head) = parse_head(buf, is_head)? {
                return Ok(head);
            }
        }
        buf.reserve(READ_CHUNK);
        let n = read_some(s, buf).await?;
        if n == 0 {
            return Err(
                io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a response").into(),
            );
        }
    }
}

/// Parses a complete response head off the front of `buf`, if there is one.
fn parse_head(buf: &mut BytesMut, is_head: bool) -> Result<Option<ResponseHead>, ExchangeError> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut headers);
        let len = match parsed.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(None),
            Ok(httparse::Status::Partial) => {
                return Err(ExchangeError::Protocol("response head too large"))
            }
            Err(_) => return Err(ExchangeError::Protocol("unparsable response head")),
        };
        let code = parsed.code.unwrap_or(502);
        if (100..200).contains(&code) && code != 101 {
            buf.advance(len);
            continue;
        }
        if !(100..1000).contains(&code) {
            return Err(ExchangeError::Protocol("status code"));
        }
        let base = buf.as_ptr() as usize;
        let offset = |p: &[u8]| (p.as_ptr() as usize - base) as u32;
        let mut spans = Vec::with_capacity(parsed.headers.len());
        let mut framing = Framing::UntilClose;
        let mut keep_alive = parsed.version == Some(1);
        // Value spans of Connection headers: the headers they name stay on this hop.
        let mut named = Vec::new();
        let mut length = None;
        for h in parsed.headers.iter() {
            let name = h.name.as_bytes();
            let raw = h.value;
            let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
            if is("transfer-encoding") {
                // Chunked frames the body only as the final coding (RFC 9112 §6.1).
                let last = raw.rsplit(|&b| b == b',').next().unwrap_or_default();
                if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    framing = Framing::Chunked(Chunk::Size);
                }
                continue;
            }
            if is("connection") {
                if has_token(raw, b"close") {
                    keep_alive = false;
                }
                let vs = offset(raw) as usize;
                named.push(vs..vs + raw.len());
                continue;
            }
            // Per-hop headers stay on this hop (HTTP/2 clients reject them).
            if is("upgrade") || is("trailer") || is("keep-alive") || is("proxy-connection") {
                continue;
            }
            if is("content-length") {
                let n = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or(ExchangeError::Protocol("content-length"))?;
                // Two different lengths cannot be relayed safely (RFC 9112 §6.3);
                // a repeated one is passed on once.
                match length.replace(n) {
                    Some(m) if m != n => {
                        return Err(ExchangeError::Protocol("conflicting content-length"))
                    }
                    Some(_) => continue,
                    None => {}
                }
                if !matches!(framing, Framing::Chunked(_)) {
                    framing = Framing::Length(n);
                }
            }
            let (ns, vs) = (offset(name), offset(raw));
            spans.push(Span {
                name: (ns, ns + name.len() as u32),
                value: (vs, vs + raw.len() as u32),
            });
        }
        let chunked = matches!(framing, Framing::Chunked(_));
        if chunked || !named.is_empty() {
            let head = &buf[..len];
            spans.retain(|s| {
                let name = &head[s.name.0 as usize..s.name.1 as usize];
                if name.eq_ignore_ascii_case(b"content-length") {
                    // Framing is not the Connection header's to strip; and with
                    // chunked it must go (RFC 9112 §6.3), or the client would
                    // get a head announcing two framings.
                    return !chunked;
                }
                !named.iter().any(|v| has_token(&head[v.clone()], name))
            });
        }
        if is_head || code == 204 || code == 304 {
            // A HEAD answer's Content-Length describes the GET body.
            framing = Framing::Length(0);
        } else if matches!(framing, Framing::UntilClose) {
            keep_alive = false;
        }
        return Ok(Some(ResponseHead {
            status: code,
            bytes: buf.split_to(len).freeze(),
            spans,
            added: Vec::new(),
            state: Framing::with_keep_alive(framing, keep_alive),
        }));
    }
}

/// Whether a comma-separated header value lists `token` (case-insensitive).
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Result<ResponseHead, ExchangeError> {
        let mut buf = BytesMut::from(head.as_bytes());
        parse_head(&mut buf, false).map(|h| h.expect("a whole head"))
    }

    fn names(h: &ResponseHead) -> Vec<String> {
        h.headers()
            .map(|(n, _)| String::from_utf8_lossy(n).to_ascii_lowercase())
            .collect()
    }

    #[test]
    fn chunked_wins_over_a_length_which_is_dropped() {
        for head in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n",
        ] {
            let h = parse(head).unwrap();
            assert!(!h.length_framed(), "{head}");
            assert!(!names(&h).contains(&"content-length".to_owned()), "{head}");
        }
        // Chunked that is not the final coding does not frame the body.
        let h = parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n").unwrap();
        assert!(matches!(h.state.framing, Framing::UntilClose));
    }

    #[test]
    fn the_connection_header_cannot_strip_the_length() {
        let h = parse(
            "HTTP/1.1 200 OK\r\nConnection: content-length, X-Hop\r\nX-Hop: 1\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\n",
        )
        .unwrap();
        assert!(h.length_framed());
        assert_eq!(names(&h), ["x-kept", "content-length"]);
    }

    #[test]
    fn lengths_that_disagree_are_refused_and_repeats_passed_once() {
        assert!(
            parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n").is_err()
        );
        let h = parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n").unwrap();
        assert_eq!(names(&h), ["content-length"]);
        assert!(matches!(h.state.framing, Framing::Length(2)));
    }
}
