//! Reading a request head for a handler's plan: the part every handler
//! does the same way.

use super::Parsed;

/// hyper's default limit on request headers; a head with more is hyper's
/// to refuse (431).
pub const MAX_HEADERS: usize = 100;

/// A whole HTTP/1.1 request head at the front of the client's bytes.
pub struct RequestHead<'h, 'b> {
    pub method: &'b str,
    /// The request target as sent (path and query, maybe a fragment).
    pub target: &'b str,
    pub headers: &'h [httparse::Header<'b>],
    /// Where the head ends in the bytes.
    pub len: usize,
}

/// The HTTP/1.1 request head at the front of `buf`, parsed into
/// `headers`; or what a plan makes of the bytes so far instead: `Partial`
/// (not whole yet), `Fallback` (another version, or malformed: hyper's, to
/// answer as it does).
pub fn request_head<'h, 'b, P>(
    buf: &'b [u8],
    headers: &'h mut [httparse::Header<'b>],
) -> Result<RequestHead<'h, 'b>, Parsed<P>> {
    if buf.is_empty() {
        return Err(Parsed::Partial);
    }
    let mut req = httparse::Request::new(headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err(Parsed::Partial),
        Err(_) => return Err(Parsed::Fallback),
    };
    match (req.method, req.path, req.version) {
        (Some(method), Some(target), Some(1)) => Ok(RequestHead {
            method,
            target,
            headers: req.headers,
            len,
        }),
        _ => Err(Parsed::Fallback),
    }
}
