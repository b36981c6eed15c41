//! JSON bodies of sandboxd's REST API (`/v1/files`, `/v1/health`,
//! `/v1/metadata`), shaped exactly like upstream's filesystem.yaml.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Default ports and limits, upstream's numbers.
pub const DEFAULT_REST_PORT: u16 = 8080;
pub const DEFAULT_GRPC_PORT: u16 = 9090;
pub const DEFAULT_LEGACY_PORT: u16 = 8888;
pub const DEFAULT_MAX_WATCHES: usize = 64;
pub const DEFAULT_STREAM_CHUNK_SIZE: usize = 4096;
pub const DEFAULT_METADATA_ENV_PREFIX: &str = "SANDBOX_";

/// File names of the Unix sockets `--unix-socket DIR` creates.
pub const REST_SOCKET: &str = "rest.sock";
pub const GRPC_SOCKET: &str = "grpc.sock";

/// Where a client behind a router presents sandboxd's token: the router
/// takes `Authorization` for itself and strips it, so the hub (which holds
/// the token) and sandboxd (which checks it) meet on this header instead.
pub const ROUTED_AUTH_HEADER: &str = "x-sandboxd-authorization";

/// Substrings that mark an environment variable as secret; such variables
/// never appear in `/v1/metadata`, whatever their prefix.
pub const SECRET_NAME_MARKERS: &[&str] = &[
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CRED", "KEY", "AUTH", "BEARER", "PRIVATE", "CERT",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EntryType {
    File,
    Directory,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// RFC 3339, UTC.
    pub modified_at: String,
    /// Octal permission bits, e.g. `0644`.
    pub mode: String,
}

/// sandboxd's own files route beside upstream's `/v1/files`:
/// `GET {META_ROUTE}/{path}` is a [`MetaEntry`] (`?list=true`: a
/// directory's [`MetaListing`]), `POST ?mode=&parents=` makes a directory,
/// `PATCH` with a [`SetMode`] body changes the permission bits. A final
/// symbolic link is never followed (403). What E2B's volume content API
/// reports of an entry, for a volume on Kubernetes.
pub const META_ROUTE: &str = "/v1/_sandhub/meta";

/// `POST`: `process.v1` `Execute` over HTTP/1.1, a Sandhub extension. The
/// body is a protobuf `ExecuteRequest`, a success a protobuf
/// `ExecuteResponse` ([`PROTOBUF_CONTENT_TYPE`]), an error the usual JSON.
/// One write each way, where a unary gRPC call over HTTP/2 takes a
/// HEADERS and a DATA frame, often in two writes from two threads. A
/// sandboxd without it answers 404 `no route for ...` (an older build) or
/// Go's `404 page not found` (upstream's); clients then use gRPC.
///
/// `?timeout_ms=N` kills the process group after N ms, as a timed run
/// does: the answer then has exit code 124, the output read so far, and
/// [`EXECUTE_TIMED_OUT_HEADER`] set to `true`.
pub const EXECUTE_ROUTE: &str = "/v1/_sandhub/execute";
pub const EXECUTE_TIMED_OUT_HEADER: &str = "x-sandhub-timed-out";
pub const PROTOBUF_CONTENT_TYPE: &str = "application/x-protobuf";
/// The largest `EXECUTE_ROUTE` request body: gRPC's decoding limit for
/// `Execute` on sandboxd (64 MiB).
pub const MAX_EXECUTE_REQUEST: usize = 64 << 20;

/// An entry with its ids, mode and times, as sandboxd's process sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// A file's length; 0 for a directory.
    pub size: u64,
    /// Permission bits (at most `0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// RFC 3339 with nanoseconds, UTC.
    pub atime: String,
    pub mtime: String,
    pub ctime: String,
}

/// A directory's regular files and directories (links and special files
/// left out, none followed), by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaListing {
    pub entries: Vec<MetaEntry>,
}

/// `PATCH {META_ROUTE}/{path}`'s body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetMode {
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DirectoryListing {
    /// The listed directory relative to the root, with a leading `/`.
    pub path: String,
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub uptime_seconds: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub env: BTreeMap<String, String>,
}

/// True when an environment variable's name looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_NAME_MARKERS.iter().any(|m| upper.contains(m))
}
