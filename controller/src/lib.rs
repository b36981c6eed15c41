//! sandhub-controller: level-triggered reconcilers for the upstream agent-sandbox CRDs.
//!
//! # Layout
//!
//! One reconciler per module, each reading the objects, deciding, then
//! writing only differences:
//! - `sandbox`: Sandbox → Pod, Service, PVCs and status;
//! - `template`: SandboxTemplate → its NetworkPolicy;
//! - `claim`: SandboxClaim → one Sandbox, adopted warm or created cold
//!   (the decisions are pure, in `claim::plan`);
//! - `warmpool`: SandboxWarmPool → N warm Sandboxes (`warmpool::plan`).
//!
//! Shared by all four:
//! - `context`: the client, caches, flags, metrics and event recorder;
//! - [`error`]: the one reconciler error, with its metric label;
//! - `object`: conditions, controller references and readiness of objects;
//! - `metrics`: Prometheus metrics with upstream's names;
//! - `trace`: the span of each reconcile (`--otlp-endpoint`).
//!
//! Around them: [`flags`] and `config` (flags, the tuning ConfigMap), [`app`]
//! (start-up, leader election in `leader`, client rate limits in
//! `ratelimit`), `serve` (`/metrics`, probes), [`crdgen`] and [`manifests`]
//! (the CRDs and install manifests generated from `sandhub-api`'s types).
//!
//! The public surface is what the binary and the tests use: [`app::run`],
//! [`flags::Cli`], [`crdgen`], [`manifests`], and the reconcilers' shared
//! vocabulary ([`Error`], [`Context`], [`Metrics`]).

pub mod app;
pub mod crdgen;
pub mod error;
pub mod flags;
pub mod manifests;

mod claim;
mod config;
mod context;
mod leader;
mod metrics;
mod object;
mod ratelimit;
mod sandbox;
mod serve;
mod template;
mod trace;
mod warmpool;

pub use context::Context;
pub use error::Error;
pub use metrics::Metrics;
