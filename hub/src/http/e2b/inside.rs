//! File work beyond the workspace, done by commands inside the sandbox:
//! they run as the sandbox's own user in its own namespaces, so they reach
//! exactly what the sandbox's processes could (the hub resolves nothing).
//! Paths travel as argv, never through a shell's parser.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sandhub_api::{
    error::Code,
    hub::{Command, ExecRequest, ExecResult},
};
use sandhub_client::{Error, ProcessEvent, Result, StartProcess, StdinInput};

use crate::backend::TenantView;

/// One file or directory as `stat`/`find` describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub path: String,
    pub dir: bool,
    pub size: u64,
    pub mode: u32,
    pub owner: String,
    pub group: String,
    /// Seconds since the epoch.
    pub modified: f64,
}

const EXEC_TIMEOUT_S: f64 = 120.0;
/// What `list` returns at most; deeper trees are cut there.
pub const MAX_LISTED: usize = 10_000;

async fn run(api: &Arc<dyn TenantView>, id: &str, argv: &[&str]) -> Result<ExecResult> {
    api.exec(
        id,
        ExecRequest {
            command: Command::Argv(argv.iter().map(|s| s.to_string()).collect()),
            env: BTreeMap::new(),
            cwd: String::new(),
            timeout_seconds: Some(EXEC_TIMEOUT_S),
            stdin: String::new(),
            container: None,
        },
    )
    .await
}

/// A failed command's error, in the words its stderr used.
fn failure(what: &str, path: &str, result: &ExecResult) -> Error {
    let said = result.stderr.trim();
    let code = if said.contains("No such file") || said.contains("Not a directory") {
        Code::NotFound
    } else if said.contains("Permission denied") || said.contains("Read-only file system") {
        Code::PermissionDenied
    } else if said.contains("File exists") || said.contains("Is a directory") {
        Code::InvalidArgument
    } else if said.contains("No space left") || said.contains("Disk quota") {
        Code::ResourceExhausted
    } else {
        Code::Internal
    };
    Error::new(code, format!("{what} {path}: {said}"))
}

async fn checked(api: &Arc<dyn TenantView>, id: &str, what: &str, argv: &[&str]) -> Result<String> {
    let result = run(api, id, argv).await?;
    if result.exit_code != 0 {
        return Err(failure(what, argv.last().copied().unwrap_or(""), &result));
    }
    Ok(result.stdout)
}

/// `stat` of one path (following a final symlink, as reading it would).
pub async fn stat(api: &Arc<dyn TenantView>, id: &str, path: &str) -> Result<Entry> {
    let out = checked(
        api,
        id,
        "stat",
        &["stat", "-L", "-c", "%F\t%s\t%a\t%U\t%G\t%Y\t%n", "--", path],
    )
    .await?;
    let line = out.lines().next().unwrap_or_default();
    let f: Vec<&str> = line.splitn(7, '\t').collect();
    if f.len() < 7 {
        return Err(Error::internal(format!(
            "stat {path}: unexpected output {line:?}"
        )));
    }
    Ok(Entry {
        path: path.to_string(),
        dir: f[0] == "directory",
        size: f[1].parse().unwrap_or(0),
        mode: u32::from_str_radix(f[2], 8).unwrap_or(0),
        owner: f[3].into(),
        group: f[4].into(),
        modified: f[5].parse().unwrap_or(0.0),
    })
}

/// The entries under `path`, `depth` levels down.
pub async fn list(
    api: &Arc<dyn TenantView>,
    id: &str,
    path: &str,
    depth: u32,
) -> Result<Vec<Entry>> {
    let dir = stat(api, id, path).await?;
    if !dir.dir {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("{path} is not a directory"),
        ));
    }
    let depth = depth.max(1).to_string();
    let out = checked(
        api,
        id,
        "listing",
        &[
            "find",
            "-H",
            path,
            "-mindepth",
            "1",
            "-maxdepth",
            &depth,
            "-printf",
            "%y\t%s\t%m\t%u\t%g\t%T@\t%p\n",
        ],
    )
    .await?;
    Ok(out
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.splitn(7, '\t').collect();
            (f.len() == 7).then(|| Entry {
                path: f[6].to_string(),
                dir: f[0] == "d",
                size: f[1].parse().unwrap_or(0),
                mode: u32::from_str_radix(f[2], 8).unwrap_or(0),
                owner: f[3].into(),
                group: f[4].into(),
                modified: f[5].parse().unwrap_or(0.0),
            })
        })
        .take(MAX_LISTED)
        .collect())
}

pub async fn make_dir(api: &Arc<dyn TenantView>, id: &str, path: &str) -> Result<()> {
    checked(api, id, "making", &["mkdir", "-p", "--", path])
        .await
        .map(drop)
}

pub async fn rename(api: &Arc<dyn TenantView>, id: &str, from: &str, to: &str) -> Result<()> {
    // As envd does, the destination's parents are made first.
    let script = "mkdir -p -- \"$(dirname -- \"$2\")\" && mv -T -- \"$1\" \"$2\"";
    checked(api, id, "moving", &["sh", "-c", script, "sh", from, to])
        .await
        .map(drop)
}

pub async fn remove(api: &Arc<dyn TenantView>, id: &str, path: &str) -> Result<()> {
    // `rm -rf` succeeds on a missing path; E2B answers not_found.
    stat_exists(api, id, path).await?;
    checked(api, id, "removing", &["rm", "-rf", "--", path])
        .await
        .map(drop)
}

async fn stat_exists(api: &Arc<dyn TenantView>, id: &str, path: &str) -> Result<()> {
    // There, or a dangling symlink (which `rm` removes too): one exec.
    let script = "test -e \"$1\" || test -L \"$1\"";
    if run(api, id, &["sh", "-c", script, "sh", path])
        .await?
        .exit_code
        != 0
    {
        return Err(Error::new(
            Code::NotFound,
            format!("{path}: no such file or directory"),
        ));
    }
    Ok(())
}

/// Bytes of a failing reader's stderr kept for its error message.
const STDERR_KEPT: usize = 4096;

/// A file's bytes, streamed from `cat` (checked to be a file first, so a
/// missing one is NOT_FOUND before anything is sent). The answer waits for
/// `cat`'s first bytes or its exit: a file that `stat` sees but `cat`
/// cannot read (`/proc/1/environ`) is an error answer, not a 200 whose
/// body breaks off.
pub async fn read(
    api: &Arc<dyn TenantView>,
    id: &str,
    path: &str,
) -> Result<impl Stream<Item = Result<Bytes>> + Send + 'static> {
    let entry = stat(api, id, path).await?;
    if entry.dir {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("{path} is a directory"),
        ));
    }
    let mut events = api
        .start(
            id,
            StartProcess {
                command: vec!["cat".into(), "--".into(), path.into()],
                ..Default::default()
            },
        )
        .await?;
    let first = first_bytes(&mut events, path).await?;
    let rest = events.filter_map(|event| async move {
        match event {
            Ok(ProcessEvent::Stdout { data }) => Some(Ok(Bytes::from(data))),
            Ok(ProcessEvent::Exited { exit_code }) if exit_code != 0 => Some(Err(Error::internal(
                format!("cat exited with {exit_code} mid-read"),
            ))),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    });
    Ok(futures::stream::iter(first.map(Ok)).chain(rest))
}

/// A reader's first bytes (`None`: it exited at once, cleanly: an empty
/// file), or the error its exit and stderr say.
async fn first_bytes(
    events: &mut (impl Stream<Item = Result<ProcessEvent>> + Unpin),
    path: &str,
) -> Result<Option<Bytes>> {
    let mut stderr = Vec::new();
    while let Some(event) = events.next().await {
        match event? {
            ProcessEvent::Stdout { data } => return Ok(Some(Bytes::from(data))),
            ProcessEvent::Stderr { data } => {
                let room = STDERR_KEPT.saturating_sub(stderr.len());
                stderr.extend_from_slice(&data[..data.len().min(room)]);
            }
            ProcessEvent::Exited { exit_code: 0 } => return Ok(None),
            ProcessEvent::Exited { exit_code } => {
                let result = ExecResult {
                    exit_code,
                    stdout: String::new(),
                    stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    timed_out: false,
                };
                return Err(failure("reading", path, &result));
            }
            ProcessEvent::Started { .. } => {}
        }
    }
    Err(Error::internal(format!(
        "reading {path}: the reader's stream ended without an exit"
    )))
}

/// Writes `data` to `path` (making its parents), through `cat`'s stdin.
pub async fn write(
    api: &Arc<dyn TenantView>,
    id: &str,
    path: &str,
    mut data: impl Stream<Item = Result<Bytes>> + Send + Unpin,
) -> Result<()> {
    let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\"";
    let mut events = api
        .start(
            id,
            StartProcess {
                command: ["sh", "-c", script, "sh", path].map(String::from).to_vec(),
                ..Default::default()
            },
        )
        .await?;
    let pid = match events.next().await {
        Some(Ok(ProcessEvent::Started { pid })) => pid,
        Some(Err(e)) => return Err(e),
        _ => return Err(Error::internal("the writer did not start")),
    };
    let mut stderr = Vec::new();
    while let Some(chunk) = data.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = api.signal(id, pid, sandhub_client::Signal::Sigkill).await;
                return Err(e);
            }
        };
        if let Err(e) = api.write_stdin(id, pid, StdinInput::Data(chunk)).await {
            // The writer died (its stderr says why); fall through to read it.
            tracing::debug!(error = %e, "writer's stdin closed early");
            break;
        }
    }
    let _ = api.write_stdin(id, pid, StdinInput::Eof).await;
    let wait = async {
        while let Some(event) = events.next().await {
            match event? {
                ProcessEvent::Stderr { data } => stderr.extend_from_slice(&data),
                ProcessEvent::Exited { exit_code } => return Ok(exit_code),
                _ => {}
            }
        }
        Err(Error::internal("the writer's stream ended without an exit"))
    };
    let exit_code = tokio::time::timeout(Duration::from_secs_f64(EXEC_TIMEOUT_S), wait)
        .await
        .map_err(|_| Error::new(Code::DeadlineExceeded, format!("writing {path} timed out")))??;
    if exit_code != 0 {
        let result = ExecResult {
            exit_code,
            stdout: String::new(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            timed_out: false,
        };
        return Err(failure("writing", path, &result));
    }
    Ok(())
}
