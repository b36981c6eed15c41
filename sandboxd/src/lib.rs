//! sandboxd: the daemon inside every sandbox.
//!
//! It serves the upstream agent-sandbox sandboxd wire protocol (REST files
//! API, gRPC `process.v1`), Sandhub's `watcher.v1`, and the legacy python
//! runtime endpoints, all confined to one root directory.

pub mod auth;
pub mod config;
pub mod confine;
pub mod daemon;
pub mod error;
pub mod files;
pub mod legacy;
pub mod metrics;
pub mod process;
pub mod rest;
pub mod server;
pub mod transfer;
pub mod watcher;

pub use config::Config;
pub use daemon::Daemon;
