//! `sandhub exec ID -- CMD...`: runs a command in a sandbox with its
//! output streamed live, this process's stdin forwarded to it, SIGINT and
//! SIGTERM passed on, and the command's exit code as ours.

use std::{io::ErrorKind, time::Duration};

use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use sandhub_client::{
    http::HubClient, Error, ProcessEvent, ProcessEvents, Result, Sandboxes, Signal, StartProcess,
    StdinInput,
};
use tokio::{
    io::{AsyncReadExt, AsyncWrite, AsyncWriteExt},
    signal::unix::{signal, SignalKind},
    time::Instant,
};

use super::{
    args::{parse_duration, parse_key_value, to_map},
    terminal, ClientArgs,
};

/// `timeout(1)`'s code for a command that ran out of time.
pub const TIMED_OUT: i32 = 124;
/// After the timeout's SIGTERM, how long the command gets before SIGKILL,
/// and after that how long we wait for its exit event before giving up.
const TERM_GRACE: Duration = Duration::from_secs(2);
const KILL_GRACE: Duration = Duration::from_secs(5);
/// Ctrl-C this many times and the command is SIGKILLed: the way out of a
/// command that ignores SIGINT.
const INTERRUPTS_BEFORE_KILL: u32 = 3;
const STDIN_CHUNK: usize = 64 * 1024;

/// The command is argv, never a shell string: `sandhub exec ID -- "a b"`
/// runs a program named `a b`. For pipes, globs or `&&`, say so:
/// `sandhub exec ID -- sh -c 'make && ./test | tee log'`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox id.
    id: String,

    /// Environment for the command, repeatable (env: one per line).
    #[arg(long = "env", value_name = "KEY=VALUE", env = "SANDHUB_EXEC_ENV",
          value_delimiter = '\n', value_parser = parse_key_value)]
    env: Vec<(String, String)>,

    /// Working directory inside the workspace (default: the workspace).
    #[arg(long, value_name = "DIR", env = "SANDHUB_EXEC_CWD")]
    cwd: Option<String>,

    /// Stop the command after this long (SIGTERM, then SIGKILL) and exit 124.
    #[arg(long, value_name = "DURATION", env = "SANDHUB_EXEC_TIMEOUT", value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// Run the command on a terminal (stdout and stderr then merge); with
    /// a local terminal, it is switched to raw mode meanwhile.
    #[arg(short, long, env = "SANDHUB_EXEC_TTY")]
    tty: bool,

    /// The command and its arguments (argv; use `sh -c '...'` for shell syntax).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<String>,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn run(args: ExecArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    // Installed before the process starts so a Ctrl-C from then on is
    // forwarded instead of killing us and leaving the command orphaned.
    let mut signals = Signals::new()?;
    let pty = args
        .tty
        .then(|| terminal::size().unwrap_or(terminal::DEFAULT_SIZE));
    let raw = if args.tty {
        terminal::RawMode::enable()?
    } else {
        None
    };
    let mut events = hub
        .start(
            &args.id,
            StartProcess {
                command: args.command,
                env: to_map(args.env),
                cwd: args.cwd.unwrap_or_default(),
                pty,
                stdin_closed: false,
            },
        )
        .await?;
    let pid = match events.next().await {
        Some(Ok(ProcessEvent::Started { pid })) => pid,
        Some(Ok(other)) => {
            return Err(Error::internal(format!(
                "the hub sent {other:?} before the process started"
            )))
        }
        Some(Err(e)) => return Err(e),
        None => return Err(Error::unavailable("the hub closed the process stream")),
    };
    tokio::spawn(forward_stdin(hub.clone(), args.id.clone(), pid));
    let process = Process {
        hub,
        id: args.id,
        pid,
    };
    let code = process
        .drive(&mut events, &mut signals, args.timeout, pty.is_some())
        .await;
    drop(raw);
    code
}

struct Process {
    hub: HubClient,
    id: String,
    pid: i32,
}

/// The escalation after `--timeout`: each step happens at its deadline.
enum Timeout {
    None,
    Term(Instant),
    Kill(Instant),
    GiveUp(Instant),
}

impl Timeout {
    fn deadline(&self) -> Option<Instant> {
        match self {
            Timeout::None => None,
            Timeout::Term(t) | Timeout::Kill(t) | Timeout::GiveUp(t) => Some(*t),
        }
    }
}

impl Process {
    async fn drive(
        &self,
        events: &mut ProcessEvents,
        signals: &mut Signals,
        timeout: Option<Duration>,
        tty: bool,
    ) -> Result<i32> {
        let mut stdout = tokio::io::stdout();
        let mut stderr = tokio::io::stderr();
        let mut timeout = timeout.map_or(Timeout::None, |t| Timeout::Term(Instant::now() + t));
        let mut timed_out = false;
        let mut interrupts = 0;
        loop {
            let deadline = timeout.deadline();
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(ProcessEvent::Stdout { data })) => {
                        if !write(&mut stdout, &data).await? {
                            return Ok(broken_pipe());
                        }
                    }
                    Some(Ok(ProcessEvent::Stderr { data })) => {
                        // Nobody reading our stderr is no reason to stop.
                        let _ = write(&mut stderr, &data).await;
                    }
                    Some(Ok(ProcessEvent::Exited { exit_code })) => {
                        return Ok(if timed_out { TIMED_OUT } else { exit_status(exit_code) });
                    }
                    Some(Ok(ProcessEvent::Started { .. })) => {}
                    Some(Err(e)) => return Err(e),
                    None => return Err(Error::unavailable("the process stream ended before the exit event")),
                },
                _ = sleep_until(deadline) => {
                    timed_out = true;
                    timeout = match timeout {
                        Timeout::Term(_) => {
                            self.signal(Signal::Sigterm).await;
                            Timeout::Kill(Instant::now() + TERM_GRACE)
                        }
                        Timeout::Kill(_) => {
                            self.signal(Signal::Sigkill).await;
                            Timeout::GiveUp(Instant::now() + KILL_GRACE)
                        }
                        Timeout::GiveUp(_) | Timeout::None => {
                            eprintln!("error: DEADLINE_EXCEEDED: the command did not exit after SIGKILL");
                            return Ok(TIMED_OUT);
                        }
                    };
                }
                _ = signals.interrupt.recv() => {
                    interrupts += 1;
                    let sig = if interrupts >= INTERRUPTS_BEFORE_KILL { Signal::Sigkill } else { Signal::Sigint };
                    self.signal(sig).await;
                }
                _ = signals.terminate.recv() => self.signal(Signal::Sigterm).await,
                _ = signals.resize.recv(), if tty => {
                    if let Some(size) = terminal::size() {
                        let _ = self.hub.resize(&self.id, self.pid, size).await;
                    }
                }
            }
        }
    }

    /// Best effort: a process that already exited needs no signal, and its
    /// exit event is on its way.
    async fn signal(&self, sig: Signal) {
        let _ = self.hub.signal(&self.id, self.pid, sig).await;
    }
}

struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    resize: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        let install = |kind: SignalKind| {
            signal(kind).map_err(|e| Error::internal(format!("installing a signal handler: {e}")))
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            resize: install(SignalKind::window_change())?,
        })
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Writes and flushes so output shows up as it is produced; `false` when
/// the reader went away.
async fn write(out: &mut (impl AsyncWrite + Unpin), data: &[u8]) -> Result<bool> {
    match async {
        out.write_all(data).await?;
        out.flush().await
    }
    .await
    {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Error::internal(format!("writing output: {e}"))),
    }
}

/// What a shell reports for a process killed by SIGPIPE. Returning ends
/// the process stream, which makes the hub kill the command.
fn broken_pipe() -> i32 {
    128 + libc::SIGPIPE
}

/// An exit status the OS can carry (sandboxd already reports a signal
/// death as 128 + signal; anything else out of range is a plain failure).
fn exit_status(code: i32) -> i32 {
    if (0..=255).contains(&code) {
        code
    } else {
        255
    }
}

/// Copies stdin to the process in order, then closes its stdin. Errors end
/// the copy silently: they mean the process is gone, and its exit event
/// (or the stream's error) says so.
async fn forward_stdin(hub: HubClient, id: String, pid: i32) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        let input = match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => StdinInput::Eof,
            Ok(n) => StdinInput::Data(Bytes::copy_from_slice(&buf[..n])),
        };
        let eof = input == StdinInput::Eof;
        if hub.write_stdin(&id, pid, input).await.is_err() || eof {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(0), 0);
        assert_eq!(exit_status(7), 7);
        assert_eq!(exit_status(137), 137);
        assert_eq!(exit_status(-1), 255);
        assert_eq!(exit_status(256), 255);
    }
}
