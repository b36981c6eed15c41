//! envd's `filesystem.Filesystem` service (unary Connect calls): Stat,
//! ListDir, MakeDir, Move and Remove. Workspace paths go through sandboxd;
//! paths beyond it through commands inside the sandbox ([`super::inside`]).

use std::sync::Arc;

use sandhub_api::{error::Code, sandboxd::EntryType};
use sandhub_client::{Error, Result};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    inside::{self, Entry},
    paths::{base_name, Place},
};
use crate::backend::TenantView;

#[derive(Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

/// The deepest a `ListDir` goes. envd takes any `depth` (0 meaning 1) and
/// walks as deep as asked; here a deeper request lists this deep, which is
/// as deep as a 4096-byte path (PATH_MAX) can name ("a/" per level). The
/// entries are cut at [`inside::MAX_LISTED`] anyway.
pub const MAX_LIST_DEPTH: u32 = 2048;

/// The levels a `ListDir` of `depth` lists: at least 1, at most
/// [`MAX_LIST_DEPTH`] (`find -maxdepth` refuses numbers past `i32::MAX`).
fn list_depth(depth: u32) -> u32 {
    depth.clamp(1, MAX_LIST_DEPTH)
}

#[derive(Deserialize)]
struct ListRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

fn permissions(dir: bool, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(if dir { 'd' } else { '-' });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// An `EntryInfo` in proto3 JSON.
fn entry_info(e: &Entry) -> Value {
    let modified = humantime::format_rfc3339_millis(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(e.modified.max(0.0)),
    )
    .to_string();
    json!({
        "name": base_name(&e.path),
        "type": if e.dir { "FILE_TYPE_DIRECTORY" } else { "FILE_TYPE_FILE" },
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(e.dir, e.mode),
        "owner": e.owner,
        "group": e.group,
        "modifiedTime": modified,
    })
}

fn from_sandboxd(parent: &str, f: &sandhub_api::sandboxd::FileEntry) -> Entry {
    let modified = humantime::parse_rfc3339_weak(f.modified_at.trim_end_matches('Z'))
        .ok()
        .or_else(|| humantime::parse_rfc3339(&f.modified_at).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64());
    let path = if f.name.is_empty() {
        parent.to_string()
    } else {
        format!("{}/{}", parent.trim_end_matches('/'), f.name)
    };
    Entry {
        path,
        dir: f.kind == EntryType::Directory,
        size: f.size,
        mode: u32::from_str_radix(f.mode.trim_start_matches('0'), 8).unwrap_or(0),
        owner: String::new(),
        group: String::new(),
        modified,
    }
}

async fn stat_place(api: &Arc<dyn TenantView>, id: &str, place: &Place) -> Result<Entry> {
    match place {
        Place::Workspace(rel) => {
            let path = place.absolute();
            if rel.is_empty() {
                // The workspace itself: sandboxd lists it, it does not stat it.
                return inside::stat(api, id, &path).await;
            }
            match api.stat(id, rel).await? {
                Some(f) => {
                    let parent = path.rsplit_once('/').map_or("/", |(p, _)| p);
                    let mut e = from_sandboxd(parent, &f);
                    e.path = path.clone();
                    Ok(e)
                }
                None => Err(Error::new(
                    Code::NotFound,
                    format!("{path}: no such file or directory"),
                )),
            }
        }
        Place::Elsewhere(abs) => inside::stat(api, id, abs).await,
    }
}

async fn list_workspace(
    api: &Arc<dyn TenantView>,
    id: &str,
    rel: &str,
    depth: u32,
) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut frontier = vec![rel.to_string()];
    for level in 0..list_depth(depth) {
        if frontier.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for dir in frontier {
            let listing = match api.list_files(id, &dir).await {
                Ok(l) => l,
                // A subdirectory gone (or unreadable) since its parent was
                // listed is left out; the one asked for is an error.
                Err(e) if level > 0 => {
                    tracing::debug!(error = %e, dir, "skipping a subdirectory");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let parent = Place::Workspace(dir.clone()).absolute();
            for f in &listing.entries {
                let e = from_sandboxd(&parent, f);
                if e.dir {
                    next.push(if dir.is_empty() {
                        f.name.clone()
                    } else {
                        format!("{dir}/{}", f.name)
                    });
                }
                out.push(e);
                if out.len() >= inside::MAX_LISTED {
                    return Ok(out);
                }
            }
        }
        frontier = next;
    }
    Ok(out)
}

/// One `filesystem.Filesystem/<method>` call; the answer message.
pub async fn call(api: &Arc<dyn TenantView>, id: &str, method: &str, body: Value) -> Result<Value> {
    let parse = |v: Value| -> Result<PathRequest> {
        serde_json::from_value(v).map_err(|e| Error::new(Code::InvalidArgument, e.to_string()))
    };
    match method {
        "Stat" => {
            let place = Place::parse(&parse(body)?.path);
            let e = stat_place(api, id, &place).await?;
            Ok(json!({"entry": entry_info(&e)}))
        }
        "ListDir" => {
            let req: ListRequest = serde_json::from_value(body)
                .map_err(|e| Error::new(Code::InvalidArgument, e.to_string()))?;
            let place = Place::parse(&req.path);
            let depth = list_depth(req.depth);
            let entries = match &place {
                Place::Workspace(rel) => list_workspace(api, id, rel, depth).await?,
                Place::Elsewhere(abs) => inside::list(api, id, abs, depth).await?,
            };
            Ok(json!({"entries": entries.iter().map(entry_info).collect::<Vec<_>>()}))
        }
        "MakeDir" => {
            let place = Place::parse(&parse(body)?.path);
            let path = place.absolute();
            if stat_place(api, id, &place).await.is_ok() {
                return Err(Error::new(Code::Conflict, format!("{path} already exists")));
            }
            inside::make_dir(api, id, &path).await?;
            let e = stat_place(api, id, &place).await?;
            Ok(json!({"entry": entry_info(&e)}))
        }
        "Move" => {
            let req: MoveRequest = serde_json::from_value(body)
                .map_err(|e| Error::new(Code::InvalidArgument, e.to_string()))?;
            let (from, to) = (Place::parse(&req.source), Place::parse(&req.destination));
            stat_place(api, id, &from).await?;
            inside::rename(api, id, &from.absolute(), &to.absolute()).await?;
            let e = stat_place(api, id, &to).await?;
            Ok(json!({"entry": entry_info(&e)}))
        }
        "Remove" => {
            let place = Place::parse(&parse(body)?.path);
            match &place {
                Place::Workspace(rel) if !rel.is_empty() => {
                    if api.stat(id, rel).await?.is_none() {
                        return Err(Error::new(
                            Code::NotFound,
                            format!("{}: no such file or directory", place.absolute()),
                        ));
                    }
                    api.delete_file(id, rel, true).await?;
                }
                other => inside::remove(api, id, &other.absolute()).await?,
            }
            Ok(json!({}))
        }
        _ => Err(Error::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{method} is not served"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_depth_is_envds_within_a_bound() {
        assert_eq!(list_depth(0), 1, "envd: 0 means 1");
        assert_eq!(list_depth(3), 3);
        assert_eq!(list_depth(u32::MAX), MAX_LIST_DEPTH);
    }

    #[test]
    fn permissions_read_like_ls() {
        assert_eq!(permissions(false, 0o644), "-rw-r--r--");
        assert_eq!(permissions(true, 0o755), "drwxr-xr-x");
    }

    #[test]
    fn entries_speak_proto3_json() {
        let e = Entry {
            path: "/workspace/a.txt".into(),
            dir: false,
            size: 12,
            mode: 0o644,
            owner: "root".into(),
            group: "root".into(),
            modified: 0.0,
        };
        let v = entry_info(&e);
        assert_eq!(v["name"], "a.txt");
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "12");
        assert_eq!(v["mode"], 0o644);
        assert_eq!(v["modifiedTime"], "1970-01-01T00:00:00.000Z");
    }
}
