//! sandhub-controller: level-triggered reconcilers for the upstream agent-sandbox CRDs.
//!
//! One reconciler per module (`sandbox`, `template`, `claim`, `warmpool`), all sharing one
//! [`context::Context`]; `crdgen` prints the CRDs generated from `sandhub-api`'s types.

pub mod claim;
pub mod config;
pub mod context;
pub mod crdgen;
pub mod flags;
pub mod metrics;
pub mod warmpool;
