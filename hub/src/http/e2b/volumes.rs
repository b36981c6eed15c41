//! E2B's volumes, mapped onto the tenant's named volumes (issue #32).
//!
//! - The control plane (`/volumes`, API key): an E2B volume IS a named
//!   volume, its `volumeID` its name (the SDKs take any string as an id,
//!   and a name is already unique in its tenant). E2B's create has no
//!   size: such volumes get [`DEFAULT_SIZE_MB`], within the tenant's cap.
//! - The content API (`/volumecontent/{volumeID}/...`), authorized by the
//!   volume's token alone (`Authorization: Bearer`), so it is diverted
//!   before the hub's API-key auth. It is served from the same place as
//!   `/v1/volumes/{name}/files` (`volume_store.rs`): the hub's own
//!   directory fd on the local backend, where every step is an `openat2`
//!   that follows no link, or the volume's helper Pod on Kubernetes.
//!
//! A volume token is the hub's signed token (`../signing.rs`) for the scope
//! `volume:{name}:{created_at}`: it names its tenant, opens that one volume
//! and nothing else (no sandbox, no other volume, no API route), and dies
//! with the volume: one made again under the same name has a new
//! `created_at`, so the old token opens nothing.

use std::sync::Arc;

use axum::{
    extract::{Path, Request},
    http::{header, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Extension, Json, Router,
};
use sandhub_api::{
    error::Code,
    sandboxd::EntryType,
    volumes::{CreateVolume, Volume},
};
use sandhub_client::{Error, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{files::rest_error, E2b};
use crate::{
    http::{
        signing::Tokens,
        upload::{self, Upload},
        volume_store::{Stat, Store},
        Api, AppState,
    },
    volume_files::VolPath,
};

/// The size of a volume made through E2B's API, in MiB: E2B's create
/// takes none. The tenant's volume cap (`--tenant-max-volume-mb`) still
/// bounds it.
pub const DEFAULT_SIZE_MB: u64 = 1024;
/// Deepest `depth` a listing takes: deeper trees are listed level by level.
const MAX_DEPTH: u32 = 16;
/// Most entries one listing returns, so a huge tree cannot make one
/// answer grow without bound.
const MAX_ENTRIES: usize = 10_000;
/// Ids mapped per sandbox (the local backend's 16-bit range): a host id
/// outside it is shown as the kernel shows an unmapped id.
const ID_RANGE: u32 = 65_536;
const OVERFLOW_ID: u32 = 65_534;
/// Mode of files and directories made with none given.
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

pub fn routes() -> Router<crate::http::AppState> {
    Router::new()
        .route("/volumes", post(create).get(list))
        .route("/volumes/{id}", get(info).delete(destroy))
}

fn scope(v: &Volume) -> String {
    format!("volume:{}:{}", v.name, v.created_at)
}

fn with_token(e2b: &E2b, tenant: &str, v: &Volume) -> Value {
    // No `domain`: the SDKs would send content calls to `api.<domain>`,
    // while ours are on this listener (`E2B_VOLUME_API_URL`).
    json!({
        "volumeID": v.name,
        "name": v.name,
        "token": e2b.tokens.issue(tenant, &scope(v)),
    })
}

#[derive(Deserialize)]
struct NewVolume {
    name: String,
}

async fn create(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    body: axum::body::Bytes,
) -> Response {
    let req: NewVolume = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return rest_error(&Error::new(Code::InvalidArgument, format!("bad body: {e}"))),
    };
    let made = api
        .create_volume(CreateVolume {
            name: req.name,
            size_mb: DEFAULT_SIZE_MB,
            labels: Default::default(),
            access_mode: None,
            from_snapshot: None,
        })
        .await;
    match made {
        Ok(v) => (
            StatusCode::CREATED,
            Json(with_token(&e2b, api.tenant(), &v)),
        )
            .into_response(),
        Err(e) => rest_error(&e),
    }
}

async fn list(Api(api): Api) -> Response {
    match api.list_volumes().await {
        Ok(l) => Json(
            l.volumes
                .iter()
                .map(|v| json!({"volumeID": v.name, "name": v.name}))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => rest_error(&e),
    }
}

async fn info(
    Api(api): Api,
    Extension(e2b): Extension<Arc<E2b>>,
    Path(id): Path<String>,
) -> Response {
    match api.get_volume(&id).await {
        Ok(v) => Json(with_token(&e2b, api.tenant(), &v)).into_response(),
        Err(e) => rest_error(&e),
    }
}

async fn destroy(Api(api): Api, Path(id): Path<String>) -> Response {
    match api.delete_volume(&id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => rest_error(&e),
    }
}

/// Whether `path` is the content API's (diverted before API-key auth).
pub fn is_content(path: &str) -> bool {
    path.starts_with("/volumecontent/")
}

fn unauthorized() -> Response {
    super::unauthorized("send the volume's token as `Authorization: Bearer <token>`")
}

/// The query every content call may carry (each takes what it needs).
#[derive(Debug, Default, Deserialize)]
struct ContentQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    force: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    mode: Option<u32>,
}

/// A content call: `/volumecontent/{volumeID}/{dir|path|file}`, its token
/// checked against that volume of the tenant it names.
pub async fn content(state: AppState, e2b: Arc<E2b>, request: Request) -> Response {
    let uri_path = request.uri().path().to_string();
    let rest = uri_path.trim_start_matches("/volumecontent/");
    let Some((id, op)) = rest.split_once('/') else {
        return rest_error(&Error::new(Code::NotFound, "no such volume content route"));
    };
    let id = match percent_encoding::percent_decode_str(id).decode_utf8() {
        Ok(id) => id.into_owned(),
        Err(_) => return unauthorized(),
    };
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        return unauthorized();
    };
    // Only a tenant this hub serves is asked about its volume; the token
    // then has to be that tenant's for that volume, as it is now.
    let Some(tenant) = Tokens::claimed_tenant(token).filter(|t| e2b.tenants.contains(t)) else {
        return unauthorized();
    };
    let api = state.hub.tenant(&tenant);
    let Ok(volume) = api.get_volume(&id).await else {
        return unauthorized();
    };
    if e2b.tokens.verify(token, &scope(&volume)).as_deref() != Some(tenant.as_str()) {
        return unauthorized();
    }
    let q: ContentQuery = match serde_urlencoded::from_str(request.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return rest_error(&Error::invalid(format!("bad query: {e}"))),
    };
    let dir = match Store::open(api.as_ref(), &id).await {
        Ok(d) => d,
        Err(e) => return rest_error(&e),
    };
    let method = request.method().clone();
    let outcome = match (op, method) {
        ("dir", Method::GET) => list_dir(&dir, &q).await,
        ("dir", Method::POST) => make_dir(&dir, &q).await,
        ("path", Method::GET) => stat(&dir, &q).await.map(|v| Json(v).into_response()),
        ("path", Method::PATCH) => patch(&dir, &q, request).await,
        ("path", Method::DELETE) => remove(&dir, &q).await,
        ("file", Method::GET) => read(&dir, &q).await,
        ("file", Method::PUT) => write(&state, &dir, &q, request).await,
        ("dir" | "path" | "file", _) => Ok((
            StatusCode::METHOD_NOT_ALLOWED,
            Json(
                json!({"code": 405, "message": "method not allowed on this volume content route"}),
            ),
        )
            .into_response()),
        _ => Err(Error::new(Code::NotFound, "no such volume content route")),
    };
    outcome.unwrap_or_else(|e| rest_error(&e))
}

fn path_of(q: &ContentQuery) -> Result<VolPath> {
    let raw = q.path.as_deref().unwrap_or("/");
    VolPath::parse(raw).map_err(|e| e.error)
}

/// A host id as the sandboxes see it.
fn sandbox_id(host: u32, root: u32) -> u32 {
    host.checked_sub(root)
        .filter(|id| *id < ID_RANGE)
        .unwrap_or(OVERFLOW_ID)
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// E2B's `VolumeEntryStat`.
fn entry_stat(dir: &Store, path: &VolPath, e: &Stat) -> Value {
    let (uid, gid) = dir.owner();
    let m = &e.meta;
    json!({
        "name": e.name,
        "type": match e.kind {
            EntryType::Directory => "directory",
            EntryType::File => "file",
        },
        "path": path.display(),
        "size": e.size,
        "mode": m.mode,
        "uid": sandbox_id(m.uid, uid),
        "gid": sandbox_id(m.gid, gid),
        "atime": rfc3339(m.atime),
        "mtime": rfc3339(m.mtime),
        "ctime": rfc3339(m.ctime),
    })
}

fn child(path: &VolPath, name: &str) -> Result<VolPath> {
    VolPath::parse(&format!("{}/{name}", path.display())).map_err(|e| e.error)
}

async fn stat(dir: &Store, q: &ContentQuery) -> Result<Value> {
    let path = path_of(q)?;
    let e = dir.stat(&path).await?;
    Ok(entry_stat(dir, &path, &e))
}

/// `depth` levels below `path` (1: its own entries), breadth first.
async fn list_dir(dir: &Store, q: &ContentQuery) -> Result<Response> {
    let depth = q.depth.unwrap_or(1);
    if !(1..=MAX_DEPTH).contains(&depth) {
        return Err(Error::invalid(format!(
            "depth must be from 1 to {MAX_DEPTH}"
        )));
    }
    let mut level = vec![path_of(q)?];
    let mut out = Vec::new();
    for d in 0..depth {
        let mut next = Vec::new();
        for p in level {
            let listed = match dir.list(&p).await {
                Ok(l) => l,
                // Below the first level, a directory gone meanwhile is
                // simply not there any more.
                Err(e) if d > 0 && e.code == Code::NotFound => continue,
                Err(e) => return Err(e),
            };
            for e in listed {
                let cp = child(&p, &e.name)?;
                out.push(entry_stat(dir, &cp, &e));
                if out.len() > MAX_ENTRIES {
                    return Err(Error::invalid(format!(
                        "over {MAX_ENTRIES} entries; list with a smaller depth"
                    )));
                }
                if e.kind == EntryType::Directory {
                    next.push(cp);
                }
            }
        }
        level = next;
    }
    Ok(Json(out).into_response())
}

/// Ownership: what the API makes belongs to the sandboxes' root, the only
/// id every sandbox maps; another is refused rather than ignored.
fn check_ids(uid: Option<u32>, gid: Option<u32>) -> Result<()> {
    if uid.is_some_and(|u| u != 0) || gid.is_some_and(|g| g != 0) {
        return Err(Error::invalid(
            "uid and gid may only be 0: files made through the volume API belong to \
             the sandboxes' root",
        ));
    }
    Ok(())
}

fn check_mode(mode: Option<u32>) -> Result<()> {
    if mode.is_some_and(|m| m > 0o7777) {
        return Err(Error::invalid(
            "mode takes permission bits only (at most 0o7777)",
        ));
    }
    Ok(())
}

async fn make_dir(dir: &Store, q: &ContentQuery) -> Result<Response> {
    check_ids(q.uid, q.gid)?;
    check_mode(q.mode)?;
    let path = path_of(q)?;
    dir.make_dir(&path, q.force.unwrap_or(false), q.mode.unwrap_or(DIR_MODE))
        .await?;
    let e = dir.stat(&path).await?;
    Ok((StatusCode::CREATED, Json(entry_stat(dir, &path, &e))).into_response())
}

async fn patch(dir: &Store, q: &ContentQuery, request: Request) -> Result<Response> {
    let path = path_of(q)?;
    let body = axum::body::to_bytes(request.into_body(), 64 * 1024)
        .await
        .map_err(|e| Error::invalid(format!("reading the body: {e}")))?;
    let md: Metadata = if body.is_empty() {
        Metadata::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| Error::invalid(format!("bad body: {e}")))?
    };
    check_ids(md.uid, md.gid)?;
    check_mode(md.mode)?;
    if let Some(mode) = md.mode {
        dir.set_mode(&path, mode).await?;
    }
    let e = dir.stat(&path).await?;
    Ok(Json(entry_stat(dir, &path, &e)).into_response())
}

async fn remove(dir: &Store, q: &ContentQuery) -> Result<Response> {
    let path = path_of(q)?;
    // E2B's remove takes a directory with its contents.
    dir.remove(&path).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn read(dir: &Store, q: &ContentQuery) -> Result<Response> {
    dir.read(&path_of(q)?).await
}

async fn write(
    state: &AppState,
    dir: &Store,
    q: &ContentQuery,
    request: Request,
) -> Result<Response> {
    let limits = state.limits;
    check_ids(q.uid, q.gid)?;
    check_mode(q.mode)?;
    upload::refuse_declared(&limits, request.headers())?;
    let path = path_of(q)?;
    let Upload {
        data,
        tripped,
        remainder,
    } = upload::capped(&limits, request.into_body());
    let result = dir.write(&path, data, q.mode.unwrap_or(FILE_MODE)).await;
    if tripped.is_set() {
        return Err(limits.upload_too_large());
    }
    if result.is_err() {
        // Refused before the body ended (a full volume): the client is
        // still sending and must get this answer, not a reset.
        remainder
            .drain(limits.max_upload_bytes, crate::guard::DRAIN_TIMEOUT)
            .await;
    }
    result?;
    let e = dir.stat(&path).await?;
    Ok((StatusCode::CREATED, Json(entry_stat(dir, &path, &e))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_show_as_the_sandboxes_see_them() {
        assert_eq!(sandbox_id(1_000_000_000, 1_000_000_000), 0);
        assert_eq!(sandbox_id(1_000_001_000, 1_000_000_000), 1000);
        assert_eq!(sandbox_id(0, 1_000_000_000), OVERFLOW_ID);
        assert_eq!(sandbox_id(1_000_065_536, 1_000_000_000), OVERFLOW_ID);
    }

    #[test]
    fn a_volume_token_opens_its_volume_as_made_only() {
        let tokens = Tokens::random();
        let v = |name: &str, at: &str| Volume {
            name: name.into(),
            size_mb: 1,
            labels: Default::default(),
            created_at: at.into(),
            access_mode: None,
        };
        let t = tokens.issue("alice", &scope(&v("data", "t1")));
        assert_eq!(
            tokens.verify(&t, &scope(&v("data", "t1"))).as_deref(),
            Some("alice")
        );
        assert_eq!(tokens.verify(&t, &scope(&v("other", "t1"))), None);
        // Made again under the same name: the old token is dead.
        assert_eq!(tokens.verify(&t, &scope(&v("data", "t2"))), None);
        // Nor is it a sandbox's token.
        assert_eq!(tokens.verify(&t, "data"), None);
        assert_eq!(Tokens::claimed_tenant(&t).as_deref(), Some("alice"));
    }

    #[test]
    fn ids_and_modes_are_checked() {
        assert!(check_ids(Some(0), None).is_ok());
        assert!(check_ids(Some(1000), None).is_err());
        assert!(check_ids(None, Some(1)).is_err());
        assert!(check_mode(Some(0o755)).is_ok());
        assert!(check_mode(Some(0o10000)).is_err());
    }
}
