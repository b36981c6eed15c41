//! The HTTP/1.1 fast path that `sandhub-router` and the hub's port proxy
//! share: a keep-alive client's plain requests served without hyper's
//! server, each head parsed in place and written straight into a pooled
//! upstream connection's buffer, the answer read and relayed by the same
//! task. No connection task, no channels, no `HeaderMap` per request.
//!
//! # Layout
//!
//! - [`inbound`]: the server for clients. It asks its [`inbound::Handler`]
//!   (the router's proxy, the hub's port route) for every decision, and
//!   hands whatever that does not take to hyper with the bytes already read.
//! - [`outbound`]: the direct exchange with the upstream: the request out,
//!   the response head parsed (`head`) and its body read off the connection
//!   (`body`), the connection handed back through [`outbound::Keep`].
//! - [`pool`]: idle upstream connections by key, for a caller's own pool.
//! - [`wire`]: the codec both sides share (bytes and buffers only).
//! - [`count`]: byte counting and the bound on draining a refused body.
//!
//! Arrows: `inbound` -> `outbound` -> `pool`, and everything -> `wire`.
//! The crate knows no routing, tenancy or metrics of its users.

pub mod count;
pub mod inbound;
pub mod outbound;
pub mod pool;
pub mod wire;

pub use count::{ByteCount, DRAIN_CAP, DRAIN_TIMEOUT};
