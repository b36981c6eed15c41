//! The gRPC status as the router writes it: the codes it produces itself
//! and the `grpc-status`/`grpc-message` pair. A leaf: it knows HTTP headers
//! and nothing of the proxy, so both the error mapping and the response
//! bodies (a deadline's trailers) can use it.

use http::{HeaderMap, HeaderValue};

/// gRPC status codes the router itself produces.
pub mod code {
    pub const CANCELLED: u8 = 1;
    pub const INVALID_ARGUMENT: u8 = 3;
    pub const DEADLINE_EXCEEDED: u8 = 4;
    pub const PERMISSION_DENIED: u8 = 7;
    pub const INTERNAL: u8 = 13;
    pub const UNAVAILABLE: u8 = 14;
    pub const UNAUTHENTICATED: u8 = 16;
}

/// grpc-message is percent-encoded: everything outside printable ASCII, and '%'.
pub fn encode_message(msg: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    percent_encoding::utf8_percent_encode(msg, SET).to_string()
}

/// Adds `grpc-status` and (when it can be encoded) `grpc-message` to `h`:
/// the headers of a trailers-only answer, or a body's trailers.
pub fn put(h: &mut HeaderMap, code: u8, message: &str) {
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(v) = HeaderValue::from_str(&encode_message(message)) {
        h.insert("grpc-message", v);
    }
}
