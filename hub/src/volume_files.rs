//! Files in a named volume with no sandbox running
//! (`/v1/volumes/{name}/files/...`, issue #32 §1).
//!
//! A volume's contents are written by sandboxes, so every name in them
//! is untrusted: any component may be a link planted to lead the hub
//! elsewhere (another tenant's volume, `/etc`). Nothing here ever turns
//! a path into a string for `std::fs`. Each step starts from the volume
//! root's directory fd ([`VolumeDir`], opened by the backend with the
//! same rules) and is one `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, so the
//! kernel refuses a link anywhere on the way, and a mount, however the
//! tree changes while we walk it. The last component is then acted on
//! relative to its parent's fd, never following it: `O_NOFOLLOW` opens,
//! `statat(AT_SYMLINK_NOFOLLOW)`, `mkdirat`, `unlinkat`, `renameat`.
//! Links are neither followed nor listed; deleting one removes the link.
//!
//! What the API creates belongs to the sandboxes' root (the id map's
//! `host_root`), so a sandbox that mounts the volume later may change it.

use std::{
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use rustix::{
    fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags},
    io::Errno,
};
use sandhub_api::{
    error::Code,
    sandboxd::{DirectoryListing, EntryType, FileEntry},
};
use sandhub_client::{ByteStream, Error};
use tokio::io::AsyncWriteExt;

/// Longest path the API takes, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;
/// Longest name of one component, in bytes (`NAME_MAX`).
pub const MAX_NAME: usize = 255;
/// Bytes per read or write of a file's data: each is one hop to the
/// blocking pool.
pub const IO_CHUNK: usize = 1 << 20;
/// Deepest directory a recursive delete descends into: deeper trees are
/// refused rather than walked without bound.
pub const MAX_DELETE_DEPTH: usize = 256;
/// Where an upload is written before it is renamed into place: a dot
/// file in the target's directory, so the rename never crosses a
/// directory and a failed upload leaves nothing under the target's name.
const UPLOAD_PREFIX: &str = ".sandhub-upload-";

/// How directories are opened. No `O_NOFOLLOW`: with it a link as the
/// last component answers ENOTDIR, without it `RESOLVE_NO_SYMLINKS`
/// answers ELOOP, which says what was refused (nothing is followed
/// either way).
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// A failure and, when its code word alone does not say it, the HTTP
/// status to send it with (507 for a full volume, as sandboxd does).
#[derive(Debug)]
pub struct FileError {
    pub error: Error,
    pub status: Option<u16>,
}

impl From<Error> for FileError {
    fn from(error: Error) -> Self {
        FileError {
            error,
            status: None,
        }
    }
}

pub type FileResult<T> = std::result::Result<T, FileError>;

fn fail(code: Code, message: impl Into<String>) -> FileError {
    Error::new(code, message).into()
}

/// What the kernel said about `path`, in the words a client can act on.
fn io_error(e: Errno, path: &VolPath) -> FileError {
    let p = path.display();
    match e {
        Errno::NOENT => fail(Code::NotFound, format!("{p}: no such file or directory")),
        Errno::NOTDIR => fail(
            Code::Conflict,
            format!("{p}: a component of the path is not a directory"),
        ),
        Errno::LOOP => fail(
            Code::PermissionDenied,
            format!("{p}: a symbolic link is on the path; the volume files API follows none"),
        ),
        Errno::XDEV => fail(
            Code::PermissionDenied,
            format!("{p}: the path leaves the volume"),
        ),
        Errno::ACCESS | Errno::PERM | Errno::ROFS => {
            fail(Code::PermissionDenied, format!("{p}: permission denied"))
        }
        Errno::ISDIR => fail(Code::Conflict, format!("{p}: is a directory")),
        Errno::NOTEMPTY => fail(
            Code::Conflict,
            format!("{p}: directory not empty; pass recursive=true to delete it"),
        ),
        Errno::EXIST => fail(Code::Conflict, format!("{p}: already exists")),
        Errno::NOSPC | Errno::DQUOT => FileError {
            error: Error::new(
                Code::ResourceExhausted,
                format!("{p}: the volume is full (its size_mb); nothing was written"),
            ),
            status: Some(507),
        },
        Errno::NAMETOOLONG => fail(Code::InvalidArgument, format!("{p}: name too long")),
        Errno::MFILE | Errno::NFILE => {
            fail(Code::ResourceExhausted, format!("{p}: too many open files"))
        }
        other => {
            let e: std::io::Error = other.into();
            fail(Code::Internal, format!("{p}: {e}"))
        }
    }
}

/// A path inside a volume, checked: no NUL, no `..`, at most
/// [`MAX_PATH`] bytes and [`MAX_NAME`] per component. Empty and `.`
/// components are dropped; no components is the volume's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolPath(Vec<String>);

impl VolPath {
    pub fn parse(raw: &str) -> FileResult<Self> {
        let bad = |why: &str| fail(Code::InvalidArgument, format!("path {raw:?}: {why}"));
        if raw.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if raw.len() > MAX_PATH {
            return Err(bad(&format!("longer than {MAX_PATH} bytes")));
        }
        let mut parts = Vec::new();
        for seg in raw.split('/') {
            match seg {
                "" | "." => {}
                // Refused rather than resolved: a volume path names one
                // place, spelled one way.
                ".." => return Err(bad("`..` is not allowed")),
                s if s.len() > MAX_NAME => {
                    return Err(bad(&format!("a component is longer than {MAX_NAME} bytes")))
                }
                s => parts.push(s.to_string()),
            }
        }
        Ok(VolPath(parts))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// As clients see it: `/` or `/a/b`.
    pub fn display(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The path relative to the volume root, `""` for the root (as a
    /// sandboxd with the volume as its root takes it).
    pub fn relative(&self) -> String {
        self.0.join("/")
    }

    /// The path relative to the volume root as `openat2` takes it.
    fn rel(&self) -> String {
        if self.0.is_empty() {
            ".".into()
        } else {
            self.0.join("/")
        }
    }

    fn parent(&self) -> Option<(VolPath, &str)> {
        let (last, parent) = self.0.split_last()?;
        Some((VolPath(parent.to_vec()), last))
    }
}

/// One volume's root directory, opened by the backend without following
/// links or crossing mounts, and the owner new files get.
#[derive(Debug, Clone)]
pub struct VolumeDir {
    root: Arc<OwnedFd>,
    owner: (u32, u32),
}

/// What a `GET` found.
pub enum Found {
    Directory(DirectoryListing),
    File {
        file: std::fs::File,
        entry: FileEntry,
    },
}

/// What E2B's volume API reports of an entry besides a [`FileEntry`]:
/// the ids are the host's (see [`VolumeDir::owner`] to map them).
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

fn at(secs: i64, nsec: i64) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsec.clamp(0, 999_999_999) as u32)
}

// `stat`'s time fields are not i64 on every architecture.
#[allow(clippy::unnecessary_cast)]
fn meta(st: &rfs::Stat) -> Meta {
    Meta {
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: at(st.st_atime as i64, st.st_atime_nsec as i64),
        mtime: at(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime: at(st.st_ctime as i64, st.st_ctime_nsec as i64),
    }
}

fn kind(st: &rfs::Stat) -> Option<EntryType> {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Some(EntryType::File),
        FileType::Directory => Some(EntryType::Directory),
        _ => None,
    }
}

fn entry(name: &str, st: &rfs::Stat) -> Option<FileEntry> {
    let kind = kind(st)?;
    let secs = st.st_mtime.max(0) as u64;
    let mtime = UNIX_EPOCH + Duration::new(secs, st.st_mtime_nsec as u32);
    Some(FileEntry {
        name: name.to_string(),
        size: if kind == EntryType::File {
            st.st_size as u64
        } else {
            0
        },
        kind,
        modified_at: humantime::format_rfc3339_seconds(mtime).to_string(),
        mode: format!("{:04o}", st.st_mode & 0o7777),
    })
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> FileResult<T> + Send + 'static,
) -> FileResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(fail(Code::Internal, format!("file task failed: {e}"))))
}

impl VolumeDir {
    /// `root` must be the volume's root opened as `DiskQuotas::open_volume`
    /// opens it; `owner` the host ids of the sandboxes' root.
    pub fn new(root: OwnedFd, owner: (u32, u32)) -> Self {
        VolumeDir {
            root: Arc::new(root),
            owner,
        }
    }

    fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// A directory of the volume, reached from the root in one `openat2`
    /// that follows no link and crosses no mount.
    fn open_dir(&self, path: &VolPath) -> FileResult<OwnedFd> {
        rfs::openat2(self.root(), path.rel(), DIR_FLAGS, Mode::empty(), RESOLVE)
            .map_err(|e| io_error(e, path))
    }

    /// `path`'s parent directory and last name; the root has neither.
    fn parent<'a>(&self, path: &'a VolPath) -> FileResult<(OwnedFd, &'a str, VolPath)> {
        let Some((parent, name)) = path.parent() else {
            return Err(fail(
                Code::InvalidArgument,
                "the volume's root is a directory, not a file; name a path inside it",
            ));
        };
        let fd = self.open_dir(&parent)?;
        Ok((fd, name, parent))
    }

    /// What is at `path`, never following a link: a link is refused
    /// (403), a special file is not described (409).
    fn stat_blocking(&self, path: &VolPath) -> FileResult<FileEntry> {
        self.stat_meta_blocking(path).map(|(e, _)| e)
    }

    fn stat_meta_blocking(&self, path: &VolPath) -> FileResult<(FileEntry, Meta)> {
        let (st, name) = match path.parent() {
            None => (rfs::fstat(self.root()).map_err(|e| io_error(e, path))?, ""),
            Some(_) => {
                let (dir, name, _) = self.parent(path)?;
                let st = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_error(e, path))?;
                (st, name)
            }
        };
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(io_error(Errno::LOOP, path));
        }
        let e = entry(name, &st).ok_or_else(|| {
            fail(
                Code::Conflict,
                format!("{}: neither a regular file nor a directory", path.display()),
            )
        })?;
        Ok((e, meta(&st)))
    }

    pub async fn stat(&self, path: VolPath) -> FileResult<FileEntry> {
        let me = self.clone();
        blocking(move || me.stat_blocking(&path)).await
    }

    /// [`VolumeDir::stat`] with the ids, mode and times E2B reports.
    pub async fn stat_meta(&self, path: VolPath) -> FileResult<(FileEntry, Meta)> {
        let me = self.clone();
        blocking(move || me.stat_meta_blocking(&path)).await
    }

    /// The host uid and gid of the sandboxes' root, who owns what the
    /// API makes.
    pub fn owner(&self) -> (u32, u32) {
        self.owner
    }

    /// A directory's regular files and directories, by name; links and
    /// special files are left out (none is followed to describe it).
    fn list_blocking(&self, path: &VolPath) -> FileResult<DirectoryListing> {
        Ok(DirectoryListing {
            path: path.display(),
            entries: self
                .list_meta_blocking(path)?
                .into_iter()
                .map(|(e, _)| e)
                .collect(),
        })
    }

    fn list_meta_blocking(&self, path: &VolPath) -> FileResult<Vec<(FileEntry, Meta)>> {
        let dir = self.open_dir(path)?;
        let mut entries = Vec::new();
        let reader = rfs::Dir::read_from(&dir).map_err(|e| io_error(e, path))?;
        for item in reader {
            let item = item.map_err(|e| io_error(e, path))?;
            let Ok(name) = item.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            if let Some(e) = entry(name, &st) {
                entries.push((e, meta(&st)));
            }
        }
        entries.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        Ok(entries)
    }

    /// [`VolumeDir::list`] with each entry's ids, mode and times.
    pub async fn list_meta(&self, path: VolPath) -> FileResult<Vec<(FileEntry, Meta)>> {
        let me = self.clone();
        blocking(move || me.list_meta_blocking(&path)).await
    }

    /// Makes the directory `path` (its missing parents too with
    /// `parents`), owned by the sandboxes' root with `mode`. One that
    /// exists is a conflict, except with `parents` (as `mkdir -p`), where
    /// an existing directory is left as it is.
    fn make_dir_blocking(&self, path: &VolPath, parents: bool, mode: u32) -> FileResult<()> {
        let (dir, name) = if parents {
            let dir = self.make_parents(path)?;
            let name = path.parent().map(|(_, n)| n).unwrap_or_default();
            (dir, name)
        } else {
            let (dir, name, _) = self.parent(path)?;
            (dir, name)
        };
        match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            Err(Errno::EXIST) if parents => {
                // Left alone, but only a real directory counts as made:
                // a file or link there is still a conflict.
                let st = rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_error(e, path))?;
                return match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => Ok(()),
                    FileType::Symlink => Err(io_error(Errno::LOOP, path)),
                    _ => Err(io_error(Errno::EXIST, path)),
                };
            }
            Err(e) => return Err(io_error(e, path)),
        }
        let fd = rfs::openat2(&dir, name, DIR_FLAGS, Mode::empty(), RESOLVE)
            .map_err(|e| io_error(e, path))?;
        self.own(&fd, mode & 0o7777, path)
    }

    pub async fn make_dir(&self, path: VolPath, parents: bool, mode: u32) -> FileResult<()> {
        let me = self.clone();
        blocking(move || me.make_dir_blocking(&path, parents, mode)).await
    }

    /// Sets the permission bits of a regular file or directory; a link is
    /// refused, never followed. The entry is opened from its parent's fd
    /// (`O_NOFOLLOW | O_NONBLOCK`, so no FIFO blocks) and checked to be
    /// what `statat` saw before it is changed through that fd.
    fn set_mode_blocking(&self, path: &VolPath, mode: u32) -> FileResult<()> {
        let mode = Mode::from_raw_mode(mode & 0o7777);
        if path.is_root() {
            return rfs::fchmod(self.root(), mode).map_err(|e| io_error(e, path));
        }
        let seen = self.stat_blocking(path)?;
        let (fd, ..) = self.open_as(path, seen.kind)?;
        rfs::fchmod(&fd, mode).map_err(|e| io_error(e, path))
    }

    /// Opens `path`'s last name from its parent's fd with `O_NOFOLLOW`
    /// (read-only, non-blocking, so no FIFO or device can hold it) and
    /// checks it is the `want` a `statat` saw: a swap in between is refused.
    fn open_as<'a>(
        &self,
        path: &'a VolPath,
        want: EntryType,
    ) -> FileResult<(OwnedFd, rfs::Stat, &'a str)> {
        let (dir, name, _) = self.parent(path)?;
        let fd = rfs::openat2(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| io_error(e, path))?;
        let st = rfs::fstat(&fd).map_err(|e| io_error(e, path))?;
        if kind(&st) != Some(want) {
            return Err(fail(
                Code::Conflict,
                format!("{}: changed while being opened", path.display()),
            ));
        }
        Ok((fd, st, name))
    }

    pub async fn set_mode(&self, path: VolPath, mode: u32) -> FileResult<()> {
        let me = self.clone();
        blocking(move || me.set_mode_blocking(&path, mode)).await
    }

    pub async fn list(&self, path: VolPath) -> FileResult<DirectoryListing> {
        let me = self.clone();
        blocking(move || me.list_blocking(&path)).await
    }

    /// A directory's listing, or a regular file opened for reading: the
    /// last name is opened with `O_NOFOLLOW` from its parent's fd and
    /// checked to be the regular file `statat` saw (a swap in between is
    /// refused), so no FIFO or device is ever opened.
    fn get_blocking(&self, path: &VolPath) -> FileResult<Found> {
        let entry = self.stat_blocking(path)?;
        if entry.kind == EntryType::Directory {
            return self.list_blocking(path).map(Found::Directory);
        }
        let (fd, st, name) = self.open_as(path, EntryType::File)?;
        let entry = self::entry(name, &st).unwrap_or(entry);
        Ok(Found::File {
            file: fd.into(),
            entry,
        })
    }

    pub async fn get(&self, path: VolPath) -> FileResult<Found> {
        let me = self.clone();
        blocking(move || me.get_blocking(&path)).await
    }

    /// Opens `path`'s parent, making each missing directory on the way
    /// (mode 0755, the sandboxes' root's). Each step is one component
    /// opened from the last one's fd with the resolve rules, so a link
    /// met on the way is refused, never followed or replaced.
    fn make_parents(&self, path: &VolPath) -> FileResult<OwnedFd> {
        let Some((parent, _)) = path.parent() else {
            return Err(fail(
                Code::InvalidArgument,
                "the volume's root is a directory, not a file; name a path inside it",
            ));
        };
        let mut cur = rustix::io::dup(self.root()).map_err(|e| io_error(e, &parent))?;
        let mut walked = VolPath(Vec::new());
        for comp in &parent.0 {
            walked.0.push(comp.clone());
            let open =
                |dir: &OwnedFd| rfs::openat2(dir, comp.as_str(), DIR_FLAGS, Mode::empty(), RESOLVE);
            let next = match open(&cur) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rfs::mkdirat(&cur, comp.as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) => {
                            let fd = open(&cur).map_err(|e| io_error(e, &walked))?;
                            self.own(&fd, 0o755, &walked)?;
                            fd
                        }
                        // Made by someone else meanwhile: take it as found.
                        Err(Errno::EXIST) => open(&cur).map_err(|e| io_error(e, &walked))?,
                        Err(e) => return Err(io_error(e, &walked)),
                    }
                }
                Err(e) => return Err(io_error(e, &walked)),
            };
            cur = next;
        }
        Ok(cur)
    }

    /// Gives a file or directory the API made to the sandboxes' root, and
    /// its mode (set explicitly: the hub's umask is not the client's).
    fn own(&self, fd: &OwnedFd, mode: u32, path: &VolPath) -> FileResult<()> {
        let (uid, gid) = self.owner;
        rfs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| io_error(e, path))?;
        rfs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| io_error(e, path))
    }

    /// Writes `data` to `path`, making its parents: into a new temporary
    /// file beside it (`O_CREAT | O_EXCL | O_NOFOLLOW`), synced, then
    /// renamed over the name, so a reader sees the old file or the whole
    /// new one and a failed upload (a full volume, a cut body) leaves
    /// nothing behind. A link at the name is replaced, not followed.
    pub async fn write(&self, path: VolPath, data: ByteStream, mode: u32) -> FileResult<()> {
        let me = self.clone();
        let p = path.clone();
        let (dir, tmp, file) = blocking(move || {
            let dir = me.make_parents(&p)?;
            let tmp = format!("{UPLOAD_PREFIX}{:016x}", rand::random::<u64>());
            let fd = rfs::openat(
                &dir,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| io_error(e, &p))?;
            if let Err(e) = me.own(&fd, mode, &p) {
                let _ = rfs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
                return Err(e);
            }
            Ok((dir, tmp, std::fs::File::from(fd)))
        })
        .await?;
        // From here until the rename, a cancelled request (the client went
        // away) must not leave the temporary file taking the volume's room.
        let mut upload = PendingUpload {
            dir: Arc::new(dir),
            tmp,
            done: false,
        };
        let written = copy_in(tokio::fs::File::from_std(file), data, &path).await;
        let (dir, tmp) = (upload.dir.clone(), upload.tmp.clone());
        let renamed = blocking(move || {
            written?;
            let name = path
                .parent()
                .map(|(_, n)| n.to_string())
                .unwrap_or_default();
            rfs::renameat(&*dir, tmp.as_str(), &*dir, name.as_str()).map_err(|e| io_error(e, &path))
        })
        .await;
        upload.done = renamed.is_ok();
        renamed
    }

    /// Deletes a file, a link (the link itself) or an empty directory; a
    /// directory with contents only with `recursive`, walked by fds as
    /// everything else. The root is never deleted: delete the volume.
    fn delete_blocking(&self, path: &VolPath, recursive: bool) -> FileResult<()> {
        if path.is_root() {
            return Err(fail(
                Code::Conflict,
                "refusing to delete the volume's root; delete the volume instead",
            ));
        }
        let (dir, name, _) = self.parent(path)?;
        let st =
            rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| io_error(e, path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return rfs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| io_error(e, path));
        }
        if recursive {
            let sub = rfs::openat2(&dir, name, DIR_FLAGS, Mode::empty(), RESOLVE)
                .map_err(|e| io_error(e, path))?;
            empty_dir(&sub, 0).map_err(|e| match e {
                Emptied::TooDeep => fail(
                    Code::Conflict,
                    format!(
                        "{}: deeper than {MAX_DELETE_DEPTH} directories; delete its insides first",
                        path.display()
                    ),
                ),
                Emptied::Io(e) => io_error(e, path),
            })?;
        }
        rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| io_error(e, path))
    }

    pub async fn delete(&self, path: VolPath, recursive: bool) -> FileResult<()> {
        let me = self.clone();
        blocking(move || me.delete_blocking(&path, recursive)).await
    }
}

/// An upload's temporary file, removed when dropped unless it was
/// renamed into place: on a failure and on a cancelled request alike.
struct PendingUpload {
    dir: Arc<OwnedFd>,
    tmp: String,
    done: bool,
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        if !self.done {
            // One unlink in the directory already open: quick enough for
            // a drop, and gone (ENOENT) is fine.
            let _ = rfs::unlinkat(&*self.dir, self.tmp.as_str(), AtFlags::empty());
        }
    }
}

/// Streams `data` into `file` and syncs it: btrfs may report a full
/// qgroup only when the data is written back, and a synced upload is
/// what the 204 promises.
async fn copy_in(file: tokio::fs::File, mut data: ByteStream, path: &VolPath) -> FileResult<()> {
    // Gathered into large writes: the body comes in small frames.
    let mut file = tokio::io::BufWriter::with_capacity(IO_CHUNK, file);
    let errno = |e: std::io::Error| {
        let n = e.raw_os_error().map(Errno::from_raw_os_error);
        match n {
            Some(n) => io_error(n, path),
            None => fail(Code::Internal, format!("{}: {e}", path.display())),
        }
    };
    while let Some(chunk) = data.next().await {
        let chunk = chunk?;
        file.write_all(&chunk).await.map_err(errno)?;
    }
    file.flush().await.map_err(errno)?;
    file.get_ref().sync_all().await.map_err(errno)
}

enum Emptied {
    TooDeep,
    Io(Errno),
}

impl From<Errno> for Emptied {
    fn from(e: Errno) -> Self {
        Emptied::Io(e)
    }
}

/// Deletes everything inside `dir`: each directory is opened from its
/// parent's fd with the resolve rules (no link followed, no mount
/// crossed), everything else unlinked where it is.
fn empty_dir(dir: &OwnedFd, depth: usize) -> std::result::Result<(), Emptied> {
    if depth >= MAX_DELETE_DEPTH {
        return Err(Emptied::TooDeep);
    }
    let mut names = Vec::new();
    for item in rfs::Dir::read_from(dir)? {
        let item = item?;
        let name = item.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(item.file_name().to_owned());
        }
    }
    for name in names {
        let st = rfs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let sub = rfs::openat2(dir, name.as_c_str(), DIR_FLAGS, Mode::empty(), RESOLVE)?;
            empty_dir(&sub, depth + 1)?;
            rfs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR)?;
        } else {
            rfs::unlinkat(dir, name.as_c_str(), AtFlags::empty())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked() {
        assert!(VolPath::parse("").unwrap().is_root());
        assert!(VolPath::parse("/").unwrap().is_root());
        assert_eq!(VolPath::parse("/a//./b/").unwrap().display(), "/a/b");
        for bad in ["..", "a/../b", "/../etc", "a\0b"] {
            let e = VolPath::parse(bad).unwrap_err();
            assert_eq!(e.error.code, Code::InvalidArgument, "{bad:?}");
        }
        assert!(VolPath::parse(&"x".repeat(256)).is_err());
        assert!(VolPath::parse(&"a/".repeat(2049)).is_err());
        assert!(VolPath::parse(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn a_full_volume_is_507() {
        let p = VolPath::parse("a").unwrap();
        for e in [Errno::DQUOT, Errno::NOSPC] {
            let f = io_error(e, &p);
            assert_eq!(f.status, Some(507));
            assert_eq!(f.error.code, Code::ResourceExhausted);
        }
        assert_eq!(io_error(Errno::LOOP, &p).error.code, Code::PermissionDenied);
    }
}
