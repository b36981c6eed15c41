//! Per-sandbox cgroups: `<mount>/sandhub/<sandbox-id>` on cgroup v2, or the
//! same path under each of the v1 `memory`, `pids` and `cpu` hierarchies.
//!
//! v2 is preferred when its hierarchy offers all three controllers; hybrid
//! hosts whose v2 mount has none (controllers bound to v1) use v1.

use std::{
    fmt::Write as _,
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

use super::error::annotate;

const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
const PARENT: &str = "sandhub";
/// Cgroups under the parent whose name starts so are spares' (see
/// `spare.rs`), never a sandbox's: sandbox ids cannot start with a dot.
pub(crate) const SPARE_PREFIX: &str = ".spare-";
/// The CFS period quotas are expressed against (the kernel default).
const CPU_PERIOD_US: u64 = 100_000;

/// Resource limits of one sandbox; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Limits {
    pub cpu: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.cpu.is_some() || self.memory_mb.is_some() || self.pids.is_some()
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// `base` = `<cgroup2 mount>/sandhub` (or under the delegated cgroup).
    V2 { base: PathBuf },
    /// `<mount of each controller>/sandhub`.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        /// `cpuacct` (CPU time used, for the usage sampler) where it is a
        /// hierarchy of its own; None where it is co-mounted with `cpu`
        /// (or absent).
        cpuacct: Option<PathBuf>,
        /// `freezer` (pause) where it is mounted; None: no pause.
        freezer: Option<PathBuf>,
    },
}

/// What [`detect`] found, per cgroup version, for the probe's report.
#[derive(Debug, Clone)]
pub(crate) struct Findings {
    pub v1: Result<(), String>,
    pub v2: Result<(), String>,
}

struct Mount {
    point: PathBuf,
    fstype: String,
    super_opts: String,
}

fn mounts() -> io::Result<Vec<Mount>> {
    let raw = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in raw.lines() {
        // id parent major:minor root mountpoint opts [optional...] - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        let mut r = right.split(' ');
        let (Some(fstype), Some(_source), Some(super_opts)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        out.push(Mount {
            point: PathBuf::from(unescape_mountinfo(point)),
            fstype: fstype.to_string(),
            super_opts: super_opts.to_string(),
        });
    }
    Ok(out)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Finds a usable hierarchy and prepares its `sandhub` parent (creating it,
/// enabling v2 controllers for its children). Returns the backend, or why
/// neither version works.
pub(crate) fn detect() -> (Option<Backend>, Findings) {
    let mounts = match mounts() {
        Ok(m) => m,
        Err(e) => {
            let msg = format!("reading /proc/self/mountinfo: {e}");
            return (
                None,
                Findings {
                    v1: Err(msg.clone()),
                    v2: Err(msg),
                },
            );
        }
    };
    let v2 = detect_v2(&mounts);
    if let Ok(backend) = &v2 {
        let findings = Findings {
            v1: detect_v1(&mounts, false).map(|_| ()),
            v2: Ok(()),
        };
        return (Some(backend.clone()), findings);
    }
    let v1 = detect_v1(&mounts, true);
    let findings = Findings {
        v1: v1.as_ref().map(|_| ()).map_err(Clone::clone),
        v2: v2.map(|_| ()),
    };
    (v1.ok(), findings)
}

fn detect_v2(mounts: &[Mount]) -> Result<Backend, String> {
    let Some(mount) = mounts.iter().find(|m| m.fstype == "cgroup2") else {
        return Err("no cgroup2 filesystem is mounted".into());
    };
    let (uid, _) = super::sys::effective_ids();
    // As root the whole hierarchy is ours; otherwise only a cgroup
    // delegated to us (our own, e.g. a systemd user service with
    // Delegate=yes) can hold the sandboxes.
    let parent = if uid == 0 {
        mount.point.clone()
    } else {
        let own = own_v2_cgroup().map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
        mount.point.join(own.trim_start_matches('/'))
    };
    let available = std::fs::read_to_string(parent.join("cgroup.controllers"))
        .map_err(|e| format!("reading {}/cgroup.controllers: {e}", parent.display()))?;
    let available: Vec<&str> = available.split_whitespace().collect();
    let missing: Vec<&str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !available.contains(c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "cgroup v2 at {} offers controllers [{}], missing {} (they are bound to v1 \
             hierarchies or not delegated)",
            parent.display(),
            available.join(" "),
            missing.join(", ")
        ));
    }
    let enable = "+memory +pids +cpu";
    let base = parent.join(PARENT);
    let setup = || -> io::Result<()> {
        write(&parent.join("cgroup.subtree_control"), enable)?;
        mkdir_ok(&base)?;
        write(&base.join("cgroup.subtree_control"), enable)
    };
    setup().map_err(|e| {
        let hint = if uid == 0 {
            "the cgroup may hold processes itself (a container's root cgroup); \
             run the hub from a host cgroup or pass --allow-no-cgroup-limits"
        } else {
            "the cgroup is not delegated to this user, or this process sits in it \
             (cgroup v2 allows controllers only for cgroups without processes); \
             run as root, start the hub in a delegated cgroup \
             (systemd-run --user -p Delegate=yes), or pass --allow-no-cgroup-limits"
        };
        format!(
            "cgroup v2 memory/pids/cpu controllers cannot be delegated at {}: {e}; {hint}",
            base.display()
        )
    })?;
    Ok(Backend::V2 { base })
}

/// What all sandboxes together may use on a machine of `mem_kib`: its
/// memory less a reserve for the hub and the host (1/8, at least 1 GiB),
/// and 3/4 of the processes the kernel can number (`pid_max` and
/// `threads-max`), so a fork bomb in every sandbox still leaves the host
/// room to run.
pub(crate) fn host_caps(mem_kib: u64) -> (u64, u64) {
    let bytes = mem_kib.saturating_mul(1024);
    let reserve = (bytes / 8).max(1 << 30);
    let memory = bytes.saturating_sub(reserve).max(bytes / 2);
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let tasks = [
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(32768);
    (memory, (tasks / 4 * 3).max(1024))
}

fn own_v2_cgroup() -> io::Result<String> {
    let raw = std::fs::read_to_string("/proc/self/cgroup")?;
    raw.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup v2 entry"))
}

fn detect_v1(mounts: &[Mount], create: bool) -> Result<Backend, String> {
    let find = |controller: &str| {
        mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == controller))
            .map(|m| m.point.join(PARENT))
    };
    let (memory, pids, cpu) = (find("memory"), find("pids"), find("cpu"));
    let missing: Vec<&str> = CONTROLLERS
        .iter()
        .zip([&memory, &pids, &cpu])
        .filter(|(_, p)| p.is_none())
        .map(|(c, _)| *c)
        .collect();
    let (Some(memory), Some(pids), Some(cpu)) = (memory, pids, cpu) else {
        return Err(format!(
            "cgroup v1 has no {} controller mounted",
            missing.join(", ")
        ));
    };
    // A best-effort controller: used where mounted (and, when creating,
    // where its parent could be made), else done without.
    let optional = |dir: Option<PathBuf>| match (dir, create) {
        (Some(d), true) => mkdir_ok(&d).is_ok().then_some(d),
        (dir, _) => dir,
    };
    // CPU accounting rides along where it is its own hierarchy (only the
    // usage sampler reads it).
    let cpuacct = optional(find("cpuacct").filter(|d| *d != cpu));
    // The freezer too (only pause needs it), co-mounted with another
    // controller or not (`dirs` lists a directory once).
    let freezer = optional(find("freezer"));
    if create {
        for dir in [&memory, &pids, &cpu] {
            mkdir_ok(dir).map_err(|e| {
                format!(
                    "cgroup v1: cannot create {}: {e} (creating cgroups needs root)",
                    dir.display()
                )
            })?;
        }
    }
    Ok(Backend::V1 {
        memory,
        pids,
        cpu,
        cpuacct,
        freezer,
    })
}

impl Backend {
    /// Bounds every sandbox together (the `sandhub` parent cgroup): memory
    /// at `memory_bytes`, processes and threads at `pids`. Sandboxes' own
    /// limits are ceilings that may add up past the machine (see the
    /// tenant quotas); this one is what keeps the hub and the host alive
    /// when they are all reached at once: the kernel then reclaims and
    /// OOM-kills inside the sandboxes, never outside them.
    pub fn cap_all(&self, memory_bytes: u64, pids: u64) -> io::Result<()> {
        match self {
            Backend::V2 { base } => {
                write(&base.join("memory.max"), &memory_bytes.to_string())?;
                write(&base.join("pids.max"), &pids.to_string())
            }
            Backend::V1 {
                memory, pids: p, ..
            } => {
                write(
                    &memory.join("memory.limit_in_bytes"),
                    &memory_bytes.to_string(),
                )?;
                write(&p.join("pids.max"), &pids.to_string())
            }
        }
    }

    /// The cgroup of sandbox `id` (existing or not).
    pub fn sandbox(&self, id: &str) -> SandboxCgroup {
        match self {
            Backend::V2 { base } => SandboxCgroup::V2(base.join(id)),
            Backend::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => SandboxCgroup::V1 {
                memory: memory.join(id),
                pids: pids.join(id),
                cpu: cpu.join(id),
                cpuacct: cpuacct.as_ref().map(|d| d.join(id)),
                freezer: freezer.as_ref().map(|d| d.join(id)),
            },
        }
    }

    /// Creates (or reuses an empty) cgroup for `id` and applies `limits`,
    /// writing "unlimited" for the ones not given so a reused cgroup keeps
    /// nothing from an earlier run.
    pub fn create(&self, id: &str, limits: &Limits) -> Result<SandboxCgroup, CreateError> {
        let cg = self.sandbox(id);
        for dir in cg.dirs() {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !procs_in(&dir)?.is_empty() {
                        return Err(CreateError::Busy(dir));
                    }
                }
                Err(e) => {
                    return Err(annotate(format!("creating cgroup {}", dir.display()), e).into())
                }
            }
        }
        cg.apply(limits)?;
        Ok(cg)
    }
}

impl Backend {
    /// Whether a cgroup keeps its processes and counters across a
    /// rename(2), which is how a spare's cgroup becomes a sandbox's. Only
    /// v1 allows it (v2 refuses to rename cgroups).
    pub fn renames(&self) -> bool {
        matches!(self, Backend::V1 { .. })
    }

    /// Creates the empty cgroup `name` (a spare's, [`SPARE_PREFIX`]) with
    /// no limits of its own: the parent's caps bound it, and it gets the
    /// sandbox's limits when it is renamed to one ([`SandboxCgroup::rename_to`]).
    pub fn create_spare(&self, name: &str) -> io::Result<SandboxCgroup> {
        let cg = self.sandbox(name);
        let mut made: Vec<PathBuf> = Vec::new();
        for dir in cg.dirs() {
            if let Err(e) = std::fs::create_dir(&dir) {
                for d in made.iter().rev() {
                    let _ = std::fs::remove_dir(d);
                }
                return Err(annotate(format!("creating cgroup {}", dir.display()), e));
            }
            made.push(dir);
        }
        Ok(cg)
    }

    /// Removes the spare cgroups (`.spare-<hub pid>-<n>`) of hubs that are
    /// gone. Only a dead hub's: another hub on this host may have made its
    /// spare's cgroup and not yet moved the spare in. The kernel refuses to
    /// remove a cgroup that still has processes, so none is lost here.
    pub fn sweep_spares(&self) {
        let hub_gone = |name: &str| {
            let pid = name
                .strip_prefix(SPARE_PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<i32>().ok())
                .and_then(Pid::from_raw);
            pid.is_some_and(|p| {
                rustix::process::test_kill_process(p) == Err(rustix::io::Errno::SRCH)
            })
        };
        for parent in self.sandbox("").dirs() {
            let Ok(entries) = std::fs::read_dir(&parent) else {
                continue;
            };
            for entry in entries.flatten() {
                if hub_gone(&entry.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum CreateError {
    /// The cgroup exists and still has processes: the sandbox is running.
    Busy(PathBuf),
    Io(io::Error),
}

impl From<io::Error> for CreateError {
    fn from(e: io::Error) -> Self {
        CreateError::Io(e)
    }
}

#[derive(Debug, Clone)]
pub(crate) enum SandboxCgroup {
    V2(PathBuf),
    /// One directory per controller; two or all may coincide when
    /// controllers are co-mounted.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        cpuacct: Option<PathBuf>,
        freezer: Option<PathBuf>,
    },
}

/// Whether a sandbox's cgroup is frozen (`pause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freeze {
    Thawed,
    /// Asked to freeze, not every task is frozen yet.
    Freezing,
    Frozen,
}

impl SandboxCgroup {
    /// Every distinct directory, memory's first.
    pub fn dirs(&self) -> Vec<PathBuf> {
        match self {
            SandboxCgroup::V2(dir) => vec![dir.clone()],
            SandboxCgroup::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                let mut dirs: Vec<PathBuf> = Vec::with_capacity(5);
                for d in [
                    Some(memory),
                    Some(pids),
                    Some(cpu),
                    cpuacct.as_ref(),
                    freezer.as_ref(),
                ]
                .into_iter()
                .flatten()
                {
                    if !dirs.contains(d) {
                        dirs.push(d.clone());
                    }
                }
                dirs
            }
        }
    }

    /// How many processes the kernel's OOM killer has killed in this
    /// cgroup (its descendants too). The counter is the kernel's: nothing in
    /// the sandbox can write it. v1 kernels before 4.13 have no count (0).
    pub fn oom_kills(&self) -> io::Result<u64> {
        let (file, key) = match self {
            SandboxCgroup::V2(_) => ("memory.events", "oom_kill"),
            SandboxCgroup::V1 { .. } => ("memory.oom_control", "oom_kill"),
        };
        let text = std::fs::read_to_string(self.file(file))?;
        Ok(counter(&text, key).unwrap_or(0))
    }

    fn file(&self, controller_file: &str) -> PathBuf {
        match self {
            SandboxCgroup::V2(dir) => dir.join(controller_file),
            SandboxCgroup::V1 {
                memory, pids, cpu, ..
            } => {
                let dir = match controller_file.split('.').next() {
                    Some("pids") => pids,
                    Some("cpu") => cpu,
                    _ => memory,
                };
                dir.join(controller_file)
            }
        }
    }

    /// Renames this cgroup (a spare's) to sandbox `id`'s in every
    /// hierarchy, processes and all ([`Backend::renames`]). An empty cgroup
    /// already there (left by an earlier run of the sandbox) is replaced;
    /// one with processes is [`CreateError::Busy`]. On failure, what was
    /// renamed is renamed back.
    pub fn rename_to(&self, backend: &Backend, id: &str) -> Result<SandboxCgroup, CreateError> {
        let target = backend.sandbox(id);
        let (from, to) = (self.dirs(), target.dirs());
        debug_assert_eq!(from.len(), to.len());
        let rename = |f: &Path, t: &Path| {
            std::fs::rename(f, t).map_err(|e| {
                annotate(
                    format!("renaming cgroup {} to {}", f.display(), t.display()),
                    e,
                )
            })
        };
        let one = |f: &Path, t: &Path| -> Result<(), CreateError> {
            match rename(f, t) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
                    ) =>
                {
                    if !procs_in(t)?.is_empty() {
                        return Err(CreateError::Busy(t.to_path_buf()));
                    }
                    std::fs::remove_dir(t)
                        .map_err(|e| annotate(format!("removing cgroup {}", t.display()), e))?;
                    Ok(rename(f, t)?)
                }
                other => Ok(other?),
            }
        };
        for (i, (f, t)) in from.iter().zip(&to).enumerate() {
            if let Err(e) = one(f, t) {
                for (f, t) in from.iter().zip(&to).take(i).rev() {
                    let _ = std::fs::rename(t, f);
                }
                return Err(e);
            }
        }
        Ok(target)
    }

    /// Writes `limits`, "unlimited" for the ones not given.
    pub fn apply(&self, limits: &Limits) -> io::Result<()> {
        let mem = limits.memory_mb.map(|mb| mb.saturating_mul(1 << 20));
        let pids = limits
            .pids
            .map_or_else(|| "max".to_string(), |p| p.to_string());
        let quota = limits
            .cpu
            .map(|c| ((c * CPU_PERIOD_US as f64).round() as u64).max(1000));
        if let SandboxCgroup::V2(d) = self {
            write(
                &d.join("memory.max"),
                &mem.map_or("max".into(), |m| m.to_string()),
            )?;
            // Swap would let a hog outlive its memory limit.
            let swap = d.join("memory.swap.max");
            if swap.exists() {
                write(&swap, if mem.is_some() { "0" } else { "max" })?;
            }
            write(&d.join("pids.max"), &pids)?;
            let cpu = match quota {
                Some(q) => format!("{q} {CPU_PERIOD_US}"),
                None => format!("max {CPU_PERIOD_US}"),
            };
            write(&d.join("cpu.max"), &cpu)?;
        } else {
            let limit = mem.map_or("-1".into(), |m| m.to_string());
            let memsw = Some(self.file("memory.memsw.limit_in_bytes")).filter(|p| p.exists());
            // memsw must stay >= limit_in_bytes: order the writes so each
            // one is valid whether the limit grows or shrinks.
            if let Some(memsw) = &memsw {
                if mem.is_none() {
                    write(memsw, "-1")?;
                }
            }
            write(&self.file("memory.limit_in_bytes"), &limit)?;
            if let (Some(memsw), Some(_)) = (&memsw, mem) {
                // Best effort: swap accounting may be off (swapaccount=0).
                let _ = write(memsw, &limit);
            }
            write(&self.file("pids.max"), &pids)?;
            write(&self.file("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write(
                &self.file("cpu.cfs_quota_us"),
                &quota.map_or("-1".into(), |q| q.to_string()),
            )?;
        }
        Ok(())
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: i32) -> io::Result<()> {
        for dir in self.dirs() {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Host pids of every process in the cgroup.
    pub fn procs(&self) -> io::Result<Vec<i32>> {
        let mut all = Vec::new();
        for dir in self.dirs() {
            for pid in procs_in(&dir)? {
                if !all.contains(&pid) {
                    all.push(pid);
                }
            }
        }
        Ok(all)
    }

    /// The freezer's directory and whether it is v2's (`cgroup.freeze`);
    /// None: this host cannot freeze (a v1 host without `freezer`).
    fn freezer(&self) -> Option<(&Path, bool)> {
        match self {
            SandboxCgroup::V2(dir) => Some((dir, true)),
            SandboxCgroup::V1 { freezer, .. } => freezer.as_deref().map(|d| (d, false)),
        }
    }

    /// Whether this cgroup can be frozen at all.
    pub fn can_freeze(&self) -> bool {
        self.freezer().is_some()
    }

    /// The freezer's state now (Thawed where there is none).
    pub fn freeze_state(&self) -> io::Result<Freeze> {
        Ok(match self.freezer() {
            None => Freeze::Thawed,
            Some((dir, true)) => {
                let asked = std::fs::read_to_string(dir.join("cgroup.freeze"))?;
                let events = std::fs::read_to_string(dir.join("cgroup.events"))?;
                match (asked.trim() == "1", counter(&events, "frozen") == Some(1)) {
                    (true, true) => Freeze::Frozen,
                    (true, false) => Freeze::Freezing,
                    // Thawing (or thawed): it runs, or is about to.
                    (false, _) => Freeze::Thawed,
                }
            }
            Some((dir, false)) => {
                match std::fs::read_to_string(dir.join("freezer.state"))?.trim() {
                    "FROZEN" => Freeze::Frozen,
                    "FREEZING" => Freeze::Freezing,
                    _ => Freeze::Thawed,
                }
            }
        })
    }

    /// Freezes every process of the cgroup (they keep their memory, open
    /// files and sockets, and get no CPU) and waits until the kernel says
    /// all are frozen, at most `timeout`; false when they were not (the
    /// cgroup is then left thawed). Unsupported without a freezer.
    pub fn freeze(&self, timeout: Duration) -> io::Result<bool> {
        let Some((dir, v2)) = self.freezer() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this host's cgroup v1 has no freezer controller mounted",
            ));
        };
        if !v2 {
            // A process the v1 freezer cgroup missed (a sandbox started by
            // a hub before it knew of the freezer) joins it now.
            self.gather_into(dir)?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            if v2 {
                write(&dir.join("cgroup.freeze"), "1")?;
            } else {
                // v1 re-walks the tasks on every write of FROZEN.
                write(&dir.join("freezer.state"), "FROZEN")?;
            }
            if self.freeze_state()? == Freeze::Frozen {
                if !v2 && self.gather_into(dir)? {
                    // One forked while freezing: freeze again.
                    continue;
                }
                return Ok(true);
            }
            if Instant::now() >= deadline {
                let _ = self.thaw();
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// v1: moves every process of the sandbox that is not in the freezer
    /// cgroup `dir` into it; whether there was one.
    fn gather_into(&self, dir: &Path) -> io::Result<bool> {
        let SandboxCgroup::V1 { memory, .. } = self else {
            return Ok(false);
        };
        mkdir_ok(dir)?;
        let inside = procs_in(dir)?;
        let mut moved = false;
        for pid in procs_in(memory)? {
            if !inside.contains(&pid) {
                // One that exited meanwhile is no error.
                if write(&dir.join("cgroup.procs"), &pid.to_string()).is_ok() {
                    moved = true;
                }
            }
        }
        Ok(moved)
    }

    /// Thaws the cgroup: its processes run on where they stopped.
    /// Nothing to do where it was not frozen (or cannot be).
    pub fn thaw(&self) -> io::Result<()> {
        let Some((dir, v2)) = self.freezer() else {
            return Ok(());
        };
        if !dir.exists() {
            return Ok(());
        }
        if v2 {
            write(&dir.join("cgroup.freeze"), "0")
        } else {
            write(&dir.join("freezer.state"), "THAWED")
        }
    }

    /// SIGKILLs every process in the cgroup until it is empty, then removes
    /// it. Safe against pid reuse: each pid is pinned with a pidfd and only
    /// signalled if it is still listed in the cgroup after pinning.
    pub fn kill_and_remove(&self, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        if let SandboxCgroup::V2(dir) = self {
            let kill = dir.join("cgroup.kill");
            if kill.exists() {
                let _ = write(&kill, "1");
            }
        }
        loop {
            let listed = self.procs()?;
            if listed.is_empty() && self.try_rmdir()? {
                return Ok(true);
            }
            let pinned: Vec<(i32, OwnedFd)> = listed
                .iter()
                .filter_map(|&pid| {
                    let fd = pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
                    Some((pid, fd))
                })
                .collect();
            let still = self.procs()?;
            for (pid, fd) in &pinned {
                if still.contains(pid) {
                    let _ = pidfd_send_signal(fd, Signal::KILL);
                }
            }
            // A paused sandbox: v1 keeps killed tasks frozen until thawed
            // (v2 lets a fatal signal through). Thawed after the signals,
            // they die before running another instruction of their own.
            if !listed.is_empty() {
                let _ = self.thaw();
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Removes every directory; false while one is still busy.
    fn try_rmdir(&self) -> io::Result<bool> {
        for dir in self.dirs() {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(false),
                Err(e) => return Err(annotate(format!("removing {}", dir.display()), e)),
            }
        }
        Ok(true)
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn procs_in(dir: &Path) -> io::Result<Vec<i32>> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(raw) => Ok(raw.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| annotate(format!("writing {value:?} to {}", path.display()), e))
}

fn mkdir_ok(dir: &Path) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// One line per version for the probe and for error messages.
pub(crate) fn describe(findings: &Findings) -> String {
    let mut s = String::new();
    match &findings.v2 {
        Ok(()) => s.push_str("cgroup v2: usable"),
        Err(e) => {
            let _ = write!(s, "{e}");
        }
    }
    s.push_str("; ");
    match &findings.v1 {
        Ok(()) => s.push_str("cgroup v1: usable"),
        Err(e) => {
            let _ = write!(s, "{e}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_sandboxes_together_leave_the_host_room() {
        let (memory, pids) = host_caps(24 << 20);
        assert_eq!(memory, 21 << 30, "24 GiB less 1/8");
        let (small, _) = host_caps(4 << 20);
        assert_eq!(small, 3 << 30, "4 GiB less the 1 GiB floor");
        let (tiny, _) = host_caps(1 << 20);
        assert_eq!(tiny, 512 << 20, "never below half");
        assert!(pids >= 1024);
    }

    #[test]
    fn reads_flat_keyed_counters() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(counter(events, "oom_kill"), Some(2));
        assert_eq!(counter(events, "oom"), Some(3));
        assert_eq!(
            counter("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"),
            None
        );
    }

    #[test]
    fn reads_the_freezer_of_either_version() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = SandboxCgroup::V2(dir.path().to_path_buf());
        let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        put("cgroup.freeze", "0\n");
        put("cgroup.events", "populated 1\nfrozen 0\n");
        assert_eq!(v2.freeze_state().unwrap(), Freeze::Thawed);
        put("cgroup.freeze", "1\n");
        assert_eq!(v2.freeze_state().unwrap(), Freeze::Freezing);
        put("cgroup.events", "populated 1\nfrozen 1\n");
        assert_eq!(v2.freeze_state().unwrap(), Freeze::Frozen);
        assert!(v2.can_freeze());

        let v1 = |freezer: Option<PathBuf>| SandboxCgroup::V1 {
            memory: dir.path().join("m"),
            pids: dir.path().join("p"),
            cpu: dir.path().join("c"),
            cpuacct: None,
            freezer,
        };
        let none = v1(None);
        assert!(!none.can_freeze());
        assert_eq!(none.freeze_state().unwrap(), Freeze::Thawed);
        assert_eq!(
            none.freeze(Duration::from_millis(1)).unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
        none.thaw().unwrap();
        let with = v1(Some(dir.path().to_path_buf()));
        for (text, state) in [
            ("THAWED\n", Freeze::Thawed),
            ("FREEZING\n", Freeze::Freezing),
            ("FROZEN\n", Freeze::Frozen),
        ] {
            put("freezer.state", text);
            assert_eq!(with.freeze_state().unwrap(), state, "{text}");
        }
        assert_eq!(with.dirs().len(), 4, "the freezer is one of its dirs");
    }

    /// A real process in a real cgroup v2 (root, and a `cgroup2` mount
    /// with `cgroup.freeze`, which needs no controller; skipped elsewhere):
    /// frozen, thawed, frozen again and killed frozen.
    #[test]
    fn v2_freezes_thaws_and_kills_a_frozen_process() {
        let Some(mount) = mounts()
            .ok()
            .and_then(|m| m.into_iter().find(|m| m.fstype == "cgroup2"))
        else {
            eprintln!("skipped: no cgroup2 mount");
            return;
        };
        let dir = mount
            .point
            .join(format!("sandhub-freeze-test-{}", std::process::id()));
        if std::fs::create_dir(&dir).is_err() || !dir.join("cgroup.freeze").exists() {
            let _ = std::fs::remove_dir(&dir);
            eprintln!(
                "skipped: cannot make a freezable cgroup under {}",
                mount.point.display()
            );
            return;
        }
        let cg = SandboxCgroup::V2(dir.clone());
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let stat =
            |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if cg.add(child.id() as i32).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir(&dir);
            eprintln!("skipped: cannot move a process into {}", dir.display());
            return;
        }
        assert!(cg.freeze(Duration::from_secs(5)).unwrap());
        assert_eq!(cg.freeze_state().unwrap(), Freeze::Frozen);
        cg.thaw().unwrap();
        assert_eq!(cg.freeze_state().unwrap(), Freeze::Thawed);
        assert!(cg.freeze(Duration::from_secs(5)).unwrap());
        assert!(!stat(child.id()).is_empty());
        // Killed while frozen: it dies, and the cgroup goes.
        assert!(cg.kill_and_remove(Duration::from_secs(5)).unwrap());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(!dir.exists());
    }

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/end\\"), "/end\\");
    }

    #[test]
    fn v1_dirs_cover_each_controller_once() {
        let b = Backend::V1 {
            memory: "/sys/fs/cgroup/memory/sandhub".into(),
            pids: "/sys/fs/cgroup/pids/sandhub".into(),
            cpu: "/sys/fs/cgroup/cpu,cpuacct/sandhub".into(),
            cpuacct: None,
            freezer: None,
        };
        let cg = b.sandbox("s1");
        assert_eq!(cg.dirs().len(), 3);
        assert_eq!(
            cg.file("cpu.cfs_quota_us"),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/sandhub/s1/cpu.cfs_quota_us")
        );
        assert_eq!(
            cg.file("memory.limit_in_bytes"),
            PathBuf::from("/sys/fs/cgroup/memory/sandhub/s1/memory.limit_in_bytes")
        );
        let co = Backend::V1 {
            memory: "/cg/all/sandhub".into(),
            pids: "/cg/all/sandhub".into(),
            cpu: "/cg/cpu/sandhub".into(),
            cpuacct: Some("/cg/cpuacct/sandhub".into()),
            freezer: Some("/cg/freezer/sandhub".into()),
        };
        assert_eq!(
            co.sandbox("s1").dirs().len(),
            4,
            "cpuacct and freezer of their own"
        );
    }
}
