//! A spare stage 1: `sandhub __sandbox-init` started before the launch that
//! will use it, waiting on its sync socket for the sandbox's log and config.
//!
//! # Why
//! Two costs sat on every cold create's path, before any namespace existed
//! (issue #34 §4, `strace -T` of the hub):
//! - moving stage 1 into its cgroup: on cgroup v1 the first migration
//!   after a quiet spell waits for an RCU grace period, 5-19 ms here
//!   (the kernel's `cgroup_threadgroup_rwsem` taken for writing);
//! - exec'ing this binary: ~1 ms more than `/bin/true` (its relocations).
//!
//! A spare pays both ahead. On take, its cgroup (`.spare-<pid>-<n>`) is
//! renamed to the sandbox's and given the sandbox's limits before the
//! config is sent, so nothing of the sandbox ever runs outside its limits.
//! Where cgroups cannot be renamed (v2), the spare has no cgroup, and the
//! launch makes the sandbox's and moves stage 1 in, as before.
//!
//! # Life
//! One spare at most ([`Spares`]): a launch takes it (or starts one in
//! place when there is none or it died) and asks for the next in the
//! background. A spare runs only its own code: it reads nothing but its
//! socket, whose other end only the hub holds, and exits at EOF, so a hub
//! that dies leaves no spare running; the empty cgroup it leaves is
//! removed by the next hub's [`Backend::sweep_spares`].

use std::{
    io,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use super::{
    cgroup::{Backend, SandboxCgroup, SPARE_PREFIX},
    channel::Channel,
    init,
};

/// How long a discarded spare's processes may take to die.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// One started stage 1 and what belongs to it.
#[derive(Debug)]
pub(super) struct Spare {
    pub child: Child,
    pub chan: Channel,
    /// Its own cgroup (with it inside), where cgroups can be renamed.
    pub cgroup: Option<SandboxCgroup>,
}

impl Spare {
    /// Starts `exe __sandbox-init` (stdout and stderr on /dev/null until
    /// it gets the sandbox's log) and, where `cgroups` can rename, moves it
    /// into a new cgroup of its own.
    fn start(exe: &Path, cgroups: Option<&Backend>) -> io::Result<Spare> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let (chan, inside) = Channel::pair()?;
        let mut child = Command::new(exe)
            // argv[0] is visible inside (/proc/1/cmdline): no host path.
            .arg0("sandhub")
            .arg(init::SUBCOMMAND)
            .env_clear()
            .stdin(Stdio::from(inside))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let Some(backend) = cgroups.filter(|b| b.renames()) else {
            return Ok(Spare {
                child,
                chan,
                cgroup: None,
            });
        };
        let name = format!(
            "{SPARE_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let moved = backend.create_spare(&name).and_then(|cg| {
            if let Err(e) = cg.add(child.id() as i32) {
                let _ = cg.kill_and_remove(KILL_TIMEOUT);
                return Err(e);
            }
            Ok(cg)
        });
        match moved {
            Ok(cg) => Ok(Spare {
                child,
                chan,
                cgroup: Some(cg),
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills and reaps it, and removes its cgroup.
    fn discard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill_and_remove(KILL_TIMEOUT) {
                tracing::warn!(error = %e, "removing a spare's cgroup");
            }
        }
    }
}

/// The hub's spare, and its refill.
#[derive(Debug)]
pub(super) struct Spares {
    exe: PathBuf,
    cgroups: Option<Backend>,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    slot: Mutex<Option<Spare>>,
    refilling: AtomicBool,
    closed: AtomicBool,
}

impl Shared {
    fn put(&self, spare: Spare) {
        let old = {
            let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
            if self.closed.load(Ordering::Acquire) {
                Some(spare)
            } else {
                slot.replace(spare)
            }
        };
        if let Some(old) = old {
            old.discard();
        }
    }
}

impl Spares {
    pub fn new(exe: PathBuf, cgroups: Option<Backend>) -> Self {
        if let Some(b) = cgroups.as_ref().filter(|b| b.renames()) {
            b.sweep_spares();
        }
        Spares {
            exe,
            cgroups,
            shared: Arc::default(),
        }
    }

    /// The spare if one is ready and alive, else one started now; either
    /// way the next is then started in the background.
    pub fn take(&self) -> io::Result<Spare> {
        let ready = self
            .shared
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let spare = match ready {
            Some(mut s) => {
                if s.alive() {
                    Ok(s)
                } else {
                    s.discard();
                    Spare::start(&self.exe, self.cgroups.as_ref())
                }
            }
            None => Spare::start(&self.exe, self.cgroups.as_ref()),
        };
        self.refill();
        spare
    }

    /// The host pid of the spare waiting now, if any (tests, diagnostics).
    pub fn ready_pid(&self) -> Option<i32> {
        let slot = self.shared.slot.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().map(|s| s.child.id() as i32)
    }

    /// Starts a spare in the background unless one is being started.
    pub fn refill(&self) {
        if self.shared.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (exe, cgroups, shared) = (self.exe.clone(), self.cgroups.clone(), self.shared.clone());
        let spawned = std::thread::Builder::new()
            .name("sandhub-spare".into())
            .spawn(move || {
                match Spare::start(&exe, cgroups.as_ref()) {
                    Ok(spare) => shared.put(spare),
                    Err(e) => tracing::warn!(error = %e, "starting a spare sandbox init"),
                }
                shared.refilling.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting the spare's thread");
            self.shared.refilling.store(false, Ordering::Release);
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        let spare = self
            .shared
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(spare) = spare {
            spare.discard();
        }
    }
}
