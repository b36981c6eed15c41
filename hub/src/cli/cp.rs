//! `sandhub cp SRC DST`: files between here and a sandbox, streamed both
//! ways. Exactly one side is `ID:path`; the path is relative to the
//! sandbox's `/workspace`. `-` is stdin (as SRC) or stdout (as DST).

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use clap::Args;
use futures::{StreamExt, TryStreamExt};
use sandhub_api::{error::Code, hub::is_dns_label, sandboxd::EntryType};
use sandhub_client::{http::HubClient, ByteStream, Error, Result, Sandboxes, WriteOptions};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use super::{output, ClientArgs, Output};

const UPLOAD_CHUNK: usize = 256 * 1024;

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  sandhub cp ./data.bin sb-1a2b:input/        upload into /workspace/input/
  sandhub cp sb-1a2b:out/result.json .        download into the current directory
  sandhub cp -r ./src sb-1a2b:src             upload a directory tree
  tar c . | sandhub cp - sb-1a2b:src.tar      upload stdin

A local path that looks like ID:path (a colon after a lowercase name) is
written ./name:path.")]
pub struct CpArgs {
    /// A local path, `-` for stdin, or ID:path.
    src: String,

    /// A local path, `-` for stdout, or ID:path.
    dst: String,

    /// Copy directories and their contents (empty directories and symbolic
    /// links are skipped).
    #[arg(short, long, env = "SANDHUB_CP_RECURSIVE")]
    recursive: bool,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Operand {
    /// stdin or stdout.
    Std,
    Local(PathBuf),
    Remote {
        id: String,
        path: String,
    },
}

impl Operand {
    fn parse(s: &str) -> Operand {
        if s == "-" {
            return Operand::Std;
        }
        match s.split_once(':') {
            Some((id, path)) if is_dns_label(id) => Operand::Remote {
                id: id.to_string(),
                path: path.to_string(),
            },
            _ => Operand::Local(PathBuf::from(s)),
        }
    }
}

/// What was copied, for `--output json`.
#[derive(Debug, Default, Serialize)]
struct Copied {
    files: u64,
    bytes: u64,
}

pub async fn run(args: CpArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    copy(
        hub,
        &args.src,
        &args.dst,
        args.recursive,
        Remote::Sandbox,
        args.client.output,
    )
    .await
}

/// What the `NAME:path` side of a copy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Remote {
    /// A sandbox's workspace (`sandhub cp`).
    Sandbox,
    /// A named volume, no sandbox needed (`sandhub volume cp`).
    Volume,
}

/// A copy between here and a sandbox or a volume: the same walk either
/// way, only the calls differ.
pub(super) async fn copy(
    hub: HubClient,
    src: &str,
    dst: &str,
    recursive: bool,
    remote: Remote,
    output: Output,
) -> Result<i32> {
    let copy = Copy {
        hub,
        recursive,
        remote,
        bytes: Arc::default(),
        files: Arc::default(),
    };
    match (Operand::parse(src), Operand::parse(dst)) {
        (Operand::Remote { .. }, Operand::Remote { .. }) => {
            return Err(Error::invalid(
                "both sides are NAME:path; copy through a local file instead",
            ))
        }
        (Operand::Remote { id, path }, local) => copy.download(&id, &path, local).await?,
        (local, Operand::Remote { id, path }) => copy.upload(local, &id, &path).await?,
        _ => {
            return Err(Error::invalid(match remote {
                Remote::Sandbox => {
                    "one side must be ID:path (a sandbox id, a colon, a workspace path)"
                }
                Remote::Volume => "one side must be VOLUME:path (a volume name, a colon, a path)",
            }))
        }
    }
    if output == Output::Json {
        output::json(&Copied {
            files: copy.files.load(Ordering::Relaxed),
            bytes: copy.bytes.load(Ordering::Relaxed),
        })?;
    }
    Ok(0)
}

struct Copy {
    hub: HubClient,
    recursive: bool,
    remote: Remote,
    bytes: Arc<AtomicU64>,
    files: Arc<AtomicU64>,
}

impl Copy {
    async fn read(&self, id: &str, path: &str) -> Result<ByteStream> {
        match self.remote {
            Remote::Sandbox => self.hub.read_file(id, path).await,
            Remote::Volume => self.hub.read_volume_file(id, path).await,
        }
    }

    async fn write(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        match self.remote {
            Remote::Sandbox => self.hub.write_file(id, path, data, options).await,
            Remote::Volume => self.hub.write_volume_file(id, path, data, options).await,
        }
    }

    async fn stat(&self, id: &str, path: &str) -> Result<Option<sandhub_api::sandboxd::FileEntry>> {
        match self.remote {
            Remote::Sandbox => self.hub.stat(id, path).await,
            Remote::Volume => self.hub.stat_volume_file(id, path).await,
        }
    }

    async fn list(&self, id: &str, path: &str) -> Result<sandhub_api::sandboxd::DirectoryListing> {
        match self.remote {
            Remote::Sandbox => self.hub.list_files(id, path).await,
            Remote::Volume => self.hub.list_volume_files(id, path).await,
        }
    }

    async fn upload(&self, src: Operand, id: &str, path: &str) -> Result<()> {
        let local = match src {
            Operand::Std => {
                if names_directory(path) {
                    return Err(Error::invalid(
                        "stdin has no file name: give the destination's full path",
                    ));
                }
                return self.upload_stream(tokio::io::stdin(), None, id, path).await;
            }
            Operand::Local(local) => local,
            Operand::Remote { .. } => unreachable!("checked by the caller"),
        };
        let meta = tokio::fs::metadata(&local)
            .await
            .map_err(|e| local_error(&local, e))?;
        let name = file_name(&local)?;
        let target = if self.remote_is_dir(id, path).await? {
            join(path, &name)
        } else {
            path.to_string()
        };
        if !meta.is_dir() {
            return self.upload_file(&local, id, &target).await;
        }
        if !self.recursive {
            return Err(Error::invalid(format!(
                "{} is a directory (use -r to copy it)",
                local.display()
            )));
        }
        for (file, rel) in walk(&local)? {
            self.upload_file(&file, id, &join(&target, &rel)).await?;
        }
        Ok(())
    }

    async fn upload_file(&self, local: &Path, id: &str, path: &str) -> Result<()> {
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|e| local_error(local, e))?;
        let mode = file
            .metadata()
            .await
            .map_err(|e| local_error(local, e))?
            .permissions()
            .mode();
        // Keeps scripts executable and private files private.
        self.upload_stream(file, Some(mode & 0o777), id, path)
            .await
            .map_err(|e| context(e, &format!("{id}:{path}")))
    }

    async fn upload_stream(
        &self,
        reader: impl AsyncRead + Send + 'static,
        mode: Option<u32>,
        id: &str,
        path: &str,
    ) -> Result<()> {
        let bytes = self.bytes.clone();
        let stream: ByteStream = Box::pin(
            ReaderStream::with_capacity(reader, UPLOAD_CHUNK)
                .map_err(|e| Error::internal(format!("reading the local file: {e}")))
                .inspect_ok(move |chunk| {
                    bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }),
        );
        let options = WriteOptions {
            append: false,
            mode,
        };
        self.write(id, path, stream, options).await?;
        self.files.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether an upload to `path` goes *into* it: an existing directory,
    /// or a path spelled as one.
    async fn remote_is_dir(&self, id: &str, path: &str) -> Result<bool> {
        if names_directory(path) {
            return Ok(true);
        }
        Ok(self
            .stat(id, path)
            .await?
            .is_some_and(|e| e.kind == EntryType::Directory))
    }

    async fn download(&self, id: &str, path: &str, dst: Operand) -> Result<()> {
        // Reading first costs one request for the common case (a file);
        // only a refusal needs a second look at what is there.
        let stream = match self.read(id, path).await {
            Ok(stream) => stream,
            Err(e) if e.code == Code::Conflict && self.is_remote_dir(id, path).await => {
                return self.download_dir(id, path, dst).await;
            }
            Err(e) => return Err(context(e, &format!("{id}:{path}"))),
        };
        match dst {
            Operand::Std => self.save(stream, tokio::io::stdout(), None).await,
            Operand::Local(local) => {
                let target = if local.is_dir() || local.as_os_str().to_string_lossy().ends_with('/')
                {
                    local.join(remote_name(path)?)
                } else {
                    local
                };
                self.download_to(stream, &target).await
            }
            Operand::Remote { .. } => unreachable!("checked by the caller"),
        }
    }

    async fn is_remote_dir(&self, id: &str, path: &str) -> bool {
        matches!(self.stat(id, path).await, Ok(Some(e)) if e.kind == EntryType::Directory)
    }

    async fn download_dir(&self, id: &str, path: &str, dst: Operand) -> Result<()> {
        let Operand::Local(local) = dst else {
            return Err(Error::invalid(format!(
                "{id}:{path} is a directory; it cannot go to stdout"
            )));
        };
        if !self.recursive {
            return Err(Error::invalid(format!(
                "{id}:{path} is a directory (use -r to copy it)"
            )));
        }
        // Like cp -r: into an existing directory, else as the new name.
        let root = if local.is_dir() && !names_directory(path) {
            local.join(remote_name(path)?)
        } else {
            local
        };
        // Iterative, so a deep tree cannot overflow the stack of an async fn.
        let mut pending = vec![(path.to_string(), root)];
        while let Some((dir, local_dir)) = pending.pop() {
            tokio::fs::create_dir_all(&local_dir)
                .await
                .map_err(|e| local_error(&local_dir, e))?;
            let listing = self.list(id, &dir).await?;
            for entry in listing.entries {
                let remote = join(&dir, &entry.name);
                let target = local_dir.join(&entry.name);
                match entry.kind {
                    EntryType::Directory => pending.push((remote, target)),
                    EntryType::File => {
                        let stream = self
                            .read(id, &remote)
                            .await
                            .map_err(|e| context(e, &format!("{id}:{remote}")))?;
                        self.download_to(stream, &target).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A failed download leaves no partial file behind.
    async fn download_to(&self, stream: ByteStream, target: &Path) -> Result<()> {
        let file = tokio::fs::File::create(target)
            .await
            .map_err(|e| local_error(target, e))?;
        let result = self.save(stream, file, Some(target)).await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(target).await;
        }
        result
    }

    async fn save(
        &self,
        mut stream: ByteStream,
        mut out: impl AsyncWrite + Unpin,
        target: Option<&Path>,
    ) -> Result<()> {
        let write_error = |e: std::io::Error| match target {
            Some(path) => local_error(path, e),
            None => Error::internal(format!("writing to stdout: {e}")),
        };
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            out.write_all(&chunk).await.map_err(write_error)?;
            self.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        out.flush().await.map_err(write_error)?;
        self.files.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The regular files under `root` with their `/`-separated paths relative
/// to it, sorted so uploads happen in a predictable order.
fn walk(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| local_error(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| local_error(&dir, e))?;
            let name = entry.file_name().into_string().map_err(|n| {
                Error::invalid(format!(
                    "{}: file names must be UTF-8",
                    dir.join(n).display()
                ))
            })?;
            let path = entry.path();
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let kind = entry.file_type().map_err(|e| local_error(&path, e))?;
            if kind.is_dir() {
                pending.push((path, rel));
            } else if kind.is_file() {
                files.push((path, rel));
            } else {
                eprintln!("warning: skipping {} (not a regular file)", path.display());
            }
        }
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(files)
}

/// The workspace root, or a path ending in `/`.
fn names_directory(path: &str) -> bool {
    path.is_empty() || path == "." || path.ends_with('/')
}

fn join(dir: &str, name: &str) -> String {
    let dir = dir.trim_end_matches('/');
    if dir.is_empty() || dir == "." {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn file_name(path: &Path) -> Result<String> {
    // `.` and `..` have no name of their own; take the directory's.
    let absolute = std::path::absolute(path).map_err(|e| local_error(path, e))?;
    let normalized: PathBuf = absolute.components().collect();
    let name = normalized
        .file_name()
        .or_else(|| path.file_name())
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::invalid(format!("{}: no usable file name", path.display())))?;
    Ok(name.to_string())
}

/// The last segment of a workspace path.
fn remote_name(path: &str) -> Result<String> {
    path.split('/')
        .rev()
        .find(|s| !s.is_empty() && *s != "." && *s != "..")
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("{path:?} has no file name to copy to")))
}

fn local_error(path: &Path, e: std::io::Error) -> Error {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => Code::NotFound,
        std::io::ErrorKind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Internal,
    };
    Error::new(code, format!("{}: {e}", path.display()))
}

/// Says which file an error is about; the hub's message may not.
fn context(e: Error, what: &str) -> Error {
    Error::new(e.code, format!("{what}: {}", e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands() {
        assert_eq!(Operand::parse("-"), Operand::Std);
        assert_eq!(
            Operand::parse("sb-1:a/b"),
            Operand::Remote {
                id: "sb-1".into(),
                path: "a/b".into()
            }
        );
        assert_eq!(
            Operand::parse("sb-1:"),
            Operand::Remote {
                id: "sb-1".into(),
                path: "".into()
            }
        );
        assert_eq!(
            Operand::parse("./sb-1:a"),
            Operand::Local("./sb-1:a".into())
        );
        assert_eq!(Operand::parse("/tmp/x"), Operand::Local("/tmp/x".into()));
        assert_eq!(Operand::parse("Big:x"), Operand::Local("Big:x".into()));
    }

    #[test]
    fn paths() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join(".", "a"), "a");
        assert_eq!(join("d/", "a"), "d/a");
        assert_eq!(join("d", "x/a"), "d/x/a");
        assert!(names_directory(""));
        assert!(names_directory("d/"));
        assert!(!names_directory("d"));
        assert_eq!(remote_name("a/b/").unwrap(), "b");
        assert_eq!(remote_name("f").unwrap(), "f");
        assert!(remote_name("").is_err());
        assert_eq!(file_name(Path::new("/tmp/x.txt")).unwrap(), "x.txt");
        assert_eq!(file_name(Path::new("/tmp/dir/.")).unwrap(), "dir");
    }

    #[test]
    fn walks_sorted_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        std::fs::write(dir.path().join("a"), "1").unwrap();
        std::fs::write(dir.path().join("b/c/d"), "2").unwrap();
        std::os::unix::fs::symlink("a", dir.path().join("link")).unwrap();
        let rels: Vec<String> = walk(dir.path()).unwrap().into_iter().map(|f| f.1).collect();
        assert_eq!(rels, ["a", "b/c/d"]);
    }
}
