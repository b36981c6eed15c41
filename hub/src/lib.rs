//! The Sandhub hub: one model of sandboxes behind REST, MCP and Gym, on the
//! embedded local backend or on Kubernetes.
//!
//! # Layout
//!
//! Commands (`main.rs` dispatches):
//! - [`serve`]: `sandhub serve`, the hub service on either backend.
//! - [`mcp`]: `sandhub mcp`, MCP on stdio (a hub URL, or a local hub in-process).
//! - [`cli`]: the client commands (`create`, `exec`, `cp`, `pool`, ...).
//! - [`egress_proxy`]: `sandhub egress-proxy`, the egress gateway in proxy
//!   form for Kubernetes Pods (policies from the claims `kube` writes;
//!   flags and resolver shared with `local::egress`).
//!
//! Front doors:
//! - [`http`]: the HTTP app: state, auth, extractors; its children `rest/`
//!   (`/v1`, probes, metrics), `gym/` (`/gym/v1`), `e2b/` (E2B's API),
//!   `hosts` (ports by host name), `proxy/` (to sandbox ports), `browser`,
//!   `signing` and the `/mcp` mount (its own `# Layout` lists them).
//! - [`guard`]: the operator's limits, checked in front of every backend,
//!   and each operation timed into [`ops`] (`sandhub_operation_seconds`).
//! - [`gauges`]: the pool and tenant gauges `/metrics` reads from the
//!   backend at each scrape.
//!
//! The seam and the two backends behind it:
//! - [`backend`]: [`Backend`] and [`TenantView`], what the front doors need,
//!   and `EnvStore`, where the Gym keeps environments across restarts.
//! - [`local`]: the local backend: model, tenant view, lifecycle, pools, the
//!   pure decisions (`local::plan`), the SQLite store, the image store and
//!   the namespace runtime in `local::runtime` (its own `# Layout`).
//! - [`kube`]: the kubernetes backend (SandboxClaims, the controller's pools;
//!   one tenant's view split into `kube::tenant`'s sandboxes, templates,
//!   pools, secrets and volumes).
//! - [`policy`]: the operator's sandbox defaults and tenant quotas, for both.
//! - [`changes`]: lifecycle changes run to their end as tasks of their own,
//!   under per-tenant permits, whoever hangs up, for both.
//! - [`events`]: lifecycle events, one vocabulary for both backends: the
//!   log (SQLite on the local backend, a ring on kubernetes) and its live
//!   feed, which `GET /v1/events` streams.
//! - [`webhooks`]: signed webhooks of those events: the rules both backends
//!   share (checks, outbound address rules, signature, one attempt), the
//!   seam `/v1/webhooks` calls, and the local backend's outbox and deliverer
//!   (kubernetes': `kube::webhooks`).
//! - [`entrypoint`]: whether a sandbox's entrypoint runs, or how it ended, for both.
//! - [`usage`]: each sandbox's ring of resource samples, its series and
//!   the OOM/disk alerts, for both (the local sampler is `local::sampler`).
//! - [`secrets_file`]: the operator's secret values (`--secrets-file`), for
//!   both backends and the egress proxy.
//! - [`volume_files`]: a named volume's files reached from its directory fd
//!   without following a link (the local backend's; Kubernetes serves them
//!   through a helper Pod's sandboxd, `kube::tenant`).
//! - [`sqlite`]: how the store, the event log and the webhook outbox open
//!   their SQLite file (WAL, and a busy handler that waits in short steps).
//!
//! Request validation is not here: it is part of the API contract
//! (`sandhub_api::validate`), so both backends refuse the same requests.
//! Arrows point down this list and never back: the front doors use the
//! seam, the backends implement it. Sibling modules must not import each
//! other in a circle (`scripts/import_circles.py`); the one left, inside
//! `http` (`hosts`, `proxy`, `e2b`), is named in `http`'s docs.

pub mod backend;
pub mod changes;
pub mod cli;
pub mod code;
pub mod egress_proxy;
pub mod entrypoint;
pub mod events;
pub mod gauges;
pub mod guard;
pub mod http;
pub mod kube;
pub mod local;
pub mod mcp;
pub mod ops;
pub mod policy;
pub mod secrets_file;
pub mod serve;
pub mod sqlite;
pub mod usage;
pub mod volume_files;
pub mod webhooks;

pub use backend::{Backend, TenantView};
pub use http::{app, AppState, Limits};
pub use kube::KubeTenancy;
pub use local::{Hub, TenantHub};
