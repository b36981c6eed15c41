//! Streaming and process types the trait uses beyond the JSON bodies in
//! `sandhub_api::hub`.

use std::{collections::BTreeMap, pin::Pin};

use bytes::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};

use crate::Result;

pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;
pub type ProcessEvents = Pin<Box<dyn Stream<Item = Result<ProcessEvent>> + Send>>;
pub type WatchEvents = Pin<Box<dyn Stream<Item = Result<Vec<WatchEvent>>> + Send>>;

/// Starts a long-running process (dev server, test suite, shell).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StartProcess {
    /// argv; use `["/bin/sh", "-c", "..."]` for a shell string.
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cwd: String,
    /// Allocate a terminal of this size (stdout and stderr then merge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Start with stdin already closed: the process reads EOF at once, and
    /// no separate close has to follow. Ignored with a terminal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// One event of a started process, in order: `Started`, output, `Exited`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ProcessEvent {
    Started { pid: i32 },
    Stdout { data: Vec<u8> },
    Stderr { data: Vec<u8> },
    Exited { exit_code: i32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdinInput {
    Data(Bytes),
    /// Closes stdin (on a terminal: sends the EOF character).
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Signal {
    Sigint,
    Sigterm,
    Sigkill,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOptions {
    pub append: bool,
    /// Permission bits for a file this write creates (default 0644).
    pub mode: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum WatchKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: WatchKind,
    /// Workspace-relative with a leading `/`.
    pub path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub old_path: String,
    pub is_dir: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub timestamp_ms: i64,
}
