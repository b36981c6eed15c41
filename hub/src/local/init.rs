//! The inside of a sandbox: what `sandhub __sandbox-init` runs.
//!
//! The hub spawns `<exe> __sandbox-init` with the sync socket as stdin and
//! the sandbox log as stdout/stderr, then (see `channel.rs`):
//!
//! 1. **stage 1** reads the config, lowers its `oom_score_adj` to -900
//!    (only possible before leaving the initial user namespace; PID 1 and
//!    sandboxd inherit it, workloads reset it in `child_setup`), forks the
//!    shim and exits, so the shim is nobody's child in the hub;
//! 2. **the shim** leaves the hub's session, unshares the user, mount, PID,
//!    UTS, IPC, cgroup (and network) namespaces, opens the host paths it
//!    needs, reports its pid; once the hub wrote its id maps it becomes
//!    root inside, forks PID 1 and waits for it. Its host pid plus start
//!    time identify the sandbox across hub restarts;
//! 3. **PID 1** builds the root filesystem, sets the hostname, brings `lo`
//!    up, forks sandboxd (always PID 2) and then only reaps: orphans of the
//!    sandbox land on it, and tokio in sandboxd reaps only its own
//!    children. It forwards SIGTERM to sandboxd and exits with it;
//! 4. **sandboxd** serves REST and gRPC on the socket dir and tells the hub
//!    it is ready once both sockets accept connections.
//!
//! Stage 1, the shim and PID 1 stay single-threaded: `unshare
//! (CLONE_NEWUSER)` demands it, and they fork.

use std::{
    ffi::OsString,
    os::fd::{AsFd, FromRawFd, OwnedFd},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    channel::{Channel, InitConfig, Msg},
    mounts::{self, HostFds},
    sys::{self, Forked},
    workspace::{self, WorkspaceLayout, SANDBOXD_PID, SOCKET_DIR, WORKSPACE},
};

/// The hidden subcommand `main.rs` dispatches here.
pub const SUBCOMMAND: &str = "__sandbox-init";

/// OOM score of the sandbox's own machinery (shim, PID 1, sandboxd).
const MACHINERY_OOM_SCORE_ADJ: &str = "-900";

/// Entry point of `sandhub __sandbox-init [ARGS]`; `args` excludes the
/// subcommand. Must be called before any thread (tokio) exists.
///
/// - no arguments: start a sandbox (stage 1; the hub is on stdin);
/// - `reset <shim-pid>`: reset that sandbox's workspace from outside by
///   entering its namespaces (tests and debugging; the hub's route goes
///   through sandboxd instead). Prints `reset_us=<microseconds>`.
pub fn main(args: Vec<OsString>) -> ! {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match args.first().map(String::as_str) {
        None => stage1(),
        Some("reset") => {
            let code = match args.get(1).and_then(|p| p.parse().ok()) {
                Some(pid) => reset_from_outside(pid),
                None => {
                    eprintln!("usage: sandhub {SUBCOMMAND} reset <shim-pid>");
                    2
                }
            };
            sys::exit_now(code)
        }
        Some(other) => {
            eprintln!("sandhub {SUBCOMMAND}: unknown mode {other:?}");
            sys::exit_now(2)
        }
    }
}

/// Reports `msg` to the hub (best effort) and the log, then exits.
fn fail(chan: &Channel, msg: String) -> ! {
    eprintln!("sandbox init: {msg}");
    let _ = chan.send(&Msg::Error(msg));
    sys::exit_now(1)
}

fn stage1() -> ! {
    // SAFETY: fd 0 is the sync socket the hub passed as stdin; nothing
    // else in this fresh process owns it.
    let chan = Channel(unsafe { OwnedFd::from_raw_fd(0) });
    let cfg: InitConfig = match chan.recv(None) {
        Ok(Some(Msg::Config(json))) => match serde_json::from_slice(&json) {
            Ok(cfg) => cfg,
            Err(e) => fail(&chan, format!("bad config: {e}")),
        },
        Ok(None) => sys::exit_now(1),
        Ok(Some(other)) => fail(&chan, format!("expected the config, got {other:?}")),
        Err(e) => fail(&chan, format!("reading the config: {e}")),
    };
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", MACHINERY_OOM_SCORE_ADJ) {
        // Rootless: lowering needs CAP_SYS_RESOURCE; run unprotected.
        eprintln!("sandbox init: cannot lower oom_score_adj: {e}");
    }
    match sys::fork() {
        Ok(Forked::Parent(_)) => sys::exit_now(0),
        Ok(Forked::Child) => shim(chan, cfg),
        Err(e) => fail(&chan, format!("fork: {e}")),
    }
}

fn shim(chan: Channel, cfg: InitConfig) -> ! {
    if let Err(e) = sys::setsid() {
        fail(&chan, format!("setsid: {e}"));
    }
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
        let _ = sys::ignore_signal(sig);
    }
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
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
    let host = match HostFds::open(&cfg) {
        Ok(h) => h,
        Err(e) => fail(&chan, e.to_string()),
    };
    if let Err(e) = chan.send(&Msg::ShimPid(sys::getpid())) {
        fail(&chan, format!("reporting the shim pid: {e}"));
    }
    match chan.recv(None) {
        Ok(Some(Msg::Mapped)) => {}
        Ok(Some(other)) => fail(&chan, format!("expected Mapped, got {other:?}")),
        Ok(None) | Err(_) => sys::exit_now(1),
    }
    if let Err(e) = sys::become_root(cfg.idmap.allows_setgroups()) {
        fail(&chan, format!("becoming root in the user namespace: {e}"));
    }
    let pid1 = match sys::fork() {
        Ok(Forked::Child) => pid1(chan, cfg, host),
        Ok(Forked::Parent(pid)) => pid,
        Err(e) => fail(&chan, format!("forking PID 1: {e}")),
    };
    drop(host);
    let _ = sys::null_over(0);
    std::mem::forget(chan); // fd 0 now is /dev/null
    let _ = sys::forward_signals_to(pid1, &[libc::SIGTERM]);
    loop {
        match sys::waitpid(pid1, 0) {
            Ok((_, status)) => sys::exit_now(sys::exit_code(status)),
            Err(_) => sys::exit_now(1),
        }
    }
}

fn pid1(chan: Channel, cfg: InitConfig, host: HostFds) -> ! {
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
        if let Err(e) = sys::loopback_up() {
            fail(&chan, format!("bringing lo up: {e}"));
        }
    }
    let sandboxd = match sys::fork() {
        Ok(Forked::Child) => sandboxd_main(chan, cfg),
        Ok(Forked::Parent(pid)) => pid,
        Err(e) => fail(&chan, format!("forking sandboxd: {e}")),
    };
    if sandboxd != SANDBOXD_PID {
        eprintln!("sandbox init: sandboxd is pid {sandboxd}, expected {SANDBOXD_PID}");
    }
    let _ = sys::null_over(0);
    std::mem::forget(chan);
    let _ = sys::forward_signals_to(sandboxd, &[libc::SIGTERM, libc::SIGINT]);
    loop {
        match sys::waitpid(-1, 0) {
            Ok((pid, status)) if pid == sandboxd => sys::exit_now(sys::exit_code(status)),
            Ok(_) => {}
            Err(_) => sys::exit_now(1),
        }
    }
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

fn sandboxd_main(chan: Channel, cfg: InitConfig) -> ! {
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
        let _ = sys::default_signal(sig);
    }
    // Parsed before the template's env is applied, so `SANDBOXD_*`
    // variables in it cannot reconfigure the daemon.
    use clap::Parser as _;
    let config = match sandboxd::Config::try_parse_from([
        "sandboxd",
        "--unix-socket",
        SOCKET_DIR,
        "--legacy-port",
        "0",
        "--root-dir",
        WORKSPACE,
    ]) {
        Ok(c) => c,
        Err(e) => fail(&chan, format!("sandboxd flags: {e}")),
    };
    // Single-threaded here: mutating the environment is sound.
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    for (k, v) in base_env(&cfg).into_iter().chain(cfg.env.clone()) {
        std::env::set_var(k, v);
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cfg.log_filter))
        .with_writer(std::io::stderr)
        .try_init();
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
        let daemon = sandboxd::Daemon::new(config)?;
        tokio::spawn(announce_ready(chan.clone()));
        sandboxd::server::run(daemon).await
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

/// Tells the hub "ready" once both sockets accept connections, then hands
/// fd 0 back to /dev/null and clears trash left by earlier resets.
async fn announce_ready(chan: Arc<Mutex<Option<Channel>>>) {
    let dir = Path::new(SOCKET_DIR);
    let socks = [
        dir.join(sandhub_api::sandboxd::REST_SOCKET),
        dir.join(sandhub_api::sandboxd::GRPC_SOCKET),
    ];
    // sandboxd binds both before its first await; on this single-threaded
    // runtime that is usually done by our first poll. Stale socket files
    // from an earlier run refuse connections, so connecting is the test.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socks
        .iter()
        .all(|s| std::os::unix::net::UnixStream::connect(s).is_ok())
    {
        if Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(Duration::from_micros(250)).await;
    }
    if let Some(chan) = chan.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = chan.send(&Msg::Ready);
        let _ = sys::null_over(0);
        std::mem::forget(chan);
    }
    let _ =
        tokio::task::spawn_blocking(|| workspace::purge_trash(Path::new(workspace::OVERLAY_DIR)))
            .await;
}

/// `__sandbox-init reset <shim-pid>`: joins the sandbox's user, mount and
/// PID namespaces (through its PID 1) and resets its workspace in a child
/// that is a member of the PID namespace, so it can see and kill the
/// sandbox's processes.
fn reset_from_outside(shim: i32) -> i32 {
    let run = || -> std::io::Result<i32> {
        let init = *super::procfs::children(shim)?
            .first()
            .ok_or_else(|| std::io::Error::other(format!("shim {shim} has no PID 1")))?;
        let ns = |name: &str| std::fs::File::open(format!("/proc/{init}/ns/{name}"));
        let (user, mnt, pid) = (ns("user")?, ns("mnt")?, ns("pid")?);
        sys::setns(user.as_fd(), libc::CLONE_NEWUSER)?;
        sys::setns(mnt.as_fd(), libc::CLONE_NEWNS)?;
        sys::setns(pid.as_fd(), libc::CLONE_NEWPID)?;
        sys::become_root(false)?;
        match sys::fork()? {
            Forked::Child => {
                let started = Instant::now();
                let code = match WorkspaceLayout::discover()
                    .and_then(|l| workspace::swap_layers(&l).map(|trash| (l, trash)))
                {
                    Ok((_, trash)) => {
                        println!("reset_us={}", started.elapsed().as_micros());
                        let _ = std::fs::remove_dir_all(trash);
                        0
                    }
                    Err(e) => {
                        eprintln!("reset: {e}");
                        1
                    }
                };
                use std::io::Write;
                let _ = std::io::stdout().flush();
                sys::exit_now(code)
            }
            Forked::Parent(child) => Ok(sys::exit_code(sys::waitpid(child, 0)?.1)),
        }
    };
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("reset: {e}");
            1
        }
    }
}
