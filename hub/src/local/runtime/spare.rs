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
//! One spare at most ([`Spares`]): a launch takes it (waits for the one
//! being started, or starts one in place when there is none or it died)
//! and asks for the next in the background. (Asking only once the launch
//! was over, so that the next spare's exec would not compete with it for
//! the CPU, measured 1.02×: no gain, not kept.) A spare runs only its own code: it reads nothing but its
//! socket, whose other end only the hub holds, and exits at EOF, so a hub
//! that dies leaves no spare running; the empty cgroup it leaves is
//! removed by the next hub's [`Backend::sweep_spares`].

use std::{
    io,
    os::{fd::BorrowedFd, unix::process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    time::Duration,
};

use super::{
    cgroup::{Backend, SandboxCgroup, SPARE_PREFIX},
    channel::{Channel, Msg},
    init,
};

/// How long a discarded spare's processes may take to die.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a launch waits for a spare being started before it starts
/// one itself: more than a spare takes (an exec and a cgroup move, whose
/// RCU grace period measured up to 19 ms), less than a stuck one.
const REFILL_WAIT: Duration = Duration::from_millis(100);

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
    /// it gets the sandbox's log), sends it sandboxd's `log_filter` (so it
    /// sets up sandboxd's logging while it waits) and, where `cgroups` can
    /// rename, moves it into a new cgroup of its own.
    fn start(exe: &Path, cgroups: Option<&Backend>, log_filter: &str) -> io::Result<Spare> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let (chan, inside) = Channel::pair()?;
        let child = Command::new(exe)
            // argv[0] is visible inside (/proc/1/cmdline): no host path.
            .arg0("sandhub")
            .arg(init::SUBCOMMAND)
            .env_clear()
            .stdin(Stdio::from(inside))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id() as i32;
        let mut spare = Spare {
            child,
            chan,
            cgroup: None,
        };
        if let Err(e) = spare.chan.send(&Msg::LogFilter(log_filter.to_string())) {
            spare.discard();
            return Err(e);
        }
        let Some(backend) = cgroups.filter(|b| b.renames()) else {
            return Ok(spare);
        };
        let name = format!(
            "{SPARE_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let moved = backend.create_spare(&name).and_then(|cg| {
            let added = cg.add(pid);
            spare.cgroup = Some(cg);
            added
        });
        match moved {
            Ok(()) => Ok(spare),
            Err(e) => {
                spare.discard();
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
    /// sandboxd's `tracing` filter, the same for every sandbox.
    log_filter: Arc<str>,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when a refill ends, with a spare or without.
    refilled: Condvar,
}

#[derive(Debug, Default)]
struct State {
    spare: Option<Spare>,
    refilling: bool,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends a refill: keeps `spare` unless the hub let go of its spares.
    fn refilled(&self, spare: Option<Spare>) {
        let unwanted = {
            let mut state = self.lock();
            state.refilling = false;
            match spare {
                Some(s) if !state.closed => state.spare.replace(s),
                other => other,
            }
        };
        self.refilled.notify_all();
        if let Some(s) = unwanted {
            s.discard();
        }
    }
}

impl Spares {
    pub fn new(exe: PathBuf, cgroups: Option<Backend>, log_filter: &str) -> Self {
        if let Some(b) = cgroups.as_ref().filter(|b| b.renames()) {
            b.sweep_spares();
        }
        Spares {
            exe,
            cgroups,
            log_filter: log_filter.into(),
            shared: Arc::default(),
        }
    }

    /// The spare if one is ready and alive (waiting for one being started
    /// rather than starting a second), else one started now, handed the
    /// sandbox's `log`; the next is then started in the background. A
    /// spare that died after the check (its socket is closed) is replaced
    /// once.
    pub fn take(&self, log: BorrowedFd<'_>) -> io::Result<Spare> {
        let spare = self.ready_or_new();
        self.refill();
        let spare = spare?;
        if spare.chan.send_log(log).is_ok() {
            return Ok(spare);
        }
        spare.discard();
        let fresh = self.start()?;
        match fresh.chan.send_log(log) {
            Ok(()) => Ok(fresh),
            Err(e) => {
                fresh.discard();
                Err(e)
            }
        }
    }

    fn ready_or_new(&self) -> io::Result<Spare> {
        let ready = {
            let state = self.shared.lock();
            let (mut state, _) = self
                .shared
                .refilled
                .wait_timeout_while(state, REFILL_WAIT, |s| s.spare.is_none() && s.refilling)
                .unwrap_or_else(|p| p.into_inner());
            state.spare.take()
        };
        if let Some(mut s) = ready {
            if s.alive() {
                return Ok(s);
            }
            s.discard();
        }
        self.start()
    }

    /// A spare started in place, on the calling thread.
    fn start(&self) -> io::Result<Spare> {
        Spare::start(&self.exe, self.cgroups.as_ref(), &self.log_filter)
    }

    /// The host pid of the spare waiting now, if any (tests, diagnostics).
    pub fn ready_pid(&self) -> Option<i32> {
        self.shared
            .lock()
            .spare
            .as_ref()
            .map(|s| s.child.id() as i32)
    }

    /// Starts a spare in the background unless one is ready or being
    /// started.
    pub fn refill(&self) {
        {
            let mut state = self.shared.lock();
            if state.spare.is_some() || state.refilling || state.closed {
                return;
            }
            state.refilling = true;
        }
        let (exe, cgroups, log_filter, shared) = (
            self.exe.clone(),
            self.cgroups.clone(),
            self.log_filter.clone(),
            self.shared.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("sandhub-spare".into())
            .spawn(move || {
                let spare = Spare::start(&exe, cgroups.as_ref(), &log_filter)
                    .inspect_err(|e| tracing::warn!(error = %e, "starting a spare sandbox init"))
                    .ok();
                shared.refilled(spare);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting the spare's thread");
            self.shared.refilled(None);
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        let spare = {
            let mut state = self.shared.lock();
            state.closed = true;
            state.spare.take()
        };
        if let Some(spare) = spare {
            spare.discard();
        }
    }
}
