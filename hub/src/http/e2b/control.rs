//! E2B's control plane, mapped onto the tenant's sandboxes: create
//! (`templateID` names a Sandhub template or pool, `base` the default;
//! `metadata` becomes labels, `timeout` the deadline, `envVars` the
//! sandbox's environment, `volumeMounts` its volumes), connect (resuming a paused one), info, kill,
//! timeout, pause, list (filtered and paginated) and metrics.

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    extract::{Path, Query},
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post, put},
    Extension, Json, Router,
};
use sandhub_api::{
    error::Code,
    hub::{CreateSandbox, Sandbox, SandboxState, DEFAULT_TEMPLATE},
    usage::{MetricsQuery, UsageLimits},
    volumes::VolumeMount,
};
use sandhub_client::{Error, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    network::{describe, translate, E2bNetwork, Offline},
    E2b, ENVD_VERSION,
};
use crate::{
    backend::TenantView,
    http::{Api, AppState},
};

/// E2B's default: a sandbox lives 5 minutes unless told otherwise.
const DEFAULT_TIMEOUT_S: u64 = 300;
/// The longest `timeout` taken (E2B's own cap for its paid tier: 24 h).
const MAX_TIMEOUT_S: u64 = 24 * 3600;
const E2B_BASE: &str = "base";
const CLIENT_ID: &str = "sandhub";
/// Reported as `endAt` for a sandbox with no deadline.
const NO_DEADLINE: &str = "9999-12-31T23:59:59Z";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/metrics", get(many_metrics))
        .route("/sandboxes/{id}/network", put(set_network))
}

/// E2B's API errors: `{code: <HTTP status>, message}`.
fn api_error(e: &Error) -> Response {
    super::files::rest_error(e)
}

fn e2b_template(name: &str) -> &str {
    if name == DEFAULT_TEMPLATE {
        E2B_BASE
    } else {
        name
    }
}

fn timeout_of(seconds: Option<u64>) -> Result<u64> {
    match seconds {
        None => Ok(DEFAULT_TIMEOUT_S),
        Some(s) if s > MAX_TIMEOUT_S => Err(Error::new(
            Code::InvalidArgument,
            format!("timeout {s}s is over the {MAX_TIMEOUT_S}s limit"),
        )),
        Some(s) => Ok(s.max(1)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID", default)]
    template_id: Option<String>,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    network: Option<E2bNetwork>,
    /// `[{name, path}]`: the tenant's named volumes (E2B's volumeID is
    /// the name), mounted read-write.
    #[serde(default)]
    volume_mounts: Option<Vec<E2bVolumeMount>>,
}

#[derive(Debug, Deserialize)]
struct E2bVolumeMount {
    name: String,
    path: String,
}

#[derive(Debug, Default, Deserialize)]
struct TimeoutBody {
    #[serde(default)]
    timeout: Option<u64>,
}

/// What create and connect answer.
fn created(e2b: &E2b, tenant: &str, sb: &Sandbox) -> Value {
    let mut v = json!({
        "templateID": e2b_template(&sb.template),
        "alias": e2b_template(&sb.template),
        "sandboxID": sb.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e2b.tokens.issue(tenant, &sb.id),
        // The code-interpreter SDKs send only this one on their `/contexts`
        // calls (port 49999): the same signed token, which names the tenant.
        "trafficAccessToken": e2b.tokens.issue(tenant, &sb.id),
    });
    if let Some(domain) = &e2b.domain {
        v["domain"] = json!(domain);
    }
    v
}

async fn detail(api: &Arc<dyn TenantView>, e2b: &E2b, sb: &Sandbox) -> Value {
    let limits = api
        .get_template(&sb.template)
        .await
        .ok()
        .map(|t| t.template);
    let (cpu, memory, disk) = limits.map_or((0, 0, 0), |t| {
        (
            t.cpu.map_or(0, |c| c.ceil() as u64),
            t.memory_mb.unwrap_or(0),
            t.disk_mb.unwrap_or(0),
        )
    });
    let mut v = created(e2b, api.tenant(), sb);
    v["startedAt"] = json!(sb.created_at);
    v["endAt"] = json!(sb.shutdown_at.as_deref().unwrap_or(NO_DEADLINE));
    v["cpuCount"] = json!(cpu);
    v["memoryMB"] = json!(memory);
    v["diskSizeMB"] = json!(disk);
    v["state"] = json!(if is_paused(sb) { "paused" } else { "running" });
    v["metadata"] = json!(sb.labels);
    let (internet, network) = describe(sb.network.as_ref());
    if let Some(i) = internet {
        v["allowInternetAccess"] = json!(i);
    }
    if let Some(n) = network {
        v["network"] = n;
    }
    v
}

/// A sandbox E2B would still know: running or paused.
fn alive(sb: &Sandbox) -> bool {
    matches!(
        sb.state,
        SandboxState::Ready
            | SandboxState::Pending
            | SandboxState::Paused
            | SandboxState::Suspended
    )
}

/// What E2B calls paused: frozen (its `pause` here) or, where the backend
/// cannot freeze, suspended.
fn is_paused(sb: &Sandbox) -> bool {
    matches!(sb.state, SandboxState::Paused | SandboxState::Suspended)
}

async fn live(api: &Arc<dyn TenantView>, id: &str) -> Result<Sandbox> {
    let sb = api.get(id).await?;
    if !alive(&sb) {
        return Err(Error::new(
            Code::NotFound,
            format!("sandbox {id} not found"),
        ));
    }
    Ok(sb)
}

async fn create(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    body: axum::body::Bytes,
) -> Response {
    let req: NewSandbox = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return api_error(&Error::new(Code::InvalidArgument, format!("bad body: {e}"))),
    };
    let outcome = async {
        let template = match req.template_id.as_deref() {
            None | Some("") | Some(E2B_BASE) => DEFAULT_TEMPLATE.to_string(),
            Some(t) => t.to_string(),
        };
        let network = match (&req.network, req.allow_internet_access) {
            (None, None | Some(true)) => None,
            (n, internet) => {
                // "Nothing may be reached" keeps a gateway where the
                // template has one, so a later PUT can open it again.
                let egress = api
                    .get_template(&template)
                    .await
                    .is_ok_and(|t| t.template.network.mode == sandhub_api::hub::Network::Egress);
                let offline = if egress {
                    Offline::DenyAll
                } else {
                    Offline::None
                };
                translate(
                    &n.as_ref().map_or_else(E2bNetwork::default, |n| n.clone()),
                    internet,
                    offline,
                )?
            }
        };
        let sb = api
            .create(CreateSandbox {
                template: Some(template),
                labels: req.metadata.unwrap_or_default(),
                env: req.env_vars.unwrap_or_default(),
                shutdown_after_seconds: Some(timeout_of(req.timeout)?),
                network,
                volumes: req
                    .volume_mounts
                    .unwrap_or_default()
                    .into_iter()
                    .map(|m| VolumeMount {
                        name: m.name,
                        path: m.path,
                        read_only: false,
                    })
                    .collect(),
                ..Default::default()
            })
            .await?;
        Ok::<_, Error>(created(&e2b, api.tenant(), &sb))
    }
    .await;
    match outcome {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => api_error(&e),
    }
}

async fn connect(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: TimeoutBody = serde_json::from_slice(&body).unwrap_or_default();
    let outcome = async {
        let mut sb = live(&api, &id).await?;
        let resumed = is_paused(&sb);
        if resumed {
            sb = api.resume(&id).await?;
        }
        if let Some(t) = req.timeout {
            sb = api.set_deadline(&id, timeout_of(Some(t))?).await?;
        }
        Ok::<_, Error>((resumed, created(&e2b, api.tenant(), &sb)))
    }
    .await;
    match outcome {
        Ok((true, v)) => (StatusCode::CREATED, Json(v)).into_response(),
        Ok((false, v)) => Json(v).into_response(),
        Err(e) => api_error(&e),
    }
}

async fn info(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    Path(id): Path<String>,
) -> Response {
    match live(&api, &id).await {
        Ok(sb) => Json(detail(&api, &e2b, &sb).await).into_response(),
        Err(e) => api_error(&e),
    }
}

async fn kill(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    Path(id): Path<String>,
) -> Response {
    match api.delete(&id).await {
        Ok(()) => {
            e2b.processes.forget_sandbox(api.tenant(), &id);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => api_error(&e),
    }
}

async fn set_timeout(Api(api): Api, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let req: TimeoutBody = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return api_error(&Error::new(Code::InvalidArgument, format!("bad body: {e}"))),
    };
    let outcome = async {
        live(&api, &id).await?;
        let seconds = timeout_of(Some(req.timeout.ok_or_else(|| {
            Error::new(Code::InvalidArgument, "give the new timeout in seconds")
        })?))?;
        api.set_deadline(&id, seconds).await
    }
    .await;
    match outcome {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(&e),
    }
}

/// `PUT /sandboxes/{id}/network`: replaces the running sandbox's rules
/// (omitted fields clear them, as in E2B): our `PATCH .../network` with
/// the translated words (`none` when nothing may be reached: on an egress
/// sandbox its gateway stays, refusing all). 204 as E2B answers.
async fn set_network(Api(api): Api, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let req: E2bNetwork = if body.iter().all(u8::is_ascii_whitespace) {
        E2bNetwork::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return api_error(&Error::new(Code::InvalidArgument, format!("bad body: {e}")))
            }
        }
    };
    let outcome = async {
        live(&api, &id).await?;
        let spec = translate(&req, None, Offline::None)?
            .unwrap_or_else(|| sandhub_api::hub::Network::Egress.into());
        api.set_network(&id, spec).await
    }
    .await;
    match outcome {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => api_error(&e),
    }
}

/// E2B's pause keeps the processes: it is this hub's `pause` (frozen in
/// place, memory kept). A backend that cannot freeze (kubernetes) suspends
/// instead: the files stay, the processes do not.
async fn pause(Api(api): Api, Path(id): Path<String>) -> Response {
    match live(&api, &id).await {
        Ok(sb) if is_paused(&sb) => api_error(&Error::new(
            Code::Conflict,
            format!("sandbox {id} is already paused"),
        )),
        Ok(_) => {
            let paused = match api.pause(&id).await {
                Err(e) if e.code == Code::Unimplemented => api.suspend(&id).await,
                outcome => outcome,
            };
            match paused {
                Ok(_) => StatusCode::NO_CONTENT.into_response(),
                Err(e) => api_error(&e),
            }
        }
        Err(e) => api_error(&e),
    }
}

/// `start` and `end` of the metrics routes: Unix seconds.
#[derive(Debug, Default, Deserialize)]
struct MetricsRange {
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    end: Option<String>,
}

fn unix_param(name: &str, v: Option<&str>) -> Result<Option<u64>> {
    v.map(|s| {
        s.trim().parse::<u64>().map_err(|_| {
            Error::new(
                Code::InvalidArgument,
                format!("{name}: {s:?} is not Unix seconds"),
            )
        })
    })
    .transpose()
}

/// One sample in E2B's shape (`SandboxMetric`, every field the pinned SDK
/// requires): CPU as a percentage of the cores the sandbox may use, memory
/// and disk in bytes. A limit the
/// sandbox does not have is the host's (cores, memory) or 0 (disk).
fn e2b_metric(s: &sandhub_api::usage::UsageSample, limits: &UsageLimits) -> Value {
    let cores = limits
        .cpu
        .filter(|c| *c > 0.0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    let pct = (s.cpu_cores / cores * 100.0).clamp(0.0, 100.0);
    let mem_total = limits
        .memory_mb
        .map_or_else(host_memory_bytes, |mb| mb.saturating_mul(1 << 20));
    let unix = humantime::parse_rfc3339(&s.timestamp)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    json!({
        "timestamp": s.timestamp,
        "timestampUnix": unix,
        "cpuCount": cores.ceil() as u64,
        "cpuUsedPct": (pct * 100.0).round() / 100.0,
        "memUsed": s.memory_bytes,
        "memTotal": mem_total,
        // The page cache is not sampled apart (memUsed counts it): 0.
        "memCache": 0,
        "diskUsed": s.disk_bytes.unwrap_or(0),
        "diskTotal": limits.disk_mb.map_or(0, |mb| mb.saturating_mul(1 << 20)),
    })
}

fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: the sandbox's samples (1 s
/// apart for the last 15 minutes, 10 s before that) in E2B's shape,
/// oldest first; `[]` while none is kept yet.
async fn metrics(
    Api(api): Api,
    Path(id): Path<String>,
    Query(range): Query<MetricsRange>,
) -> Response {
    let outcome = async {
        let start = unix_param("start", range.start.as_deref())?;
        let end = unix_param("end", range.end.as_deref())?;
        live(&api, &id).await?;
        let m = api
            .metrics(
                &id,
                MetricsQuery {
                    since: start,
                    step: None,
                },
            )
            .await?;
        let end = end.map(|e| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(e),
            )
            .to_string()
        });
        // RFC 3339 in whole seconds, UTC: compared as text.
        Ok::<_, Error>(
            m.samples
                .iter()
                .filter(|s| end.as_ref().is_none_or(|e| &s.timestamp <= e))
                .map(|s| e2b_metric(s, &m.limits))
                .collect::<Vec<_>>(),
        )
    };
    match outcome.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => api_error(&e),
    }
}

/// The most sandboxes one `GET /sandboxes/metrics` names.
const MAX_METRICS_IDS: usize = 100;

#[derive(Debug, Default, Deserialize)]
struct ManyMetrics {
    #[serde(default)]
    sandbox_ids: Option<String>,
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the latest sample of each
/// named sandbox the caller has running (`{"sandboxes": {id: metric}}`);
/// others are left out, as E2B does.
async fn many_metrics(Api(api): Api, Query(q): Query<ManyMetrics>) -> Response {
    let ids: Vec<&str> = q
        .sandbox_ids
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ids.len() > MAX_METRICS_IDS {
        return api_error(&Error::new(
            Code::InvalidArgument,
            format!("sandbox_ids: at most {MAX_METRICS_IDS} ids"),
        ));
    }
    let mut out = serde_json::Map::new();
    for id in ids {
        if let Ok(Sandbox {
            usage: Some(u),
            state: SandboxState::Ready,
            ..
        }) = api.get(id).await
        {
            out.insert(id.to_string(), e2b_metric(&u.latest, &u.limits));
        }
    }
    Json(json!({ "sandboxes": out })).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    /// `k=v&k2=v2`, itself URL-encoded.
    #[serde(default)]
    metadata: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    next_token: Option<String>,
}

const MAX_PAGE: usize = 1000;

fn page_key(sb: &Sandbox) -> String {
    format!("{}_{}", sb.created_at, sb.id)
}

async fn list(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    Query(q): Query<ListQuery>,
    uri: axum::http::Uri,
) -> Response {
    // `state` may repeat (`state=running&state=paused`) or be
    // comma-separated; `metadata` is a query string of its own.
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(uri.query().unwrap_or("")).unwrap_or_default();
    let states: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "state")
        .flat_map(|(_, v)| v.split(',').map(str::to_string))
        .collect();
    let wanted: BTreeMap<String, String> = match &q.metadata {
        Some(m) => match serde_urlencoded::from_str::<Vec<(String, String)>>(m) {
            Ok(kv) => kv.into_iter().collect(),
            Err(e) => {
                return api_error(&Error::new(
                    Code::InvalidArgument,
                    format!("bad metadata: {e}"),
                ))
            }
        },
        None => BTreeMap::new(),
    };
    let mut sandboxes = match api.list(&wanted).await {
        Ok(s) => s,
        Err(e) => return api_error(&e),
    };
    sandboxes.retain(|sb| {
        alive(sb)
            && (states.is_empty()
                || states.iter().any(|s| match s.as_str() {
                    "paused" => is_paused(sb),
                    "running" => !is_paused(sb),
                    _ => false,
                }))
    });
    // Pages follow creation order; a page's token is its last sandbox's
    // place in it, which stays meaningful when that sandbox is gone.
    sandboxes.sort_by_key(page_key);
    if let Some(after) = &q.next_token {
        sandboxes.retain(|sb| page_key(sb).as_str() > after.as_str());
    }
    let limit = q.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let more = sandboxes.len() > limit;
    sandboxes.truncate(limit);
    let mut out = Vec::with_capacity(sandboxes.len());
    for sb in &sandboxes {
        out.push(detail(&api, &e2b, sb).await);
    }
    let mut headers = HeaderMap::new();
    if more {
        if let Some(last) = sandboxes.last() {
            if let Ok(v) = HeaderValue::from_str(&page_key(last)) {
                headers.insert("x-next-token", v);
            }
        }
    }
    (headers, Json(out)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_default_and_cap() {
        assert_eq!(timeout_of(None).unwrap(), DEFAULT_TIMEOUT_S);
        assert_eq!(timeout_of(Some(0)).unwrap(), 1);
        assert_eq!(timeout_of(Some(60)).unwrap(), 60);
        assert_eq!(
            timeout_of(Some(MAX_TIMEOUT_S + 1)).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(e2b_template(DEFAULT_TEMPLATE), "base");
        assert_eq!(e2b_template("py"), "py");
    }
}
