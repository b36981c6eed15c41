//! `/workspace`: an overlay of the sandbox's own upper layer over its seed
//! layers. Reset swaps the upper layer for an empty one; snapshot copies
//! it; fork starts a new sandbox with the snapshot as its topmost lower
//! layer.
//!
//! Inside every sandbox the layers sit at fixed paths (bind mounts set up
//! by PID 1), so code running in the sandbox can remount the workspace
//! without knowing host paths:
//!
//! ```text
//! /.sandhub/layers/lower-0 .. lower-N   read-only, topmost first
//! /.sandhub/layers/empty                the lower layer when there is no seed
//! /.sandhub/overlay/upper               the sandbox's writes
//! /.sandhub/overlay/work                overlayfs scratch (same filesystem as upper)
//! /.sandhub/overlay/trash-*             upper layers dropped by reset, being deleted
//! ```
//!
//! On the host, `/.sandhub/overlay` is `<state_dir>/overlay`.

use std::{
    io,
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use super::error::annotate;

/// Where the layer directories are visible inside a sandbox.
pub const SANDHUB_DIR: &str = "/.sandhub";
pub const LAYERS_DIR: &str = "/.sandhub/layers";
pub const OVERLAY_DIR: &str = "/.sandhub/overlay";
pub const WORKSPACE: &str = "/workspace";

/// sandboxd is PID 1 of the sandbox: the namespace's init goes on as
/// sandboxd once it has built the root (`init.rs`). Reset spares it.
pub const SANDBOXD_PID: i32 = 1;

/// The directories that make up one sandbox's workspace overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceLayout {
    pub mount_point: PathBuf,
    /// Topmost first; never empty (an empty dir stands in for no seed).
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl WorkspaceLayout {
    /// The layout as seen inside a sandbox with `n_lowers` seed layers.
    pub fn inside(n_lowers: usize) -> Self {
        let layers = Path::new(LAYERS_DIR);
        let lowers = if n_lowers == 0 {
            vec![layers.join("empty")]
        } else {
            (0..n_lowers)
                .map(|i| layers.join(format!("lower-{i}")))
                .collect()
        };
        WorkspaceLayout {
            mount_point: PathBuf::from(WORKSPACE),
            lowers,
            upper: Path::new(OVERLAY_DIR).join("upper"),
            work: Path::new(OVERLAY_DIR).join("work"),
        }
    }

    /// Finds the layout from inside a running sandbox (for sandboxd's
    /// reset route): counts the `lower-N` directories.
    pub fn discover() -> io::Result<Self> {
        let mut n = 0;
        while Path::new(LAYERS_DIR).join(format!("lower-{n}")).is_dir() {
            n += 1;
        }
        if n == 0 && !Path::new(LAYERS_DIR).join("empty").is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{LAYERS_DIR} has no layers: not inside a sandhub sandbox"),
            ));
        }
        Ok(Self::inside(n))
    }

    /// overlayfs mount options. `userxattr`: the overlay is mounted inside
    /// a user namespace, where `trusted.*` xattrs (whiteout and opaque
    /// markers) cannot be written; without it deleting a seed directory
    /// fails with EIO.
    pub fn options(&self) -> String {
        let lowers: Vec<String> = self
            .lowers
            .iter()
            .map(|p| escape_option(&p.to_string_lossy()))
            .collect();
        format!(
            "lowerdir={},upperdir={},workdir={},userxattr",
            lowers.join(":"),
            escape_option(&self.upper.to_string_lossy()),
            escape_option(&self.work.to_string_lossy()),
        )
    }

    fn overlay_parent(&self) -> &Path {
        self.upper.parent().unwrap_or(Path::new(OVERLAY_DIR))
    }
}

/// overlayfs splits options on `,` and layers on `:`; both may be escaped.
fn escape_option(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, ',' | ':' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Mounts the overlay at `layout.mount_point`.
pub fn mount_workspace(layout: &WorkspaceLayout) -> io::Result<()> {
    use rustix::mount::{mount, MountFlags};
    let options = std::ffi::CString::new(layout.options())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in overlay options"))?;
    mount(
        "overlay",
        &layout.mount_point,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        options.as_c_str(),
    )
    .map_err(|e| {
        annotate(
            format!(
                "mounting overlay on {} ({})",
                layout.mount_point.display(),
                layout.options()
            ),
            e.into(),
        )
    })
}

static TRASH_SEQ: AtomicU64 = AtomicU64::new(0);

/// Gives the workspace its seed state back. Runs inside the sandbox, in a
/// process with CAP_SYS_ADMIN in the sandbox's user namespace (sandboxd).
///
/// 1. SIGKILLs every process of the sandbox except sandboxd (PID 1) and
///    the caller with its ancestors (their files would pin the old upper
///    layer and their next writes would land in a workspace that is gone);
/// 2. detaches the overlay;
/// 3. moves `upper` and `work` into a fresh `trash-*` directory (a rename:
///    O(1) whatever the upper layer holds) and creates empty ones with the
///    old upper root's owner and mode;
/// 4. mounts the overlay again;
/// 5. deletes the trash on a background thread.
///
/// Callers holding fds under the workspace (sandboxd's root) must reopen
/// them afterwards: they still point into the detached overlay.
pub fn reset_workspace(layout: &WorkspaceLayout) -> io::Result<()> {
    let trash = swap_layers(layout)?;
    let spawned = std::thread::Builder::new()
        .name("workspace-trash".into())
        .spawn(move || {
            if let Err(e) = std::fs::remove_dir_all(&trash) {
                tracing::warn!(trash = %trash.display(), error = %e, "deleting a dropped upper layer");
            }
        });
    if let Err(e) = spawned {
        // Out of pids, say: the reset itself is done; the next start of
        // the sandbox purges what is left (see `purge_trash`).
        tracing::warn!(error = %e, "cannot delete the dropped upper layer now");
    }
    Ok(())
}

/// Steps 1 to 4 of [`reset_workspace`]; returns the trash directory.
fn swap_layers(layout: &WorkspaceLayout) -> io::Result<PathBuf> {
    kill_workload()?;
    // Volumes below /workspace leave with the old overlay: keep a clone
    // of each to mount again on the new one.
    let volumes = super::volumes::clone_below(&layout.mount_point)?;
    let meta = std::fs::metadata(&layout.upper)
        .map_err(|e| annotate(format!("stat {}", layout.upper.display()), e))?;
    rustix::mount::unmount(&layout.mount_point, rustix::mount::UnmountFlags::DETACH).map_err(
        |e| {
            annotate(
                format!("unmounting {}", layout.mount_point.display()),
                e.into(),
            )
        },
    )?;
    let trash = layout.overlay_parent().join(format!(
        "trash-{}-{}",
        std::process::id(),
        TRASH_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let fresh_layers = || -> io::Result<()> {
        let step = |what: &str, r: io::Result<()>| r.map_err(|e| annotate(what, e));
        step("creating trash dir", std::fs::create_dir(&trash))?;
        step(
            "moving upper aside",
            std::fs::rename(&layout.upper, trash.join("upper")),
        )?;
        step(
            "moving work aside",
            std::fs::rename(&layout.work, trash.join("work")),
        )?;
        let mut b = std::fs::DirBuilder::new();
        b.mode(0o755);
        step("creating upper", b.create(&layout.upper))?;
        b.mode(0o700);
        step("creating work", b.create(&layout.work))?;
        // The upper root's owner and mode are /workspace's: keep them.
        step(
            "restoring upper owner",
            std::os::unix::fs::chown(&layout.upper, Some(meta.uid()), Some(meta.gid())),
        )?;
        step(
            "restoring upper mode",
            std::fs::set_permissions(
                &layout.upper,
                std::fs::Permissions::from_mode(meta.mode() & 0o7777),
            ),
        )
    };
    if let Err(e) = fresh_layers().and_then(|()| mount_workspace(layout)) {
        // Never leave the sandbox without a workspace: put back whatever
        // was moved and mount again (the old state, or an empty one).
        for (dir, name) in [(&layout.upper, "upper"), (&layout.work, "work")] {
            if !dir.exists() {
                let _ = std::fs::rename(trash.join(name), dir);
            }
        }
        let _ = mount_workspace(layout);
        remount(&volumes);
        return Err(e);
    }
    remount(&volumes);
    Ok(trash)
}

/// Attaches the volumes cloned before a reset; one that fails is logged
/// (the workspace itself is back either way).
fn remount(volumes: &[super::volumes::DetachedVolume]) {
    for v in volumes {
        if let Err(e) = v.attach() {
            tracing::error!(error = %e, "mounting a volume again after the reset");
        }
    }
}

/// SIGKILLs every process in this PID namespace but sandboxd (PID 1) and
/// the caller's own ancestry, until none is left (a process forking while
/// we scan is caught by the next pass).
fn kill_workload() -> io::Result<()> {
    let me = super::sys::getpid();
    let mut spared = vec![SANDBOXD_PID, me];
    // Ancestors inside the namespace (a helper run under sandboxd); the
    // chain ends at PID 1 or at a parent outside the namespace (ppid 0).
    let mut p = me;
    for _ in 0..64 {
        match super::procfs::stat(p) {
            Ok(st) if st.ppid > 1 => {
                spared.push(st.ppid);
                p = st.ppid;
            }
            _ => break,
        }
    }
    let mut signalled: Vec<i32> = Vec::new();
    for _pass in 0..1000 {
        let mut found = false;
        for pid in super::procfs::all_pids()? {
            if spared.contains(&pid) || signalled.contains(&pid) || !running(pid) {
                continue;
            }
            found = true;
            super::sys::kill(pid, libc::SIGKILL)?;
            signalled.push(pid);
        }
        if !found {
            wait_exited(&signalled);
            return Ok(());
        }
    }
    Err(io::Error::other(
        "processes keep appearing while resetting the workspace",
    ))
}

/// Whether `pid` exists and has not exited (a zombie has).
fn running(pid: i32) -> bool {
    super::procfs::stat(pid).is_ok_and(|st| st.is_running())
}

/// How long a reset waits for the processes it killed to exit.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Waits until each of `pids` has exited (gone, or a zombie its parent
/// has yet to reap). A SIGKILL is acted on only when its process next
/// runs, which on a busy machine can be after the reset would have
/// answered: a `ps` right after the reset then still listed the workload
/// (`reset_restores_the_seed_and_kills_processes` failed so in a CI run).
/// A process that outlasts [`EXIT_WAIT`] (stuck in the kernel) is logged,
/// and the reset goes on: it can never run its own code again.
fn wait_exited(pids: &[i32]) {
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|&p| running(p)).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(?left, "processes killed by a reset have not exited yet");
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Upper layers left behind by earlier resets (a reset whose background
/// deletion did not finish before the sandbox stopped), to delete with
/// [`purge_trash`].
pub fn trash(overlay_dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(overlay_dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with("trash-") {
            found.push(entry.path());
        }
    }
    Ok(found)
}

/// Deletes what [`trash`] found.
pub fn purge_trash(trash: &[PathBuf]) -> io::Result<()> {
    for dir in trash {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_paths_and_options() {
        let l = WorkspaceLayout::inside(2);
        assert_eq!(
            l.options(),
            "lowerdir=/.sandhub/layers/lower-0:/.sandhub/layers/lower-1,\
             upperdir=/.sandhub/overlay/upper,workdir=/.sandhub/overlay/work,userxattr"
        );
        let empty = WorkspaceLayout::inside(0);
        assert_eq!(empty.lowers, vec![PathBuf::from("/.sandhub/layers/empty")]);
        assert_eq!(escape_option("/a,b:c"), "/a\\,b\\:c");
    }
}
