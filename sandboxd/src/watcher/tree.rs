//! The set of inotify watches behind one WatchDir stream, and the
//! translation of raw inotify events into `watcher.v1` events.
//!
//! Directories are always opened through the kernel, never by host path:
//! the watched directory beneath the sandbox root (`Root::open_dir`), and
//! every subdirectory beneath that directory's fd with `RESOLVE_NO_SYMLINKS`.
//! A watch is then placed on `/proc/self/fd/<fd>`, which names the inode the
//! fd already holds, so a symlink swapped in between the open and the watch
//! cannot point the watch anywhere else. Once placed, a watch pins its inode
//! by itself and follows it through renames, so no path is trusted again.
//!
//! The fds are held only while watches are being added, never for the
//! stream's life: an open fd pins the directory's dentry, and the kernel
//! then defers IN_DELETE_SELF until that fd closes, so a removed directory
//! would never end its stream.

use std::{
    collections::{HashMap, HashSet},
    ffi::{OsStr, OsString},
    io,
    os::fd::OwnedFd,
};

use inotify::{Event, EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use rustix::{
    fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags},
    io::Errno,
};
use sandhub_api::proto::watcher::v1::EventType;
use tracing::{debug, warn};

use super::batch::{error_event, event, Batch};
use crate::{
    confine::{fd_num, RelPath, Root},
    error::{Error, Result},
};

/// IN_MODIFY rather than IN_CLOSE_WRITE: a log appended to through a
/// long-lived fd never closes, and the batch folds the per-write repeats.
/// IN_EXCL_UNLINK keeps files that are deleted but still open quiet.
const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::MODIFY)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::EXCL_UNLINK);

/// Whether the stream goes on after an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Continue,
    /// The watched directory is gone; the batch ends with the ERROR saying so.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// The initial scan: what is there already is no news.
    Quiet,
    /// A directory that appeared after the stream started: everything in
    /// it arrived before its watch did, so each entry is reported as CREATE.
    Announce,
    /// After lost events: add whatever watches are missing, report nothing.
    Rescan,
}

/// A subtree cut loose by IN_MOVED_FROM, waiting to learn where it went.
struct Moving {
    /// The moved directory's path below the top.
    from: String,
    head: WatchDescriptor,
    dirs: Vec<(WatchDescriptor, String)>,
}

pub(crate) struct Tree {
    watches: Watches,
    top_path: RelPath,
    top: WatchDescriptor,
    recursive: bool,
    /// Every live watch, by the directory's path below the top ("" = top).
    dirs: HashMap<WatchDescriptor, String>,
    /// By rename cookie. Resolved by the matching IN_MOVED_TO (moved within
    /// the tree: the watches move along) or by the moved directory's own
    /// IN_MOVE_SELF, which the kernel queues after both halves of a rename
    /// (moved out: the watches go).
    moving: HashMap<u32, Moving>,
    limit_reported: bool,
}

impl Tree {
    /// Opens and watches `rel` (and, if `recursive`, everything beneath it).
    /// Problems with single subdirectories become ERROR events in `out`.
    pub(crate) fn open(
        root: &Root,
        rel: RelPath,
        recursive: bool,
        out: &mut Batch,
    ) -> Result<(Tree, Inotify)> {
        let shown = rel.display();
        let top_fd = match root.open_dir(&rel) {
            Ok(fd) => fd,
            // O_DIRECTORY on a file answers ENOTDIR, which reads as "a
            // parent is missing"; tell the client what it actually named.
            Err(Error::NotFound(msg)) => {
                return Err(match root.open_path(&rel) {
                    Ok(_) => Error::InvalidArgument(format!("{shown}: not a directory")),
                    Err(_) => Error::NotFound(msg),
                })
            }
            Err(e) => return Err(e),
        };
        let inotify = Inotify::init().map_err(|e| watch_error(e, &shown))?;
        let mut watches = inotify.watches();
        let top = watches
            .add(proc_path(&top_fd), MASK)
            .map_err(|e| watch_error(e, &shown))?;
        let mut tree = Tree {
            watches,
            top_path: rel,
            top: top.clone(),
            recursive,
            dirs: HashMap::from([(top, String::new())]),
            moving: HashMap::new(),
            limit_reported: false,
        };
        if recursive {
            tree.walk(&top_fd, String::new(), Walk::Quiet, out);
        }
        Ok((tree, inotify))
    }

    pub(crate) fn watch_count(&self) -> usize {
        self.dirs.len()
    }

    /// Translates one inotify event into zero or more `watcher.v1` events.
    pub(crate) fn handle(&mut self, root: &Root, ev: Event<OsString>, out: &mut Batch) -> Step {
        let mask = ev.mask;
        if mask.contains(EventMask::Q_OVERFLOW) {
            warn!(path = %self.top_path.display(), "inotify queue overflowed");
            out.push(error_event(
                self.top_path.display(),
                "event queue overflowed: some events were lost".into(),
            ));
            if self.recursive {
                // A lost IN_CREATE is a directory that would stay unwatched.
                self.rewalk(root, String::new(), Walk::Rescan, out);
            }
            return Step::Continue;
        }
        if ev.wd == self.top && ev.name.is_none() {
            return self.handle_top_self(mask, out);
        }
        let Some(dir) = self.dirs.get(&ev.wd).cloned() else {
            if mask.contains(EventMask::MOVE_SELF) {
                self.settle_move_out(&ev.wd);
            }
            return Step::Continue;
        };
        let Some(name) = ev.name else {
            // A subdirectory's own events. Its parent's watch reports the
            // same change by name (ATTRIB, DELETE, MOVED_FROM); only the end
            // of the watch matters here.
            if mask.contains(EventMask::IGNORED) {
                self.dirs.remove(&ev.wd);
            }
            return Step::Continue;
        };
        let sub = join(&dir, &name.to_string_lossy());
        // A name that isn't UTF-8 can be reported (lossily) but not reopened.
        let walkable = self.recursive && name.to_str().is_some();
        let path = self.show(&sub);
        let is_dir = mask.contains(EventMask::ISDIR);
        if mask.contains(EventMask::CREATE) {
            out.push(event(EventType::Create, path, is_dir));
            if is_dir && walkable {
                // Entries made before the new watch exists would be missed.
                self.rewalk(root, sub, Walk::Announce, out);
            }
        } else if mask.contains(EventMask::MOVED_TO) {
            out.push(event(EventType::Create, path, is_dir));
            if is_dir && walkable {
                match self.moving.remove(&ev.cookie) {
                    Some(moving) => self.reattach(moving, &sub),
                    None => self.rewalk(root, sub, Walk::Announce, out),
                }
            }
        } else if mask.contains(EventMask::MODIFY) {
            out.push(event(EventType::Write, path, is_dir));
        } else if mask.contains(EventMask::DELETE) {
            out.push(event(EventType::Remove, path, is_dir));
        } else if mask.contains(EventMask::MOVED_FROM) {
            out.push(event(EventType::Rename, path, is_dir));
            if is_dir && walkable {
                self.detach(sub, ev.cookie);
            }
        } else if mask.contains(EventMask::ATTRIB) {
            out.push(event(EventType::Chmod, path, is_dir));
        }
        Step::Continue
    }

    fn handle_top_self(&mut self, mask: EventMask, out: &mut Batch) -> Step {
        let shown = self.top_path.display();
        let message = if mask.contains(EventMask::DELETE_SELF) {
            format!("watched directory {shown} was removed")
        } else if mask.contains(EventMask::MOVE_SELF) {
            format!("watched directory {shown} was renamed or moved")
        } else if mask.intersects(EventMask::IGNORED | EventMask::UNMOUNT) {
            format!("watched directory {shown} was removed or unmounted")
        } else {
            if mask.contains(EventMask::ATTRIB) {
                out.push(event(EventType::Chmod, shown, true));
            }
            return Step::Continue;
        };
        debug!(path = %shown, "watched directory went away");
        out.push(error_event(shown, message));
        Step::End
    }

    /// Walks `sub` after the stream started.
    fn rewalk(&mut self, root: &Root, sub: String, how: Walk, out: &mut Batch) {
        // Reopened by path: if the top was renamed meanwhile, this fails or
        // finds a stranger, and either way the queued IN_MOVE_SELF ends the
        // stream right after.
        match root.open_dir(&self.top_path) {
            Ok(top_fd) => self.walk(&top_fd, sub, how, out),
            Err(e) => debug!(error = %e, "watched directory gone; not walking"),
        }
    }

    /// Watches `sub` and every directory beneath it.
    fn walk(&mut self, top_fd: &OwnedFd, sub: String, how: Walk, out: &mut Batch) {
        // A bind mount can make a directory its own descendant.
        let mut visited = HashSet::from([self.top.clone()]);
        let mut stack = vec![sub];
        while let Some(sub) = stack.pop() {
            let fd = match open_sub(top_fd, &sub) {
                Ok(fd) => fd,
                // Already gone again, or replaced by a symlink: its own
                // events (REMOVE, CREATE) tell the story.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                Err(e) => {
                    self.report(&sub, e.into(), out);
                    continue;
                }
            };
            if !sub.is_empty() {
                match self.watches.add(proc_path(&fd), MASK) {
                    Ok(wd) if !visited.insert(wd.clone()) => continue,
                    Ok(wd) if self.dirs.contains_key(&wd) => {
                        // Watched before this walk (say, by the initial scan
                        // and now by its IN_CREATE): whatever appeared in it
                        // since has been reported by its own watch.
                        if how == Walk::Announce {
                            continue;
                        }
                    }
                    Ok(wd) => {
                        self.dirs.insert(wd, sub.clone());
                    }
                    Err(e) => {
                        self.report(&sub, e, out);
                        continue;
                    }
                }
            }
            let entries = match list(&fd) {
                Ok(entries) => entries,
                Err(e) => {
                    self.report(&sub, e.into(), out);
                    continue;
                }
            };
            for (name, is_dir) in entries {
                let child = join(&sub, &name.to_string_lossy());
                if how == Walk::Announce {
                    out.push(event(EventType::Create, self.show(&child), is_dir));
                }
                if is_dir && name.to_str().is_some() {
                    stack.push(child);
                }
            }
        }
    }

    fn detach(&mut self, sub: String, cookie: u32) {
        let prefix = format!("{sub}/");
        let mut head = None;
        let mut dirs = Vec::new();
        self.dirs.retain(|wd, path| {
            if *path == sub {
                head = Some(wd.clone());
            } else if !path.starts_with(&prefix) {
                return true;
            }
            dirs.push((wd.clone(), std::mem::take(path)));
            false
        });
        // No watch on the moved directory means it was never walked (its
        // IN_CREATE is still queued); its destination will be walked instead.
        if let Some(head) = head {
            self.moving.insert(
                cookie,
                Moving {
                    from: sub,
                    head,
                    dirs,
                },
            );
        } else {
            self.forget(dirs.into_iter().map(|(wd, _)| wd));
        }
    }

    fn reattach(&mut self, moving: Moving, to: &str) {
        for (wd, path) in moving.dirs {
            let rest = &path[moving.from.len()..];
            self.dirs.insert(wd, format!("{to}{rest}"));
        }
    }

    /// The moved directory's IN_MOVE_SELF came without an IN_MOVED_TO: it
    /// left the tree, so its watches must not report under the old paths.
    fn settle_move_out(&mut self, wd: &WatchDescriptor) {
        let cookie = self
            .moving
            .iter()
            .find_map(|(cookie, m)| (m.head == *wd).then_some(*cookie));
        if let Some(moving) = cookie.and_then(|c| self.moving.remove(&c)) {
            debug!(from = %self.show(&moving.from), "directory moved out of the watched tree");
            self.forget(moving.dirs.into_iter().map(|(wd, _)| wd));
        }
    }

    fn forget(&mut self, wds: impl Iterator<Item = WatchDescriptor>) {
        for wd in wds {
            // EINVAL: the kernel already dropped it (directory deleted).
            let _ = self.watches.remove(wd);
        }
    }

    fn report(&mut self, sub: &str, err: io::Error, out: &mut Batch) {
        let path = self.show(sub);
        warn!(%path, error = %err, "cannot watch directory");
        if err.raw_os_error() == Some(libc::ENOSPC) {
            if !self.limit_reported {
                self.limit_reported = true;
                out.push(error_event(
                    path,
                    "inotify watch limit reached (fs.inotify.max_user_watches): \
                     this directory and others are not watched"
                        .into(),
                ));
            }
            return;
        }
        let message = format!("not watched: {}", Error::io(err, &path));
        out.push(error_event(path, message));
    }

    /// The client's view of a path below the top: root-relative, with a
    /// leading slash.
    fn show(&self, sub: &str) -> String {
        let top = self.top_path.display();
        match (sub.is_empty(), top.as_str()) {
            (true, _) => top,
            (false, "/") => format!("/{sub}"),
            (false, _) => format!("{top}/{sub}"),
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Opens a directory below the top without following any symlink, so the
/// walk can neither leave the top nor visit a directory twice.
fn open_sub(top_fd: &OwnedFd, sub: &str) -> rustix::io::Result<OwnedFd> {
    let path = if sub.is_empty() { "." } else { sub };
    rfs::openat2(
        top_fd,
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
}

fn proc_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd_num(fd))
}

/// Entry names of a directory held as an `O_PATH` fd, and whether each is a
/// directory itself (a symlink to one is not).
fn list(dir: &OwnedFd) -> rustix::io::Result<Vec<(OsString, bool)>> {
    let fd = rfs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut reader = rfs::Dir::new(fd)?;
    let mut out = Vec::new();
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name).to_os_string();
        let is_dir = match entry.file_type() {
            rfs::FileType::Directory => true,
            rfs::FileType::Unknown => rfs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory)
                .unwrap_or(false),
            _ => false,
        };
        out.push((name, is_dir));
    }
    Ok(out)
}

/// Maps a failure to start watching to what the client can act on.
fn watch_error(err: io::Error, path: &str) -> Error {
    match err.raw_os_error() {
        Some(libc::ENOSPC) => Error::ResourceExhausted(format!(
            "{path}: inotify watch limit reached (fs.inotify.max_user_watches)"
        )),
        Some(libc::EMFILE) => Error::ResourceExhausted(format!(
            "{path}: inotify instance limit reached (fs.inotify.max_user_instances)"
        )),
        // /proc is how the watch is pinned to the opened inode.
        Some(libc::ENOENT) => Error::Internal(format!(
            "{path}: cannot watch: /proc/self/fd is not available"
        )),
        _ => Error::io(err, path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_builds_paths_below_the_top() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
    }
}
