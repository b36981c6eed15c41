//! Unpacking one layer tar into an empty directory, safely.
//!
//! A layer is untrusted input: its entries may name `../x`, `/etc/x`, a
//! path through a symlink an earlier entry planted, or a hard link to a
//! host file. So nothing here joins paths: every parent directory is
//! opened from the layer's root fd with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, and every entry is made with an
//! `*at` call relative to that fd that does not follow a final symlink.
//! An entry that names anything outside (an absolute path, `..`) or walks
//! through a symlink is refused, and the whole layer with it.
//!
//! The result is in overlayfs's own format, so layers stack as overlay
//! lower directories as they are: an OCI whiteout `.wh.NAME` becomes a
//! char 0/0 device `NAME`, an opaque marker `.wh..wh..opq` becomes the
//! `trusted.overlay.opaque=y` xattr on its directory. Owners are shifted
//! into the sandbox id range ([`IdMap`]), so an image's root-owned files
//! are root inside the sandbox and nobody's on the host.

use std::{
    io::{self, Read},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Component, Path},
};

use rustix::{
    fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, Timestamps},
    io::Errno,
};

use sandhub_api::error::ErrorBody;

use crate::local::runtime::IdMap;

/// How every path inside the layer is resolved: below the layer root, no
/// symlink anywhere, no mount crossing.
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
/// Deepest path a layer entry may have: far beyond any real image, low
/// enough that walking it stays cheap.
const MAX_DEPTH: usize = 256;

/// Why a layer was refused: the caller turns it into `INVALID_ARGUMENT`
/// (the layer's fault) or `INTERNAL` (ours).
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?}: {why}")]
    Hostile { path: String, why: String },
    #[error("layer is not a readable tar: {0}")]
    Corrupt(io::Error),
    #[error("unpacking layer: {0}")]
    Io(#[from] io::Error),
    /// The caller's budget refused more bytes (a quota, not the layer's
    /// fault).
    #[error("{}", .0.message)]
    Refused(ErrorBody),
}

fn hostile(path: &Path, why: impl Into<String>) -> UnpackError {
    UnpackError::Hostile {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// What an unpack wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub bytes: u64,
    /// What the layer cost against its budget: file data plus
    /// [`ENTRY_COST`] per entry read. The layer's size for quotas.
    pub charged: u64,
}

/// What one entry costs against the unpack budget beyond its data: an
/// inode and a directory entry (a layer of a million empty files is a
/// bomb too).
pub const ENTRY_COST: u64 = 512;

/// Unpacks the (uncompressed) tar `input` into the empty directory `root`,
/// refusing it once file data plus [`ENTRY_COST`] per entry passes
/// `max_bytes` (a gzip bomb).
pub fn unpack_layer(
    input: impl Read,
    root: BorrowedFd<'_>,
    idmap: &IdMap,
    max_bytes: u64,
) -> Result<UnpackStats, UnpackError> {
    unpack_layer_charged(input, root, idmap, max_bytes, &mut |_| Ok(()))
}

/// [`unpack_layer`], and `charge` is asked for each entry's cost before
/// the entry is written: a refusal stops the unpack (a quota).
pub fn unpack_layer_charged(
    input: impl Read,
    root: BorrowedFd<'_>,
    idmap: &IdMap,
    max_bytes: u64,
    charge: &mut dyn FnMut(u64) -> Result<(), ErrorBody>,
) -> Result<UnpackStats, UnpackError> {
    let mut archive = tar::Archive::new(input);
    let mut stats = UnpackStats::default();
    for entry in archive.entries().map_err(UnpackError::Corrupt)? {
        let mut entry = entry.map_err(UnpackError::Corrupt)?;
        let path = entry.path().map_err(UnpackError::Corrupt)?.into_owned();
        let cost = entry.size().saturating_add(ENTRY_COST);
        if stats.charged.saturating_add(cost) > max_bytes {
            return Err(hostile(
                &path,
                format!("the layer unpacks to more than {max_bytes} bytes"),
            ));
        }
        charge(cost).map_err(UnpackError::Refused)?;
        stats.charged += cost;
        let Some(rel) = confined(&path)? else {
            // `./` itself: the layer root, which we made.
            continue;
        };
        let (parent, name) = split(&rel);
        let dir = ensure_parents(root, parent, idmap, &path)?;
        let header = entry.header().clone();
        let kind = header.entry_type();
        let xattrs = xattrs_of(&mut entry)?;
        if name == OPAQUE {
            rfs::fsetxattr(
                &dir,
                "trusted.overlay.opaque",
                b"y",
                rfs::XattrFlags::empty(),
            )
            .map_err(io::Error::from)?;
            stats.entries += 1;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
                return Err(hostile(&path, "whiteout of no valid name"));
            }
            remove_existing(dir.as_fd(), hidden)?;
            rfs::mknodat(&dir, hidden, FileType::CharacterDevice, Mode::empty(), 0)
                .map_err(io::Error::from)?;
            stats.entries += 1;
            continue;
        }
        let mode = Mode::from_raw_mode(header.mode().map_err(UnpackError::Corrupt)? & 0o7777);
        let (uid, gid) = idmap.image_owner(
            header.uid().map_err(UnpackError::Corrupt)?,
            header.gid().map_err(UnpackError::Corrupt)?,
        );
        let (uid, gid) = (rfs::Uid::from_raw(uid), rfs::Gid::from_raw(gid));
        let mtime = header.mtime().unwrap_or(0);
        match kind {
            tar::EntryType::Directory => {
                match rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) => {}
                    Err(Errno::EXIST) => {
                        // A directory may be listed again (its metadata
                        // updated); anything else in its place goes.
                        if open_beneath_dir(dir.as_fd(), name).is_err() {
                            remove_existing(dir.as_fd(), name)?;
                            rfs::mkdirat(&dir, name, Mode::from_raw_mode(0o700))
                                .map_err(io::Error::from)?;
                        }
                    }
                    Err(e) => return Err(io::Error::from(e).into()),
                }
                let fd = open_beneath_dir(dir.as_fd(), name)
                    .map_err(|e| hostile(&path, e.to_string()))?;
                finish(fd.as_fd(), mode, uid, gid, mtime, &xattrs)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_existing(dir.as_fd(), name)?;
                let fd = rfs::openat(
                    &dir,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(io::Error::from)?;
                let mut file = std::fs::File::from(fd);
                stats.bytes += io::copy(&mut entry, &mut file).map_err(UnpackError::Corrupt)?;
                finish(file.as_fd(), mode, uid, gid, mtime, &xattrs)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(UnpackError::Corrupt)?
                    .ok_or_else(|| hostile(&path, "symlink without a target"))?;
                remove_existing(dir.as_fd(), name)?;
                // The target is only text: nothing here ever follows it.
                rfs::symlinkat(target.as_ref(), &dir, name).map_err(io::Error::from)?;
                rfs::chownat(&dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(io::Error::from)?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(UnpackError::Corrupt)?
                    .ok_or_else(|| hostile(&path, "hard link without a target"))?
                    .into_owned();
                let Some(src) = confined(&target)? else {
                    return Err(hostile(&path, "hard link to the layer root"));
                };
                let (sparent, sname) = split(&src);
                let sdir = if sparent.is_empty() {
                    rfs::openat(root, ".", OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                        .map_err(io::Error::from)?
                } else {
                    open_beneath_dir(root, sparent).map_err(|e| {
                        hostile(&path, format!("hard link target {}: {e}", target.display()))
                    })?
                };
                // The source must be something this layer made before:
                // a file (not a directory) right here, found without
                // following any link.
                let st = rfs::statat(&sdir, sname, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| {
                    hostile(
                        &path,
                        format!("hard link to {} not in this layer", target.display()),
                    )
                })?;
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    return Err(hostile(&path, "hard link to a directory"));
                }
                remove_existing(dir.as_fd(), name)?;
                rfs::linkat(&sdir, sname, &dir, name, AtFlags::empty()).map_err(io::Error::from)?;
            }
            tar::EntryType::Fifo => {
                remove_existing(dir.as_fd(), name)?;
                rfs::mknodat(&dir, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
                    .map_err(io::Error::from)?;
                // Just made by us in a directory no one else writes, so
                // the *at forms cannot be redirected.
                rfs::chownat(&dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(io::Error::from)?;
                rfs::chmodat(&dir, name, mode, AtFlags::empty()).map_err(io::Error::from)?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                let major = header.device_major().ok().flatten().unwrap_or(1);
                let minor = header.device_minor().ok().flatten().unwrap_or(1);
                if kind == tar::EntryType::Char && major == 0 && minor == 0 {
                    // Already an overlay-format whiteout.
                    remove_existing(dir.as_fd(), name)?;
                    rfs::mknodat(&dir, name, FileType::CharacterDevice, Mode::empty(), 0)
                        .map_err(io::Error::from)?;
                } else {
                    // A sandbox gets its /dev from the runtime; device
                    // nodes from an image would be host devices.
                    tracing::warn!(path = %path.display(), "skipping a device node in a layer");
                    continue;
                }
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(hostile(&path, format!("unsupported entry type {other:?}")));
            }
        }
        stats.entries += 1;
    }
    Ok(stats)
}

/// The entry's path as plain components below the layer root, or `None`
/// for the root itself. `..` and absolute paths are refused.
fn confined(path: &Path) -> Result<Option<String>, UnpackError> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => {
                let p = p
                    .to_str()
                    .ok_or_else(|| hostile(path, "name is not UTF-8"))?;
                parts.push(p);
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(hostile(path, "`..` leaves the layer")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(hostile(path, "absolute path"))
            }
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(hostile(path, "nested too deep"));
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// `a/b/c` as (`a/b`, `c`); (`""`, `c`) at the top.
fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

fn open_beneath_dir(dir: BorrowedFd<'_>, path: &str) -> io::Result<OwnedFd> {
    rfs::openat2(
        dir,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
    .map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR | Errno::XDEV => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path} is not a plain directory of this layer (a symlink or a file)"),
        ),
        e => io::Error::from(e),
    })
}

/// Opens `parent` (relative to the layer root), making any missing
/// directory on the way (tars may omit them). A component that is a
/// symlink or a file refuses the entry: that is the classic
/// symlink-then-write-through attack.
fn ensure_parents(
    root: BorrowedFd<'_>,
    parent: &str,
    idmap: &IdMap,
    entry: &Path,
) -> Result<OwnedFd, UnpackError> {
    let mut dir = rfs::openat(
        root,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    if parent.is_empty() {
        return Ok(dir);
    }
    for part in parent.split('/') {
        match rfs::mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                let (uid, gid) = idmap.image_owner(0, 0);
                let (uid, gid) = (rfs::Uid::from_raw(uid), rfs::Gid::from_raw(gid));
                rfs::chownat(&dir, part, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(io::Error::from)?;
            }
            Err(Errno::EXIST) => {}
            Err(e) => return Err(io::Error::from(e).into()),
        }
        dir = open_beneath_dir(dir.as_fd(), part)
            .map_err(|e| hostile(entry, format!("parent {part:?}: {e}")))?;
    }
    Ok(dir)
}

/// Removes `name` in `dir` if present (a later entry replaces an earlier
/// one of the same layer), without following it.
fn remove_existing(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            let sub = open_beneath_dir(dir, name)?;
            clear_dir(sub.as_fd(), 0)?;
            Ok(rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
        }
        Ok(_) => Ok(rfs::unlinkat(dir, name, AtFlags::empty())?),
    }
}

fn clear_dir(dir: BorrowedFd<'_>, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("directory nested too deep"));
    }
    let names: Vec<String> = rfs::Dir::read_from(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
        .filter(|n| n != "." && n != "..")
        .collect();
    for n in names {
        let st = rfs::statat(dir, n.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let sub = open_beneath_dir(dir, &n)?;
            clear_dir(sub.as_fd(), depth + 1)?;
            rfs::unlinkat(dir, n.as_str(), AtFlags::REMOVEDIR)?;
        } else {
            rfs::unlinkat(dir, n.as_str(), AtFlags::empty())?;
        }
    }
    Ok(())
}

/// Owner, mode (after the chown, which clears set-id bits), xattrs and
/// mtime of an entry made through `fd`.
fn finish(
    fd: BorrowedFd<'_>,
    mode: Mode,
    uid: rfs::Uid,
    gid: rfs::Gid,
    mtime: u64,
    xattrs: &[(String, Vec<u8>)],
) -> io::Result<()> {
    rfs::fchown(fd, Some(uid), Some(gid))?;
    rfs::fchmod(fd, mode)?;
    for (name, value) in xattrs {
        if let Err(e) = rfs::fsetxattr(fd, name.as_str(), value, rfs::XattrFlags::empty()) {
            // Filesystems without user xattrs: the file is still usable.
            tracing::debug!(%name, error = %e, "xattr not kept");
        }
    }
    let t = rfs::Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    rfs::futimens(
        fd,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
    )?;
    Ok(())
}

/// The entry's xattrs from its PAX header (`SCHILY.xattr.NAME`), only
/// `user.*`. `trusted.*` (overlayfs's own `trusted.overlay.*` among
/// them: a redirect or a metacopy could point outside the layer) and
/// `security.*` (file capabilities written from the host's namespace
/// would be the host's) are dropped.
fn xattrs_of<R: Read>(
    entry: &mut tar::Entry<'_, R>,
) -> Result<Vec<(String, Vec<u8>)>, UnpackError> {
    let mut out = Vec::new();
    let Some(exts) = entry.pax_extensions().map_err(UnpackError::Corrupt)? else {
        return Ok(out);
    };
    for ext in exts {
        let ext = ext.map_err(UnpackError::Corrupt)?;
        let Ok(key) = ext.key() else { continue };
        let Some(name) = key.strip_prefix("SCHILY.xattr.") else {
            continue;
        };
        if name.starts_with("user.") {
            out.push((name.to_string(), ext.value_bytes().to_vec()));
        }
    }
    Ok(out)
}
