//! Starting and stopping the sandboxd under test.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context};
use tokio::process::{Child, Command};

/// How long sandboxd may take to listen; startup is milliseconds, so
/// reaching this means it is broken, not slow.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SIGTERMed sandboxd may take to drain before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Daemon {
    /// `kill_on_drop`, so an error anywhere in the suite never leaves a
    /// sandboxd running.
    child: Child,
    pub bin: PathBuf,
    /// Upstream's Go daemon, rather than a build of ours.
    pub upstream: bool,
    pub rest_url: String,
    pub grpc_url: String,
}

impl Daemon {
    /// Starts sandboxd on two free loopback ports (legacy API off) and waits
    /// until both accept connections. No HTTP request is made, so the first
    /// health call the caller makes really is the first request served.
    pub async fn start(bin: &Path, root: &Path) -> anyhow::Result<Daemon> {
        let bin = bin.canonicalize().with_context(|| {
            format!(
                "sandboxd binary {} not found; build it with \
                     `cargo build --release -p sandboxd` or pass --sandboxd-bin",
                bin.display()
            )
        })?;
        let (rest_port, grpc_port) = (free_port()?, free_port()?);
        let mut command = Command::new(&bin);
        let upstream = is_upstream(&bin).await?;
        if upstream {
            // Upstream's Go daemon: no legacy port, and its logs at the
            // level ours runs at (no line per request).
            command.args(["--zap-log-level", "error"]);
        } else {
            command.args(["--legacy-port", "0"]);
        }
        let mut child = command
            .args(["--listen-host", "127.0.0.1"])
            .args(["--rest-port", &rest_port.to_string()])
            .args(["--grpc-port", &grpc_port.to_string()])
            .arg("--root-dir")
            .arg(root)
            // Warnings still reach the terminal; per-request info logs would
            // cost sandboxd time that is not part of what we measure.
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        for port in [rest_port, grpc_port] {
            loop {
                if let Some(status) = child.try_wait()? {
                    bail!("sandboxd exited during startup: {status}");
                }
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "sandboxd did not listen on port {port} within {STARTUP_TIMEOUT:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(Daemon {
            child,
            bin,
            upstream,
            rest_url: format!("http://127.0.0.1:{rest_port}"),
            grpc_url: format!("http://127.0.0.1:{grpc_port}"),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("sandboxd is not reaped before stop")
    }

    pub async fn health(&self, http: &reqwest::Client) -> anyhow::Result<()> {
        let url = format!("{}/v1/health", self.rest_url);
        let resp = http
            .get(&url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        ensure!(resp.status().is_success(), "GET {url}: {}", resp.status());
        Ok(())
    }

    /// SIGTERM, then SIGKILL if draining takes too long.
    pub async fn stop(mut self) {
        if let Some(pid) = self
            .child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
            .await
            .is_err()
        {
            eprintln!("sandboxd did not stop within {STOP_TIMEOUT:?}; killing it");
            let _ = self.child.kill().await;
        }
    }
}

/// Whether `bin` is upstream's sandboxd (Go's `flag` usage, no
/// `--legacy-port`) rather than ours.
async fn is_upstream(bin: &Path) -> anyhow::Result<bool> {
    let out = Command::new(bin)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {} --help", bin.display()))?;
    let help = [out.stdout, out.stderr].concat();
    Ok(!String::from_utf8_lossy(&help).contains("legacy-port"))
}

/// A loopback port that was free a moment ago (sandboxd binds it next; a
/// collision in between fails startup loudly rather than measuring wrong).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
