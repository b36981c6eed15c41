//! `/v1/_sandhub/meta/{path}`: ids, mode and times of an entry, a listing
//! of them, `mkdir` with a mode and `chmod` (`sandhub_api::sandboxd::META_ROUTE`).
//!
//! Upstream's `/v1/files` reports a name, size, type, mtime and mode, and
//! makes directories only as a file's parents; E2B's volume content API
//! needs the rest. The hub asks this of the helper Pod that mounts a volume
//! on Kubernetes, so, as the hub's own volume code does, a final symbolic
//! link is never followed: it is refused (403), or left out of a listing.
//! Everything above the final name is resolved by [`Root`], beneath the
//! root.

use std::{
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use axum::{
    extract::{Request, State},
    http::{Method, StatusCode},
    response::{IntoResponse, Response},
    routing::any,
    Json, Router,
};
use rustix::{
    fs::{self as rfs, AtFlags, FileType, Mode, OFlags},
    io::Errno,
};
use sandhub_api::sandboxd::{EntryType, MetaEntry, MetaListing, SetMode, META_ROUTE};

use crate::{
    confine::{RelPath, Root},
    error::{Error, Result},
    files::{form_pairs, parse_bool, request_path},
    Daemon,
};

/// The largest `PATCH` body read: a `{"mode": n}` is a few bytes.
const MAX_BODY: usize = 4096;

pub fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route(META_ROUTE, any(handle))
        .route(&format!("{META_ROUTE}/"), any(handle))
        .route(&format!("{META_ROUTE}/{{*path}}"), any(handle))
}

async fn handle(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    let result = serve(&daemon, request).await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn serve(daemon: &Daemon, request: Request) -> Result<Response> {
    let rel = request_path(request.uri().path(), META_ROUTE)?;
    let query = Query::parse(request.uri().query())?;
    let root = daemon.root();
    match *request.method() {
        Method::GET if query.list => Ok(Json(list(&root, &rel)?).into_response()),
        Method::GET => Ok(Json(stat(&root, &rel)?).into_response()),
        Method::POST => {
            let mode = query.mode.ok_or_else(|| {
                Error::InvalidArgument("making a directory needs its mode (`mode=`)".into())
            })?;
            make_dir(&root, &rel, query.parents, mode)?;
            Ok((StatusCode::CREATED, Json(stat(&root, &rel)?)).into_response())
        }
        Method::PATCH => {
            let body = axum::body::to_bytes(request.into_body(), MAX_BODY)
                .await
                .map_err(|e| Error::InvalidArgument(format!("reading the body: {e}")))?;
            let SetMode { mode } = serde_json::from_slice(&body).map_err(|e| {
                Error::InvalidArgument(format!("the body must be {{\"mode\": n}}: {e}"))
            })?;
            set_mode(&root, &rel, checked_mode(mode)?)?;
            Ok(Json(stat(&root, &rel)?).into_response())
        }
        _ => Err(Error::InvalidArgument(format!(
            "method {} is not supported on {META_ROUTE}; use GET, POST or PATCH",
            request.method()
        ))),
    }
}

#[derive(Default)]
struct Query {
    list: bool,
    parents: bool,
    mode: Option<u32>,
}

impl Query {
    fn parse(query: Option<&str>) -> Result<Self> {
        let mut q = Query::default();
        for (key, value) in form_pairs(query.unwrap_or("")) {
            match key.as_str() {
                "list" => q.list = parse_bool("list", &value)?,
                "parents" => q.parents = parse_bool("parents", &value)?,
                "mode" => {
                    let m = value.parse().map_err(|_| {
                        Error::InvalidArgument(format!("mode must be a number, not `{value}`"))
                    })?;
                    q.mode = Some(checked_mode(m)?);
                }
                _ => {}
            }
        }
        Ok(q)
    }
}

fn checked_mode(mode: u32) -> Result<u32> {
    if mode > 0o7777 {
        return Err(Error::InvalidArgument(format!(
            "mode takes permission bits only (at most 0o7777), not {mode:#o}"
        )));
    }
    Ok(mode)
}

fn at(secs: i64, nsec: i64) -> String {
    let t = if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsec.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH
    };
    humantime::format_rfc3339_nanos(t).to_string()
}

// `stat`'s time fields are not i64 on every architecture.
#[allow(clippy::unnecessary_cast)]
fn entry(name: &str, st: &rfs::Stat) -> Option<MetaEntry> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryType::File,
        FileType::Directory => EntryType::Directory,
        _ => return None,
    };
    Some(MetaEntry {
        name: name.to_string(),
        kind,
        size: if kind == EntryType::File {
            st.st_size as u64
        } else {
            0
        },
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: at(st.st_atime as i64, st.st_atime_nsec as i64),
        mtime: at(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime: at(st.st_ctime as i64, st.st_ctime_nsec as i64),
    })
}

/// What is at `rel`, its final name not followed.
fn stat(root: &Root, rel: &RelPath) -> Result<MetaEntry> {
    let st = root.lstat(rel)?;
    let name = rel.split_last().map(|(_, n)| n).unwrap_or("");
    if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
        return Err(Error::PermissionDenied(format!(
            "{} is a symbolic link; it is not followed",
            rel.display()
        )));
    }
    entry(name, &st).ok_or_else(|| {
        Error::Conflict(format!(
            "{} is neither a regular file nor a directory",
            rel.display()
        ))
    })
}

fn list(root: &Root, rel: &RelPath) -> Result<MetaListing> {
    let dir = root.open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    let mut reader = rfs::Dir::read_from(&dir).map_err(|e| Error::io(e.into(), &rel.display()))?;
    let mut entries = Vec::new();
    while let Some(item) = reader.read() {
        let item = item.map_err(|e| Error::io(e.into(), &rel.display()))?;
        let Ok(name) = item.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        // Gone meanwhile, a link or a special file: not described.
        let Ok(st) = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        entries.extend(entry(name, &st));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(MetaListing { entries })
}

/// Makes directory `rel` with `mode` (its missing parents too with
/// `parents`, as `mkdir -p`, which leaves one that exists as it is).
fn make_dir(root: &Root, rel: &RelPath, parents: bool, mode: u32) -> Result<()> {
    let Some((parent, name)) = rel.split_last() else {
        return if parents {
            Ok(())
        } else {
            Err(Error::Conflict("/ exists".into()))
        };
    };
    let dir = if parents {
        root.create_dir_all(&parent)?
    } else {
        root.open_dir(&parent)?
    };
    match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            let st = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| Error::io(e.into(), &rel.display()))?;
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            return if parents && is_dir {
                Ok(())
            } else {
                Err(Error::Conflict(format!("{} exists", rel.display())))
            };
        }
        Err(e) => return Err(Error::io(e.into(), &rel.display())),
    }
    // Through the new directory's own fd: the umask does not narrow it,
    // and nothing swapped in by name is changed.
    let fd = rfs::openat(
        &dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(e.into(), &rel.display()))?;
    rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| Error::io(e.into(), &rel.display()))
}

/// Sets the permission bits of a regular file or directory through an fd
/// opened without following the final name (non-blocking, so no FIFO
/// holds it) and checked to be what it is meant to be.
fn set_mode(root: &Root, rel: &RelPath, mode: u32) -> Result<()> {
    let seen = stat(root, rel)?;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match rel.split_last() {
        None => root.open_at(rel, flags | OFlags::DIRECTORY, Mode::empty())?,
        Some((parent, name)) => {
            let dir = root.open_dir(&parent)?;
            rfs::openat(&dir, name, flags | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| Error::io(e.into(), &rel.display()))?
        }
    };
    let st = rfs::fstat(&fd).map_err(|e| Error::io(e.into(), &rel.display()))?;
    if entry(&seen.name, &st).map(|e| e.kind) != Some(seen.kind) {
        return Err(Error::Conflict(format!(
            "{} changed while being opened",
            rel.display()
        )));
    }
    rfs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| Error::io(e.into(), &rel.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        (dir, root)
    }

    fn rel(p: &str) -> RelPath {
        RelPath::parse(p).unwrap()
    }

    #[test]
    fn directories_are_made_with_their_mode_and_parents_only_when_asked() {
        let (_d, r) = root();
        assert!(matches!(
            make_dir(&r, &rel("a/b"), false, 0o750),
            Err(Error::NotFound(_))
        ));
        make_dir(&r, &rel("a/b"), true, 0o750).unwrap();
        let e = stat(&r, &rel("a/b")).unwrap();
        assert_eq!(
            (e.kind, e.mode, e.name.as_str()),
            (EntryType::Directory, 0o750, "b")
        );
        // Again: left as it is with parents, a conflict without.
        make_dir(&r, &rel("a/b"), true, 0o700).unwrap();
        assert_eq!(stat(&r, &rel("a/b")).unwrap().mode, 0o750);
        assert!(matches!(
            make_dir(&r, &rel("a/b"), false, 0o700),
            Err(Error::Conflict(_))
        ));
        std::fs::write(r.host_path().join("a/f"), b"x").unwrap();
        assert!(matches!(
            make_dir(&r, &rel("a/f"), true, 0o700),
            Err(Error::Conflict(_))
        ));
    }

    #[test]
    fn links_are_neither_followed_nor_listed_and_modes_change_in_place() {
        let (d, r) = root();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), d.path().join("out")).unwrap();
        std::os::unix::fs::symlink("f", d.path().join("in")).unwrap();
        std::fs::write(d.path().join("f"), b"abc").unwrap();
        for link in ["out", "in"] {
            assert!(matches!(
                stat(&r, &rel(link)),
                Err(Error::PermissionDenied(_))
            ));
            assert!(matches!(
                set_mode(&r, &rel(link), 0o777),
                Err(Error::PermissionDenied(_))
            ));
        }
        let names: Vec<_> = list(&r, &rel(""))
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["f"]);
        set_mode(&r, &rel("f"), 0o4640).unwrap();
        let e = stat(&r, &rel("f")).unwrap();
        assert_eq!((e.mode, e.size), (0o4640, 3));
        assert!(e.mtime.ends_with('Z') && e.ctime.contains('T'), "{e:?}");
        use std::os::unix::fs::PermissionsExt;
        let secret = std::fs::metadata(outside.path().join("secret")).unwrap();
        assert_ne!(secret.permissions().mode() & 0o7777, 0o777);
        assert!(checked_mode(0o10000).is_err());
    }
}
