//! sandhub-router: the data-plane reverse proxy into sandbox Pods.
//!
//! A request names its sandbox by `X-Sandbox-*` headers (or gRPC metadata),
//! or by URL under `--path-routing-prefix`; the router authorizes it, finds
//! the Pod (Pod-IP header, Pod cache, cluster DNS), and streams the exchange
//! through: HTTP/1.1, upgrades such as WebSocket, and h2c gRPC.
//!
//! - [`config`]: flags, env and the YAML config file.
//! - [`routing`]: parsing and validating the target (pure).
//! - [`authz`]: allow-all, TokenReview and scoped tokens.
//! - [`cache`]: the Pod cache (a kube watch feeding a pure index).
//! - [`upstream`]: dialing sandboxes with retries; pooled clients.
//! - [`fast`]: the HTTP/1.1 path without hyper's server (plain and TLS listeners).
//! - [`h1`]: the direct HTTP/1.1 path to Pod IPs (per-thread pool, no extra tasks).
//! - [`proxy`]: the request path itself.
//! - [`body`]: streaming bodies with byte counts and gRPC deadlines.
//! - [`error`]: errors as `{"detail"}` JSON or gRPC trailers-only answers.
//! - [`tls`]: TLS/mTLS with certificate hot reload.
//! - [`metrics`]: Prometheus metrics with upstream's names.
//! - [`server`]: listeners, probes, graceful shutdown.

pub mod authz;
pub mod body;
pub mod cache;
pub mod config;
pub mod error;
pub mod fast;
pub mod h1;
pub mod metrics;
pub mod proxy;
pub mod routing;
pub mod server;
pub mod tls;
pub mod upstream;
