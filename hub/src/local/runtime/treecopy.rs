//! Copying a tree that a sandbox can write, as host root, without ever
//! following a symlink.
//!
//! A snapshot copies a sandbox's upper layer while the sandbox may still
//! run and rename, swap or re-link anything in it. A path-based copy
//! (`cp -a`) stats a name and opens it later by path: a workload that swaps
//! a directory for a symlink in between makes root read (or a fork mount)
//! whatever the link names on the host. Here every entry is reached from
//! its parent's directory fd, opened with `O_NOFOLLOW`, and judged by
//! `fstat` of what was actually opened; a symlink is recreated as a
//! symlink and never resolved. A race can only make the copy inconsistent,
//! never reach outside the source tree.
//!
//! Kept: owners, modes, timestamps, extended attributes (overlayfs's
//! opaque markers), hard links within the tree, whiteouts (0:0 character
//! devices) and FIFOs. Dropped: sockets and real device nodes (a sandbox
//! cannot make those; they carry no data). Data is reflinked where the
//! filesystem can, else copied in the kernel.

use std::{
    collections::HashMap,
    ffi::{CStr, OsStr},
    io,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

use rustix::{
    fs::{
        self as rfs, AtFlags, Dir, FileType, Mode, OFlags, Stat, Timespec, Timestamps, XattrFlags,
    },
    io::Errno,
};

/// Deepest directory nesting copied: every level holds two fds, and a
/// workload must not be able to exhaust the hub's.
pub const MAX_DEPTH: usize = 256;

/// What a copy wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Sum of the regular files' sizes (hard links counted once).
    pub bytes: u64,
    /// Entries created, directories included.
    pub entries: u64,
}

/// Copies the directory open as `src` to a new directory `name` under
/// `dest_parent`. `max_bytes` bounds the data copied: past it the copy
/// fails with `ENOSPC` (the caller removes what was written). On error the
/// partial destination is left for the caller to remove.
pub fn copy_tree(
    src: BorrowedFd<'_>,
    dest_parent: BorrowedFd<'_>,
    name: &str,
    max_bytes: Option<u64>,
) -> io::Result<CopyStats> {
    let st = rfs::fstat(src)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "copy source is not a directory",
        ));
    }
    rfs::mkdirat(dest_parent, name, Mode::from_raw_mode(0o700))?;
    let dest = open_dir(dest_parent, name)?;
    let mut copier = Copier {
        stats: CopyStats {
            entries: 1,
            ..CopyStats::default()
        },
        max_bytes,
        links: HashMap::new(),
        dest_root: rfs::openat(
            dest_parent,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?,
    };
    copier.copy_dir(src, dest.as_fd(), Path::new(""), 0)?;
    copy_attributes(src, dest.as_fd(), &st)?;
    Ok(copier.stats)
}

struct Copier {
    stats: CopyStats,
    max_bytes: Option<u64>,
    /// (dev, ino) of a multiply-linked source file -> its first copy,
    /// relative to `dest_root` (a tree only this copy writes).
    links: HashMap<(u64, u64), PathBuf>,
    dest_root: OwnedFd,
}

fn open_dir(parent: BorrowedFd<'_>, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    Ok(rfs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The entry changed kind or vanished between listing and opening: the
/// workload is racing the copy; the entry is skipped.
fn raced(e: Errno) -> bool {
    matches!(e, Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::ISDIR)
}

impl Copier {
    fn copy_dir(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        rel: &Path,
        depth: usize,
    ) -> io::Result<()> {
        if depth >= MAX_DEPTH {
            return Err(io::Error::other(format!(
                "the workspace nests directories deeper than {MAX_DEPTH} levels"
            )));
        }
        for entry in Dir::read_from(src)? {
            let entry = entry?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let st = match rfs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => self.copy_subdir(src, dest, name, &child, depth)?,
                FileType::RegularFile => self.copy_file(src, dest, name, &child, &st)?,
                FileType::Symlink => {
                    let target = match rfs::readlinkat(src, name, Vec::new()) {
                        Ok(t) => t,
                        Err(e) if raced(e) || e == Errno::INVAL => continue,
                        Err(e) => return Err(e.into()),
                    };
                    rfs::symlinkat(target.as_c_str(), dest, name)?;
                    self.finish_node(dest, name, &st)?;
                }
                // Overlayfs whiteouts are 0:0 character devices.
                FileType::CharacterDevice if st.st_rdev == 0 => {
                    rfs::mknodat(
                        dest,
                        name,
                        FileType::CharacterDevice,
                        Mode::from_raw_mode(0),
                        0,
                    )?;
                    self.finish_node(dest, name, &st)?;
                }
                FileType::Fifo => {
                    rfs::mknodat(dest, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)?;
                    self.finish_node(dest, name, &st)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn copy_subdir(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        name: &CStr,
        rel: &Path,
        depth: usize,
    ) -> io::Result<()> {
        let s = match open_dir(src, name) {
            Ok(fd) => fd,
            Err(e)
                if e.raw_os_error()
                    .is_some_and(|n| raced(Errno::from_raw_os_error(n))) =>
            {
                return Ok(())
            }
            Err(e) => return Err(e),
        };
        let st = rfs::fstat(&s)?;
        rfs::mkdirat(dest, name, Mode::from_raw_mode(0o700))?;
        let d = open_dir(dest, name)?;
        self.stats.entries += 1;
        self.copy_dir(s.as_fd(), d.as_fd(), rel, depth + 1)?;
        copy_attributes(s.as_fd(), d.as_fd(), &st)
    }

    fn copy_file(
        &mut self,
        src: BorrowedFd<'_>,
        dest: BorrowedFd<'_>,
        name: &CStr,
        rel: &Path,
        listed: &Stat,
    ) -> io::Result<()> {
        if listed.st_nlink > 1 {
            if let Some(first) = self.links.get(&(listed.st_dev, listed.st_ino)) {
                rfs::linkat(&self.dest_root, first, dest, name, AtFlags::empty())?;
                return Ok(());
            }
        }
        // NONBLOCK: a FIFO swapped in after the listing must not hang the
        // open; it is then seen by fstat and skipped.
        let s = match rfs::openat(
            src,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if raced(e) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let st = rfs::fstat(&s)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Ok(());
        }
        let size = st.st_size.max(0) as u64;
        self.stats.bytes = self.stats.bytes.saturating_add(size);
        if self.max_bytes.is_some_and(|max| self.stats.bytes > max) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let d = rfs::openat(
            dest,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        copy_data(s.as_fd(), d.as_fd(), size)?;
        copy_attributes(s.as_fd(), d.as_fd(), &st)?;
        self.stats.entries += 1;
        if st.st_nlink > 1 {
            self.links.insert((st.st_dev, st.st_ino), rel.to_path_buf());
        }
        Ok(())
    }

    /// Owner and times of a node that cannot be opened (symlink, whiteout,
    /// FIFO), set by name without following it.
    fn finish_node(&mut self, dest: BorrowedFd<'_>, name: &CStr, st: &Stat) -> io::Result<()> {
        rfs::chownat(
            dest,
            name,
            Some(rfs::Uid::from_raw(st.st_uid)),
            Some(rfs::Gid::from_raw(st.st_gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
            rfs::chmodat(
                dest,
                name,
                Mode::from_raw_mode(st.st_mode & 0o7777),
                AtFlags::empty(),
            )?;
        }
        rfs::utimensat(dest, name, &timestamps(st), AtFlags::SYMLINK_NOFOLLOW)?;
        self.stats.entries += 1;
        Ok(())
    }
}

/// Reflink when the filesystem can, else `copy_file_range` (in-kernel, and
/// sparse-aware on most filesystems), else read/write.
fn copy_data(src: BorrowedFd<'_>, dest: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    if size == 0 || rfs::ioctl_ficlone(dest, src).is_ok() {
        return Ok(());
    }
    let mut copied = 0u64;
    loop {
        match rfs::copy_file_range(src, None, dest, None, 1 << 30) {
            Ok(0) => return Ok(()),
            Ok(n) => copied += n as u64,
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) if copied == 0 => {
                return copy_by_hand(src, dest)
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

fn copy_by_hand(src: BorrowedFd<'_>, dest: BorrowedFd<'_>) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match rustix::io::read(src, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut written = 0;
        while written < n {
            match rustix::io::write(dest, &buf[written..n]) {
                Ok(w) => written += w,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn timestamps(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime as _,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime as _,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}

/// Extended attributes, owner, mode (after the owner: chown clears setuid
/// bits) and times, from the source fd's own `fstat`.
fn copy_attributes(src: BorrowedFd<'_>, dest: BorrowedFd<'_>, st: &Stat) -> io::Result<()> {
    copy_xattrs(src, dest)?;
    rfs::fchown(
        dest,
        Some(rfs::Uid::from_raw(st.st_uid)),
        Some(rfs::Gid::from_raw(st.st_gid)),
    )?;
    rfs::fchmod(dest, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    rfs::futimens(dest, &timestamps(st))?;
    Ok(())
}

fn copy_xattrs(src: BorrowedFd<'_>, dest: BorrowedFd<'_>) -> io::Result<()> {
    // The kernel caps a name list and a value at 64 KiB each.
    let mut names = vec![0u8; 64 * 1024];
    let len = match rfs::flistxattr(src, &mut names[..]) {
        Ok(n) => n,
        Err(Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut value = vec![0u8; 64 * 1024];
    for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = OsStr::from_bytes(name);
        let n = match rfs::fgetxattr(src, name, &mut value[..]) {
            Ok(n) => n,
            // Removed meanwhile.
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e.into()),
        };
        match rfs::fsetxattr(dest, name, &value[..n], XattrFlags::empty()) {
            Ok(()) => {}
            // security.* labels the destination filesystem does not take.
            Err(Errno::NOTSUP | Errno::PERM)
                if !name.as_bytes().starts_with(b"trusted.")
                    && !name.as_bytes().starts_with(b"user.") => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    use super::*;

    fn dir_fd(p: &Path) -> OwnedFd {
        rfs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    fn copy(src: &Path, dest_parent: &Path, name: &str, max: Option<u64>) -> io::Result<CopyStats> {
        copy_tree(dir_fd(src).as_fd(), dir_fd(dest_parent).as_fd(), name, max)
    }

    #[test]
    fn copies_files_dirs_links_and_modes() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/f.txt"), b"hello").unwrap();
        std::fs::set_permissions(
            src.join("a/b/f.txt"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::fs::hard_link(src.join("a/b/f.txt"), src.join("a/link.txt")).unwrap();
        symlink("/etc/passwd", src.join("a/escape")).unwrap();
        symlink("/etc", src.join("etcdir")).unwrap();
        let stats = copy(&src, t.path(), "dst", None).unwrap();
        let dst = t.path().join("dst");
        assert_eq!(std::fs::read(dst.join("a/b/f.txt")).unwrap(), b"hello");
        let meta = std::fs::metadata(dst.join("a/b/f.txt")).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o640);
        // Hard links stay links: a workload cannot multiply its size.
        assert_eq!(
            meta.ino(),
            std::fs::metadata(dst.join("a/link.txt")).unwrap().ino()
        );
        assert_eq!(stats.bytes, 5);
        // Symlinks are copied as links, never followed.
        assert_eq!(
            std::fs::read_link(dst.join("a/escape")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(std::fs::symlink_metadata(dst.join("etcdir"))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn a_symlinked_source_root_is_refused() {
        let t = tempfile::tempdir().unwrap();
        symlink("/etc", t.path().join("upper")).unwrap();
        // What the hub does: open the root without following links.
        let opened = rfs::openat(
            dir_fd(t.path()),
            "upper",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        );
        assert!(opened.is_err());
    }

    #[test]
    fn byte_budget_and_depth_are_enforced() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("big"), vec![1u8; 4096]).unwrap();
        let err = copy(&src, t.path(), "small", Some(1000)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));

        let deep = t.path().join("deep");
        let mut p = deep.clone();
        for _ in 0..=MAX_DEPTH {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        let err = copy(&deep, t.path(), "deepcopy", None).unwrap_err();
        assert!(err.to_string().contains("deeper"), "{err}");
    }
}
