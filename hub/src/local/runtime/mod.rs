//! The local backend's sandbox runtime: each sandbox is the `sandboxd`
//! library running in fresh namespaces and a cgroup on this machine.
//!
//! # API
//!
//! ```text
//! Runtime::new(exe, state_root, allow_no_cgroup_limits) -> Runtime
//!   checks the host (probe), prepares <state_root>/host-etc and the cgroup parent
//! runtime.with_disk_quotas(Arc<DiskQuotas>)      launch makes each state dir a
//!                                               subvolume limited to spec.disk_mb
//!                                               (see [`quota`])
//! runtime.launch(&SandboxSpec) -> Launched      blocks until sandboxd answers
//! runtime.launch_then(&spec, on_shim)           the same, calling on_shim once the
//!                                               namespaces exist (egress attaches early)
//! runtime.spare_pid()                           the stage 1 waiting for the next launch
//! runtime.is_alive(&Launched) -> bool           shim pid + start time still match
//! runtime.stop(id, &Launched)                   kill all, remove cgroup, keep files
//! runtime.remove(&SandboxSpec, Option<&Launched>)   stop + delete the state dir
//! runtime.processes(id), cgroup_dirs(id), prepare_layer(dir)
//! runtime.cgroup_tree() -> Option<CgroupTree>    every sandbox's counters, read
//!                                               through dir fds (see [`cgstat`])
//! NetNs::of(&Launched), ::of_process(pid, start) the sandbox's network namespace:
//!   .socket(family), .listening()               a socket made inside it, what listens
//!                                               (see [`netns`]; how ports are reached)
//! NetNs::fresh()                                a new namespace of its own (the egress probe)
//!
//! probe() -> HostSupport                        per-feature report
//! prepare_host_etc(state_root)                  (Runtime::new calls it)
//! spec.volumes: Vec<VolumeBind>                 named volumes bound into the sandbox
//!                                               (see [`volumes`])
//! runtime.snapshot(state_dir, dest, max_bytes)  copy an upper layer without
//!                                               following links (fork = new
//!                                               sandbox with [snapshot, ...seed])
//!
//! Inside the sandbox (for sandboxd):
//! child_setup()      pre_exec hook of every workload: oom_score_adj 0,
//!                    no_new_privs, seccomp (install_seccomp)
//! reset_workspace(&WorkspaceLayout::discover()?)   drop the upper layer
//! (both are wired into the sandboxd every sandbox runs; RESET_ROUTE,
//! `POST /v1/_sandhub/reset`, is how the hub asks for a reset)
//!
//! init::main(args)   `sandhub __sandbox-init`, dispatched by main.rs
//!                    before any runtime thread exists
//! ```
//!
//! # How a sandbox is built
//!
//! `launch` takes a `sandhub __sandbox-init` started ahead of need (a
//! spare, `spare.rs`; see [`init`] for the stages and `channel.rs` for the
//! handshake). The sandbox
//! gets new user, mount, PID, UTS, IPC and cgroup namespaces (and network,
//! unless `network_host`); its ids 0..65536 map to host ids from
//! [`HOST_ID_BASE`] ([`idmap`]); its root filesystem is described in
//! `mounts.rs`, its workspace in [`workspace`]; its cgroup lives at
//! `<mount>/sandhub/<id>` (`cgroup.rs`). sandboxd serves on
//! `<state_dir>/sock/{rest,grpc}.sock`, bound by the hub on the host (while
//! stage 1 unshares), handed to stage 1 and inherited by sandboxd as fds:
//! the sandbox never sees that directory. The per-sandbox state dir and the
//! rules for touching it are in [`statedir`].
//!
//! With disk quotas, `<state_dir>` itself is a btrfs subvolume on the
//! quota volume whose qgroup limit is the sandbox's `disk_mb`: all of the
//! above counts.
//!
//! # What keeps a workload in
//!
//! - Root inside is host uid [`HOST_ID_BASE`]: no capability outside the
//!   sandbox's user namespace, no access to host files it does not own.
//! - Host directories are bound read-only; the root tmpfs is read-only.
//!   A read-only bind made inside a user namespace could be remounted
//!   writable by root there, so workloads must not mount: the seccomp
//!   filter (`seccomp.rs`) denies every mount syscall, new user namespaces,
//!   `setns` and other host-level calls, under `no_new_privs`. sandboxd
//!   itself is not filtered (it remounts the workspace on reset) and
//!   starts nothing unfiltered.
//! - Only the sandbox's own processes, hostname, IPC objects and (unless
//!   `network_host`) network exist inside; the cgroup caps memory, pids
//!   and CPU.
//! - Visible but harmless: host paths in `/proc/self/mountinfo` (the
//!   sources of the binds) and the layer dirs under `/.sandhub`. The
//!   overlay dir is writable inside, so the hub, as root, never resolves a
//!   path in it by name: see [`statedir`] and [`treecopy`].

mod cgroup;
pub mod cgstat;
mod channel;
mod error;
mod hostetc;
pub mod idmap;
pub mod init;
mod launch;
mod mounts;
mod netns;
mod probe;
mod procfs;
pub mod quota;
mod reaper;
mod routes;
mod seccomp;
mod spare;
mod statedir;
mod sys;
pub mod treecopy;
mod volumes;
pub mod workspace;

pub use error::RuntimeError;
pub use hostetc::{prepare_host_etc, CA_BUNDLE, CA_FILE};
pub use idmap::{IdMap, HOST_ID_BASE};
pub use launch::{Launched, Runtime, SandboxSpec, EGRESS_RESOLV_CONF, OWN_PROCESSES};
pub use mounts::host_memory_kib;
pub use netns::NetNs;
pub use probe::{probe, probe_at, Check, HostSupport};
pub(crate) use procfs::runs as process_runs;
#[cfg(test)]
pub(crate) use procfs::stat as process_stat;
pub use quota::{DiskQuotas, VolumeOptions, VOLUMES_DIR};
pub use routes::RESET_ROUTE;
pub use seccomp::{child_setup, install_seccomp};
pub(crate) use statedir::open_hub_dir;
pub use volumes::VolumeBind;
pub use workspace::{reset_workspace, WorkspaceLayout};
