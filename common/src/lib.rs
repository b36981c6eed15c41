//! sandhub-common: the plumbing every Sandhub binary shares, written once.
//!
//! - [`logging`]: `tracing` to stderr as text or JSON, filtered by `Targets`
//!   directives (never `EnvFilter`: see the module).
//! - [`parse`]: Go-style listen addresses and durations, as the upstream Go
//!   programs take them on their command lines.
//! - [`signal`]: the future that resolves when the process is told to stop.
//! - [`drain`]: reading the rest of a refused request body, bounded in
//!   bytes and time (the hub, sandboxd and the router each name a bound).
//! - [`hop`]: the per-hop headers a proxy drops, and the `Connection:
//!   close` of a 413.
//!
//! It depends on nothing in the workspace, so every crate may depend on it.
//! Its outside dependencies are small leaves too (`http` for header types,
//! `futures` for `Stream`), never a server or client stack.

pub mod drain;
pub mod hop;
pub mod logging;
pub mod parse;
pub mod signal;

pub use logging::Logging;
pub use parse::{parse_bind, parse_duration};
pub use signal::{terminated, StopSignals, Terminated};
