//! The router's own HTTP/1.1 code, by side.
//!
//! - [`inbound`]: the fast-path server for clients (plain listener, and TLS
//!   without h2); it hands everything it does not serve to hyper's server.
//! - [`outbound`]: reaching sandboxes: the dialer, hyper's pooled clients
//!   (HTTP/1.1 and h2c), and the direct exchange to a Pod IP.
//! - `pool`: the direct exchange's per-thread connection pool.
//! - [`wire`]: the codec both sides share.
//!
//! Arrows: `inbound` -> `outbound` -> `pool`, and both sides -> `wire`.
//! Nothing here imports the proxy: `inbound` asks its `inbound::Handler`
//! (the proxy) for every decision.

pub mod inbound;
pub mod outbound;
mod pool;
pub mod wire;
