//! One Jupyter kernel: started as a process of the sandbox, spoken to over
//! ZeroMQ (shell: a DEALER for requests and replies; iopub: a SUB for the
//! output), interrupted with SIGINT, watched for its exit.
//!
//! Bounds: the kernel is the workload, so it may flood. Its output is read
//! by a task of its own into a bounded queue; when the queue is full,
//! messages are dropped and counted, never waited for, so a flooding
//! kernel blocks neither sandboxd nor another context, and an execution
//! whose client reads slowly loses output instead of growing memory. The
//! one message an execution cannot do without, `status: idle`, travels
//! beside the queue (a watch), so it is never dropped.

use std::{
    collections::HashMap,
    io::Write,
    net::TcpListener,
    os::unix::{fs::OpenOptionsExt, process::ExitStatusExt},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex as StdMutex,
    },
    time::{Duration, Instant},
};

use rustix::process::Signal;
use sandhub_api::code::{
    CodeEvent, ResultBundle, KERNEL_DIED_ERROR, TIMEOUT_ERROR, TRUNCATED_MARKER,
};
use serde_json::{json, Value};
use tokio::{
    io::AsyncReadExt,
    sync::{mpsc, watch, Mutex},
    task::AbortHandle,
};
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::wire::{random_hex, Message, Signer};
use crate::{
    error::{Error, Result},
    process::{signal_helper, spawn_helper},
    Daemon,
};

/// How long a kernel may take to answer its first request.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest pause between two looks at the socket table while a kernel
/// has not bound its ports yet: what a start pays at most for the polling.
const LISTEN_POLL_MAX: Duration = Duration::from_millis(20);
/// This network namespace's IPv4 TCP sockets (the kernel binds 127.0.0.1).
const TCP_TABLE: &str = "/proc/self/net/tcp";
/// Output messages queued between the kernel and an execution.
const IOPUB_QUEUE: usize = 1024;
/// After the timeout's SIGINT, how long the cell has to stop.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// After the execute reply, how long to wait for `status: idle` (which a
/// flood cannot drop, but a kernel may never send).
const IDLE_GRACE: Duration = Duration::from_secs(2);
/// The kernel's own stderr kept for telling why it died.
const STDERR_TAIL: usize = 4096;

/// What an execution streams within.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_result_bytes: usize,
    pub max_stream_bytes: usize,
}

pub struct Kernel {
    proc: Proc,
    signer: Signer,
    session: String,
    /// Held for a whole execution: one cell at a time per kernel.
    shell: Mutex<Shell>,
    iopub: Mutex<mpsc::Receiver<Message>>,
    /// The parent `msg_id` of the latest `status: idle`.
    idle: watch::Receiver<String>,
    dropped: Arc<AtomicU64>,
    /// The last cell timed out or lost output: the kernel's own queue may
    /// still be full of it, and would drop the next cell's output.
    backlog: std::sync::atomic::AtomicBool,
}

/// The kernel's process and the tasks around it; dropping it kills the
/// process group and removes the connection file.
struct Proc {
    pgid: i32,
    /// Some(why) once the kernel process exited.
    exit: watch::Receiver<Option<String>>,
    tasks: Vec<AbortHandle>,
    connection_file: PathBuf,
}

struct Shell {
    send: zeromq::DealerSendHalf,
    replies: mpsc::Receiver<Message>,
}

/// A free loopback port. The kernel binds it a moment later; another
/// process could take it first, and then the kernel fails to start and
/// says so (the caller may retry).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| Error::io(e, "a loopback port"))?;
    Ok(l.local_addr()
        .map_err(|e| Error::io(e, "a loopback port"))?
        .port())
}

fn describe_exit(status: std::io::Result<std::process::ExitStatus>, stderr: &[u8]) -> String {
    let mut why = match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("the kernel exited with code {c}"),
            (None, Some(9)) => {
                "the kernel was killed by SIGKILL (out of memory, or killed)".to_string()
            }
            (None, Some(sig)) => format!("the kernel was killed by signal {sig}"),
            _ => "the kernel exited".to_string(),
        },
        Err(e) => format!("the kernel could not be waited for: {e}"),
    };
    why.push_str(&last_words(stderr));
    why
}

/// `; its last words: a | b | c`: the last three lines of a stderr tail,
/// or nothing when it is empty.
fn last_words(stderr: &[u8]) -> String {
    let tail = String::from_utf8_lossy(stderr);
    let last: Vec<&str> = tail.lines().rev().take(3).collect();
    if last.is_empty() {
        return String::new();
    }
    let last: Vec<&str> = last.into_iter().rev().collect();
    format!("; its last words: {}", last.join(" | "))
}

/// Returns once something listens on every one of `ports` in this network
/// namespace, polling its socket table; at once if the table cannot be
/// read (zeromq's own retry then waits instead).
///
/// Why not let zeromq retry a refused connect: its retry doubles its pause
/// up to 30 s, so a kernel that bound its ports 7 s after its start was
/// reached at 12.75 s, and one that took more than 25.6 s was not reached
/// before zeromq's 30 s connect timeout. Looking first also never dials a
/// port nobody listens on, which could connect the socket to itself.
async fn wait_listening(ports: &[u16]) {
    let mut pause = Duration::from_millis(2);
    loop {
        let Ok(table) = tokio::fs::read_to_string(TCP_TABLE).await else {
            return;
        };
        let open = sandhub_api::proc_net::parse_listening(&table);
        if ports.iter().all(|&p| open.iter().any(|l| l.port == p)) {
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LISTEN_POLL_MAX);
    }
}

impl Kernel {
    /// Starts `argv` (plus `-f <connection file>`) and waits until it
    /// answers on shell and publishes on iopub.
    pub async fn start(
        daemon: &Daemon,
        mut argv: Vec<String>,
        env: &HashMap<String, String>,
        cwd: Option<&str>,
    ) -> Result<Kernel> {
        let key = random_hex();
        let ports: Vec<u16> = (0..5).map(|_| free_port()).collect::<Result<_>>()?;
        let connection = json!({
            "transport": "tcp", "ip": "127.0.0.1",
            "shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
            "control_port": ports[3], "hb_port": ports[4],
            "key": key, "signature_scheme": "hmac-sha256",
        });
        let connection_file =
            std::env::temp_dir().join(format!("sandhub-kernel-{}.json", random_hex()));
        write_private(&connection_file, &connection, daemon)?;
        argv.push("-f".into());
        argv.push(connection_file.display().to_string());
        let (mut child, pgid) = match spawn_helper(daemon, &argv, env, cwd) {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&connection_file);
                return Err(e);
            }
        };

        let mut tasks = Vec::new();
        let (exit_tx, exit) = watch::channel(None);
        let stderr = child.stderr.take();
        // The end of its stderr so far: why it died, or why a start failed.
        let stderr_tail = Arc::new(StdMutex::new(Vec::new()));
        let tail = stderr_tail.clone();
        tasks.push(
            tokio::spawn(async move {
                let reader = stderr.map(|mut err| {
                    let tail = tail.clone();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        while let Ok(n @ 1..) = err.read(&mut buf).await {
                            let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                            t.extend_from_slice(&buf[..n]);
                            let over = t.len().saturating_sub(STDERR_TAIL);
                            t.drain(..over);
                        }
                    })
                });
                let status = child.wait().await;
                // The pipe ends with the process (or soon after).
                if let Some(r) = reader {
                    let _ = tokio::time::timeout(Duration::from_millis(200), r).await;
                }
                let t = tail.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let _ = exit_tx.send(Some(describe_exit(status, &t)));
            })
            .abort_handle(),
        );

        let mut proc = Proc {
            pgid,
            exit,
            tasks,
            connection_file,
        };
        let signer = Signer::new(key.into_bytes());
        let session = random_hex();
        let dropped = Arc::<AtomicU64>::default();
        let mut exit = proc.exit.clone();
        let (stage_tx, stage) = watch::channel(Stage::Listen);
        let connect = connect(
            &mut proc, &signer, &session, &dropped, ports[0], ports[1], stage_tx,
        );
        let (shell, iopub, idle) = tokio::select! {
            r = tokio::time::timeout(START_TIMEOUT, connect) => match r {
                Ok(r) => r?,
                Err(_) => {
                    let said = last_words(&stderr_tail.lock().unwrap_or_else(|p| p.into_inner()));
                    return Err(Error::Unavailable(format!(
                        "the kernel did not answer within {}s ({}){said}",
                        START_TIMEOUT.as_secs(), stage.borrow().describe())));
                }
            },
            _ = async { exit.wait_for(Option::is_some).await.is_ok() } => {
                let why = exit.borrow().clone().unwrap_or_default();
                return Err(Error::FailedPrecondition(format!(
                    "the kernel did not start: {why}")));
            }
        };
        Ok(Kernel {
            proc,
            signer,
            session,
            shell: Mutex::new(shell),
            iopub: Mutex::new(iopub),
            idle,
            dropped,
            backlog: Default::default(),
        })
    }
    /// Why the kernel is dead, if it is.
    pub fn exited(&self) -> Option<String> {
        self.proc.exit.borrow().clone()
    }

    pub fn is_busy(&self) -> bool {
        self.shell.try_lock().is_err()
    }

    /// SIGKILL to the kernel's group, now (delete, restart): a cell still
    /// running in it ends with KernelDied.
    pub fn kill(&self) {
        signal_helper(self.proc.pgid, Signal::KILL);
    }

    /// SIGINT to the kernel's group: what Jupyter's interrupt does.
    pub fn interrupt(&self) {
        signal_helper(self.proc.pgid, Signal::INT);
    }

    /// Runs one cell, sending its events to `out` and the `end` last.
    /// `env` is set in `os.environ` around it. Returns when the cell is
    /// done, timed out and interrupted, or the kernel died; a client that
    /// goes away interrupts the cell.
    pub async fn execute(
        &self,
        code: &str,
        env: &HashMap<String, String>,
        timeout: Duration,
        bounds: Bounds,
        out: mpsc::Sender<CodeEvent>,
    ) {
        let mut shell = self.shell.lock().await;
        let mut iopub = self.iopub.lock().await;
        // What arrived between cells (a thread printing) belongs to none.
        while iopub.try_recv().is_ok() {}
        while shell.replies.try_recv().is_ok() {}
        let started = Instant::now();
        let dropped_before = self.dropped.load(Ordering::Relaxed);
        let mut run = Run {
            out,
            bounds,
            stream_bytes: 0,
            stream_cut: false,
            execution_count: 0,
            client_gone: false,
            interrupted: false,
        };
        if let Some(why) = self.exited() {
            run.died(&why).await;
        } else {
            if self.backlog.swap(false, Ordering::Relaxed) {
                self.sync(&mut shell, &mut iopub).await;
            }
            if !env.is_empty() {
                self.silent(&mut shell, &mut iopub, &env_preamble(env))
                    .await;
            }
            self.cell(&mut shell, &mut iopub, code, timeout, &mut run)
                .await;
            if !env.is_empty() && self.exited().is_none() {
                self.silent(&mut shell, &mut iopub, ENV_RESTORE).await;
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed) - dropped_before;
        if dropped > 0 || run.interrupted {
            self.backlog.store(true, Ordering::Relaxed);
        }
        run.send(CodeEvent::End {
            execution_count: run.execution_count,
            duration: started.elapsed().as_secs_f64(),
            dropped,
        })
        .await;
    }

    /// Waits until the kernel's iopub backlog has reached us: a request's
    /// `status: idle` comes after everything published before it (ZeroMQ
    /// keeps order), so once it is seen the next cell's output cannot be
    /// dropped behind the old flood. Bounded: a kernel still busy with an
    /// uninterruptible cell is given up on after a while.
    async fn sync(&self, shell: &mut Shell, iopub: &mut mpsc::Receiver<Message>) {
        let until = tokio::time::Instant::now() + INTERRUPT_GRACE;
        while tokio::time::Instant::now() < until {
            let (frames, id) = self
                .signer
                .request(&self.session, "kernel_info_request", json!({}));
            if shell.send.send(message(frames)).await.is_err() {
                return;
            }
            let mut idle = self.idle.clone();
            let seen = async { idle.wait_for(|p| *p == id).await.is_ok() };
            let drain = async { while iopub.recv().await.is_some() {} };
            tokio::select! {
                true = seen => break,
                _ = drain => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
        while iopub.try_recv().is_ok() {}
        while shell.replies.try_recv().is_ok() {}
    }

    /// A silent request (no output, no history): the env preamble.
    async fn silent(&self, shell: &mut Shell, iopub: &mut mpsc::Receiver<Message>, code: &str) {
        let (frames, id) = self.signer.request(
            &self.session,
            "execute_request",
            json!({"code": code, "silent": true, "store_history": false,
                   "user_expressions": {}, "allow_stdin": false, "stop_on_error": false}),
        );
        if shell.send.send(message(frames)).await.is_err() {
            return;
        }
        let wait = async {
            while let Some(m) = shell.replies.recv().await {
                if m.parent_id == id {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(INTERRUPT_GRACE, wait).await;
        while iopub.try_recv().is_ok() {}
    }

    async fn cell(
        &self,
        shell: &mut Shell,
        iopub: &mut mpsc::Receiver<Message>,
        code: &str,
        timeout: Duration,
        run: &mut Run,
    ) {
        let (frames, id) = self.signer.request(
            &self.session,
            "execute_request",
            json!({"code": code, "silent": false, "store_history": true,
                   "user_expressions": {}, "allow_stdin": false, "stop_on_error": true}),
        );
        if let Err(e) = shell.send.send(message(frames)).await {
            run.send(error_event(
                KERNEL_DIED_ERROR,
                &format!("sending to the kernel: {e}"),
            ))
            .await;
            return;
        }
        let mut exit = self.proc.exit.clone();
        let mut idle = self.idle.clone();
        let mut deadline = tokio::time::Instant::now() + timeout;
        let mut timed_out = false;
        let mut replied = false;
        let mut idle_seen = false;
        // Set when the reply comes: how long `status: idle` may lag it.
        let mut after_reply = tokio::time::Instant::now();
        loop {
            if replied && idle_seen {
                // The reader queues a cell's output before it signals its
                // idle: all of it is queued now, though select! may have
                // taken the idle first.
                while let Ok(m) = iopub.try_recv() {
                    if m.parent_id == id && !timed_out {
                        run.iopub(m).await;
                    }
                }
                break;
            }
            tokio::select! {
                m = iopub.recv() => match m {
                    Some(m) if m.parent_id == id => {
                        if !timed_out {
                            run.iopub(m).await;
                        }
                    }
                    Some(_) => {}
                    None => break,
                },
                m = shell.replies.recv() => match m {
                    Some(m) if m.parent_id == id => {
                        replied = true;
                        after_reply = tokio::time::Instant::now() + IDLE_GRACE;
                        if let Some(n) = m.content.get("execution_count").and_then(Value::as_u64) {
                            run.execution_count = n;
                        }
                    }
                    Some(_) => {}
                    None => break,
                },
                ok = async { idle.wait_for(|p| *p == id).await.is_ok() }, if !idle_seen => {
                    if ok { idle_seen = true } else { break }
                }
                _ = async { exit.wait_for(Option::is_some).await.is_ok() } => {
                    let why = self.exited().unwrap_or_default();
                    run.died(&why).await;
                    return;
                }
                _ = tokio::time::sleep_until(after_reply), if replied => idle_seen = true,
                _ = tokio::time::sleep_until(deadline), if !replied => {
                    if timed_out {
                        // The cell ignored SIGINT: leave it be, say so.
                        run.send(error_event(TIMEOUT_ERROR,
                            "the cell did not stop after an interrupt; the context is still busy, restart it"))
                            .await;
                        return;
                    }
                    timed_out = true;
                    run.interrupted = true;
                    self.interrupt();
                    run.send(error_event(TIMEOUT_ERROR, &format!(
                        "the execution took longer than {}s and was interrupted",
                        timeout.as_secs_f64())))
                        .await;
                    deadline = tokio::time::Instant::now() + INTERRUPT_GRACE;
                }
                _ = run.out.closed(), if !run.client_gone => {
                    // Nobody reads the rest: stop the cell as exec would.
                    run.client_gone = true;
                    if !timed_out {
                        timed_out = true;
                        run.interrupted = true;
                        self.interrupt();
                        deadline = tokio::time::Instant::now() + INTERRUPT_GRACE;
                    }
                }
            }
        }
    }
}

/// How far a kernel's start got, for the error when it gets no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Listen,
    Connect,
    Handshake,
}

impl Stage {
    fn describe(self) -> &'static str {
        match self {
            Stage::Listen => "it never listened on its shell and iopub ports",
            Stage::Connect => "it listened, but its sockets did not greet",
            Stage::Handshake => "it was connected, but never answered kernel_info",
        }
    }
}

/// Connects shell and iopub once the kernel listens on both, starts their
/// readers, and handshakes: `kernel_info_request` until one of its iopub
/// messages arrives, which proves the subscription is live (a SUB misses
/// what was published before it joined). The caller bounds the whole of
/// it ([`START_TIMEOUT`]), so zeromq's own connect timeout is off.
async fn connect(
    proc: &mut Proc,
    signer: &Signer,
    session: &str,
    dropped: &Arc<AtomicU64>,
    shell_port: u16,
    iopub_port: u16,
    stage: watch::Sender<Stage>,
) -> Result<(Shell, mpsc::Receiver<Message>, watch::Receiver<String>)> {
    let zmq = |e: zeromq::ZmqError| Error::Unavailable(format!("reaching the kernel: {e}"));
    let options = || {
        let mut o = SocketOptions::default();
        o.no_connect_timeout();
        o
    };
    wait_listening(&[shell_port, iopub_port]).await;
    stage.send_replace(Stage::Connect);
    let mut shell = DealerSocket::with_options(options());
    shell
        .connect(&format!("tcp://127.0.0.1:{shell_port}"))
        .await
        .map_err(zmq)?;
    let mut iopub = SubSocket::with_options(options());
    iopub.subscribe("").await.map_err(zmq)?;
    iopub
        .connect(&format!("tcp://127.0.0.1:{iopub_port}"))
        .await
        .map_err(zmq)?;
    stage.send_replace(Stage::Handshake);
    let (send, mut recv) = shell.split();

    let (reply_tx, replies) = mpsc::channel(64);
    let signer_ = signer.clone();
    proc.tasks.push(
        tokio::spawn(async move {
            while let Ok(m) = recv.recv().await {
                if let Ok(m) = signer_.decode(&m.into_vec()) {
                    if reply_tx.send(m).await.is_err() {
                        break;
                    }
                }
            }
        })
        .abort_handle(),
    );

    let (out_tx, out_rx) = mpsc::channel(IOPUB_QUEUE);
    let (idle_tx, idle) = watch::channel(String::new());
    let (signer_, dropped) = (signer.clone(), dropped.clone());
    proc.tasks.push(
        tokio::spawn(async move {
            while let Ok(m) = iopub.recv().await {
                let Ok(m) = signer_.decode(&m.into_vec()) else {
                    // Unsigned or mis-signed: not the kernel's.
                    continue;
                };
                if m.msg_type == "status"
                    && m.content.get("execution_state").and_then(Value::as_str) == Some("idle")
                {
                    let _ = idle_tx.send(m.parent_id.clone());
                    continue;
                }
                if out_tx.try_send(m).is_err() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .abort_handle(),
    );
    let mut shell = Shell { send, replies };
    let mut iopub = out_rx;
    loop {
        let (frames, id) = signer.request(session, "kernel_info_request", json!({}));
        shell.send.send(message(frames)).await.map_err(zmq)?;
        let got_iopub = async {
            loop {
                match iopub.recv().await {
                    Some(m) if m.parent_id == id => return true,
                    Some(_) => {}
                    None => return false,
                }
            }
        };
        let mut idle_rx = idle.clone();
        let idle_seen = async { idle_rx.wait_for(|p| *p == id).await.is_ok() };
        tokio::select! {
            true = got_iopub => break,
            true = idle_seen => break,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
    // Replies of the handshake's requests are not anyone's.
    while shell.replies.try_recv().is_ok() {}
    Ok((shell, iopub, idle))
}

impl Drop for Proc {
    fn drop(&mut self) {
        signal_helper(self.pgid, Signal::KILL);
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.connection_file);
    }
}

fn message(frames: Vec<bytes::Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).expect("a request has frames")
}

/// The connection file, readable only by the kernel's user: it holds the
/// key.
fn write_private(path: &PathBuf, connection: &Value, daemon: &Daemon) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(e, "the kernel's connection file"))?;
    f.write_all(connection.to_string().as_bytes())
        .map_err(|e| Error::io(e, "the kernel's connection file"))?;
    if let Some(u) = &daemon.run_as {
        std::os::unix::fs::fchown(&f, Some(u.uid), Some(u.gid))
            .map_err(|e| Error::io(e, "the kernel's connection file"))?;
    }
    Ok(())
}

/// Sets the execution's env, remembering what it replaced.
fn env_preamble(env: &HashMap<String, String>) -> String {
    // A JSON object of strings is a Python dict literal.
    let dict = serde_json::to_string(env).unwrap_or_else(|_| "{}".into());
    format!(
        "import os as __sandhub_os\n__sandhub_env = {dict}\n\
         __sandhub_prev = {{k: __sandhub_os.environ.get(k) for k in __sandhub_env}}\n\
         __sandhub_os.environ.update(__sandhub_env)\ndel __sandhub_env"
    )
}

const ENV_RESTORE: &str = "for __k, __v in __sandhub_prev.items():\n    \
    (__sandhub_os.environ.pop(__k, None) if __v is None else __sandhub_os.environ.__setitem__(__k, __v))\n\
    del __sandhub_prev, __sandhub_os\n";

fn error_event(name: &str, value: &str) -> CodeEvent {
    CodeEvent::Error {
        name: name.into(),
        value: value.into(),
        traceback: Vec::new(),
    }
}

/// One execution's output side.
struct Run {
    out: mpsc::Sender<CodeEvent>,
    bounds: Bounds,
    stream_bytes: usize,
    stream_cut: bool,
    execution_count: u64,
    client_gone: bool,
    /// The cell was interrupted (timeout, client gone).
    interrupted: bool,
}

impl Run {
    async fn send(&mut self, e: CodeEvent) {
        if !self.client_gone && self.out.send(e).await.is_err() {
            self.client_gone = true;
        }
    }

    async fn died(&mut self, why: &str) {
        self.send(error_event(
            KERNEL_DIED_ERROR,
            &format!("{why}; restart the context"),
        ))
        .await;
    }

    async fn iopub(&mut self, m: Message) {
        let c = &m.content;
        let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        match m.msg_type.as_str() {
            "stream" => {
                if self.stream_cut {
                    return;
                }
                let mut t = text("text");
                let room = self
                    .bounds
                    .max_stream_bytes
                    .saturating_sub(self.stream_bytes);
                if t.len() > room {
                    let mut end = room;
                    while !t.is_char_boundary(end) {
                        end -= 1;
                    }
                    t.truncate(end);
                    t.push_str(TRUNCATED_MARKER);
                    self.stream_cut = true;
                }
                self.stream_bytes += t.len();
                let e = if text("name") == "stderr" {
                    CodeEvent::Stderr { text: t }
                } else {
                    CodeEvent::Stdout { text: t }
                };
                self.send(e).await;
            }
            "execute_input" => {
                if let Some(n) = c.get("execution_count").and_then(Value::as_u64) {
                    self.execution_count = n;
                }
            }
            "execute_result" | "display_data" | "update_display_data" => {
                if let Some(n) = c.get("execution_count").and_then(Value::as_u64) {
                    self.execution_count = n;
                }
                let mut b = bundle(c.get("data"));
                b.is_main_result = m.msg_type == "execute_result";
                b.bound(self.bounds.max_result_bytes);
                self.send(CodeEvent::Result(b)).await;
            }
            "error" => {
                let traceback = c
                    .get("traceback")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                let e = CodeEvent::Error {
                    name: text("ename"),
                    value: text("evalue"),
                    traceback,
                };
                self.send(e).await;
            }
            _ => {}
        }
    }
}

/// The MIME types Sandhub passes on, from a kernel's `data`.
fn bundle(data: Option<&Value>) -> ResultBundle {
    let s = |k: &str| {
        data.and_then(|d| d.get(k)).and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            // Text may come as a list of lines (nbformat style).
            Value::Array(a) => Some(a.iter().filter_map(Value::as_str).collect()),
            _ => None,
        })
    };
    ResultBundle {
        text: s("text/plain"),
        html: s("text/html"),
        markdown: s("text/markdown"),
        png: s("image/png").map(|p| p.replace('\n', "")),
        jpeg: s("image/jpeg").map(|p| p.replace('\n', "")),
        svg: s("image/svg+xml"),
        json: data.and_then(|d| d.get("application/json")).cloned(),
        is_main_result: false,
        truncated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiting_for_listeners_ends_soon_after_the_last_binds() {
        let first = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let second_port = free_port().unwrap();
        let ports = [first.local_addr().unwrap().port(), second_port];
        let started = Instant::now();
        let binder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Taken meanwhile by another process: then nothing to test.
            TcpListener::bind(("127.0.0.1", second_port)).ok()
        });
        tokio::time::timeout(Duration::from_secs(10), wait_listening(&ports))
            .await
            .expect("both ports listen");
        let waited = started.elapsed();
        let second = binder.await.unwrap();
        if second.is_some() {
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
            // The poll's pause is capped, so the wait ends within a few
            // pauses of the bind (zeromq's retry would have slept 400 ms).
            assert!(
                waited < Duration::from_millis(300) + 10 * LISTEN_POLL_MAX,
                "{waited:?}"
            );
        }
        drop(first);
    }
}
