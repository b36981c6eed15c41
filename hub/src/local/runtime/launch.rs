//! Size: `Runtime`, a sandbox's life from launch to removal, every step on the same state.
//!
//! The hub's side of a sandbox's life: launch, liveness, stop, removal.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    io,
    os::{
        fd::AsFd,
        unix::fs::{DirBuilderExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    process::Child,
    sync::Arc,
    time::{Duration, Instant},
};

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use serde::{Deserialize, Serialize};

use super::{
    cgroup::{self, Backend, CreateError, Limits, SandboxCgroup},
    channel::{Channel, InitConfig, Msg},
    error::{IoContext, RuntimeError},
    hostetc,
    idmap::IdMap,
    init, probe, procfs,
    quota::DiskQuotas,
    reaper,
    spare::Spares,
    statedir::{self, StateDir},
    treecopy::{self, CopyStats},
};

/// How long a sandbox may take to answer before launch gives up.
/// `/etc/resolv.conf` of an egress sandbox: the gateway's DNS responder
/// (`sandhub_gateway::policy::internal::GATEWAY`; a test checks they agree).
pub const EGRESS_RESOLV_CONF: &str =
    "# sandhub: the egress gateway answers here\nnameserver 100.127.0.1\n";

const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long processes may take to die after SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a pause waits for every process to be frozen (a process in an
/// uninterruptible sleep, e.g. on a slow disk, is frozen when it wakes).
pub(crate) const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// What to run. `state_dir` is the sandbox's own directory (created by
/// [`Runtime::launch`]; kept by [`Runtime::stop`], deleted by
/// [`Runtime::remove`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Also the hostname and the cgroup name.
    pub id: String,
    pub state_dir: PathBuf,
    /// Seed layers of `/workspace`, topmost first; may be empty. Files
    /// should be owned by the sandbox id range ([`Runtime::prepare_layer`]),
    /// or root inside sees them as `nobody` and cannot change them.
    pub lower_layers: Vec<PathBuf>,
    /// A template's root filesystem, read-only; `None`: the host's
    /// `/usr`, `/bin`, `/sbin`, `/lib*` and a sanitized `/etc`.
    pub root_fs: Option<PathBuf>,
    /// Added to sandboxd's (and so every process's) environment.
    pub env: BTreeMap<String, String>,
    /// Where processes started without a `cwd` run (an absolute path in
    /// the sandbox); `None`: `/workspace`.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Who workloads run as (`user[:group]`); `None`: the sandbox's root.
    #[serde(default)]
    pub user: Option<String>,
    /// Started in the background at start and after each reset.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// CPUs (e.g. 0.5); memory in MiB; most tasks (processes and threads,
    /// sandboxd's own included).
    pub cpu: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
    /// Share the host's network namespace instead of a private one with
    /// only `lo`.
    pub network_host: bool,
    /// sandboxd's `--max-upload-bytes` (0: no limit).
    pub max_upload_bytes: u64,
    /// Disk quota in MiB for the whole state dir (see [`super::quota`]);
    /// applied when the runtime has disk quotas.
    #[serde(default)]
    pub disk_mb: Option<u64>,
    /// `network: egress`: the sandbox's `/etc/resolv.conf` names the
    /// gateway's DNS responder (the hub attaches the gateway itself once
    /// the sandbox runs). Only with the host's `/etc` (no `root_fs`).
    #[serde(default)]
    pub egress: bool,
    /// Named volumes bound into the sandbox (see `volumes.rs`).
    #[serde(default)]
    pub volumes: Vec<super::VolumeBind>,
}

impl SandboxSpec {
    /// A spec with no seed, the host's root filesystem, no limits and no
    /// network.
    pub fn new(id: impl Into<String>, state_dir: impl Into<PathBuf>) -> Self {
        SandboxSpec {
            id: id.into(),
            state_dir: state_dir.into(),
            lower_layers: Vec::new(),
            root_fs: None,
            env: BTreeMap::new(),
            workdir: None,
            user: None,
            entrypoint: Vec::new(),
            cpu: None,
            memory_mb: None,
            pids: None,
            network_host: false,
            max_upload_bytes: 0,
            disk_mb: None,
            egress: false,
            volumes: Vec::new(),
        }
    }

    /// The sandbox's upper layer on the host (for inspection only: the
    /// sandbox can swap it for a symlink at any time; the hub itself opens
    /// it through [`Runtime::snapshot`]).
    pub fn upper_dir(&self) -> PathBuf {
        StateDir::new(&self.state_dir).overlay.join("upper")
    }

    /// Where sandboxd's `rest.sock` and `grpc.sock` are, on the host only.
    pub fn socket_dir(&self) -> PathBuf {
        StateDir::new(&self.state_dir).sock
    }

    fn limits(&self) -> Limits {
        Limits {
            cpu: self.cpu,
            memory_mb: self.memory_mb,
            pids: self.pids,
        }
    }
}

/// How many processes a sandbox is when it runs no workload: the shim and
/// sandboxd (which is PID 1, see `init.rs`).
pub const OWN_PROCESSES: usize = 2;

/// A running sandbox, as the hub stores it. `shim_pid` + `start_time`
/// name the sandbox's outermost process for good (pids get reused, the
/// pair does not), so a restarted hub can tell a live sandbox from a
/// stranger that inherited the pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launched {
    pub shim_pid: i32,
    /// Field 22 of `/proc/<shim_pid>/stat`.
    pub start_time: u64,
    pub socket_dir: PathBuf,
}

/// Where the egress sandboxes' `/etc` copy is.
#[derive(Debug)]
enum EgressEtc {
    Making(std::thread::JoinHandle<std::io::Result<PathBuf>>),
    Made(PathBuf),
    /// Not begun, or failed (tried again at the next egress launch).
    Unmade,
}

/// Starts and stops sandboxes on this machine. Cheap to share (`&self`
/// everywhere); `launch` blocks for the few milliseconds a start takes.
#[derive(Debug)]
pub struct Runtime {
    exe: PathBuf,
    state_root: PathBuf,
    allow_no_cgroup_limits: bool,
    cgroups: Option<Backend>,
    idmap: IdMap,
    host_etc: PathBuf,
    /// The `/etc` copy of egress sandboxes ([`Runtime::begin_egress_etc`]).
    egress_etc: std::sync::Mutex<EgressEtc>,
    /// The hub's egress CA (brokered secrets), for that copy.
    egress_ca: Option<String>,
    /// Disk quotas (issue #12 row 6); `None`: sandboxes write without limit.
    disk_quotas: Option<Arc<DiskQuotas>>,
    /// Stage 1 started ahead of the next launch (`spare.rs`).
    spares: Spares,
}

impl Runtime {
    /// Checks the host (failing with the missing feature's name), prepares
    /// the cgroup parent and the sanitized `/etc` under `state_root`.
    ///
    /// `exe` is the `sandhub` binary to re-execute as `__sandbox-init`
    /// (`/proc/self/exe` in the hub). Without a usable cgroup hierarchy
    /// this fails unless `allow_no_cgroup_limits`.
    ///
    /// The sandboxes' own log level comes from `SANDHUB_SANDBOX_LOG`
    /// (a `tracing` filter, default `warn`); logs go to
    /// `<state_dir>/sandbox.log`.
    pub fn new(
        exe: impl Into<PathBuf>,
        state_root: impl Into<PathBuf>,
        allow_no_cgroup_limits: bool,
    ) -> Result<Self, RuntimeError> {
        let exe = exe.into();
        let state_root = state_root.into();
        std::fs::metadata(&exe).ctx(|| format!("sandbox executable {}", exe.display()))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&state_root)
            .ctx(|| format!("creating state dir {}", state_root.display()))?;
        let support = probe::probe_at(&state_root);
        if let Some((feature, detail)) = support.blocker() {
            return Err(RuntimeError::MissingFeature { feature, detail });
        }
        let (cgroups, findings) = cgroup::detect();
        if cgroups.is_none() {
            let what = cgroup::describe(&findings);
            if !allow_no_cgroup_limits {
                return Err(RuntimeError::NoCgroupLimits(format!(
                    "no cgroup hierarchy can enforce the memory, pids and cpu limits: {what}; \
                     run as root on a host with these controllers, or pass \
                     --allow-no-cgroup-limits to run sandboxes without limits"
                )));
            }
            tracing::warn!(%what, "running sandboxes without cgroup limits");
        }
        if let Some(cg) = &cgroups {
            let (memory, pids) = cgroup::host_caps(super::host_memory_kib());
            if let Err(e) = cg.cap_all(memory, pids) {
                tracing::warn!(error = %e, "could not bound all sandboxes together");
            }
        }
        let host_etc = hostetc::prepare_host_etc(&state_root)
            .ctx(|| "preparing the sandboxes' /etc".to_string())?;
        let log_filter = std::env::var("SANDHUB_SANDBOX_LOG").unwrap_or_else(|_| "warn".into());
        let spares = Spares::new(exe.clone(), cgroups.clone(), &log_filter);
        spares.refill();
        Ok(Runtime {
            exe,
            state_root,
            allow_no_cgroup_limits,
            cgroups,
            idmap: IdMap::for_current_user(),
            egress_etc: std::sync::Mutex::new(EgressEtc::Unmade),
            egress_ca: None,
            host_etc,
            disk_quotas: None,
            spares,
        })
    }

    /// Puts the hub's egress CA (PEM) into egress sandboxes' trust store.
    pub fn with_egress_ca(mut self, pem: String) -> Self {
        self.egress_ca = Some(pem);
        self
    }

    /// Begins the egress sandboxes' `/etc` copy on a thread of its own (the
    /// built-in `default` template is egress, so most hubs need it, and its
    /// ~100 ms of links then overlap the start). Called once the CA is
    /// known; without it the first egress launch makes the copy.
    pub fn begin_egress_etc(self) -> Self {
        let (host, ca) = (self.host_etc.clone(), self.egress_ca.clone());
        let made = std::thread::Builder::new()
            .name("sandhub-egress-etc".into())
            .spawn(move || hostetc::prepare_egress_etc(&host, EGRESS_RESOLV_CONF, ca.as_deref()))
            .map_or(EgressEtc::Unmade, EgressEtc::Making);
        *self.egress_etc.lock().unwrap_or_else(|p| p.into_inner()) = made;
        self
    }

    /// Gives every sandbox launched from now on the disk quota of its
    /// spec's `disk_mb`.
    pub fn with_disk_quotas(mut self, quotas: Arc<DiskQuotas>) -> Self {
        self.disk_quotas = Some(quotas);
        self
    }

    pub fn state_root(&self) -> &Path {
        &self.state_root
    }

    /// The id mapping every sandbox gets.
    pub fn idmap(&self) -> IdMap {
        self.idmap
    }

    /// Makes a directory usable as a lower layer: chowns host ids
    /// `0..65536` into the sandbox range (idempotent; nothing rootless).
    pub fn prepare_layer(&self, dir: &Path) -> Result<(), RuntimeError> {
        self.idmap
            .shift_tree(dir)
            .ctx(|| format!("preparing layer {}", dir.display()))
    }

    /// The sanitized `/etc` whose `resolv.conf` names the egress gateway.
    fn egress_etc(&self) -> Result<PathBuf, RuntimeError> {
        let mut slot = self.egress_etc.lock().unwrap_or_else(|p| p.into_inner());
        let made = match std::mem::replace(&mut *slot, EgressEtc::Unmade) {
            EgressEtc::Made(p) => Ok(p),
            EgressEtc::Making(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the /etc thread panicked"))),
            EgressEtc::Unmade => hostetc::prepare_egress_etc(
                &self.host_etc,
                EGRESS_RESOLV_CONF,
                self.egress_ca.as_deref(),
            ),
        };
        let p = made.ctx(|| "preparing the egress sandboxes' /etc".to_string())?;
        *slot = EgressEtc::Made(p.clone());
        Ok(p)
    }

    /// Starts a sandbox and returns once its sandboxd accepts connections
    /// on both sockets. On error nothing of the attempt keeps running.
    pub fn launch(&self, spec: &SandboxSpec) -> Result<Launched, RuntimeError> {
        self.launch_then(spec, |_| {})
    }

    /// [`Runtime::launch`], calling `on_shim` as soon as the sandbox's
    /// namespaces exist and its shim is known (the handle it will return),
    /// while the sandbox is still building its root and starting sandboxd:
    /// what needs only the namespaces (the egress gateway) can be set up
    /// meanwhile. The launch may still fail after it.
    pub fn launch_then(
        &self,
        spec: &SandboxSpec,
        on_shim: impl FnOnce(&Launched),
    ) -> Result<Launched, RuntimeError> {
        let started = Instant::now();
        validate_id(&spec.id)?;
        let dirs = StateDir::new(&spec.state_dir);
        // Disk quota (issue #12 row 6): the state dir becomes a limited
        // subvolume before anything is made in it, so everything the
        // sandbox can write (workspace layer, sockets, log) counts.
        match (&self.disk_quotas, spec.disk_mb) {
            (Some(q), Some(mb)) => {
                q.confine(&spec.state_dir, super::quota::limit_bytes(mb))
                    .ctx(|| format!("disk quota of {}", spec.id))?;
            }
            (None, Some(_)) => tracing::debug!(id = %spec.id, "no disk quotas: disk_mb ignored"),
            _ => {}
        }
        dirs.prepare(&self.idmap)
            .ctx(|| format!("preparing {}", dirs.root.display()))?;
        for layer in &spec.lower_layers {
            self.check_layer(layer)?;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&dirs.log)
            .ctx(|| format!("opening {}", dirs.log.display()))?;
        let spare = self
            .spares
            .take(log.as_fd())
            .ctx(|| format!("starting {} {}", self.exe.display(), init::SUBCOMMAND))?;
        drop(log);
        let stage1 = spare.child.id() as i32;
        // From here a failure kills stage 1 and removes its cgroup.
        let mut attempt = Attempt {
            child: Some(spare.child),
            shim: None,
            cgroup: spare.cgroup,
            done: false,
        };
        self.confine(spec, stage1, &mut attempt)?;
        let launched = self.start(spec, &dirs, &spare.chan, stage1, &mut attempt, on_shim)?;
        attempt.done = true;
        // The shim is stage 1, our child: reaped whenever it exits.
        if let Some(shim) = attempt.child.take() {
            reaper::adopt(shim);
        }
        tracing::debug!(id = %spec.id, shim = launched.shim_pid, elapsed = ?started.elapsed(), "sandbox ready");
        Ok(launched)
    }

    /// Puts stage 1 (`pid`, a spare's) into sandbox `spec.id`'s cgroup
    /// with its limits: the spare's own cgroup renamed where cgroups can
    /// be, else a new one it is moved into. Either way before the config
    /// goes out, so nothing of the sandbox runs unconfined.
    fn confine(
        &self,
        spec: &SandboxSpec,
        pid: i32,
        attempt: &mut Attempt,
    ) -> Result<(), RuntimeError> {
        let busy = |e| match e {
            CreateError::Busy(cgroup) => RuntimeError::AlreadyRunning {
                id: spec.id.clone(),
                cgroup,
            },
            CreateError::Io(e) => RuntimeError::io(format!("cgroup of {}", spec.id), e),
        };
        let Some(backend) = &self.cgroups else {
            if spec.limits().any() {
                debug_assert!(self.allow_no_cgroup_limits);
                tracing::warn!(id = %spec.id, "limits requested but no cgroups: ignored");
            }
            return Ok(());
        };
        match &attempt.cgroup {
            Some(spare) => {
                let cg = spare.rename_to(backend, &spec.id).map_err(busy)?;
                attempt.cgroup = Some(cg.clone());
                cg.apply(&spec.limits())
                    .ctx(|| format!("limits of sandbox {}", spec.id))
            }
            None => {
                let cg = backend.create(&spec.id, &spec.limits()).map_err(busy)?;
                attempt.cgroup = Some(cg.clone());
                cg.add(pid)
                    .ctx(|| format!("moving the sandbox into its cgroup {:?}", cg.dirs()))
            }
        }
    }

    fn start(
        &self,
        spec: &SandboxSpec,
        dirs: &StateDir,
        chan: &Channel,
        stage1: i32,
        attempt: &mut Attempt,
        on_shim: impl FnOnce(&Launched),
    ) -> Result<Launched, RuntimeError> {
        let deadline = Instant::now() + LAUNCH_TIMEOUT;
        // The inside resolves these from the hub's cwd; make that moot.
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let config = InitConfig {
            id: spec.id.clone(),
            state_dir: abs(&dirs.root),
            lower_layers: spec.lower_layers.iter().map(|p| abs(p)).collect(),
            root_fs: spec.root_fs.as_deref().map(abs),
            host_etc: if spec.egress {
                self.egress_etc()?
            } else {
                self.host_etc.clone()
            },
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            user: spec.user.clone(),
            entrypoint: spec.entrypoint.clone(),
            network_host: spec.network_host,
            memory_mb: spec.memory_mb,
            max_upload_bytes: spec.max_upload_bytes,
            volumes: spec.volumes.clone(),
            idmap: self.idmap,
        };
        let json = serde_json::to_vec(&config)
            .map_err(io::Error::other)
            .ctx(|| "encoding the sandbox config".to_string())?;
        chan.send(&Msg::Config(json))
            .ctx(|| "sending the sandbox config".to_string())?;
        // While stage 1 unshares (the slowest step of its own): sandboxd's
        // sockets, in the hub-only sock dir, handed over with `Mapped`.
        let listeners = statedir::bind_listeners(&dirs.sock)
            .ctx(|| format!("binding sandboxd's sockets in {}", dirs.sock.display()))?;
        match self.expect(spec, dirs, chan, deadline)? {
            Msg::Unshared => {}
            other => return Err(self.protocol(spec, dirs, other)),
        }
        self.idmap
            .write(stage1)
            .ctx(|| format!("writing the id maps of sandbox {}", spec.id))?;
        chan.send_mapped(&listeners)
            .ctx(|| "signalling the sandbox".to_string())?;
        drop(listeners);
        // Stage 1 goes on as the shim (`init.rs`): the same process.
        let shim = match self.expect(spec, dirs, chan, deadline)? {
            Msg::ShimPid(pid) if pid == stage1 => pid,
            other => return Err(self.protocol(spec, dirs, other)),
        };
        let start_time = procfs::stat(shim)
            .ctx(|| format!("reading /proc/{shim}/stat of the new sandbox"))?
            .start_time;
        attempt.shim = Some((shim, start_time));
        let launched = Launched {
            shim_pid: shim,
            start_time,
            socket_dir: dirs.sock.clone(),
        };
        on_shim(&launched);
        match self.expect(spec, dirs, chan, deadline)? {
            Msg::Ready => {}
            other => return Err(self.protocol(spec, dirs, other)),
        }
        Ok(launched)
    }

    /// The next message from the sandbox; an `Error` message, EOF and the
    /// deadline become errors.
    fn expect(
        &self,
        spec: &SandboxSpec,
        dirs: &StateDir,
        chan: &Channel,
        deadline: Instant,
    ) -> Result<Msg, RuntimeError> {
        let left = deadline.saturating_duration_since(Instant::now());
        match chan.recv(Some(left)) {
            Ok(Some(Msg::Error(message))) => Err(RuntimeError::Start {
                id: spec.id.clone(),
                message,
                log: dirs.log.clone(),
            }),
            Ok(Some(msg)) => Ok(msg),
            Ok(None) => Err(RuntimeError::Start {
                id: spec.id.clone(),
                message: format!(
                    "the sandbox exited before it was ready{}",
                    last_log_line(&dirs.log)
                        .map(|l| format!(": {l}"))
                        .unwrap_or_default()
                ),
                log: dirs.log.clone(),
            }),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(RuntimeError::StartTimeout {
                id: spec.id.clone(),
                timeout: LAUNCH_TIMEOUT,
                log: dirs.log.clone(),
            }),
            Err(e) => Err(RuntimeError::io("reading from the sandbox", e)),
        }
    }

    fn protocol(&self, spec: &SandboxSpec, dirs: &StateDir, got: Msg) -> RuntimeError {
        RuntimeError::Start {
            id: spec.id.clone(),
            message: format!(
                "unexpected message {got:?} (is {} the same sandhub build?)",
                self.exe.display()
            ),
            log: dirs.log.clone(),
        }
    }

    /// Copies the upper layer of the sandbox whose state dir is `state_dir`
    /// to the new directory `dest` (a snapshot; a fork's topmost lower
    /// layer). The upper layer is opened without following links and
    /// copied entry by entry from directory fds (see `treecopy`), so a
    /// workload racing the copy cannot make it read anything of the host.
    /// Past `max_bytes` of data the copy fails with `ENOSPC`; on any
    /// failure nothing is left at `dest`.
    pub fn snapshot(
        &self,
        state_dir: &Path,
        dest: &Path,
        max_bytes: Option<u64>,
    ) -> Result<CopyStats, RuntimeError> {
        let what = || format!("snapshot of {} to {}", state_dir.display(), dest.display());
        let upper = StateDir::new(state_dir).open_upper(&self.idmap).ctx(what)?;
        let (Some(parent), Some(name)) = (dest.parent(), dest.file_name().and_then(|n| n.to_str()))
        else {
            return Err(RuntimeError::io(
                what(),
                io::Error::new(io::ErrorKind::InvalidInput, "bad snapshot destination"),
            ));
        };
        let parent = statedir::open_hub_dir(parent).ctx(what)?;
        if std::fs::symlink_metadata(dest).is_ok() {
            return Err(RuntimeError::io(
                what(),
                io::Error::new(io::ErrorKind::AlreadyExists, "the destination exists"),
            ));
        }
        treecopy::copy_tree(upper.as_fd(), parent.as_fd(), name, max_bytes).map_err(|e| {
            if let Err(rm) = std::fs::remove_dir_all(dest) {
                if rm.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(dest = %dest.display(), error = %rm, "removing a failed snapshot");
                }
            }
            RuntimeError::io(what(), e)
        })
    }

    /// The host pid of the stage 1 started ahead for the next launch, if
    /// one is ready (`spare.rs`).
    pub fn spare_pid(&self) -> Option<i32> {
        self.spares.ready_pid()
    }

    /// Whether the sandbox's shim is still the same running process.
    pub fn is_alive(&self, l: &Launched) -> bool {
        procfs::runs(l.shim_pid, l.start_time)
    }

    /// Host pids of every process of sandbox `id` (its cgroup's members;
    /// empty without cgroups). A sandbox with more than its
    /// [`OWN_PROCESSES`] is running something.
    pub fn processes(&self, id: &str) -> Result<Vec<i32>, RuntimeError> {
        validate_id(id)?;
        match &self.cgroups {
            Some(b) => b
                .sandbox(id)
                .procs()
                .ctx(|| format!("listing processes of {id}")),
            None => Ok(Vec::new()),
        }
    }

    /// The OOM killer's kills in sandbox `id`'s cgroup since it was made;
    /// None without cgroups (nothing can tell).
    pub fn oom_kills(&self, id: &str) -> Result<Option<u64>, RuntimeError> {
        validate_id(id)?;
        match &self.cgroups {
            Some(b) => b
                .sandbox(id)
                .oom_kills()
                .map(Some)
                .ctx(|| format!("reading the OOM kills of {id}")),
            None => Ok(None),
        }
    }

    /// Every sandbox's cgroup, for the usage sampler; None without cgroups.
    pub fn cgroup_tree(&self) -> Option<super::cgstat::CgroupTree> {
        self.cgroups.clone().map(super::cgstat::CgroupTree::new)
    }

    /// The cgroup directories of sandbox `id` (whether they exist or not).
    pub fn cgroup_dirs(&self, id: &str) -> Vec<PathBuf> {
        self.cgroups
            .as_ref()
            .map(|b| b.sandbox(id).dirs())
            .unwrap_or_default()
    }

    /// Freezes every process of sandbox `id` (pause): they keep their
    /// memory, files and sockets and get no CPU. Returns once the kernel
    /// says all are frozen, at most [`FREEZE_TIMEOUT`] (then it is thawed
    /// again and this fails).
    pub fn freeze(&self, id: &str) -> Result<(), RuntimeError> {
        validate_id(id)?;
        let cg = self.freezable(id)?;
        let frozen = cg
            .freeze(FREEZE_TIMEOUT)
            .ctx(|| format!("freezing sandbox {id}"))?;
        if !frozen {
            return Err(RuntimeError::io(
                format!("freezing sandbox {id}"),
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("its processes were not all frozen within {FREEZE_TIMEOUT:?}"),
                ),
            ));
        }
        Ok(())
    }

    /// Thaws sandbox `id`: its processes run on where they stopped.
    pub fn thaw(&self, id: &str) -> Result<(), RuntimeError> {
        validate_id(id)?;
        match &self.cgroups {
            Some(b) => b.sandbox(id).thaw().ctx(|| format!("thawing sandbox {id}")),
            None => Ok(()),
        }
    }

    /// Whether sandbox `id`'s cgroup is frozen, or being frozen.
    pub fn is_frozen(&self, id: &str) -> bool {
        validate_id(id).is_ok()
            && self.cgroups.as_ref().is_some_and(|b| {
                b.sandbox(id)
                    .freeze_state()
                    .is_ok_and(|s| s != super::cgroup::Freeze::Thawed)
            })
    }

    fn freezable(&self, id: &str) -> Result<SandboxCgroup, RuntimeError> {
        let missing = |detail: &str| RuntimeError::MissingFeature {
            feature: "pause (the cgroup freezer)",
            detail: detail.to_string(),
        };
        let Some(b) = &self.cgroups else {
            return Err(missing("the hub runs without cgroups"));
        };
        let cg = b.sandbox(id);
        if !cg.can_freeze() {
            return Err(missing(
                "this host's cgroup v1 has no freezer controller mounted",
            ));
        }
        Ok(cg)
    }

    /// Kills every process of the sandbox and removes its cgroup; its
    /// files stay (suspend). Idempotent: stopping a dead sandbox only
    /// cleans up.
    pub fn stop(&self, id: &str, l: &Launched) -> Result<(), RuntimeError> {
        validate_id(id)?;
        // The shim first: its death takes PID 1 (parent-death signal) and
        // with it the whole PID namespace.
        let shim_gone = kill_verified(l.shim_pid, l.start_time);
        match &self.cgroups {
            Some(backend) => {
                let cg = backend.sandbox(id);
                self.sweep(id, &cg)?;
            }
            None => {
                let deadline = Instant::now() + STOP_TIMEOUT;
                while !shim_gone && self.is_alive(l) {
                    if Instant::now() > deadline {
                        return Err(RuntimeError::StopTimeout {
                            id: id.to_string(),
                            timeout: STOP_TIMEOUT,
                            cgroup: PathBuf::new(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        for sock in [
            sandhub_api::sandboxd::REST_SOCKET,
            sandhub_api::sandboxd::GRPC_SOCKET,
        ] {
            let _ = std::fs::remove_file(l.socket_dir.join(sock));
        }
        Ok(())
    }

    /// Kills whatever sandbox `id`'s cgroup holds and removes the cgroup:
    /// the stop of a sandbox whose launch never reported back.
    pub fn kill_all(&self, id: &str) -> Result<(), RuntimeError> {
        validate_id(id)?;
        match &self.cgroups {
            Some(b) => self.sweep(id, &b.sandbox(id)),
            None => Ok(()),
        }
    }

    /// Whether `dir` may be a lower layer: a real directory (never a
    /// symlink), not a mount point, owned by the hub or the sandbox ids.
    pub fn check_layer(&self, dir: &Path) -> Result<(), RuntimeError> {
        statedir::open_layer(dir, &self.idmap)
            .map(drop)
            .ctx(|| format!("checking layer {}", dir.display()))
    }

    fn sweep(&self, id: &str, cg: &SandboxCgroup) -> Result<(), RuntimeError> {
        let clean = cg
            .kill_and_remove(STOP_TIMEOUT)
            .ctx(|| format!("stopping sandbox {id}"))?;
        if !clean {
            return Err(RuntimeError::StopTimeout {
                id: id.to_string(),
                timeout: STOP_TIMEOUT,
                cgroup: cg.dirs().first().cloned().unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// Stops the sandbox (if `launched` is known; otherwise whatever its
    /// cgroup holds) and deletes its state dir.
    pub fn remove(
        &self,
        spec: &SandboxSpec,
        launched: Option<&Launched>,
    ) -> Result<(), RuntimeError> {
        validate_id(&spec.id)?;
        match launched {
            Some(l) => self.stop(&spec.id, l)?,
            None => {
                if let Some(b) = &self.cgroups {
                    self.sweep(&spec.id, &b.sandbox(&spec.id))?;
                }
            }
        }
        match std::fs::remove_dir_all(&spec.state_dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(RuntimeError::io(
                format!("removing {}", spec.state_dir.display()),
                e,
            )),
            _ => Ok(()),
        }
    }
}

/// SIGKILLs `pid` if it still is the process that started at `start_time`.
/// The pidfd pins the process between the check and the signal. Returns
/// true when the process is known to be gone already.
fn kill_verified(pid: i32, start_time: u64) -> bool {
    let Some(p) = Pid::from_raw(pid) else {
        return true;
    };
    let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else {
        return true;
    };
    match procfs::stat(pid) {
        Ok(st) if st.start_time == start_time && st.is_running() => {
            let _ = pidfd_send_signal(&fd, Signal::KILL);
            false
        }
        _ => true,
    }
}

/// Cleans up a launch that did not finish.
struct Attempt {
    child: Option<Child>,
    shim: Option<(i32, u64)>,
    cgroup: Option<SandboxCgroup>,
    done: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some((pid, start)) = self.shim {
            kill_verified(pid, start);
        }
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill_and_remove(STOP_TIMEOUT) {
                tracing::warn!(error = %e, "cleaning up the cgroup of a failed launch");
            }
        }
    }
}

fn last_log_line(log: &Path) -> Option<String> {
    let raw = std::fs::read(log).ok()?;
    let tail = &raw[raw.len().saturating_sub(4096)..];
    String::from_utf8_lossy(tail)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

/// Ids become hostnames, cgroup and directory names: keep them to a safe
/// alphabet and the 64-byte hostname limit.
pub(crate) fn validate_id(id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && !id.starts_with(['.', '-'])
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidId(id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated() {
        for good in ["a", "sbx-1", "A_b.c", &"x".repeat(63)] {
            assert!(validate_id(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é", &"x".repeat(64)] {
            assert!(validate_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn launched_round_trips_through_json() {
        let l = Launched {
            shim_pid: 42,
            start_time: 123456,
            socket_dir: "/var/lib/sandhub/s/sock".into(),
        };
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<Launched>(&json).unwrap(), l);
    }
}
