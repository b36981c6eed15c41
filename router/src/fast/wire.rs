//! Writing the client's side of the exchange: status lines, dates, chunks
//! and the router's own small answers.

use std::time::SystemTime;

use bytes::{BufMut, Bytes, BytesMut};
use http::StatusCode;

use crate::{
    body::ProxyBody,
    h1::{put_chunk_size, put_header},
};

pub(super) fn status_line(out: &mut BytesMut, code: u16) {
    out.put_slice(b"HTTP/1.1 ");
    let mut digits = [0u8; 3];
    digits[0] = b'0' + (code / 100 % 10) as u8;
    digits[1] = b'0' + (code / 10 % 10) as u8;
    digits[2] = b'0' + (code % 10) as u8;
    out.put_slice(&digits);
    out.put_u8(b' ');
    let reason = StatusCode::from_u16(code)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("<none>");
    out.put_slice(reason.as_bytes());
    out.put_slice(b"\r\n");
}

/// `date: <IMF-fixdate>\r\n`, formatted once a second per worker thread.
pub(super) fn put_date(out: &mut BytesMut) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((0, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                d.1.copy_from_slice(text.as_bytes());
                d.0 = secs;
            }
        }
        out.put_slice(b"date: ");
        out.put_slice(&d.1);
        out.put_slice(b"\r\n");
    });
}

/// `data` as it is, or as one chunk of a chunked body, into `out`.
pub(super) fn put_piece(out: &mut BytesMut, data: &[u8], chunked: bool) {
    if chunked {
        put_chunk_size(out, data.len());
        out.put_slice(data);
        out.put_slice(b"\r\n");
    } else {
        out.put_slice(data);
    }
}

/// One of the router's own answers (errors), whole, into `out`.
pub(super) fn write_small(out: &mut BytesMut, resp: http::Response<ProxyBody>, keep_alive: bool) {
    use std::fmt::Write;
    out.clear();
    status_line(out, resp.status().as_u16());
    for (name, value) in resp.headers() {
        put_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let body = match resp.into_body() {
        ProxyBody::Full(Some(b)) => b,
        _ => Bytes::new(),
    };
    let _ = write!(out, "content-length: {}\r\n", body.len());
    put_date(out);
    if !keep_alive {
        out.put_slice(b"connection: close\r\n");
    }
    out.put_slice(b"\r\n");
    out.put_slice(&body);
}
