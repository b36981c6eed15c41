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
