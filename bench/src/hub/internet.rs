//! The egress phase's own "internet", built like the tests' one
//! (`hub/tests/common/internet.rs`): a network namespace made here, joined
//! to the host by a veth pair, with servers running on threads that
//! `setns()` into it. Nothing is ever sent to an address this machine does
//! not own:
//!
//! ```text
//! host side of the veth   198.19.0.1/24
//! the bench namespace     198.19.0.2/24   HTTP :80 (GET /bytes/N), a TCP sink :9, DNS :53
//! ```
//!
//! The DNS server answers every name under [`ZONE`] with 198.19.0.2 (so a
//! fresh name can be asked each time) and NXDOMAIN otherwise.
//!
//! Names (`shbench<pid>`, `shbh<pid>`, `shbn<pid>`) and addresses differ
//! from the tests' (`sheg*`, 198.18.0.0/24), and the tests' cross-process
//! lock is held while this is up, so a test run and a bench never fight
//! over routes. Dropping it (also on an error) removes the namespace and
//! the veth; Ctrl-C is handled by [`cleanup_on_ctrl_c`], and a run killed
//! outright is cleaned up by the next one ([`sweep_stale`]).

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::Sender,
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{bail, Context};
use sandhub_gateway::dns::wire;

/// The test internets' lock file (see `hub/tests/common/internet.rs`).
const LOCK: &str = "/run/sandhub-test-internet.lock";
const NS_PREFIX: &str = "shbench";
pub const HOST_ADDR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);
/// Names below this resolve to [`SERVER_ADDR`].
pub const ZONE: &str = "bench.test";
pub const HTTP_PORT: u16 = 80;
/// Accepts connections and holds each until the client closes it.
pub const SINK_PORT: u16 = 9;

pub struct Internet {
    ns: String,
    veth: String,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    _lock: std::fs::File,
}

impl Internet {
    pub fn up() -> anyhow::Result<Internet> {
        let lock = take_lock()?;
        sweep_stale();
        let pid = std::process::id() % 100_000;
        let (ns, veth, peer) = (
            format!("{NS_PREFIX}{pid}"),
            format!("shbh{pid}"),
            format!("shbn{pid}"),
        );
        // From here on, Drop removes whatever was made.
        let mut net = Internet {
            ns: ns.clone(),
            veth: veth.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            _lock: lock,
        };
        ip(&format!("netns add {ns}"))?;
        ip(&format!(
            "link add {veth} type veth peer name {peer} netns {ns}"
        ))?;
        ip(&format!("addr add {HOST_ADDR}/24 dev {veth}"))?;
        ip(&format!("link set {veth} up"))?;
        ip(&format!("-n {ns} link set lo up"))?;
        ip(&format!("-n {ns} addr add {SERVER_ADDR}/24 dev {peer}"))?;
        ip(&format!("-n {ns} link set {peer} up"))?;
        ip(&format!("-n {ns} route add default via {HOST_ADDR}"))?;
        net.serve(HTTP_PORT, serve_bytes)?;
        net.serve(SINK_PORT, hold_until_eof)?;
        net.serve_dns()?;
        Ok(net)
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Runs a server on a thread inside the namespace and waits until it
    /// says it is bound (`f` sends `Ok` on the channel it gets) or fails.
    fn spawn_inside(
        &mut self,
        f: impl FnOnce(&Sender<anyhow::Result<()>>) -> anyhow::Result<()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.ns))?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        self.threads.push(std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with an fd it owns.
            let r = if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                Err(anyhow::anyhow!(
                    "setns: {}",
                    std::io::Error::last_os_error()
                ))
            } else {
                f(&ready_tx)
            };
            if let Err(e) = r {
                let _ = ready_tx.send(Err(e));
            }
        }));
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .context("a server in the bench namespace did not start")?
    }

    /// A TCP server: one thread per connection running `handle`.
    fn serve(&mut self, port: u16, handle: fn(TcpStream)) -> anyhow::Result<()> {
        let stop = self.stop.clone();
        self.spawn_inside(move |ready| {
            let l = TcpListener::bind((SERVER_ADDR, port))?;
            let _ = ready.send(Ok(()));
            // Blocking accept: Drop wakes it with a connection of its own.
            for s in l.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(s) = s {
                    std::thread::spawn(move || handle(s));
                }
            }
            Ok(())
        })
    }

    fn serve_dns(&mut self) -> anyhow::Result<()> {
        let stop = self.stop.clone();
        self.spawn_inside(move |ready| {
            let s = UdpSocket::bind((SERVER_ADDR, 53))?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            let _ = ready.send(Ok(()));
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = s.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(q) = wire::parse_query(&buf[..n]) else {
                    continue;
                };
                let ours = q.name == ZONE || q.name.ends_with(&format!(".{ZONE}"));
                let answer = match (ours, q.qtype) {
                    (true, wire::TYPE_A) => wire::answer(&q, wire::NOERROR, &[SERVER_ADDR], 60),
                    (true, _) => wire::answer(&q, wire::NOERROR, &[], 60),
                    (false, _) => wire::answer(&q, wire::NXDOMAIN, &[], 60),
                };
                let _ = s.send_to(&answer, from);
            }
            Ok(())
        })
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for port in [HTTP_PORT, SINK_PORT] {
            let _ = TcpStream::connect_timeout(&(SERVER_ADDR, port).into(), Duration::from_secs(1));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        remove(&self.ns, &self.veth);
    }
}

/// `GET /bytes/N`: N bytes of zeros (HTTP/1.1, Connection: close).
fn serve_bytes(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let Some(len) = path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok())
    else {
        let _ = s
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    // 256 KiB writes: few syscalls, so the server is never the bottleneck.
    let chunk = vec![0u8; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if s.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n as u64;
    }
}

/// Holds a connection until the client closes it, so the server never
/// closes first (the client's connect is what is timed).
fn hold_until_eof(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = [0u8; 512];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// An exclusive flock on the tests' lock file; waits (and says so) while a
/// test run or another bench holds it.
fn take_lock() -> anyhow::Result<std::fs::File> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .with_context(|| format!("opening {LOCK}"))?;
    // SAFETY: flock on a file this function owns.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!("egress: waiting for {LOCK} (a test run or another bench holds it)");
        // SAFETY: as above; blocks until free.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("flock {LOCK}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(lock)
}

/// Removes bench namespaces (and their veths) whose process is gone: a
/// run killed with SIGKILL leaves them. Called with the lock held.
fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        // The name holds the pid modulo 100000, so an unrelated process
        // may hold a matching pid: then the namespace is left alone.
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            eprintln!("egress: removing {name}, left by a run that was killed");
            remove(&name, &format!("shbh{pid}"));
        }
    }
}

fn remove(ns: &str, veth: &str) {
    let _ = Command::new("ip").args(["link", "del", veth]).output();
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// On Ctrl-C, removes the namespace and veth, then SIGKILLs this run's
/// sandbox processes (those under `state_dir`: sandboxes outlive the hub,
/// which in the same process group gets the SIGINT too and stops), as the
/// suite's normal teardown ends, and exits 130. Runs when the
/// single-threaded runtime next polls, so at worst after the blocking
/// command of the moment (one download) ends.
pub fn cleanup_on_ctrl_c(net: &Internet, state_dir: std::path::PathBuf) {
    let (ns, veth) = (net.ns.clone(), net.veth.clone());
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("interrupted: removing {ns} and {veth}");
            remove(&ns, &veth);
            let killed = super::procs::kill_leftovers(&state_dir);
            eprintln!("interrupted: killed {killed} sandbox processes of this run");
            std::process::exit(130);
        }
    });
}

fn ip(args: &str) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {args}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
