//! Sandboxes: create, list, get, delete, and their lifecycle.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{
        CreateSandbox, EgressLog, ForkRequest, NetworkSpec, Sandbox, SandboxList, Snapshot,
        SnapshotList,
    },
    usage::SandboxMetrics,
};
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{
    Api, ApiError, ApiJson, ApiJsonOrDefault, ApiPath, ApiQuery, ApiResult, AppState,
};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_sandbox, list_sandboxes))
        .routes(routes!(get_sandbox, delete_sandbox))
        .routes(routes!(suspend))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(take_snapshot, list_snapshots))
        .routes(routes!(delete_snapshot))
        .routes(routes!(reset))
        .routes(routes!(fork))
        .routes(routes!(egress_log))
        .routes(routes!(set_network))
        .routes(routes!(sandbox_metrics))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsParams {
    /// Samples from this time on: Unix seconds or RFC 3339 (default: all
    /// kept, up to 1 h 15 min).
    since: Option<String>,
    /// Seconds per point, 1 to 3600 (default 1).
    step: Option<String>,
}

/// A sandbox's CPU, memory, processes, disk and network over time, sampled
/// each second (15 minutes at 1 s, then an hour at 10 s), with the limits
/// it is measured against. Empty while it is not running.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), MetricsParams),
    responses(
        (status = 200, body = SandboxMetrics),
        (status = 400, body = ErrorBody, description = "A bad `since` or `step` (named)"),
        (status = 404, body = ErrorBody),
    ))]
async fn sandbox_metrics(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<MetricsParams>,
) -> ApiResult<ApiJson<SandboxMetrics>> {
    let query = crate::usage::parse_query(q.since.as_deref(), q.step.as_deref())
        .map_err(|m| ApiError::new(Code::InvalidArgument, m))?;
    Ok(ApiJson(api.metrics(&id, query).await?))
}

/// Change a running sandbox's network: the body (the `network` shape of a
/// create request) replaces the sandbox's own narrowing of its template's
/// policy, by the same rule as on create (never wider). New connections
/// and DNS queries follow it at once; open ones go on. `none` refuses
/// every new connection and name. Kept across hub restarts, suspend and
/// resume.
#[utoipa::path(patch, path = "/v1/sandboxes/{id}/network", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = NetworkSpec,
    responses(
        (status = 200, body = Sandbox),
        (status = 400, body = ErrorBody, description = "A bad pattern, or an entry that would widen the template's policy (named); on Kubernetes: no gateway yet"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "Not Ready, or a sandbox without a gateway (`none`, `host`) asked for another mode"),
        (status = 413, body = ErrorBody),
    ))]
async fn set_network(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    ApiJson(network): ApiJson<NetworkSpec>,
) -> ApiResult<ApiJson<Sandbox>> {
    Ok(ApiJson(api.set_network(&id, network).await?))
}

/// The last decisions (at most 256, oldest first) of a sandbox's egress
/// gateway: what the workload tried to reach, allowed or refused and why,
/// and the payload bytes of each allowed connection. Empty for a sandbox
/// that is not `network: egress` or not running.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = EgressLog), (status = 404, body = ErrorBody)))]
async fn egress_log(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<EgressLog>> {
    Ok(ApiJson(EgressLog {
        decisions: api.egress_log(&id).await?,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
// Stated: `ApiQuery` hides the `Query` utoipa would infer it from.
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Comma-separated `key=value` pairs; a sandbox must carry all of them.
    labels: Option<String>,
}

fn parse_selector(s: &str) -> ApiResult<BTreeMap<String, String>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    ApiError::new(
                        Code::InvalidArgument,
                        format!("label selector `{pair}` must be key=value"),
                    )
                })
        })
        .collect()
}

/// Create a sandbox: claimed warm from a pool when one is ready, else started cold.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandbox,
    responses(
        (status = 201, body = Sandbox),
        (status = 400, body = ErrorBody, description = "Bad JSON, labels or lifetimes"),
        (status = 403, body = ErrorBody, description = "The template asks for what the operator does not allow (network: host)"),
        (status = 404, body = ErrorBody, description = "Unknown template or pool"),
        (status = 412, body = ErrorBody, description = "The template cannot start as it is (e.g. its `user` is not in its image)"),
        (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "Over a tenant quota (sandboxes, memory, snapshots)"),
    ))]
async fn create_sandbox(
    Api(api): Api,
    ApiJson(req): ApiJson<CreateSandbox>,
) -> ApiResult<(StatusCode, ApiJson<Sandbox>)> {
    Ok((StatusCode::CREATED, ApiJson(api.create(req).await?)))
}

/// List the caller's sandboxes, optionally filtered by labels.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", params(ListQuery),
    responses((status = 200, body = SandboxList), (status = 400, body = ErrorBody)))]
async fn list_sandboxes(
    Api(api): Api,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<ApiJson<SandboxList>> {
    let selector = parse_selector(q.labels.as_deref().unwrap_or(""))?;
    Ok(ApiJson(SandboxList {
        sandboxes: api.list(&selector).await?,
    }))
}

/// One sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody)))]
async fn get_sandbox(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<Sandbox>> {
    Ok(ApiJson(api.get(&id).await?))
}

/// Delete a sandbox: its processes and files are gone.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_sandbox(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<StatusCode> {
    api.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Stop every process, keep the files.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/suspend", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
async fn suspend(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<Sandbox>> {
    Ok(ApiJson(api.suspend(&id).await?))
}

/// Freeze every process in place: memory, open files and sockets stay,
/// no CPU is used (state `Paused`); `resume` thaws it in milliseconds.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The sandbox is not Ready, or this host cannot freeze (no cgroup freezer)"),
        (status = 501, body = ErrorBody, description = "The backend has no pause (kubernetes)")))]
async fn pause(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<Sandbox>> {
    Ok(ApiJson(api.pause(&id).await?))
}

/// Start a suspended sandbox again on the same files, or thaw a paused one.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = Sandbox), (status = 403, body = ErrorBody, description = "The template asks for what the operator does not allow (network: host)"),
        (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
async fn resume(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<Sandbox>> {
    Ok(ApiJson(api.resume(&id).await?))
}

/// Keep a copy of the workspace's current state.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/snapshots", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, body = Snapshot), (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The workspace's layer is not the sandbox's directory"),
        (status = 429, body = ErrorBody, description = "Over a tenant quota (sandboxes, memory, snapshots)")))]
async fn take_snapshot(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<(StatusCode, ApiJson<Snapshot>)> {
    Ok((StatusCode::CREATED, ApiJson(api.snapshot(&id).await?)))
}

/// Snapshots taken of a sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/snapshots", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SnapshotList), (status = 404, body = ErrorBody)))]
async fn list_snapshots(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<SnapshotList>> {
    let snapshots = api.list_snapshots(&id).await?;
    Ok(ApiJson(SnapshotList { snapshots }))
}

/// Delete a snapshot and the disk space it holds (also after its sandbox
/// is gone). Refused while a sandbox forked from it exists.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/snapshots/{snapshot}", tag = "lifecycle",
    params(
        ("id" = String, Path, description = "Sandbox id the snapshot was taken of"),
        ("snapshot" = String, Path, description = "Snapshot id"),
    ),
    responses(
        (status = 204),
        (status = 404, body = ErrorBody, description = "No such snapshot of this sandbox"),
        (status = 409, body = ErrorBody, description = "A sandbox forked from it still exists"),
    ))]
async fn delete_snapshot(
    Api(api): Api,
    ApiPath((id, snapshot)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    api.delete_snapshot(&id, &snapshot).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Kill every process and restore the workspace to its seed state (milliseconds).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/reset", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = Sandbox), (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
async fn reset(Api(api): Api, ApiPath(id): ApiPath<String>) -> ApiResult<ApiJson<Sandbox>> {
    Ok(ApiJson(api.reset(&id).await?))
}

/// Start a new sandbox from a snapshot of this one (a fresh one unless named).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "lifecycle",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body(content = Option<ForkRequest>, content_type = "application/json"),
    responses((status = 201, body = Sandbox), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody, description = "The template asks for what the operator does not allow (network: host)"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The workspace's layer is not the sandbox's directory"),
        (status = 429, body = ErrorBody, description = "Over a tenant quota (sandboxes, memory, snapshots)")))]
async fn fork(
    Api(api): Api,
    ApiPath(id): ApiPath<String>,
    // The body is optional: an empty one forks a fresh snapshot.
    ApiJsonOrDefault(req): ApiJsonOrDefault<ForkRequest>,
) -> ApiResult<(StatusCode, ApiJson<Sandbox>)> {
    Ok((StatusCode::CREATED, ApiJson(api.fork(&id, req).await?)))
}
