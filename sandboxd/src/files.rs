//! REST `/v1/files/{path}`: read, list, stat, write, append and delete files
//! beneath the root.
//!
//! The path is taken from the raw request path and percent-decoded here, so
//! that the SDK's single-segment form (`a%2Fb.txt`) and literal slashes
//! (`a/b.txt`) name the same file.

use std::{
    os::fd::OwnedFd,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    body::Body,
    extract::{DefaultBodyLimit, Request, State},
    http::{header, HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::any,
    Json, Router,
};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use sandhub_api::sandboxd::{DirectoryListing, EntryType, FileEntry};

use crate::{
    confine::{kind_of, Kind, RelPath, Root},
    error::{Error, Result},
    transfer, Daemon,
};

pub(crate) const PREFIX: &str = "/v1/files";
const DEFAULT_MODE: u32 = 0o644;

pub fn routes() -> Router<Arc<Daemon>> {
    Router::new()
        .route(PREFIX, any(handle))
        .route("/v1/files/", any(handle))
        .route("/v1/files/{*path}", any(handle))
        // Uploads stream to disk; the only cap is --max-upload-bytes.
        .layer(DefaultBodyLimit::disable())
}

async fn handle(State(daemon): State<Arc<Daemon>>, request: Request) -> Response {
    let result = match *request.method() {
        Method::GET => get(&daemon, request, true).await,
        Method::HEAD => get(&daemon, request, false).await,
        Method::PUT => put(&daemon, request).await,
        Method::DELETE => delete(&daemon, request).await,
        _ => Err(Error::InvalidArgument(format!(
            "method {} is not supported on /v1/files; use GET, HEAD, PUT or DELETE",
            request.method()
        ))),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The root-relative path a request names.
pub fn request_path(raw_path: &str, prefix: &str) -> Result<RelPath> {
    let rest = raw_path.strip_prefix(prefix).unwrap_or("");
    let decoded = percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .map_err(|_| Error::InvalidArgument("path is not valid UTF-8".into()))?;
    RelPath::parse(&decoded)
}

/// Query parameters, parsed by hand so every bad value gets a clear message.
#[derive(Default)]
struct Query {
    mode: Option<u32>,
    append: bool,
    recursive: bool,
    kind: Option<Kind>,
}

impl Query {
    fn parse(query: Option<&str>) -> Result<Self> {
        let mut q = Query::default();
        for (key, value) in form_pairs(query.unwrap_or("")) {
            match key.as_str() {
                "mode" => q.mode = Some(parse_mode(&value)?),
                "append" => q.append = parse_bool("append", &value)?,
                "recursive" => q.recursive = parse_bool("recursive", &value)?,
                "type" => {
                    q.kind = Some(match value.as_str() {
                        "file" => Kind::File,
                        "directory" => Kind::Directory,
                        other => {
                            return Err(Error::InvalidArgument(format!(
                                "type must be `file` or `directory`, not `{other}`"
                            )))
                        }
                    })
                }
                // Unknown parameters are ignored, as upstream does.
                _ => {}
            }
        }
        Ok(q)
    }
}

pub(crate) fn form_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|s| !s.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        (decode(k), decode(v))
    })
}

/// `^0[0-7]{3}$`, upstream's rule.
fn parse_mode(value: &str) -> Result<u32> {
    let bytes = value.as_bytes();
    if bytes.len() != 4 || bytes[0] != b'0' || !bytes[1..].iter().all(|b| (b'0'..=b'7').contains(b))
    {
        return Err(Error::InvalidArgument(format!(
            "mode must match ^0[0-7]{{3}}$ (e.g. 0644), not `{value}`"
        )));
    }
    Ok(u32::from_str_radix(&value[1..], 8).expect("checked octal"))
}

/// Go's `strconv.ParseBool` spellings, since upstream parses with it.
pub fn parse_bool(name: &str, value: &str) -> Result<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(Error::InvalidArgument(format!(
            "{name} must be true or false, not `{other}`"
        ))),
    }
}

async fn get(daemon: &Daemon, request: Request, with_body: bool) -> Result<Response> {
    let rel = request_path(request.uri().path(), PREFIX)?;
    let query = Query::parse(request.uri().query())?;
    let root = &daemon.root();
    let st = root.stat(&rel)?;
    let kind = kind_of(&st);
    if let Some(expected) = query.kind {
        if expected != kind {
            return Err(Error::Conflict(format!(
                "{} is a {}, not a {}",
                rel.display(),
                kind_word(kind),
                kind_word(expected)
            )));
        }
    }
    match kind {
        Kind::Directory => {
            let listing = list(root, &rel)?;
            if with_body {
                Ok(Json(listing).into_response())
            } else {
                let len = serde_json::to_vec(&listing).map(|v| v.len()).unwrap_or(0);
                Ok((
                    [
                        (header::CONTENT_TYPE, "application/json".to_string()),
                        (header::CONTENT_LENGTH, len.to_string()),
                    ],
                    Body::empty(),
                )
                    .into_response())
            }
        }
        Kind::File => serve_file(root, &rel, request.headers(), with_body).await,
        Kind::Other => Err(Error::InvalidArgument(format!(
            "{} is neither a regular file nor a directory",
            rel.display()
        ))),
    }
}

fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "file",
        Kind::Directory => "directory",
        Kind::Other => "special file",
    }
}

/// How a listing reports an entry; special files (sockets, devices) are
/// left out of listings.
pub fn entry_type(st: &rfs::Stat) -> Option<EntryType> {
    match kind_of(st) {
        Kind::File => Some(EntryType::File),
        Kind::Directory => Some(EntryType::Directory),
        Kind::Other => None,
    }
}

pub fn list(root: &Root, rel: &RelPath) -> Result<DirectoryListing> {
    let entries = root
        .list(rel)?
        .into_iter()
        .filter_map(|(name, st)| {
            let kind = entry_type(&st)?;
            Some(FileEntry {
                name,
                size: if kind == EntryType::File {
                    st.st_size as u64
                } else {
                    0
                },
                kind,
                modified_at: rfc3339(mtime(&st)),
                mode: format!("{:04o}", st.st_mode & 0o7777),
            })
        })
        .collect();
    Ok(DirectoryListing {
        path: rel.display(),
        entries,
    })
}

pub fn mtime(st: &rfs::Stat) -> SystemTime {
    let secs = st.st_mtime.max(0) as u64;
    UNIX_EPOCH + Duration::new(secs, st.st_mtime_nsec as u32)
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `rel` opened for reading, and its stat. The opened file is statted, not
/// the path, so what is sent matches what is described; a name swapped for
/// a FIFO meanwhile is neither waited on ([`Root::open_read`]) nor read.
pub(crate) fn open_file(root: &Root, rel: &RelPath) -> Result<(std::fs::File, rfs::Stat)> {
    let file = root.open_read(rel)?;
    let st = rfs::fstat(&file).map_err(|e| Error::io(e.into(), &rel.display()))?;
    if kind_of(&st) != Kind::File {
        return Err(Error::Conflict(format!(
            "{} changed while being read",
            rel.display()
        )));
    }
    Ok((file, st))
}

/// Whether a GET's query asks for nothing but a file's bytes (none, or
/// `type=file`, or parameters a GET ignores); anything else (a listing, a
/// bad value) is [`get`]'s to answer.
pub(crate) fn is_plain_read_query(query: Option<&str>) -> bool {
    matches!(Query::parse(query), Ok(q) if matches!(q.kind, None | Some(Kind::File)))
}

async fn serve_file(
    root: &Root,
    rel: &RelPath,
    headers: &HeaderMap,
    with_body: bool,
) -> Result<Response> {
    let (file, st) = open_file(root, rel)?;
    let len = st.st_size as u64;
    let modified = mtime(&st);
    let last_modified = httpdate::fmt_http_date(modified);

    if let Some(since) = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
    {
        let whole_secs = UNIX_EPOCH + Duration::from_secs(st.st_mtime.max(0) as u64);
        if whole_secs <= since && headers.get(header::RANGE).is_none() {
            return Ok((
                StatusCode::NOT_MODIFIED,
                [(header::LAST_MODIFIED, last_modified)],
            )
                .into_response());
        }
    }

    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => None,
        Some(spec) => match parse_range(spec, len) {
            RangeSpec::Ignore => None,
            RangeSpec::One(start, end) => Some((start, end)),
            RangeSpec::Unsatisfiable => {
                return Ok((
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    [(header::CONTENT_RANGE, format!("bytes */{len}"))],
                    Json(
                        Error::InvalidArgument(format!("range {spec} is outside 0..{len}")).body(),
                    ),
                )
                    .into_response())
            }
        },
    };
    let (status, start, count) = match range {
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        None => (StatusCode::OK, 0, len),
    };
    let mut response = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, count)
        .header(header::LAST_MODIFIED, last_modified)
        .header(header::ACCEPT_RANGES, "bytes");
    if range.is_some() {
        response = response.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{len}", start + count - 1),
        );
    }
    let body = if with_body {
        Body::from_stream(transfer::read_body(file, start, count))
    } else {
        Body::empty()
    };
    response
        .body(body)
        .map_err(|e| Error::Internal(format!("building response: {e}")))
}

enum RangeSpec {
    Ignore,
    One(u64, u64),
    Unsatisfiable,
}

/// A single `bytes=` range. Multi-range requests are answered with the whole
/// file, which RFC 9110 allows.
fn parse_range(spec: &str, len: u64) -> RangeSpec {
    let Some(ranges) = spec.trim().strip_prefix("bytes=") else {
        return RangeSpec::Ignore;
    };
    if ranges.contains(',') {
        return RangeSpec::Ignore;
    }
    let Some((a, b)) = ranges.trim().split_once('-') else {
        return RangeSpec::Ignore;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.is_empty(), b.is_empty()) {
        (true, true) => return RangeSpec::Ignore,
        // Suffix: the last N bytes.
        (true, false) => match b.parse::<u64>() {
            Ok(0) => return RangeSpec::Unsatisfiable,
            Ok(n) => (len.saturating_sub(n), len.saturating_sub(1)),
            Err(_) => return RangeSpec::Ignore,
        },
        (false, _) => {
            let Ok(start) = a.parse::<u64>() else {
                return RangeSpec::Ignore;
            };
            let end = if b.is_empty() {
                len.saturating_sub(1)
            } else {
                match b.parse::<u64>() {
                    Ok(e) if e >= start => e.min(len.saturating_sub(1)),
                    _ => return RangeSpec::Ignore,
                }
            };
            (start, end)
        }
    };
    if len == 0 || parsed.0 >= len {
        return RangeSpec::Unsatisfiable;
    }
    RangeSpec::One(parsed.0, parsed.1)
}

/// sandboxd's bound on reading a refused upload before the answer (see
/// [`sandhub_common::drain`]): at most this much (more when
/// `--max-upload-bytes` is higher), for at most [`DRAIN_TIMEOUT`].
const DRAIN_MAX_BYTES: u64 = 64 << 20;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A refused upload (no space left, a path that escapes, a full disk
/// quota) is answered before the client finished sending. Closing the
/// connection on it then makes the client's next write fail with a broken
/// pipe, and it never sees the answer; so the rest of a body of bounded
/// size is read and dropped first.
async fn put(daemon: &Daemon, request: Request) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (body, rest) = sandhub_common::drain::split(body.into_data_stream());
    let result = put_body(daemon, parts, body).await;
    let bound = DRAIN_MAX_BYTES.max(daemon.config.max_upload_bytes);
    if result.is_err() && declared.is_none_or(|len| len <= bound) {
        rest.drain(bound, DRAIN_TIMEOUT).await;
    }
    result
}

async fn put_body(
    daemon: &Daemon,
    parts: http::request::Parts,
    body: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
) -> Result<Response> {
    let rel = request_path(parts.uri.path(), PREFIX)?;
    let query = Query::parse(parts.uri.query())?;
    let limit = daemon.config.max_upload_bytes;
    if limit > 0 {
        if let Some(len) = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > limit {
                return Err(too_large(limit));
            }
        }
    }
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let data: BodyStream = if content_type.starts_with("multipart/form-data") {
        Box::pin(multipart_file(&content_type, body).await?)
    } else {
        Box::pin(body.map(|r| r.map_err(|e| Error::InvalidArgument(format!("reading body: {e}")))))
    };
    let mode = query.mode.unwrap_or(DEFAULT_MODE);
    if query.append {
        append_file(&daemon.root(), &rel, mode, data, limit).await?;
    } else {
        write_atomic(&daemon.root(), &rel, mode, data, limit).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub type BodyStream = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;

/// The bytes of the multipart part named `file`.
pub async fn multipart_file(
    content_type: &str,
    body: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
) -> Result<impl Stream<Item = Result<Bytes>> + Send> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| Error::InvalidArgument(format!("bad multipart content type: {e}")))?;
    let mut multipart = multer::Multipart::new(body, boundary);
    loop {
        let field = multipart
            .next_field()
            .await
            .map_err(|e| Error::InvalidArgument(format!("bad multipart body: {e}")))?
            .ok_or_else(|| Error::InvalidArgument("multipart body has no `file` part".into()))?;
        if field.name() == Some("file") {
            return Ok(field.map(|r| {
                r.map_err(|e| Error::InvalidArgument(format!("bad multipart body: {e}")))
            }));
        }
    }
}

fn too_large(limit: u64) -> Error {
    Error::TooLarge(format!("body exceeds the {limit}-byte upload limit"))
}

/// Writes `data` to a temp file beside the target and renames it into
/// place, so readers see the old file or the new one, never half of one,
/// and a failed upload (client gone, disk full, too large) changes nothing.
pub async fn write_atomic(
    root: &Root,
    rel: &RelPath,
    mode: u32,
    data: BodyStream,
    limit: u64,
) -> Result<()> {
    let (parent, name) = rel
        .split_last()
        .ok_or_else(|| Error::InvalidArgument("cannot write to the root directory".into()))?;
    let dir = root.create_dir_all(&parent)?;
    match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if kind_of(&st) == Kind::Directory => {
            return Err(Error::InvalidArgument(format!(
                "{} is a directory",
                rel.display()
            )))
        }
        _ => {}
    }
    let tmp_name = format!(".sandboxd-{:016x}.tmp", rand::random::<u64>());
    let fd = rfs::openat(
        &dir,
        tmp_name.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| Error::io(e.into(), &rel.display()))?;
    let result = async {
        // The umask must not decide the final mode.
        rfs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| Error::io(e.into(), &rel.display()))?;
        copy_into(fd, data, limit, rel).await?;
        rfs::renameat(&dir, tmp_name.as_str(), &dir, name)
            .map_err(|e| Error::io(e.into(), &rel.display()))
    }
    .await;
    if result.is_err() {
        let _ = rfs::unlinkat(&dir, tmp_name.as_str(), AtFlags::empty());
    }
    result
}

/// Appends `data`, creating the file (and parents) if missing; `mode`
/// applies only when the file is created.
pub async fn append_file(
    root: &Root,
    rel: &RelPath,
    mode: u32,
    data: BodyStream,
    limit: u64,
) -> Result<()> {
    let (parent, _) = rel
        .split_last()
        .ok_or_else(|| Error::InvalidArgument("cannot append to the root directory".into()))?;
    root.create_dir_all(&parent)?;
    let flags = OFlags::WRONLY | OFlags::APPEND;
    let fd = match root.open_at(
        rel,
        flags | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(mode),
    ) {
        Ok(fd) => {
            rfs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| Error::io(e.into(), &rel.display()))?;
            fd
        }
        Err(Error::Conflict(_)) => {
            root.open_at(rel, flags, Mode::empty())
                .map_err(|e| match e {
                    Error::InvalidArgument(_) => {
                        Error::InvalidArgument(format!("{} is a directory", rel.display()))
                    }
                    other => other,
                })?
        }
        Err(e) => return Err(e),
    };
    copy_into(fd, data, limit, rel).await
}

async fn copy_into(fd: OwnedFd, data: BodyStream, limit: u64, rel: &RelPath) -> Result<()> {
    transfer::write_body(
        std::fs::File::from(fd),
        data,
        limit,
        || too_large(limit),
        |e| Error::io(e, &rel.display()),
    )
    .await
}

async fn delete(daemon: &Daemon, request: Request) -> Result<Response> {
    let rel = request_path(request.uri().path(), PREFIX)?;
    let query = Query::parse(request.uri().query())?;
    daemon.root().remove(&rel, query.recursive)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_upstream_rule() {
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        assert_eq!(parse_mode("0755").unwrap(), 0o755);
        for bad in ["644", "0648", "00644", "rwx", "", "1644"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ranges() {
        assert!(matches!(
            parse_range("bytes=0-9", 100),
            RangeSpec::One(0, 9)
        ));
        assert!(matches!(
            parse_range("bytes=90-", 100),
            RangeSpec::One(90, 99)
        ));
        assert!(matches!(
            parse_range("bytes=-10", 100),
            RangeSpec::One(90, 99)
        ));
        assert!(matches!(
            parse_range("bytes=50-500", 100),
            RangeSpec::One(50, 99)
        ));
        assert!(matches!(
            parse_range("bytes=100-", 100),
            RangeSpec::Unsatisfiable
        ));
        assert!(matches!(
            parse_range("bytes=0-1,4-5", 100),
            RangeSpec::Ignore
        ));
        assert!(matches!(parse_range("items=0-1", 100), RangeSpec::Ignore));
        assert!(matches!(parse_range("bytes=5-1", 100), RangeSpec::Ignore));
    }

    #[test]
    fn request_paths_decode_slashes() {
        assert_eq!(
            request_path("/v1/files/a%2Fb.txt", PREFIX)
                .unwrap()
                .as_str(),
            "a/b.txt"
        );
        assert_eq!(
            request_path("/v1/files/a/b.txt", PREFIX).unwrap().as_str(),
            "a/b.txt"
        );
        assert!(request_path("/v1/files/..%2F..%2Fetc", PREFIX).is_err());
        assert!(request_path("/v1/files/a%00b", PREFIX).is_err());
        assert!(request_path("/v1/files", PREFIX).unwrap().is_root());
    }
}
