//! The hub's REST API (`/v1/...`), described by `GET /openapi.json`, and
//! the service's own probes and metrics (`health`), and the operators'
//! view of every tenant (`admin`, `--admin-tenants`).

mod admin;
mod code;
mod entrypoint;
mod events;
mod files;
pub mod health;
pub mod images;
mod pools;
mod ports;
mod prepull;
pub mod process_list;
mod processes;
mod sandboxes;
mod secrets;
pub mod shells;
mod templates;
mod volume_files;
mod volumes;
mod webhooks;

use utoipa_axum::router::OpenApiRouter;

use super::AppState;

/// The REST routes, for [`super::routes`] to merge.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(sandboxes::routes())
        .merge(processes::routes())
        .merge(code::routes())
        .merge(entrypoint::routes())
        .merge(files::routes())
        .merge(templates::routes())
        .merge(secrets::routes())
        .merge(volumes::routes())
        .merge(volume_files::routes())
        .merge(events::routes())
        .merge(webhooks::routes())
        .merge(pools::routes())
        .merge(ports::routes())
        .merge(images::routes())
        .merge(prepull::routes())
        .merge(health::routes())
        .merge(admin::routes())
}
