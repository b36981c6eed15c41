//! Every path a client names is resolved here, and only here.
//!
//! Two layers keep a path inside the root. `RelPath::parse` normalises the
//! client's string lexically and refuses `..` that climbs above the root.
//! `Root` then resolves it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`
//! against a directory fd held open for the daemon's lifetime, so the kernel
//! itself refuses symlinks that lead out, including ones swapped in between
//! our check and our use: there is no check-then-use window to race.

use std::{
    ffi::OsStr,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};

use crate::error::{Error, Result};

/// A normalised path relative to the root: no empty, `.` or `..` segments,
/// no NUL. The empty string is the root itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RelPath(String);

impl RelPath {
    /// Parses a client path (already percent-decoded). Leading slashes are
    /// ignored: `/a/b` and `a/b` both name `<root>/a/b`.
    pub fn parse(raw: &str) -> Result<Self> {
        if raw.contains('\0') {
            return Err(Error::InvalidArgument("path contains a NUL byte".into()));
        }
        let mut parts: Vec<&str> = Vec::new();
        for seg in raw.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Err(Error::PermissionDenied(format!(
                            "{raw}: path escapes the root"
                        )));
                    }
                }
                s => parts.push(s),
            }
        }
        Ok(RelPath(parts.join("/")))
    }

    pub fn root() -> Self {
        RelPath(String::new())
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The form clients see: `/` for the root, else `/a/b`.
    pub fn display(&self) -> String {
        format!("/{}", self.0)
    }

    /// Splits into the parent directory and the last segment.
    pub fn split_last(&self) -> Option<(RelPath, &str)> {
        if self.is_root() {
            return None;
        }
        Some(match self.0.rsplit_once('/') {
            Some((parent, name)) => (RelPath(parent.to_string()), name),
            None => (RelPath::root(), self.0.as_str()),
        })
    }

    /// Appends one directory entry name (which must not contain `/`).
    pub fn join(&self, name: &str) -> RelPath {
        debug_assert!(!name.contains('/'));
        if self.is_root() {
            RelPath(name.to_string())
        } else {
            RelPath(format!("{}/{}", self.0, name))
        }
    }

    /// Every ancestor, outermost first, ending with `self`.
    pub fn prefixes(&self) -> impl Iterator<Item = RelPath> + '_ {
        self.0
            .match_indices('/')
            .map(|(i, _)| RelPath(self.0[..i].to_string()))
            .chain(std::iter::once(self.clone()))
            .filter(|p| !p.is_root())
    }

    /// The path handed to `openat2`: `.` for the root.
    fn os(&self) -> &OsStr {
        if self.is_root() {
            OsStr::new(".")
        } else {
            OsStr::new(&self.0)
        }
    }
}

/// The sandbox root, held open as a directory fd.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

/// What kind of thing a path names, after following symlinks beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Other,
}

pub fn kind_of(st: &rfs::Stat) -> Kind {
    match rfs::FileType::from_raw_mode(st.st_mode) {
        rfs::FileType::RegularFile => Kind::File,
        rfs::FileType::Directory => Kind::Directory,
        _ => Kind::Other,
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

impl Root {
    /// Opens (creating if needed) the root directory.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(path)?;
        let path = path.canonicalize()?;
        let fd = rfs::open(
            &path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root { fd, path })
    }

    /// The root's canonical host path. Used to spawn processes in it, never
    /// to open client-named files.
    pub fn host_path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `rel` beneath the root with `flags`.
    pub fn open_at(&self, rel: &RelPath, flags: OFlags, mode: Mode) -> Result<OwnedFd> {
        rfs::openat2(&self.fd, rel.os(), flags | OFlags::CLOEXEC, mode, RESOLVE)
            .map_err(|e| Error::io(e.into(), &rel.display()))
    }

    /// An `O_PATH` handle: enough to stat, or to use as a directory fd.
    pub fn open_path(&self, rel: &RelPath) -> Result<OwnedFd> {
        self.open_at(rel, OFlags::PATH, Mode::empty())
    }

    pub fn stat(&self, rel: &RelPath) -> Result<rfs::Stat> {
        let fd = self.open_path(rel)?;
        rfs::fstat(&fd).map_err(|e| Error::io(e.into(), &rel.display()))
    }

    /// Stats without following a final symlink (for delete).
    pub fn lstat(&self, rel: &RelPath) -> Result<rfs::Stat> {
        match rel.split_last() {
            None => self.stat(rel),
            Some((parent, name)) => {
                let dir = self.open_dir(&parent)?;
                rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| Error::io(e.into(), &rel.display()))
            }
        }
    }

    pub fn open_dir(&self, rel: &RelPath) -> Result<OwnedFd> {
        self.open_at(rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
    }

    /// Opens `rel` for reading. `O_NONBLOCK`: a name the workload swapped
    /// for a FIFO is not waited on at open (it does not change reads of a
    /// regular file); callers check what they opened with `fstat`.
    pub fn open_read(&self, rel: &RelPath) -> Result<std::fs::File> {
        Ok(self
            .open_at(rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?
            .into())
    }

    /// Creates `rel` and its missing parents as directories (mode 0755).
    pub fn create_dir_all(&self, rel: &RelPath) -> Result<OwnedFd> {
        for prefix in rel.prefixes() {
            match self.open_dir(&prefix) {
                Ok(_) => continue,
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
            let (parent, name) = prefix.split_last().expect("prefix is never the root");
            let dir = self.open_dir(&parent)?;
            match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(Error::io(e.into(), &prefix.display())),
            }
        }
        self.open_dir(rel)
    }

    /// Lists a directory. Entries are stat'ed through the root, so a
    /// symlink is reported as what it points to, and one that leads out of
    /// the root (or nowhere) is left out rather than described.
    pub fn list(&self, rel: &RelPath) -> Result<Vec<(String, rfs::Stat)>> {
        let dir = self.open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let mut reader =
            rfs::Dir::read_from(&dir).map_err(|e| Error::io(e.into(), &rel.display()))?;
        let mut out = Vec::new();
        while let Some(entry) = reader.read() {
            let entry = entry.map_err(|e| Error::io(e.into(), &rel.display()))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            let st = if entry.file_type() == rfs::FileType::Symlink {
                match self.stat(&rel.join(name)) {
                    Ok(st) => st,
                    Err(_) => continue,
                }
            } else {
                match rfs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => st,
                    Err(_) => continue,
                }
            };
            out.push((name.to_string(), st));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The host path of a directory inside the root, resolved through the
    /// kernel so that a symlink can never point a process outside.
    pub fn resolve_dir_host_path(&self, rel: &RelPath) -> Result<PathBuf> {
        let fd = self.open_dir(rel)?;
        let link = rfs::readlinkat(
            rfs::CWD,
            format!("/proc/self/fd/{}", fd_num(&fd)),
            Vec::new(),
        )
        .map_err(|e| Error::io(e.into(), &rel.display()))?;
        Ok(PathBuf::from(OsStr::from_bytes(link.as_bytes())))
    }

    /// Removes `rel`. Directories need `recursive`; the root itself is never
    /// removed, only emptied.
    pub fn remove(&self, rel: &RelPath, recursive: bool) -> Result<()> {
        let st = self.lstat(rel)?;
        let is_dir = rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory;
        let Some((parent, name)) = rel.split_last() else {
            if !recursive {
                return Err(Error::Conflict(
                    "refusing to delete the root; pass recursive=true to empty it".into(),
                ));
            }
            let dir = self.open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            return empty_dir(&dir).map_err(|e| Error::io(e.into(), "/"));
        };
        let parent_fd = self.open_dir(&parent)?;
        if !is_dir {
            return rfs::unlinkat(&parent_fd, name, AtFlags::empty())
                .map_err(|e| Error::io(e.into(), &rel.display()));
        }
        if recursive {
            let dir = rfs::openat(
                &parent_fd,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Error::io(e.into(), &rel.display()))?;
            empty_dir(&dir).map_err(|e| Error::io(e.into(), &rel.display()))?;
        }
        rfs::unlinkat(&parent_fd, name, AtFlags::REMOVEDIR)
            .map_err(|e| Error::io(e.into(), &rel.display()))
    }
}

pub fn fd_num(fd: &impl AsFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_fd().as_raw_fd()
}

/// Deletes everything inside `dir` without following any symlink: each
/// level is opened with `O_NOFOLLOW` relative to its parent's fd.
fn empty_dir(dir: &OwnedFd) -> rustix::io::Result<()> {
    let mut names = Vec::new();
    let mut reader = rfs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push((name.to_vec(), entry.file_type() == rfs::FileType::Directory));
    }
    for (name, is_dir) in names {
        let name = OsStr::from_bytes(&name);
        if is_dir {
            let child = rfs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            empty_dir(&child)?;
            rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
        } else {
            rfs::unlinkat(dir, name, AtFlags::empty())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_normalises_and_refuses_climbing() {
        assert_eq!(RelPath::parse("a/./b//c").unwrap().as_str(), "a/b/c");
        assert_eq!(RelPath::parse("/a/b").unwrap().as_str(), "a/b");
        assert_eq!(RelPath::parse("a/../b").unwrap().as_str(), "b");
        assert!(RelPath::parse("").unwrap().is_root());
        assert!(RelPath::parse("/").unwrap().is_root());
        assert!(matches!(
            RelPath::parse("../x"),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            RelPath::parse("a/../../x"),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            RelPath::parse("a\0b"),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn prefixes_walk_outermost_first() {
        let p = RelPath::parse("a/b/c").unwrap();
        let got: Vec<_> = p.prefixes().map(|p| p.as_str().to_string()).collect();
        assert_eq!(got, ["a", "a/b", "a/b/c"]);
        assert_eq!(RelPath::root().prefixes().count(), 0);
    }
}
