//! Files in a sandbox's workspace: upload, download, list, exists, and a
//! bounded wait for changes.

use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use sandhub_api::{error::Code, sandboxd::EntryType};
use sandhub_client::{write_bytes, WriteOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{bounded, seconds, wait};
use crate::{
    errors::ToolError,
    paths::{display, workspace_path},
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

const DEFAULT_TIMEOUT: f64 = 60.0;
const DEFAULT_MAX_ENTRIES: usize = 1000;
const DEFAULT_WATCH_SECONDS: f64 = 30.0;
const MAX_WATCH_SECONDS: f64 = 60.0;
/// After the first change, how long to keep collecting: one editor save or
/// `git checkout` is a burst of events, and the model wants it whole.
const WATCH_SETTLE: Duration = Duration::from_millis(200);
const MAX_WATCH_EVENTS: usize = 1000;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, Deserialize, JsonSchema)]
pub struct UploadFileParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Destination file, relative to /workspace (e.g. "src/main.py"; "/workspace/src/main.py"
    /// also works). Missing parent directories are created; an existing file is replaced.
    pub path: String,
    /// The file's content: text, or base64 when binary is true.
    pub content: String,
    /// True when content is base64-encoded bytes. Default false.
    #[serde(default)]
    pub binary: bool,
    /// Seconds to wait for the upload. Default 60.
    #[serde(default)]
    pub timeout: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct UploadFileResult {
    pub bytes_written: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DownloadFileParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The file to read, relative to /workspace.
    pub path: String,
    /// Return the content base64-encoded (for files that are not UTF-8 text). Default false.
    #[serde(default)]
    pub binary: bool,
    /// Seconds to wait for the download. Default 60.
    #[serde(default)]
    pub timeout: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DownloadFileResult {
    /// The file's text, or its bytes in base64 when binary was true.
    pub content: String,
    pub bytes_read: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListFilesParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The directory to list, relative to /workspace ("." or "" for /workspace itself).
    #[serde(default)]
    pub path: String,
    /// Seconds to wait for the listing. Default 60.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Most entries to return. Default 1000.
    #[serde(default)]
    pub max_entries: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileEntry {
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// "file" or "directory".
    #[serde(rename = "type")]
    pub kind: String,
    /// Last modification, RFC 3339 UTC (e.g. "2026-01-02T03:04:05Z").
    pub mod_time: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListFilesResult {
    pub entries: Vec<FileEntry>,
    /// Entries in the directory, including any left out by max_entries.
    pub total_entries: usize,
    /// True when max_entries left some out.
    pub truncated: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileExistsParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The file or directory, relative to /workspace.
    pub path: String,
    /// Seconds to wait for the answer. Default 60.
    #[serde(default)]
    pub timeout: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileExistsResult {
    pub exists: bool,
    /// "file" or "directory" when it exists.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WatchDirectoryParams {
    /// The sandbox id that create_sandbox returned.
    pub sandbox_claim_name: String,
    /// Accepted for compatibility with upstream agent-sandbox; ignored.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The directory to watch, relative to /workspace.
    #[serde(default)]
    pub path: String,
    /// Also watch subdirectories. Default false.
    #[serde(default)]
    pub recursive: bool,
    /// Seconds to wait for a change. Default 30, at most 60.
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchEvent {
    /// CREATE, WRITE, REMOVE, RENAME, CHMOD or ERROR.
    #[serde(rename = "type")]
    pub kind: String,
    /// The changed path, relative to /workspace, with a leading "/".
    pub path: String,
    pub is_dir: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WatchDirectoryResult {
    pub events: Vec<WatchEvent>,
    /// True when nothing changed before timeout_seconds.
    pub timed_out: bool,
}

#[tool_router(router = files_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Write a file in a sandbox, replacing it if it exists and creating \
        missing parent directories. Paths are relative to /workspace. For bytes that are not \
        text, base64-encode content and set binary to true.",
        annotations(
            title = "Upload file",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn upload_file(
        &self,
        Parameters(p): Parameters<UploadFileParams>,
        hub: Hub,
    ) -> Result<Json<UploadFileResult>, ToolError> {
        let timeout = seconds("timeout", p.timeout, DEFAULT_TIMEOUT)?;
        let path = workspace_path(&p.path)?;
        if path.is_empty() {
            return Err(ToolError::new(
                "path names /workspace itself; give a file path such as \"notes.txt\"",
            ));
        }
        let data = if p.binary {
            B64.decode(p.content.trim()).map_err(|e| {
                ToolError::new(format!(
                    "content is not valid base64 ({e}); encode the bytes as standard base64, \
                     or pass binary=false to upload text as it is"
                ))
            })?
        } else {
            p.content.into_bytes()
        };
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let len = data.len() as u64;
        bounded("the upload", timeout, async {
            write_bytes(sb.as_ref(), &id, &path, data, WriteOptions::default())
                .await
                .map_err(|e| self.file_error(&id, "writing", &path, e))
        })
        .await?;
        Ok(Json(UploadFileResult { bytes_written: len }))
    }

    #[tool(
        description = "Read a file from a sandbox. Paths are relative to /workspace. Text comes \
        back as it is; for files that are not UTF-8 text pass binary=true to get base64.",
        annotations(
            title = "Download file",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn download_file(
        &self,
        Parameters(p): Parameters<DownloadFileParams>,
        hub: Hub,
    ) -> Result<Json<DownloadFileResult>, ToolError> {
        let timeout = seconds("timeout", p.timeout, DEFAULT_TIMEOUT)?;
        let path = workspace_path(&p.path)?;
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let cap = self.options.max_file_bytes;
        let bytes = bounded("the download", timeout, async {
            let mut stream = sb
                .read_file(&id, &path)
                .await
                .map_err(|e| self.file_error(&id, "reading", &path, e))?;
            let mut bytes = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.file_error(&id, "reading", &path, e))?;
                if bytes.len() + chunk.len() > cap {
                    return Err(ToolError::new(format!(
                        "{} is larger than {cap} bytes, too large to return whole; read \
                         parts of it with execute_command (head, tail, sed -n, grep)",
                        display(&path)
                    )));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes)
        })
        .await?;
        let bytes_read = bytes.len() as u64;
        let content = if p.binary {
            B64.encode(&bytes)
        } else {
            String::from_utf8(bytes).map_err(|_| {
                ToolError::new(format!(
                    "{} is not UTF-8 text; call download_file again with binary=true to get \
                     it base64-encoded",
                    display(&path)
                ))
            })?
        };
        Ok(Json(DownloadFileResult {
            content,
            bytes_read,
        }))
    }

    #[tool(
        description = "List a directory in a sandbox: each entry's name, size, type (file or \
        directory) and modification time (RFC 3339). Paths are relative to /workspace.",
        annotations(
            title = "List files",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn list_files(
        &self,
        Parameters(p): Parameters<ListFilesParams>,
        hub: Hub,
    ) -> Result<Json<ListFilesResult>, ToolError> {
        let timeout = seconds("timeout", p.timeout, DEFAULT_TIMEOUT)?;
        let path = workspace_path(&p.path)?;
        let max = p.max_entries.unwrap_or(DEFAULT_MAX_ENTRIES);
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let listing = bounded("the listing", timeout, async {
            sb.list_files(&id, &path)
                .await
                .map_err(|e| self.file_error(&id, "listing", &path, e))
        })
        .await?;
        let total_entries = listing.entries.len();
        let entries = listing
            .entries
            .into_iter()
            .take(max)
            .map(|e| FileEntry {
                name: e.name,
                size: e.size,
                kind: kind(e.kind).to_string(),
                mod_time: e.modified_at,
            })
            .collect();
        Ok(Json(ListFilesResult {
            entries,
            total_entries,
            truncated: total_entries > max,
        }))
    }

    #[tool(
        description = "Check whether a file or directory exists in a sandbox. Paths are \
        relative to /workspace.",
        annotations(
            title = "File exists",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn file_exists(
        &self,
        Parameters(p): Parameters<FileExistsParams>,
        hub: Hub,
    ) -> Result<Json<FileExistsResult>, ToolError> {
        let timeout = seconds("timeout", p.timeout, DEFAULT_TIMEOUT)?;
        let path = workspace_path(&p.path)?;
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let entry = bounded("the check", timeout, async {
            sb.stat(&id, &path)
                .await
                .map_err(|e| self.file_error(&id, "checking", &path, e))
        })
        .await?;
        Ok(Json(FileExistsResult {
            exists: entry.is_some(),
            kind: entry.map(|e| kind(e.kind).to_string()),
        }))
    }

    #[tool(
        description = "Wait until something changes in a sandbox directory (a file created, \
        written, removed or renamed) and return what changed; gives up after timeout_seconds \
        (default 30, at most 60) with timed_out true. Useful to wait for a build output or a \
        log file.",
        annotations(
            title = "Watch directory",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn watch_directory(
        &self,
        Parameters(p): Parameters<WatchDirectoryParams>,
        hub: Hub,
    ) -> Result<Json<WatchDirectoryResult>, ToolError> {
        let limit = wait(
            "timeout_seconds",
            p.timeout_seconds,
            DEFAULT_WATCH_SECONDS,
            MAX_WATCH_SECONDS,
        )?;
        let path = workspace_path(&p.path)?;
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let deadline = tokio::time::Instant::now() + limit;
        let mut stream =
            match tokio::time::timeout_at(deadline, sb.watch(&id, &path, p.recursive)).await {
                Ok(r) => r.map_err(|e| self.file_error(&id, "watching", &path, e))?,
                Err(_) => {
                    return Err(ToolError::timed_out(
                        "starting the watch",
                        limit.as_secs_f64(),
                    ))
                }
            };
        let mut events = Vec::new();
        let mut until = deadline;
        while events.len() < MAX_WATCH_EVENTS {
            match tokio::time::timeout_at(until, stream.next()).await {
                Ok(Some(Ok(batch))) => {
                    events.extend(batch.into_iter().map(|e| {
                        WatchEvent {
                            kind: serde_json::to_value(e.kind)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default(),
                            path: e.path,
                            is_dir: e.is_dir,
                        }
                    }));
                    until = deadline.min(tokio::time::Instant::now() + WATCH_SETTLE);
                }
                Ok(Some(Err(e))) if events.is_empty() => {
                    return Err(self.file_error(&id, "watching", &path, e))
                }
                // An error after some events, the stream's end, or the
                // deadline: report what arrived.
                _ => break,
            }
        }
        events.truncate(MAX_WATCH_EVENTS);
        Ok(Json(WatchDirectoryResult {
            timed_out: events.is_empty(),
            events,
        }))
    }
}

impl<P: SandboxesProvider> SandhubMcp<P> {
    /// A file operation's failure, phrased about the path the model gave.
    fn file_error(&self, id: &str, doing: &str, path: &str, e: sandhub_client::Error) -> ToolError {
        let shown = display(path);
        match e.code {
            // A sandbox that vanished is not a missing file.
            Code::NotFound if e.message.contains(id) => self.gone_or(id, e),
            Code::NotFound => ToolError::new(format!(
                "{shown} does not exist in sandbox {id}; paths are relative to /workspace, and \
                 list_files shows what a directory holds"
            )),
            Code::Conflict if doing == "reading" => ToolError::new(format!(
                "{shown} is a directory; use list_files to see its entries"
            )),
            Code::PermissionDenied => ToolError::new(format!(
                "{doing} {shown} was refused: the path escapes the workspace or is not \
                 accessible; use a path relative to /workspace ({})",
                e.message
            )),
            _ => ToolError::hub(&format!("{doing} {shown}"), e),
        }
    }
}

fn kind(k: EntryType) -> &'static str {
    match k {
        EntryType::File => "file",
        EntryType::Directory => "directory",
    }
}
