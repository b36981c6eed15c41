//! sandhub-controller: level-triggered reconcilers for the upstream agent-sandbox CRDs.
//!
//! One reconciler per module (`sandbox`, `template`, `claim`, `warmpool`), all sharing one
//! [`context::Context`]; `crdgen` prints the CRDs generated from `sandhub-api`'s types;
//! `app` wires them up behind leader election (`leader`) with metrics and probes (`serve`).

pub mod app;
pub mod claim;
pub mod conditions;
pub mod config;
pub mod context;
pub mod crdgen;
pub mod flags;
pub mod leader;
pub mod manifests;
pub mod metrics;
pub mod ratelimit;
pub mod sandbox;
pub mod serve;
pub mod template;
pub mod warmpool;
