//! sandhub-router: the data-plane reverse proxy into sandbox Pods.
//!
//! A request names its sandbox by `X-Sandbox-*` headers (or gRPC metadata),
//! or by URL under `--path-routing-prefix`; the router authorizes it, finds
//! the Pod (Pod-IP header, Pod cache, cluster DNS), and streams the exchange
//! through: HTTP/1.1, upgrades such as WebSocket, and h2c gRPC.
//!
//! # Layout
//!
//! - [`config`]: flags, env and the YAML config file.
//! - [`server`]: listeners, probes, graceful shutdown; hands each client
//!   connection to the fast path or hyper's server.
//! - [`proxy`]: the request path itself, one file per protocol (plain HTTP,
//!   upgrades, gRPC) and the proxy's half of the fast path.
//! - [`http1`]: the router's HTTP/1.1 code: the fast path's server and
//!   wire codec (the `sandhub-http1` crate's, shared with the hub's port
//!   route), and its own `outbound` (dialing, hyper's pooled clients, the
//!   direct exchange to Pod IPs) and per-thread connection pool.
//! - [`routing`]: parsing and validating the target (pure).
//! - [`authz`]: allow-all, TokenReview and scoped tokens.
//! - [`cache`]: the Pod cache (a kube watch feeding a pure index).
//! - [`error`]: the router's failures as `{"detail"}` JSON or gRPC answers.
//! - [`response`]: what the router answers with ([`response::ProxyBody`])
//!   and its own small answers.
//! - [`body`]: the request body and byte counting (a leaf).
//! - [`grpc_status`]: gRPC status codes and `grpc-message` encoding (a leaf).
//! - [`tls`]: TLS/mTLS with certificate hot reload.
//! - [`metrics`]: Prometheus metrics with upstream's names.
//!
//! Arrows point one way: `server` -> `proxy` -> `http1`, and `proxy` ->
//! `error` -> `response` -> `http1`; `http1` imports only `body` and
//! `metrics` (its `inbound` server asks the proxy through the `Handler` trait
//! the proxy implements, instead of importing it). `body`, `grpc_status`,
//! `routing`, `metrics` and `config` import nothing of the crate.

pub mod authz;
pub mod body;
pub mod cache;
pub mod config;
pub mod error;
pub mod grpc_status;
pub mod http1;
pub mod metrics;
pub mod proxy;
pub mod response;
pub mod routing;
pub mod server;
pub mod tls;
