//! `GET /v1/admin/tenants`: every tenant's use against its quotas, and
//! every warm pool's fill, for the operators the hub names with
//! `--admin-tenants` (the console's Operators view reads it). Any other
//! tenant gets 404, as for anything of others it cannot see.

use axum::extract::{Extension, State};
use sandhub_api::error::{Code, ErrorBody};
use serde::Serialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{ApiError, ApiJson, ApiResult, AppState, Tenant};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(tenants))
}

/// One tenant's use and the quota each is measured against (`null`: no limit).
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TenantUsage {
    tenant: String,
    /// Sandboxes counted by the quota (running, suspended, warm).
    sandboxes: u64,
    sandboxes_quota: Option<u64>,
    /// The memory limits of those sandboxes, summed.
    memory_reserved_bytes: u64,
    memory_quota_bytes: Option<u64>,
    /// Disk the tenant's snapshots take.
    snapshot_bytes: u64,
    snapshot_quota_bytes: Option<u64>,
}

/// One warm pool's fill.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct PoolFill {
    tenant: String,
    pool: String,
    target: u64,
    ready: u64,
    starting: u64,
    /// Whether its last warm start failed (it is retrying).
    failing: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AdminTenants {
    tenants: Vec<TenantUsage>,
    pools: Vec<PoolFill>,
}

/// Every tenant's usage against its quotas (operators only).
#[utoipa::path(get, path = "/v1/admin/tenants", tag = "service",
    responses((status = 200, body = AdminTenants),
              (status = 404, body = ErrorBody, description = "Not an operator (--admin-tenants)")))]
async fn tenants(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> ApiResult<ApiJson<AdminTenants>> {
    if !state.admin_tenants.contains(&tenant.0) {
        return Err(ApiError::new(
            Code::NotFound,
            "no route for /v1/admin/tenants",
        ));
    }
    let gauges = state.hub.gauges().await?;
    let mut tenants: Vec<TenantUsage> = gauges
        .tenants
        .into_iter()
        .map(|t| TenantUsage {
            tenant: t.tenant,
            sandboxes: t.sandboxes,
            sandboxes_quota: t.sandboxes_quota,
            memory_reserved_bytes: t.memory_reserved_bytes,
            memory_quota_bytes: t.memory_quota_bytes,
            snapshot_bytes: t.snapshot_bytes,
            snapshot_quota_bytes: t.snapshot_quota_bytes,
        })
        .collect();
    tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    let mut pools: Vec<PoolFill> = gauges
        .pools
        .into_iter()
        .map(|p| PoolFill {
            tenant: p.tenant,
            pool: p.pool,
            target: p.target,
            ready: p.ready,
            starting: p.starting,
            failing: p.failing,
        })
        .collect();
    pools.sort_by(|a, b| (&a.tenant, &a.pool).cmp(&(&b.tenant, &b.pool)));
    Ok(ApiJson(AdminTenants { tenants, pools }))
}
