//! The inside of a sandbox: what `sandhub __sandbox-init` runs.
//!
//! The hub spawns `<exe> __sandbox-init` with the sync socket as stdin
//! ahead of need (a spare, see `spare.rs`), then (see `channel.rs`):
//!
//! 1. **stage 1** parses sandboxd's flags, builds its gRPC reflection and
//!    installs its logging (the filter is the spare's first message) while
//!    it idles as a spare (together ~1.1 ms of every cold create when
//!    sandboxd did them in its fresh process), lowers its `oom_score_adj`
//!    to -900 (only possible before leaving the initial user namespace;
//!    PID 1 and sandboxd inherit it, workloads reset it in `child_setup`)
//!    and leaves the hub's session. It then waits
//!    for the sandbox's log (its stdout and stderr from then on) and the
//!    config, unshares the user, mount, UTS, IPC, PID,
//!    cgroup (and network) namespaces in one call and opens the host paths
//!    it needs. The hub put it in the sandbox's cgroup before the config
//!    (so the cgroup namespace is rooted there). Meanwhile the hub binds
//!    sandboxd's listening sockets in the hub-only `<state_dir>/sock`
//!    (inherited down to sandboxd as fds; the sandbox never sees that
//!    directory, so it cannot swap a socket for a link to another's) and
//!    writes the id maps; it hands the sockets over with `Mapped`. Stage 1
//!    then becomes root inside and goes on as
//! 2. **the shim**: it reports its pid, forks PID 1 (the first child
//!    after `CLONE_NEWPID`, so the namespace's init) and waits for it. Its
//!    host pid plus start time identify the sandbox across hub restarts.
//!    It stays the hub's child (a fork less than a shim of its own, which
//!    cost 0.3-0.5 ms of every cold create); the hub reaps it (`reaper.rs`);
//! 3. **PID 1** builds the root filesystem, sets the hostname, brings `lo`
//!    up and goes on as
//! 4. **sandboxd** (so always PID 1: no fork of its own, and no workload
//!    can signal it to death, see `pid1`). It serves REST and gRPC on the
//!    inherited listeners (plus the reset route, see `routes.rs`), starts
//!    every workload through `child_setup` (seccomp, `no_new_privs`),
//!    reaps the sandbox's orphans, and tells the hub it is ready once it
//!    serves. A SIGTERM the shim forwards reaches it (its handler is
//!    installed; an init's default dispositions would drop it).
//!
//! Stage 1 (the shim) and PID 1 stay single-threaded until sandboxd starts
//! its runtime: `unshare(CLONE_NEWUSER)` demands it, and the shim forks.

use std::{
    ffi::OsString,
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    sync::{Arc, Mutex},
};

use sandboxd::server::UnixListeners;

use super::{
    channel::{Channel, InitConfig, Msg},
    mounts::{self, HostFds},
    routes, seccomp,
    sys::{self, Forked},
    workspace::{self, WORKSPACE},
};

/// The hidden subcommand `main.rs` dispatches here.
pub const SUBCOMMAND: &str = "__sandbox-init";

/// OOM score of the sandbox's own machinery (shim, PID 1, sandboxd).
const MACHINERY_OOM_SCORE_ADJ: &str = "-900";

/// Entry point of `sandhub __sandbox-init`; `args` (after the subcommand)
/// must be empty: the hub sends everything over stdin. Must be called
/// before any thread (tokio) exists.
pub fn main(args: Vec<OsString>) -> ! {
    if let Some(extra) = args.first() {
        eprintln!(
            "sandhub {SUBCOMMAND}: unexpected argument {extra:?} (this subcommand is \
             internal: the hub starts sandboxes with it)"
        );
        sys::exit_now(2)
    }
    stage1()
}

/// Reports `msg` to the hub (best effort) and the log, then exits.
fn fail(chan: &Channel, msg: String) -> ! {
    eprintln!("sandbox init: {msg}");
    let _ = chan.send(&Msg::Error(msg));
    sys::exit_now(1)
}

/// What stage 1 makes for sandboxd, handed down through the shim and
/// PID 1 (each drops its copy once it forked).
struct ForSandboxd {
    /// Bound by the hub as host root (`statedir::bind_listeners`) and
    /// handed over with `Mapped`.
    listeners: UnixListeners,
    /// Its flags, parsed before the sandbox's config arrived; `cfg`'s
    /// settings are filled in by `sandboxd_config`.
    config: sandboxd::Config,
    /// Its gRPC services that need no daemon (`sandboxd::rest::grpc_base`).
    grpc_base: sandboxd::rest::GrpcBase,
}

/// sandboxd's flags that every sandbox shares. Parsed in the spare's idle
/// time, in its own environment (the hub's, not the template's), so
/// `SANDBOXD_*` variables of a template cannot reconfigure the daemon.
fn base_sandboxd_config() -> Result<sandboxd::Config, clap::Error> {
    use clap::Parser as _;
    sandboxd::Config::try_parse_from(["sandboxd", "--legacy-port", "0", "--root-dir", WORKSPACE])
}

/// The sandbox's own settings over the shared flags, as the flags
/// `--default-cwd`, `--user`, `--entrypoint` and `--max-upload-bytes`
/// would set them (one that is unset keeps what the environment gave).
fn sandboxd_config(mut config: sandboxd::Config, cfg: &InitConfig) -> sandboxd::Config {
    config.max_upload_bytes = cfg.max_upload_bytes;
    if let Some(dir) = &cfg.workdir {
        config.default_cwd = Some(dir.into());
    }
    if let Some(user) = &cfg.user {
        config.user = Some(user.clone());
    }
    if !cfg.entrypoint.is_empty() {
        config.entrypoint = Some(serde_json::to_string(&cfg.entrypoint).unwrap_or_default());
    }
    config
}

fn stage1() -> ! {
    // SAFETY: fd 0 is the sync socket the hub passed as stdin; nothing
    // else in this fresh process owns it.
    let chan = Channel(unsafe { OwnedFd::from_raw_fd(0) });
    let base_config = match base_sandboxd_config() {
        Ok(c) => c,
        Err(e) => fail(&chan, format!("sandboxd flags: {e}")),
    };
    let grpc_base = sandboxd::rest::grpc_base();
    // sandboxd's logging, installed while this spare idles (the global
    // subscriber is inherited down the forks; it took ~0.15 ms of every
    // cold create in sandboxd). It writes to fd 2, which becomes the
    // sandbox's log below. Only sandboxd and the runtime code it shares
    // log through it; the stages before it report with `eprintln!`.
    // `Targets`, not `EnvFilter`: every sandbox would carry a regex engine
    // in its resident memory.
    match chan.recv(None) {
        Ok(Some(Msg::LogFilter(filter))) => {
            let _ = sandhub_common::Logging::new("text")
                .default_level(tracing::Level::WARN)
                .directives(&filter)
                .try_init();
        }
        Ok(None) => sys::exit_now(1),
        Ok(Some(other)) => fail(&chan, format!("expected the log filter, got {other:?}")),
        Err(e) => fail(&chan, format!("reading the log filter: {e}")),
    }
    // What needs no sandbox is done while this spare idles (~50 us of a
    // cold create when done after the config). The OOM score: lowering
    // needs CAP_SYS_RESOURCE (rootless, or a container that dropped it),
    // then we run unprotected rather than not at all, and say so in the
    // sandbox's log once there is one.
    let oom_unprotected = std::fs::write("/proc/self/oom_score_adj", MACHINERY_OOM_SCORE_ADJ).err();
    // Its own session: a signal to the hub's process group (a Ctrl-C)
    // must not reach the sandbox, which outlives the hub.
    if let Err(e) = sys::setsid() {
        fail(&chan, format!("setsid: {e}"));
    }
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
        let _ = sys::ignore_signal(sig);
    }
    // Started as a spare: stdout and stderr are /dev/null until the hub
    // picks this process for a sandbox and hands over that sandbox's log.
    match chan.recv_log() {
        Ok(Some(log)) => {
            let moved = rustix::stdio::dup2_stdout(&log).and(rustix::stdio::dup2_stderr(&log));
            if let Err(e) = moved {
                fail(&chan, format!("making the log stdout and stderr: {e}"));
            }
        }
        Ok(None) => sys::exit_now(1),
        Err(e) => fail(&chan, format!("reading the log fd: {e}")),
    }
    let cfg: InitConfig = match chan.recv(None) {
        Ok(Some(Msg::Config(json))) => match serde_json::from_slice(&json) {
            Ok(cfg) => cfg,
            Err(e) => fail(&chan, format!("bad config: {e}")),
        },
        Ok(None) => sys::exit_now(1),
        Ok(Some(other)) => fail(&chan, format!("expected the config, got {other:?}")),
        Err(e) => fail(&chan, format!("reading the config: {e}")),
    };
    if let Some(e) = oom_unprotected {
        eprintln!(
            "sandbox init: cannot lower oom_score_adj to {MACHINERY_OOM_SCORE_ADJ} \
             (needs CAP_SYS_RESOURCE): {e}; the OOM killer may pick sandboxd"
        );
    }
    // Every namespace at once. CLONE_NEWPID applies to the children: the
    // first one forked (PID 1) is the new namespace's init. The cgroup
    // namespace is rooted where we are: the sandbox's cgroup, which the
    // hub moved us into before it sent the config.
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWCGROUP;
    if !cfg.network_host {
        flags |= libc::CLONE_NEWNET;
    }
    if let Err(e) = sys::unshare(flags) {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::ENOSPC) | Some(libc::EINVAL) => {
                " (user namespaces disabled? check /proc/sys/user/max_user_namespaces, \
                 kernel.unprivileged_userns_clone and AppArmor's \
                 kernel.apparmor_restrict_unprivileged_userns)"
            }
            _ => "",
        };
        fail(&chan, format!("unshare namespaces: {e}{hint}"));
    }
    // Still the hub's host ids here, so host paths resolve as for the hub.
    let host = match HostFds::open(&cfg) {
        Ok(h) => h,
        Err(e) => fail(&chan, e.to_string()),
    };
    if let Err(e) = chan.send(&Msg::Unshared) {
        fail(&chan, format!("reporting the new namespaces: {e}"));
    }
    // Mapped: the id maps are written; with it come sandboxd's sockets.
    let listeners = match chan.recv_mapped() {
        Ok(Some(listeners)) => listeners,
        Ok(None) => sys::exit_now(1),
        Err(e) => fail(&chan, format!("reading Mapped: {e}")),
    };
    let sandboxd = ForSandboxd {
        config: sandboxd_config(base_config, &cfg),
        listeners,
        grpc_base,
    };
    if let Err(e) = sys::become_root(cfg.idmap.allows_setgroups()) {
        fail(&chan, format!("becoming root in the user namespace: {e}"));
    }
    shim(chan, cfg, host, sandboxd)
}

/// Stage 1 from here on: in every namespace of the sandbox, root inside.
fn shim(chan: Channel, cfg: InitConfig, host: HostFds, sandboxd: ForSandboxd) -> ! {
    // Names for `ps`/`top` on the host (argv stays `sandhub __sandbox-init`).
    let _ = rustix::thread::set_name(c"sandhub-shim");
    if let Err(e) = chan.send(&Msg::ShimPid(sys::getpid())) {
        fail(&chan, format!("reporting the shim pid: {e}"));
    }
    let pid1 = match sys::fork() {
        Ok(Forked::Child) => pid1(chan, cfg, host, sandboxd),
        Ok(Forked::Parent(pid)) => pid,
        Err(e) => fail(&chan, format!("forking PID 1: {e}")),
    };
    drop(host);
    drop(sandboxd);
    let _ = sys::null_over(0);
    std::mem::forget(chan); // fd 0 now is /dev/null
    let _ = sys::forward_signals_to(pid1, &[libc::SIGTERM]);
    // waitpid retries EINTR (forwarded SIGTERMs) itself.
    match sys::waitpid(pid1, 0) {
        Ok((_, status)) => sys::exit_now(sys::exit_code(status)),
        Err(_) => sys::exit_now(1),
    }
}

fn pid1(chan: Channel, cfg: InitConfig, host: HostFds, for_sandboxd: ForSandboxd) -> ! {
    // If the shim dies (stop, kill -9), the whole sandbox goes with it:
    // killing a PID namespace's init kills every process in it.
    if let Err(e) = sys::set_parent_death_signal(libc::SIGKILL) {
        fail(&chan, format!("PR_SET_PDEATHSIG: {e}"));
    }
    if let Err(e) = mounts::build_root(&cfg, host) {
        fail(&chan, e.to_string());
    }
    if let Err(e) = rustix::system::sethostname(cfg.id.as_bytes()) {
        fail(&chan, format!("sethostname: {e}"));
    }
    if !cfg.network_host {
        if let Err(e) = sandhub_gateway::tun::loopback_up() {
            fail(&chan, format!("bringing lo up: {e}"));
        }
    }
    // PID 1 goes on as sandboxd (a fork less, ~0.4 ms of every cold
    // create). As the namespace's init it inherits every orphan, which its
    // runtime reaps (`sandboxd::process::reap_as_init`), and the kernel
    // keeps the sandbox's own processes from killing or stopping it: a
    // workload's `kill -9 -1` or `kill -STOP 1` leaves it serving.
    sandboxd_main(chan, cfg, for_sandboxd)
}

/// The base environment of sandboxd and, through it, of every process it
/// starts; the template's `env` overrides it. Nothing of the hub's own
/// environment (which may hold credentials) gets in.
fn base_env(cfg: &InitConfig) -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), "/root".into()),
        ("HOSTNAME".into(), cfg.id.clone()),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

fn sandboxd_main(chan: Channel, cfg: InitConfig, made: ForSandboxd) -> ! {
    let _ = rustix::thread::set_name(c"sandboxd");
    // Ignored dispositions survive exec: undo the shim's and any the hub
    // was started with (nohup, a shell ignoring SIGQUIT), or workloads
    // could not be interrupted. SIGPIPE stays ignored, as in any Rust
    // program (std restores it for the children it spawns).
    for sig in 1..32 {
        if ![libc::SIGKILL, libc::SIGSTOP, libc::SIGPIPE].contains(&sig) {
            let _ = sys::default_signal(sig);
        }
    }
    let ForSandboxd {
        listeners,
        config,
        grpc_base,
    } = made;
    // Single-threaded here: mutating the environment is sound.
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    for (k, v) in base_env(&cfg).into_iter().chain(cfg.env.clone()) {
        std::env::set_var(k, v);
    }
    // One thread: an idle sandbox should cost a few MiB, not a worker pool.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&chan, format!("tokio runtime: {e}")),
    };
    let chan = Arc::new(Mutex::new(Some(chan)));
    let result = rt.block_on(async {
        // Workloads get the seccomp filter, no_new_privs and a normal OOM
        // score; sandboxd itself keeps its mount rights for resets.
        let daemon = sandboxd::Daemon::with_child_setup(config, Some(seccomp::child_setup))?;
        daemon.start_entrypoint();
        let ready = chan.clone();
        sandboxd::server::run_on(
            daemon,
            routes::extra_routes(),
            listeners,
            grpc_base,
            move || announce_ready(ready),
        )
        .await
    });
    match result {
        Ok(()) => sys::exit_now(0),
        Err(e) => {
            let msg = format!("sandboxd: {e:#}");
            if let Some(chan) = chan.lock().unwrap_or_else(|p| p.into_inner()).take() {
                fail(&chan, msg);
            }
            eprintln!("sandbox init: {msg}");
            sys::exit_now(1)
        }
    }
}

/// Tells the hub "ready" (sandboxd serves its listeners), hands fd 0
/// back to /dev/null and clears trash left by earlier resets.
fn announce_ready(chan: Arc<Mutex<Option<Channel>>>) {
    if let Some(chan) = chan.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = chan.send(&Msg::Ready);
        let _ = sys::null_over(0);
        std::mem::forget(chan);
    }
    // A blocking thread only when there is trash: an idle sandbox's
    // sandboxd is then one thread, and no thread's malloc arena.
    let overlay = Path::new(workspace::OVERLAY_DIR);
    match workspace::trash(overlay) {
        Ok(trash) if trash.is_empty() => {}
        Ok(trash) => drop(tokio::task::spawn_blocking(move || {
            workspace::purge_trash(&trash)
        })),
        Err(e) => eprintln!("sandbox init: listing {}: {e}", overlay.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(workdir: Option<&str>, user: Option<&str>, entrypoint: &[&str]) -> InitConfig {
        InitConfig {
            id: "sb-test".into(),
            state_dir: "/nonexistent".into(),
            lower_layers: vec![],
            root_fs: None,
            host_etc: "/etc".into(),
            env: Default::default(),
            workdir: workdir.map(Into::into),
            user: user.map(Into::into),
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            network_host: false,
            memory_mb: None,
            max_upload_bytes: 123_456,
            volumes: vec![],
            idmap: super::super::idmap::IdMap::for_current_user(),
        }
    }

    /// What sandboxd was given before its flags were parsed ahead: the
    /// sandbox's settings as command-line flags.
    fn parsed_from_flags(cfg: &InitConfig) -> sandboxd::Config {
        use clap::Parser as _;
        let max_upload = cfg.max_upload_bytes.to_string();
        let mut flags = vec!["sandboxd", "--legacy-port", "0", "--root-dir", WORKSPACE];
        flags.extend(["--max-upload-bytes", &max_upload]);
        if let Some(dir) = &cfg.workdir {
            flags.extend(["--default-cwd", dir]);
        }
        if let Some(user) = &cfg.user {
            flags.extend(["--user", user]);
        }
        let argv = serde_json::to_string(&cfg.entrypoint).unwrap();
        if !cfg.entrypoint.is_empty() {
            flags.extend(["--entrypoint", &argv]);
        }
        sandboxd::Config::try_parse_from(flags).unwrap()
    }

    #[test]
    fn the_config_parsed_ahead_is_the_one_the_flags_gave() {
        for cfg in [
            config(None, None, &[]),
            config(
                Some("/srv/app"),
                Some("1000:1000"),
                &["python", "-m", "http.server"],
            ),
        ] {
            let ahead = sandboxd_config(base_sandboxd_config().unwrap(), &cfg);
            assert_eq!(
                format!("{ahead:?}"),
                format!("{:?}", parsed_from_flags(&cfg))
            );
        }
    }
}
