//! Starts the real sandboxd binary on loopback for integration tests.
#![allow(dead_code)]

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct Daemon {
    pub child: Child,
    pub root: tempfile::TempDir,
    pub rest_port: u16,
    pub grpc_port: u16,
    pub legacy_port: u16,
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `port` accepts, or the daemon exits, or 10 s pass.
fn listening(child: &mut Child, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandboxd"))
}

impl Daemon {
    /// Starts sandboxd with a fresh temp root and the given extra flags.
    pub fn start(extra: &[&str]) -> Daemon {
        let root = tempfile::tempdir().unwrap();
        Self::start_in(root, extra)
    }

    pub fn start_in(root: tempfile::TempDir, extra: &[&str]) -> Daemon {
        // A port found free can be taken by a parallel test before the
        // daemon binds it; such a start fails fast and is retried.
        for _ in 0..5 {
            let (rest_port, grpc_port, legacy_port) = (free_port(), free_port(), free_port());
            let mut child = Command::new(binary())
                .args(["--listen-host", "127.0.0.1"])
                .args(["--rest-port", &rest_port.to_string()])
                .args(["--grpc-port", &grpc_port.to_string()])
                .args(["--legacy-port", &legacy_port.to_string()])
                .arg("--root-dir")
                .arg(root.path())
                .args(extra)
                .env(
                    "RUST_LOG",
                    std::env::var("SANDBOXD_TEST_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .stdin(Stdio::null())
                .spawn()
                .expect("spawning sandboxd");
            if listening(&mut child, rest_port) && listening(&mut child, grpc_port) {
                return Daemon {
                    child,
                    root,
                    rest_port,
                    grpc_port,
                    legacy_port,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("sandboxd did not start listening after 5 attempts");
    }

    pub fn rest(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.rest_port, path)
    }

    pub fn legacy(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.legacy_port, path)
    }

    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    pub fn root_path(&self) -> &Path {
        self.root.path()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // sandboxd starts code kernels and detached commands in process
        // groups of their own, which a SIGKILL of sandboxd alone leaves to
        // init: seven kernels of `code_kernel.rs` (one of 1.5 GB) outlived a
        // CI run. In a sandbox its PID namespace ends them; here, end them
        // while they are still sandboxd's children.
        kill_children(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `pid` runs (a zombie has a /proc entry but does not).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// `parent`'s children now: each one's pid and process group.
pub fn children(parent: u32) -> Vec<(i32, i32)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command's closing parenthesis: state, ppid, pgrp, ...
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace().skip(1);
            let ppid = fields.next()?.parse::<u32>().ok()?;
            let pgrp = fields.next()?.parse::<i32>().ok()?;
            (ppid == parent).then_some((pid, pgrp))
        })
        .collect()
}

/// SIGKILL to every child of `parent` and, for a child that leads its own
/// process group, to that whole group.
pub fn kill_children(parent: u32) {
    for (pid, pgrp) in children(parent) {
        let target = if pgrp == pid { -pid } else { pid };
        // SAFETY: a plain kill of a process (group) this test's daemon started.
        unsafe { libc::kill(target, libc::SIGKILL) };
    }
}
