//! `process.v1.ProcessService`: spawning, streaming, stdin, signals, PTYs;
//! and Sandhub's `keep.v1` (`kept`): started processes that outlive their
//! stream, their output in a bounded tail any caller can replay.
//!
//! Every child leads its own process group (a PTY child its own session,
//! which makes it a group leader too), so one `kill(-pgid)` reaches all it
//! started: signals, shutdown, and callers that go away all use that.
//!
//! Exit codes: the process's own code; for a process killed by a signal,
//! 128 + the signal number, the convention of shells, so a client can tell
//! "killed by SIGTERM" (143) from a normal exit without a second field; a
//! wait that fails for any other reason reports -1, as upstream does.

mod kept;
mod pty;
mod service;
pub(crate) mod spawn;
mod table;
pub mod unary;

pub use spawn::{is_init, reap_as_init, reap_orphans};

use std::{
    collections::HashMap,
    io,
    os::{fd::OwnedFd, unix::process::ExitStatusExt},
    path::{Path, PathBuf},
    pin::pin,
    process::ExitStatus,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use rustix::process::{Pid, Signal};
use sandhub_api::proto::{keep::v1 as kpb, process::v1 as pb};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    process::ChildStdin,
    sync::{mpsc, Mutex},
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

pub use self::kept::{LINGER as KEPT_LINGER, MAX_KEPT, TAIL_BYTES as KEPT_TAIL_BYTES};
pub use self::service::{KeptProcessService, ProcessService};
pub(crate) use self::spawn::dev_null;
use self::spawn::{Child, Command, Lead, Stdio};
use self::table::Registration;
pub use self::table::{ProcessTable, MAX_STDIN_WRITERS};
use crate::{
    confine::{RelPath, Root},
    error::{Error, Result},
    Daemon,
};

/// How long `Execute` and `run` keep reading output after the process
/// exited, when a descendant that outlived it still holds the pipes open
/// (a daemonised server, `cmd &`). Upstream's `executeWaitDelay`.
const EXECUTE_WAIT_DELAY: Duration = Duration::from_secs(10);

/// After a PTY child exits, how long the terminal may stay silent before
/// its output counts as ended. Only matters when a descendant still holds
/// the terminal; otherwise the master reports EIO right after the tail.
const PTY_LINGER: Duration = Duration::from_millis(100);

/// `Start` events queued for a client before the process's output pipes are
/// left unread, which makes the process block in `write`: a slow client slows
/// the process instead of growing the daemon's memory.
const START_QUEUE: usize = 8;

/// The exit code `run` reports when its timeout killed the process (that of
/// coreutils `timeout`).
const TIMED_OUT_EXIT_CODE: i32 = 124;

/// The result of a process run to completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    pub argv: Vec<String>,
    pub env: HashMap<String, String>,
    /// Relative to the root (or absolute under it); None = the root.
    pub cwd: Option<String>,
    pub stdin: Option<Bytes>,
    /// Killed (whole process group) after this; `timed_out` is then true
    /// and the exit code 124.
    pub timeout: Option<Duration>,
}

/// Runs a process to completion, collecting its output. If the returned
/// future is dropped first, the process group is killed.
pub async fn run(daemon: &Daemon, spec: Spec) -> Result<Completed> {
    let launch = Launch {
        argv: &spec.argv,
        env: &spec.env,
        cwd: spec.cwd.as_deref(),
    };
    collect(daemon, launch, spec.stdin, spec.timeout).await
}

/// The handles `WriteStdin`, `SendSignal` and `ResizeTTY` need on a process
/// started by `Start`.
pub(crate) struct Control {
    pgid: i32,
    input: Input,
}

enum Input {
    /// `None` once the client sent EOF.
    Pipe(Mutex<Option<ChildStdin>>),
    Pty(Arc<pty::Master>),
}

/// The parts of a request that say what to run.
#[derive(Clone, Copy)]
struct Launch<'a> {
    argv: &'a [String],
    env: &'a HashMap<String, String>,
    cwd: Option<&'a str>,
}

impl<'a> From<&'a pb::ProcessConfig> for Launch<'a> {
    fn from(c: &'a pb::ProcessConfig) -> Self {
        Launch {
            argv: &c.command,
            env: &c.env_vars,
            cwd: c.cwd.as_deref(),
        }
    }
}

impl Launch<'_> {
    fn program(&self) -> &str {
        self.argv.first().map_or("", String::as_str)
    }

    /// A command with argv, environment, working directory, user and the
    /// daemon's child setup; the caller chooses stdio and what it leads.
    fn command(&self, daemon: &Daemon) -> Result<Command> {
        let Some((program, args)) = self.argv.split_first() else {
            return Err(Error::InvalidArgument("command is required".into()));
        };
        if program.is_empty() {
            return Err(Error::InvalidArgument("command[0] is empty".into()));
        }
        let mut cmd = Command::new(program);
        cmd.args(args);
        match (self.cwd, &daemon.config.default_cwd) {
            (None | Some(""), Some(default)) if default.is_dir() => {
                cmd.current_dir(default);
            }
            (cwd, _) => match resolve_cwd(&daemon.root(), cwd)? {
                (_, Some(fd)) => {
                    cmd.current_dir_fd(fd);
                }
                (path, None) => {
                    cmd.current_dir(path);
                }
            },
        }
        if let Some(setup) = daemon.child_setup {
            cmd.setup(setup);
        }
        if let Some(user) = &daemon.run_as {
            cmd.ids(user.uid, user.gid);
            for (k, v) in user.env() {
                cmd.env(k, v);
            }
        }
        // The child inherits the daemon's environment; the request's own
        // variables go on top (after the user's, so they win).
        for (k, v) in self.env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }
}

/// The directory a process runs in. Absolute paths under the root's host
/// path are accepted as they are (clients echo back what `pwd` printed);
/// any other absolute path is taken relative to the root.
///
/// A subdirectory is opened beneath the root and the child `fchdir`s to
/// that fd: it lands on the very inode that was checked, so a symlink
/// swapped in between the check and the spawn cannot send it elsewhere.
/// The fd must outlive the spawn; the path returned then only names it.
fn resolve_cwd(root: &Root, cwd: Option<&str>) -> Result<(PathBuf, Option<OwnedFd>)> {
    let raw = match cwd {
        None | Some("") => return Ok((root.host_path().to_path_buf(), None)),
        Some(raw) => raw,
    };
    let inside = Path::new(raw)
        .strip_prefix(root.host_path())
        .ok()
        .and_then(Path::to_str)
        .unwrap_or(raw);
    let rel = RelPath::parse(inside)?;
    if rel.is_root() {
        return Ok((root.host_path().to_path_buf(), None));
    }
    let fd = root.open_dir(&rel).map_err(|e| match e {
        // An absolute cwd outside the root is read inside it (`/tmp` is
        // `<root>/tmp`): say so, or `/tmp` existing in the sandbox makes
        // the answer look wrong.
        Error::NotFound(_) => Error::NotFound(if Path::new(raw).is_absolute() && inside == raw {
            format!(
                "cwd {raw}: no such directory under {root}: a cwd is resolved inside {root} \
                 (an absolute path outside it, such as {raw}, is read as {joined})",
                root = root.host_path().display(),
                joined = root.host_path().join(rel.as_str()).display(),
            )
        } else {
            format!("cwd {raw}: no such directory")
        }),
        Error::PermissionDenied(_) => {
            Error::PermissionDenied(format!("cwd {raw}: escapes the root or is not accessible"))
        }
        other => other,
    })?;
    Ok((root.host_path().join(rel.as_str()), Some(fd)))
}

/// Spawns a long-lived helper of the sandbox's workload (a code kernel),
/// confined like every process sandboxd starts (child setup, `--user`,
/// cwd beneath the root) and leading its own process group; stdin and
/// stdout are null, stderr is piped for the caller's diagnostics. It is
/// not counted in the process table: its owner caps how many it keeps.
pub(crate) fn spawn_helper(
    daemon: &Daemon,
    argv: &[String],
    env: &HashMap<String, String>,
    cwd: Option<&str>,
) -> Result<(Child, i32)> {
    let launch = Launch { argv, env, cwd };
    let mut cmd = launch.command(daemon)?;
    cmd.lead(Lead::Group)
        .stdin(Stdio::Null)
        .stdout(Stdio::Null)
        .stderr(Stdio::Piped)
        .kill_on_drop(true);
    spawn(&mut cmd, &launch)
}

/// Signals one process group (a helper from [`spawn_helper`]).
pub(crate) fn signal_helper(pgid: i32, sig: Signal) {
    let _ = signal_group(pgid, sig);
}

fn spawn(cmd: &mut Command, launch: &Launch<'_>) -> Result<(Child, i32)> {
    let program = launch.program();
    let child = cmd.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Error::NotFound(format!("{program}: executable not found")),
        io::ErrorKind::PermissionDenied => {
            Error::PermissionDenied(format!("{program}: permission denied"))
        }
        // A NUL byte in an argument or environment variable.
        io::ErrorKind::InvalidInput => Error::InvalidArgument(format!("{program}: {e}")),
        _ => Error::io(e, program),
    })?;
    let pid = child.id();
    tracing::debug!(pid, program, "process started");
    Ok((child, pid))
}

/// Signals a whole process group. A group that is already gone is not an
/// error: the process is exiting, which is what the caller wanted.
fn signal_group(pgid: i32, sig: Signal) -> io::Result<()> {
    // kill(-1) would signal every process the daemon may signal; a child's
    // pid is never 0 or 1, but a bug here must not be able to do that.
    if pgid <= 1 {
        return Ok(());
    }
    let Some(pid) = Pid::from_raw(pgid) else {
        return Ok(());
    };
    match rustix::process::kill_process_group(pid, sig) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn exit_code(status: &io::Result<ExitStatus>) -> i32 {
    match status {
        Ok(s) => s
            .code()
            .or_else(|| s.signal().map(|sig| 128 + sig))
            .unwrap_or(-1),
        Err(_) => -1,
    }
}

/// SIGKILLs a process group when dropped armed: the caller of `Execute` or
/// `run` went away (deadline, cancel) and nobody will read the output.
struct KillOnDrop {
    pgid: i32,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(pgid = self.pgid, "caller gone; killing process group");
            let _ = signal_group(self.pgid, Signal::KILL);
        }
    }
}

/// `Execute`: runs `config` to completion (or its group killed at
/// `timeout`), all output in the answer. Both faces call this: gRPC
/// `process.v1` (no timeout there) and REST [`unary`].
pub(crate) async fn execute(
    daemon: &Daemon,
    config: &pb::ProcessConfig,
    timeout: Option<Duration>,
) -> Result<Completed> {
    collect(daemon, Launch::from(config), None, timeout).await
}

impl Completed {
    pub(crate) fn into_response(self) -> pb::ExecuteResponse {
        pb::ExecuteResponse {
            exit_code: self.exit_code,
            stdout: self.stdout.into(),
            stderr: self.stderr.into(),
        }
    }
}

/// Spawns, feeds stdin, collects stdout and stderr, and reaps.
async fn collect(
    daemon: &Daemon,
    launch: Launch<'_>,
    stdin: Option<Bytes>,
    timeout: Option<Duration>,
) -> Result<Completed> {
    let mut cmd = launch.command(daemon)?;
    cmd.lead(Lead::Group)
        .stdin(if stdin.is_some() {
            Stdio::Piped
        } else {
            Stdio::Null
        })
        .stdout(Stdio::Piped)
        .stderr(Stdio::Piped);
    let slot = daemon.processes.reserve()?;
    let started = Instant::now();
    let (mut child, pid) = spawn(&mut cmd, &launch)?;
    let mut reg = Registration::new(daemon, slot, pid, started, None);
    let mut killer = KillOnDrop {
        pgid: pid,
        armed: true,
    };
    let input = child.stdin.take();
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");

    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut timed_out = false;
    let status = {
        let mut io = pin!(async {
            tokio::join!(
                feed(input, stdin),
                read_all(stdout, &mut out),
                read_all(stderr, &mut err)
            )
        });
        let mut deadline = pin!(async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        });
        let mut io_done = false;
        let status = loop {
            tokio::select! {
                s = child.wait() => break s,
                _ = &mut io, if !io_done => io_done = true,
                _ = &mut deadline, if !timed_out => {
                    timed_out = true;
                    let _ = signal_group(pid, Signal::KILL);
                }
            }
        };
        reg.exited();
        if !io_done {
            let mut linger = pin!(tokio::time::sleep(EXECUTE_WAIT_DELAY));
            loop {
                tokio::select! {
                    _ = &mut io => break,
                    _ = &mut linger => {
                        tracing::debug!(pid, "output still open after exit; returning what was read");
                        break;
                    }
                    _ = &mut deadline, if !timed_out => {
                        timed_out = true;
                        let _ = signal_group(pid, Signal::KILL);
                    }
                }
            }
        }
        status
    };
    killer.armed = false;
    let exit_code = if timed_out {
        TIMED_OUT_EXIT_CODE
    } else {
        exit_code(&status)
    };
    tracing::debug!(pid, exit_code, timed_out, "process finished");
    Ok(Completed {
        exit_code,
        stdout: out,
        stderr: err,
        timed_out,
    })
}

async fn feed(pipe: Option<ChildStdin>, data: Option<Bytes>) {
    if let (Some(mut pipe), Some(data)) = (pipe, data) {
        // A process that exits without reading all of its input is not an
        // error of ours; EPIPE just ends the feeding.
        let _ = pipe.write_all(&data).await;
    }
}

async fn read_all(mut r: impl AsyncRead + Unpin, buf: &mut Vec<u8>) {
    // A read error ends the output; what was read so far is kept.
    let _ = r.read_to_end(buf).await;
}

type Event = std::result::Result<pb::StartResponse, Status>;

fn event(e: pb::start_response::Event) -> Event {
    Ok(pb::StartResponse { event: Some(e) })
}

/// Where a started process's output goes.
enum Sink {
    /// The one `Start` client: a slow one slows the process, and the
    /// process dies when it goes away (upstream's behaviour).
    Client(mpsc::Sender<Event>),
    /// A kept tail (`keep.v1`): never waits, and nobody's leaving kills.
    Kept(Arc<kept::Kept>),
}

impl Sink {
    /// Hands on one chunk; false once nobody will read any more.
    async fn output(&self, stderr: bool, data: Bytes) -> bool {
        match self {
            Sink::Client(tx) => {
                let ev = if stderr {
                    pb::start_response::Event::Stderr(data)
                } else {
                    pb::start_response::Event::Stdout(data)
                };
                tx.send(event(ev)).await.is_ok()
            }
            Sink::Kept(kept) => {
                kept.push(stderr, data);
                true
            }
        }
    }

    /// Resolves when the process must be killed because its reader left.
    async fn abandoned(&self) {
        match self {
            Sink::Client(tx) => tx.closed().await,
            Sink::Kept(_) => std::future::pending().await,
        }
    }

    async fn exit(self, exit_code: i32) {
        match self {
            Sink::Client(tx) => {
                let _ = tx
                    .send(event(pb::start_response::Event::Exit(pb::ExitEvent {
                        exit_code,
                    })))
                    .await;
            }
            Sink::Kept(kept) => kept.exited(exit_code),
        }
    }
}

/// Copies one pipe into the sink, at most `chunk` bytes at a time, until
/// EOF or the client is gone.
async fn pump(mut r: impl AsyncRead + Unpin, sink: &Sink, stderr: bool, chunk: usize) {
    let mut buf = vec![0; chunk];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !sink.output(stderr, Bytes::copy_from_slice(&buf[..n])).await {
            return;
        }
    }
}

/// Copies terminal output into the sink while reaping the child.
/// Output ends at EIO, or, once the child has exited, when a descendant
/// holding the terminal stays silent for `PTY_LINGER`.
async fn pump_pty(
    master: &pty::Master,
    child: &mut Child,
    sink: &Sink,
    chunk: usize,
) -> io::Result<ExitStatus> {
    let mut buf = vec![0; chunk];
    let mut status = None;
    loop {
        let read = match status {
            None => tokio::select! {
                s = child.wait() => {
                    status = Some(s);
                    continue;
                }
                r = master.read(&mut buf) => r,
            },
            Some(_) => match tokio::time::timeout(PTY_LINGER, master.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => break,
            },
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !sink.output(false, Bytes::copy_from_slice(&buf[..n])).await {
            break;
        }
    }
    match status {
        Some(s) => s,
        None => child.wait().await,
    }
}

enum Output {
    Pipes(tokio::process::ChildStdout, tokio::process::ChildStderr),
    Pty(Arc<pty::Master>),
}

/// A process `Start` spawned, registered, not yet driven.
struct Started {
    reg: Registration<Arc<Daemon>>,
    child: Child,
    output: Output,
    pid: i32,
}

/// Runs a started process to its end: output, reaping, leaving the table,
/// and the exit event last. If a `Start` client goes away, the group is
/// killed; a kept process runs on.
async fn drive(started: Started, sink: Sink, chunk: usize) {
    let Started {
        mut reg,
        mut child,
        output,
        pid,
    } = started;
    let status = {
        let mut work = pin!(async {
            match output {
                Output::Pipes(stdout, stderr) => {
                    let mut pumps = pin!(async {
                        tokio::join!(
                            pump(stdout, &sink, false, chunk),
                            pump(stderr, &sink, true, chunk)
                        )
                    });
                    let mut pumped = false;
                    let status = loop {
                        tokio::select! {
                            s = child.wait() => break s,
                            _ = &mut pumps, if !pumped => pumped = true,
                        }
                    };
                    // A background descendant (`server &`) may hold the pipes
                    // for hours; like Execute, the exit is reported after at
                    // most EXECUTE_WAIT_DELAY of lingering output.
                    if !pumped
                        && tokio::time::timeout(EXECUTE_WAIT_DELAY, &mut pumps)
                            .await
                            .is_err()
                    {
                        tracing::debug!(pid, "output still open after exit; reporting the exit");
                    }
                    status
                }
                Output::Pty(master) => pump_pty(&master, &mut child, &sink, chunk).await,
            }
        });
        tokio::select! {
            s = &mut work => s,
            () = sink.abandoned() => {
                // As upstream (the stream's context kills the command), a
                // Start process does not outlive its stream.
                tracing::debug!(pid, "stream closed; killing process group");
                let _ = signal_group(pid, Signal::KILL);
                work.await
            }
        }
    };
    reg.exited();
    let exit_code = exit_code(&status);
    tracing::debug!(pid, exit_code, "process finished");
    // Gone from the table before the client can see the exit: after it,
    // the pid is unknown.
    drop(reg);
    sink.exit(exit_code).await;
}
