//! The router's HTTP/1.1 code, by side. The fast path itself (its server,
//! the direct exchange, the wire codec) is `sandhub-http1`, shared with the
//! hub; what is the router's own is here.
//!
//! - [`inbound`], [`wire`]: the shared crate's, re-exported.
//! - [`outbound`]: reaching sandboxes: the dialer, hyper's pooled clients
//!   (HTTP/1.1 and h2c), and the direct exchange to a Pod IP.
//! - `pool`: the direct exchange's per-thread connection pool.
//!
//! Arrows: `outbound` -> `pool`. Nothing here imports the proxy: the
//! shared server asks its `inbound::Handler` (the proxy) for every decision.

pub mod outbound;
pub mod pool;

pub use sandhub_http1::{inbound, wire};
