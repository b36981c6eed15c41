//! Starting a workload without copying the daemon: `clone(CLONE_VM |
//! CLONE_VFORK)`, the way glibc's `posix_spawn` and Go's `os/exec` start
//! processes.
//!
//! Why not `std`/`tokio`'s `Command`: every process sandboxd starts needs
//! work between fork and exec (signal dispositions back to default, the
//! working directory by fd, the local backend's seccomp filter), and any
//! `pre_exec` hook sends std down its `fork` path, which copies the page
//! tables of a multi-threaded daemon on every exec. A vfork-style child
//! shares the daemon's memory until it execs, so starting `true` costs a
//! few syscalls instead of a copy.
//!
//! What that sharing demands of the child (see [`child_main`]):
//! - it runs on its own stack, with every signal blocked from before the
//!   clone until its dispositions are back to default, so no handler of the
//!   daemon ever runs in it;
//! - it allocates nothing, takes no lock and only makes raw system calls
//!   (no glibc `setuid`, which would signal the daemon's threads): all it
//!   needs (argv, environment, candidate paths) is built beforehand;
//! - it reports a failure by writing the errno into memory the parent
//!   reads once the clone returns (the parent is suspended until the child
//!   execs or exits, so there is no race) and `_exit`s.
//!
//! The caller gets a [`Child`] shaped like tokio's (the same pipe types),
//! reaped through a pidfd the clone hands over atomically (before Linux
//! 5.2, which lacks `CLONE_PIDFD`, by a blocking-pool thread in `waitpid`).
//!
//! sandboxd is PID 1 of its PID namespace (the local backend's sandboxes,
//! and a Pod's container), so every orphan of the sandbox becomes its
//! child too, and someone has to reap those or they stay zombies for the
//! sandbox's life. [`reap_as_init`] does, on each `SIGCHLD`, with
//! `waitpid(-1)`, which cannot pass over a child of ours: so every child
//! started here is in [`CHILDREN`] from its clone on, and the status of one
//! the init reaper took is kept there for its [`Child`] to collect.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    ffi::{CString, OsStr, OsString},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::{ffi::OsStrExt, process::ExitStatusExt},
    },
    process::ExitStatus,
    ptr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, MutexGuard, OnceLock,
    },
};

use tokio::{
    io::unix::AsyncFd,
    process::{ChildStderr, ChildStdin, ChildStdout},
};

use crate::ChildSetup;

/// Where one of the child's standard streams goes.
pub(crate) enum Stdio {
    Null,
    /// A pipe whose other end the [`Child`] holds.
    Piped,
    /// This fd (a terminal's slave end).
    Fd(OwnedFd),
}

/// Where the child's working directory comes from.
enum Cwd {
    Inherit,
    Path(CString),
    /// A directory already opened beneath the root: the child lands on
    /// that very inode, whatever was swapped in at its path since.
    Fd(OwnedFd),
}

/// What the child leads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lead {
    /// Nothing: it stays in the daemon's group.
    Nothing,
    /// A process group of its own, so one `kill(-pgid)` reaches all it starts.
    Group,
    /// A session of its own whose controlling terminal is its stdin (a PTY).
    Terminal,
}

/// A process to start; see the module's notes for why it is not std's.
pub(crate) struct Command {
    program: OsString,
    args: Vec<OsString>,
    env: HashMap<OsString, OsString>,
    cwd: Cwd,
    stdio: [Stdio; 3],
    lead: Lead,
    ids: Option<(u32, u32)>,
    setup: Option<ChildSetup>,
    kill_on_drop: bool,
    /// Off only in tests of the pre-5.2 path.
    pidfd: bool,
}

impl Command {
    pub(crate) fn new(program: impl AsRef<OsStr>) -> Self {
        Command {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: HashMap::new(),
            cwd: Cwd::Inherit,
            stdio: [Stdio::Null, Stdio::Null, Stdio::Null],
            lead: Lead::Nothing,
            ids: None,
            setup: None,
            kill_on_drop: false,
            pidfd: true,
        }
    }

    pub(crate) fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(
        &mut self,
        args: I,
    ) -> &mut Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets (or overrides) a variable of the environment the child gets
    /// on top of the daemon's own.
    pub(crate) fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        self.env
            .insert(key.as_ref().to_owned(), value.as_ref().to_owned());
        self
    }

    pub(crate) fn current_dir(&mut self, dir: impl AsRef<OsStr>) -> &mut Self {
        self.cwd = match CString::new(dir.as_ref().as_bytes()) {
            Ok(c) => Cwd::Path(c),
            // Reported at spawn, like every other NUL.
            Err(_) => Cwd::Path(CString::default()),
        };
        self
    }

    /// Starts the child in the directory `dir` is open on.
    pub(crate) fn current_dir_fd(&mut self, dir: OwnedFd) -> &mut Self {
        self.cwd = Cwd::Fd(dir);
        self
    }

    pub(crate) fn stdin(&mut self, s: Stdio) -> &mut Self {
        self.stdio[0] = s;
        self
    }

    pub(crate) fn stdout(&mut self, s: Stdio) -> &mut Self {
        self.stdio[1] = s;
        self
    }

    pub(crate) fn stderr(&mut self, s: Stdio) -> &mut Self {
        self.stdio[2] = s;
        self
    }

    pub(crate) fn lead(&mut self, lead: Lead) -> &mut Self {
        self.lead = lead;
        self
    }

    /// Runs the child as `uid`/`gid` with no supplementary groups.
    pub(crate) fn ids(&mut self, uid: u32, gid: u32) -> &mut Self {
        self.ids = Some((uid, gid));
        self
    }

    /// A hook run in the child last before exec; it must be
    /// async-signal-safe and allocate nothing ([`ChildSetup`]'s contract).
    pub(crate) fn setup(&mut self, setup: ChildSetup) -> &mut Self {
        self.setup = Some(setup);
        self
    }

    /// SIGKILLs the child if its [`Child`] is dropped before it was reaped.
    pub(crate) fn kill_on_drop(&mut self, yes: bool) -> &mut Self {
        self.kill_on_drop = yes;
        self
    }

    /// Starts the process. Errors are the exec's (or the setup's) errno,
    /// as std reports them: `NotFound` for a missing program,
    /// `InvalidInput` for a NUL byte.
    pub(crate) fn spawn(&mut self) -> io::Result<Child> {
        let mut plan = Plan::new(self)?;
        let null = dev_null()?.as_raw_fd();
        // Our ends of the pipes, and the fds the child dup2s onto 0-2
        // (closed here once it has).
        let mut pipes: [Option<OwnedFd>; 3] = [None, None, None];
        let mut theirs: [Option<OwnedFd>; 3] = [None, None, None];
        let mut stdio = [null; 3];
        for (i, s) in self.stdio.iter_mut().enumerate() {
            let fd = match std::mem::replace(s, Stdio::Null) {
                Stdio::Null => continue,
                Stdio::Fd(fd) => fd,
                Stdio::Piped => {
                    let (r, w) = pipe()?;
                    let (ours, child) = if i == 0 { (w, r) } else { (r, w) };
                    pipes[i] = Some(ours);
                    child
                }
            };
            // Below 3 it would be overwritten by an earlier dup2 in the
            // child; the daemon keeps 0-2 open, so this is a safety net.
            let fd = above_stdio(fd)?;
            stdio[i] = fd.as_raw_fd();
            theirs[i] = Some(fd);
        }
        let cwd_fd = match &self.cwd {
            Cwd::Fd(fd) => fd.as_raw_fd(),
            _ => -1,
        };
        let cwd_path = match &self.cwd {
            Cwd::Path(p) if p.is_empty() => return Err(nul_error()),
            Cwd::Path(p) => p.as_ptr(),
            _ => ptr::null(),
        };
        let mut args = ChildArgs {
            stdio,
            cwd_fd,
            cwd_path,
            lead: self.lead,
            ids: self.ids,
            setup: self.setup,
            candidates: plan.candidate_ptrs.as_ptr(),
            argv: plan.argv_ptrs.as_ptr(),
            sh_argv: plan.sh_argv_ptrs.as_mut_ptr(),
            envp: plan.envp_ptrs.as_ptr(),
            errno: 0,
        };
        let want_pidfd = self.pidfd && !NO_PIDFD.load(Ordering::Relaxed);
        // Held from before the clone until the pid is listed (or reaped):
        // the init reaper must never take it for an orphan.
        let mut ours = children();
        let (pid, pidfd) = STACK.with(|stack| {
            let mut stack = stack.borrow_mut();
            let stack = match stack.as_mut() {
                Some(s) => s,
                None => stack.insert(Stack::new()?),
            };
            match clone_vfork(stack, &mut args, want_pidfd) {
                // Before Linux 5.2: no CLONE_PIDFD; from now on, wait on a thread.
                Err(e) if want_pidfd && e.raw_os_error() == Some(libc::EINVAL) => {
                    NO_PIDFD.store(true, Ordering::Relaxed);
                    clone_vfork(stack, &mut args, false)
                }
                r => r,
            }
        })?;
        drop(theirs);
        // Written by the child behind the compiler's back (shared memory).
        // SAFETY: a plain read of a live, aligned i32.
        let errno = unsafe { ptr::read_volatile(&args.errno) };
        if errno != 0 {
            // The child `_exit`ed; reap it now (it is exiting already).
            let _ = waitpid(pid, 0);
            return Err(io::Error::from_raw_os_error(errno));
        }
        ours.insert(pid, None);
        drop(ours);
        let registered = match pidfd {
            // SAFETY: the pidfd moves into the AsyncFd and is closed only
            // when it drops, so the registered fd stays open and the same.
            Some(fd) => {
                unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                    .map(Reaper::PidFd)
                    .map_err(io::Error::from)
            }
            None => Ok(Reaper::Thread(tokio::task::spawn_blocking(move || {
                wait_blocking(pid)
            }))),
        };
        let reaper = match registered {
            Ok(r) => r,
            Err(e) => {
                // No way to reap it later: kill and reap it now.
                kill_unreaped(pid);
                let _ = wait_blocking(pid);
                return Err(e);
            }
        };
        // Killed if wiring its pipes fails below; then as asked.
        let mut child = Child {
            pid,
            reaper: Some(reaper),
            status: None,
            kill_on_drop: true,
            stdin: None,
            stdout: None,
            stderr: None,
        };
        let [stdin, stdout, stderr] = pipes;
        child.stdin = stdin.map(|f| ChildStdin::from_std(f.into())).transpose()?;
        child.stdout = stdout
            .map(|f| ChildStdout::from_std(f.into()))
            .transpose()?;
        child.stderr = stderr
            .map(|f| ChildStderr::from_std(f.into()))
            .transpose()?;
        child.kill_on_drop = self.kill_on_drop;
        Ok(child)
    }
}

/// How a [`Child`] learns that it exited.
enum Reaper {
    /// Its pidfd, readable once it has.
    PidFd(AsyncFd<OwnedFd>),
    /// Kernels before 5.2 (no `CLONE_PIDFD`): a blocking-pool thread waits.
    Thread(tokio::task::JoinHandle<io::Result<ExitStatus>>),
}

/// A started process, reaped through its pidfd.
pub(crate) struct Child {
    pid: i32,
    /// `None` only while dropping.
    reaper: Option<Reaper>,
    status: Option<ExitStatus>,
    kill_on_drop: bool,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) stdout: Option<ChildStdout>,
    pub(crate) stderr: Option<ChildStderr>,
}

impl Child {
    pub(crate) fn id(&self) -> i32 {
        self.pid
    }

    /// Waits for the process to exit and reaps it. Cancel-safe: the
    /// status, once read, is kept for the next call.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.status {
                return Ok(s);
            }
            match &mut self.reaper {
                Some(Reaper::PidFd(pidfd)) => {
                    let mut ready = pidfd.readable().await?;
                    match reap(self.pid)? {
                        Some(s) => self.status = Some(s),
                        None => ready.clear_ready(),
                    }
                }
                Some(Reaper::Thread(waiting)) => {
                    let status = waiting.await.map_err(io::Error::other)??;
                    self.status = Some(status);
                }
                None => return Err(io::Error::other("child already dropped")),
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        {
            // Under the lock, so the init reaper cannot free the pid (for
            // the kernel to hand out again) between the look and the kill.
            let mut ours = children();
            if ours.get(&self.pid).copied().flatten().is_some() {
                // The init reaper reaped it for us: nothing left to do.
                ours.remove(&self.pid);
                return;
            }
            if self.kill_on_drop {
                // SAFETY: listed and unreaped: the pid still names our child.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
            }
        }
        // Reap it whenever it exits, or it stays a zombie for the daemon's
        // life. Without a runtime (shutdown) the daemon is going anyway.
        // A waiting thread reaps it on its own.
        let (pid, pidfd) = match self.reaper.take() {
            Some(Reaper::PidFd(fd)) => (self.pid, fd),
            _ => return,
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                loop {
                    let Ok(mut ready) = pidfd.readable().await else {
                        return;
                    };
                    match reap(pid) {
                        Ok(None) => ready.clear_ready(),
                        _ => return,
                    }
                }
            });
        }
    }
}

/// Set once a clone with `CLONE_PIDFD` was refused (Linux before 5.2).
static NO_PIDFD: AtomicBool = AtomicBool::new(false);

/// Our unreaped children, with the status of each one the init reaper
/// ([`reap_orphans`]) reaped before its [`Child`] did. A pid enters under
/// this lock together with its clone, and every reap (the owner's or the
/// init reaper's) happens under it, so a status is never lost and a pid in
/// here is never one the kernel handed out again.
static CHILDREN: Mutex<BTreeMap<i32, Option<ExitStatus>>> = Mutex::new(BTreeMap::new());

fn children() -> MutexGuard<'static, BTreeMap<i32, Option<ExitStatus>>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

/// SIGKILLs our child `pid` unless it was reaped already: looked up under
/// the lock, so the init reaper cannot free the pid (for the kernel to hand
/// out again) between the look and the kill.
fn kill_unreaped(pid: i32) {
    let ours = children();
    if ours.get(&pid).is_some_and(Option::is_none) {
        // SAFETY: listed and unreaped, so the pid still names our child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Reaps every exited child that is not one of ours (an orphan the kernel
/// handed to PID 1), and keeps the statuses of ours for their owners.
/// Returns how many orphans it reaped.
pub fn reap_orphans() -> usize {
    let mut ours = children();
    let mut orphans = 0;
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out-pointer. __WALL: clone children too.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
        if pid > 0 {
            match ours.get_mut(&pid) {
                Some(kept) => *kept = Some(ExitStatus::from_raw(status)),
                None => orphans += 1,
            }
        } else if pid < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            // 0: children left, none exited; ECHILD: no children at all.
            return orphans;
        }
    }
}

/// Whether this process is PID 1 of its PID namespace: a sandbox's init,
/// or a Pod's first process.
pub fn is_init() -> bool {
    std::process::id() == 1
}

/// When this process is PID 1 of its namespace, reaps orphans for as long
/// as the runtime runs (see the module's notes); elsewhere does nothing,
/// since orphans go to an init that is not us.
pub fn reap_as_init() -> io::Result<()> {
    if !is_init() {
        return Ok(());
    }
    use tokio::signal::unix::{signal, SignalKind};
    let mut exited = signal(SignalKind::child())?;
    tokio::spawn(async move {
        // Signals merge: each wake-up reaps every orphan there is.
        loop {
            let orphans = reap_orphans();
            if orphans > 0 {
                tracing::debug!(orphans, "reaped orphans");
            }
            if exited.recv().await.is_none() {
                return;
            }
        }
    });
    Ok(())
}

/// `waitpid` on our own child, retried on EINTR: its status once it has
/// exited (with `WNOHANG`, `None` while it runs; without, it blocks).
fn waitpid(pid: i32, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid out-pointer; the pid is our child.
        match unsafe { libc::waitpid(pid, &mut status, flags | libc::__WALL) } {
            0 => return Ok(None),
            r if r == pid => return Ok(Some(ExitStatus::from_raw(status))),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// The status once the child has exited, without waiting: from the init
/// reaper if it took the child first, else from `waitpid`.
fn reap(pid: i32) -> io::Result<Option<ExitStatus>> {
    let mut ours = children();
    if let Some(status) = ours.get(&pid).copied().flatten() {
        ours.remove(&pid);
        return Ok(Some(status));
    }
    let status = waitpid(pid, libc::WNOHANG)?;
    if status.is_some() {
        ours.remove(&pid);
    }
    Ok(status)
}

/// Waits for the child to exit, on a thread that may block (so without
/// [`CHILDREN`]'s lock: if the init reaper takes the child meanwhile, the
/// wait ends in ECHILD and the status is in there).
fn wait_blocking(pid: i32) -> io::Result<ExitStatus> {
    let status = match waitpid(pid, 0) {
        Ok(status) => status,
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => None,
        Err(e) => return Err(e),
    };
    let mut ours = children();
    let kept = ours.remove(&pid).flatten();
    status
        .or(kept)
        .ok_or_else(|| io::Error::other("waitpid returned without a status"))
}

/// Everything the child reads, as C pointers into a [`Plan`] the parent
/// keeps alive (and suspended) until the child has execed or exited.
struct ChildArgs {
    stdio: [RawFd; 3],
    cwd_fd: RawFd,
    cwd_path: *const libc::c_char,
    lead: Lead,
    ids: Option<(u32, u32)>,
    setup: Option<ChildSetup>,
    /// NULL-terminated: the paths to try `execve` on, in PATH order.
    candidates: *const *const libc::c_char,
    argv: *const *const libc::c_char,
    /// `["/bin/sh", <slot for the script>, argv[1..]..., NULL]`, for a
    /// file without a `#!` line (`ENOEXEC`), as `execvp` does.
    sh_argv: *mut *const libc::c_char,
    envp: *const *const libc::c_char,
    /// Set by the child before it `_exit`s instead of execing.
    errno: i32,
}

/// The C strings of one spawn, owned by the parent.
struct Plan {
    _strings: Vec<CString>,
    candidate_ptrs: Vec<*const libc::c_char>,
    argv_ptrs: Vec<*const libc::c_char>,
    sh_argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

/// The shell `execvp` hands a script without `#!` to.
const SH: &[u8] = b"/bin/sh\0";

impl Plan {
    fn new(cmd: &Command) -> io::Result<Plan> {
        let cstr = |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| nul_error());
        let mut strings = Vec::new();
        // The environment: the daemon's, then the command's overrides.
        let daemon_env = std::env::vars_os().filter(|(k, _)| !cmd.env.contains_key(k));
        let overrides = cmd.env.iter().map(|(k, v)| (k.clone(), v.clone()));
        let mut envp = Vec::new();
        let mut path = None;
        for (k, v) in daemon_env.chain(overrides) {
            let mut kv = k.clone();
            kv.push("=");
            kv.push(&v);
            envp.push(cstr(&kv)?);
            if k == "PATH" {
                path = Some(v);
            }
        }
        let program = cstr(&cmd.program)?;
        let mut argv = vec![program.clone()];
        for a in &cmd.args {
            argv.push(cstr(a)?);
        }
        // Where execvp would look, decided here because the child may not
        // allocate: a name with a slash as it is, else each PATH entry
        // (glibc's default when there is none; an empty entry is the
        // working directory).
        let mut candidates = Vec::new();
        if program.as_bytes().contains(&b'/') {
            candidates.push(program);
        } else if !program.as_bytes().is_empty() {
            let path = path.unwrap_or_else(|| "/bin:/usr/bin".into());
            for dir in path.as_bytes().split(|&b| b == b':') {
                let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
                let mut full = dir.to_vec();
                full.push(b'/');
                full.extend_from_slice(program.as_bytes());
                candidates.push(CString::new(full).map_err(|_| nul_error())?);
            }
        }
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(ptr::null()))
                .collect::<Vec<_>>()
        };
        let candidate_ptrs = ptrs(&candidates);
        let argv_ptrs = ptrs(&argv);
        let envp_ptrs = ptrs(&envp);
        let mut sh_argv_ptrs = vec![SH.as_ptr().cast(), ptr::null()];
        sh_argv_ptrs.extend(argv_ptrs.iter().skip(1));
        strings.extend(candidates);
        strings.extend(argv);
        strings.extend(envp);
        Ok(Plan {
            _strings: strings,
            candidate_ptrs,
            argv_ptrs,
            sh_argv_ptrs,
            envp_ptrs,
        })
    }
}

fn nul_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "nul byte found in provided data",
    )
}

/// `/dev/null`, opened once for the daemon's life. Only a character
/// device will do: the sandbox's own root may replace the path with a
/// file of its choosing, which every workload's stdin would then read.
/// [`crate::Daemon`] opens it at start, before any workload runs.
pub(crate) fn dev_null() -> io::Result<&'static OwnedFd> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    static NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open("/dev/null")?;
    if !f.metadata()?.file_type().is_char_device() {
        return Err(io::Error::other("/dev/null is not a character device"));
    }
    Ok(NULL.get_or_init(|| f.into()))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just opened both; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an fd we own; the result is a new fd.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just opened it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// The child's stack: mapped once per thread that spawns, with a guard
/// page below it so an overflow faults instead of writing daemon memory.
struct Stack {
    base: *mut libc::c_void,
}

const STACK_SIZE: usize = 256 * 1024;
const GUARD: usize = 4096;

thread_local! {
    static STACK: RefCell<Option<Stack>> = const { RefCell::new(None) };
}

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: a fresh anonymous private mapping; checked below.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                STACK_SIZE + GUARD,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping what was just mapped.
            unsafe { libc::munmap(base, STACK_SIZE + GUARD) };
            return Err(e);
        }
        Ok(Stack { base })
    }

    fn top(&mut self) -> *mut libc::c_void {
        // Stacks grow down on every architecture sandboxd builds for; the
        // top is 16-byte aligned because the mapping is page-aligned.
        // SAFETY: one past the end of the mapping.
        unsafe { self.base.cast::<u8>().add(STACK_SIZE + GUARD).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no child runs on it any more
        // (each clone returns only after its child left it).
        unsafe { libc::munmap(self.base, STACK_SIZE + GUARD) };
    }
}

/// Clones the child with every signal blocked in this thread, so neither
/// this thread nor the child (which inherits the mask) runs a handler
/// while they share memory; returns once the child has execed or exited.
fn clone_vfork(
    stack: &mut Stack,
    args: &mut ChildArgs,
    want_pidfd: bool,
) -> io::Result<(i32, Option<OwnedFd>)> {
    let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut pidfd: libc::c_int = -1;
    // SAFETY: sigfillset initialises `all`; pthread_sigmask fills `old`.
    // clone runs `child_main` on a stack nobody else uses, with `args`
    // alive: CLONE_VFORK suspends this thread until the child execs or
    // exits. CLONE_PIDFD stores the pidfd in `pidfd`.
    let flags = libc::CLONE_VM
        | libc::CLONE_VFORK
        | libc::SIGCHLD
        | if want_pidfd { libc::CLONE_PIDFD } else { 0 };
    let pid = unsafe {
        libc::sigfillset(all.as_mut_ptr());
        libc::pthread_sigmask(libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr());
        let pid = libc::clone(
            child_main,
            stack.top(),
            flags,
            (args as *mut ChildArgs).cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let e = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), ptr::null_mut());
        if pid < 0 {
            return Err(e);
        }
        pid
    };
    // SAFETY: CLONE_PIDFD opened it for us (close-on-exec).
    Ok((
        pid,
        want_pidfd.then(|| unsafe { OwnedFd::from_raw_fd(pidfd) }),
    ))
}

/// The child, between clone and exec. Shares the daemon's memory: raw
/// system calls only, nothing allocated, nothing locked, nothing that
/// can unwind.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's ChildArgs, alive and untouched by the
    // suspended parent until this child execs or exits.
    let args = unsafe { &mut *arg.cast::<ChildArgs>() };
    // SAFETY: every call below is a plain system call on fds and C strings
    // the parent prepared; none allocates.
    let errno = unsafe { prepare(args) };
    let errno = match errno {
        0 => unsafe { exec(args) },
        e => e,
    };
    args.errno = if errno == 0 { libc::ENOEXEC } else { errno };
    // SAFETY: leaving without running any of the daemon's exit handlers.
    unsafe { libc::_exit(127) }
}

/// errno of the last failed call, read without std (which is fine to
/// call, but this keeps the child's path obviously allocation-free).
unsafe fn errno() -> i32 {
    *libc::__errno_location()
}

/// Everything between clone and exec, in std's order: stdio, ids, working
/// directory, group, signals, the setup hook. 0, or the errno that failed.
unsafe fn prepare(args: &ChildArgs) -> i32 {
    for (target, &fd) in args.stdio.iter().enumerate() {
        if libc::dup2(fd, target as i32) < 0 {
            return errno();
        }
    }
    if let Some((uid, gid)) = args.ids {
        // Raw system calls: glibc's wrappers would broadcast the change to
        // every thread of the daemon, whose memory this child shares.
        if libc::getuid() == 0 {
            // Dropping root keeps no supplementary group (as std does);
            // failing here (no CAP_SETGID in a user namespace) is not fatal.
            let _ = libc::syscall(libc::SYS_setgroups, 0, ptr::null::<libc::gid_t>());
        }
        if libc::syscall(libc::SYS_setgid, gid) != 0 || libc::syscall(libc::SYS_setuid, uid) != 0 {
            return errno();
        }
    }
    if args.cwd_fd >= 0 {
        if libc::fchdir(args.cwd_fd) != 0 {
            return errno();
        }
    } else if !args.cwd_path.is_null() && libc::chdir(args.cwd_path) != 0 {
        return errno();
    }
    match args.lead {
        Lead::Nothing => {}
        Lead::Group => {
            if libc::setpgid(0, 0) != 0 {
                return errno();
            }
        }
        Lead::Terminal => {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return errno();
            }
        }
    }
    // Every disposition back to default (a daemon handler must never run
    // here, and nothing the daemon ignores may reach the workload).
    let _ = crate::identity::default_signals();
    let mut empty: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut empty);
    libc::sigprocmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
    if let Some(setup) = args.setup {
        if let Err(e) = setup() {
            return e.raw_os_error().unwrap_or(libc::EINVAL);
        }
    }
    0
}

/// Tries each candidate path as glibc's `execvp` does; returns only on
/// failure, with the errno to report.
unsafe fn exec(args: &ChildArgs) -> i32 {
    let mut denied = false;
    let mut at = args.candidates;
    while !(*at).is_null() {
        let path = *at;
        libc::execve(path, args.argv, args.envp);
        match errno() {
            libc::ENOEXEC => {
                *args.sh_argv.add(1) = path;
                libc::execve(*args.sh_argv, args.sh_argv.cast_const(), args.envp);
                return errno();
            }
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            e => return e,
        }
        at = at.add(1);
    }
    if denied {
        libc::EACCES
    } else {
        libc::ENOENT
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    async fn output(cmd: &mut Command) -> (ExitStatus, String) {
        let mut child = cmd.stdout(Stdio::Piped).spawn().unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        (child.wait().await.unwrap(), out)
    }

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[tokio::test]
    async fn runs_and_reports_the_exit() {
        let (status, out) = output(sh("echo hi; exit 3").env("X", "y")).await;
        assert_eq!((status.code(), out.as_str()), (Some(3), "hi\n"));
        let (status, _) = output(&mut sh("kill -TERM $$")).await;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[tokio::test]
    async fn errors_are_the_execs() {
        let e = Command::new("no-such-program-here").spawn().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let e = Command::new("/no/such/path").spawn().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "echo never\n").unwrap();
        let e = Command::new(&plain).spawn().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let e = Command::new("echo").args(["a\0b"]).spawn().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = Command::new("true").env("K", "v\0").spawn().err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = Command::new("true")
            .current_dir(dir.path().join("gone"))
            .spawn()
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        fn refuse() -> io::Result<()> {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        }
        let e = Command::new("true").setup(refuse).spawn().err().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[tokio::test]
    async fn path_search_and_scripts_without_a_shebang() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // The first PATH entry holds a non-executable namesake: execvp
        // skips it (EACCES) and runs the next.
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("tool"), "echo wrong\n").unwrap();
        std::fs::write(b.join("tool"), "echo \"script $1\"\n").unwrap();
        std::fs::set_permissions(b.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}", a.display(), b.display());
        let (status, out) = output(Command::new("tool").args(["arg"]).env("PATH", &path)).await;
        assert_eq!((status.code(), out.as_str()), (Some(0), "script arg\n"));
    }

    #[tokio::test]
    async fn cwd_by_fd_group_and_signals() {
        let dir = tempfile::tempdir().unwrap();
        let fd: OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
        // The daemon ignores SIGHUP and blocks SIGUSR1 here; neither may
        // reach the child.
        // SAFETY: test-process-wide signal state, restored below.
        let old = unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let (status, out) = output(
            sh("pwd; grep -E '^(SigIgn|SigBlk)' /proc/self/status; ps -o pgid= -p $$ | tr -d ' '; echo $$")
                .current_dir_fd(fd)
                .lead(Lead::Group),
        )
        .await;
        unsafe { libc::signal(libc::SIGHUP, old) };
        assert_eq!(status.code(), Some(0), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            std::fs::canonicalize(lines[0]).unwrap(),
            std::fs::canonicalize(dir.path()).unwrap()
        );
        assert_eq!(lines[1], "SigBlk:\t0000000000000000", "{out}");
        assert_eq!(lines[2], "SigIgn:\t0000000000000000", "{out}");
        assert_eq!(lines[3], lines[4], "leads its own group: {out}");
    }

    #[tokio::test]
    async fn runs_as_another_user_without_our_groups() {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs the tests as root"
            );
            return;
        }
        let (status, out) = output(sh("id -u; id -g; id -G").ids(65534, 65533)).await;
        assert_eq!(
            (status.code(), out.as_str()),
            (Some(0), "65534\n65533\n65533\n")
        );
        // The daemon itself is still root: the change was the child's.
        assert_eq!(unsafe { libc::geteuid() }, 0);
    }

    #[tokio::test]
    async fn dropped_children_are_reaped() {
        // kill_on_drop: killed and reaped at once.
        let child = Command::new("sleep")
            .args(["60"])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id();
        drop(child);
        // Left running: reaped once it exits on its own.
        let child = Command::new("sleep").args(["0.1"]).spawn().unwrap();
        let other = child.id();
        drop(child);
        let gone = |pid: i32| !std::path::Path::new(&format!("/proc/{pid}")).exists();
        for _ in 0..100 {
            if gone(pid) && gone(other) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!(
            "a dropped child was not reaped: {pid} {}, {other} {}",
            gone(pid),
            gone(other)
        );
    }

    /// Waits until `pid` is a zombie (exited, not yet reaped).
    async fn until_exited(pid: i32) {
        for _ in 0..250 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            if stat
                .rsplit(')')
                .next()
                .unwrap()
                .trim_start()
                .starts_with('Z')
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("{pid} did not exit");
    }

    /// What PID 1's reaper does to children of ours: reaps them (it cannot
    /// pass them over) and keeps their statuses for their owners. No other
    /// test of this binary starts children outside `Command`, so the
    /// reaper here takes nobody else's.
    #[tokio::test]
    async fn the_init_reaper_keeps_our_statuses_and_reaps_orphans() {
        let mut child = sh("exit 3").spawn().unwrap();
        until_exited(child.id()).await;
        assert_eq!(reap_orphans(), 0, "ours is not an orphan");
        assert_eq!(child.wait().await.unwrap().code(), Some(3));
        assert!(!children().contains_key(&child.id()), "its entry is gone");
        // Before Linux 5.2 a thread blocks in waitpid for each child: it
        // and the reaper race, and whichever wins, the status arrives.
        for _ in 0..20 {
            let mut cmd = sh("exit 4");
            cmd.pidfd = false;
            let mut child = cmd.spawn().unwrap();
            let racing = std::thread::spawn(|| {
                let until = std::time::Instant::now() + std::time::Duration::from_millis(20);
                while std::time::Instant::now() < until {
                    assert_eq!(reap_orphans(), 0);
                }
            });
            assert_eq!(child.wait().await.unwrap().code(), Some(4));
            racing.join().unwrap();
            assert!(!children().contains_key(&child.id()));
        }
        // A kill_on_drop child the reaper took: the drop kills nothing (the
        // pid may be anyone's now) and forgets it.
        let mut cmd = sh("exit 0");
        let child = cmd.kill_on_drop(true).spawn().unwrap();
        let pid = child.id();
        until_exited(pid).await;
        reap_orphans();
        drop(child);
        assert!(!children().contains_key(&pid));
        // A child that is not ours, as an orphan is to PID 1: reaped.
        // Reaped below by reap_orphans, not by a wait, as PID 1 would.
        #[allow(clippy::zombie_processes)]
        let foreign = std::process::Command::new("true").spawn().unwrap();
        let pid = foreign.id() as i32;
        until_exited(pid).await;
        assert_eq!(reap_orphans(), 1);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[tokio::test]
    async fn without_a_pidfd_a_thread_waits() {
        let mut cmd = sh("exit 7");
        cmd.pidfd = false;
        let (status, _) = output(&mut cmd).await;
        assert_eq!(status.code(), Some(7));
        let mut cmd = Command::new("sleep");
        cmd.args(["60"]).kill_on_drop(true).pidfd = false;
        let child = cmd.spawn().unwrap();
        let pid = child.id();
        drop(child);
        for _ in 0..100 {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("{pid} was not killed and reaped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_spawns_from_many_threads() {
        let mut tasks = Vec::new();
        for i in 0..64 {
            tasks.push(tokio::spawn(async move {
                let (status, out) = output(&mut sh(&format!("echo {i}"))).await;
                assert_eq!((status.code(), out), (Some(0), format!("{i}\n")));
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
}
