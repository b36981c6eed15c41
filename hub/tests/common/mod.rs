//! A real `sandhub serve` for integration tests: the built binary on a free
//! loopback port with its own state directory, reached over HTTP.
//!
//! Sandboxes outlive their hub by design, so dropping a [`TestHub`] deletes
//! every sandbox and pool through the API first, then kills the hub, and as a
//! last resort kills every process whose mounts name this hub's directory
//! (each sandbox process has its state dir mounted) and removes their cgroups.

#![allow(dead_code)]

pub mod internet;
pub mod mcp;

use std::{
    future::Future,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use sandhub_api::hub::{self as api, ExecRequest, ExecResult};
use sandhub_client::{http::HubClient, Sandboxes};
use tempfile::TempDir;

pub const EXE: &str = env!("CARGO_BIN_EXE_sandhub");
/// Upper bound of every wait in these tests (never a timing assertion).
pub const WAIT: Duration = Duration::from_secs(60);

pub const ALICE_KEY: &str = "alice-key-3f9a1c2b7d5e4f60";
pub const BOB_KEY: &str = "bob-key-8e7d6c5b4a392817";

#[derive(Debug, Clone, Copy, Default)]
pub struct HubOptions {
    /// Start with an API keys file: `ALICE_KEY alice`, `BOB_KEY bob`.
    pub api_keys: bool,
    /// More `sandhub serve` flags (policy, quotas, upload cap, ...).
    pub extra_args: &'static [&'static str],
    /// More environment for `sandhub serve` (fault injection).
    pub extra_env: &'static [(&'static str, &'static str)],
    /// Start the hub with this hard and soft `RLIMIT_NOFILE` (systemd's
    /// 1024, say), which it then cannot raise.
    pub nofile: Option<u64>,
    /// An argv the hub's command line is appended to (`unshare ... --`),
    /// to start it in a changed world (a mount namespace without
    /// `/dev/net/tun`, say). Empty: the hub itself.
    pub wrapper: &'static [&'static str],
}

pub struct TestHub {
    /// Holds the state dir, the keys file, the log and anything a test
    /// puts on the host; its unique name marks every process of this hub.
    pub dir: TempDir,
    pub state_dir: PathBuf,
    pub port: u16,
    options: HubOptions,
    child: Option<Child>,
    log: PathBuf,
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a free port")
        .port()
}

/// Runs a shell script in a sandbox (two minutes at most).
pub async fn shell(c: &HubClient, id: &str, script: &str) -> ExecResult {
    let request = ExecRequest {
        command: api::Command::Shell(script.into()),
        env: Default::default(),
        cwd: String::new(),
        timeout_seconds: Some(120.0),
        stdin: String::new(),
        container: None,
    };
    c.exec(id, request)
        .await
        .unwrap_or_else(|e| panic!("exec {script:?} in {id}: {e}"))
}

/// Runs a shell script that must succeed; returns its stdout.
pub async fn shell_ok(c: &HubClient, id: &str, script: &str) -> String {
    let r = shell(c, id, script).await;
    assert_eq!(r.exit_code, 0, "{script:?} failed: {r:?}");
    r.stdout
}

/// An API error body: `{"code": ..., "message": ...}` with a non-empty message.
pub async fn error_body(response: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    let got = response.status().as_u16();
    let text = response.text().await.unwrap();
    assert_eq!(got, status, "status of {text}");
    let body: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {text}"));
    assert_eq!(body["code"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error without a message: {body}"
    );
    body
}

/// Polls `f` until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl TestHub {
    pub async fn start(options: HubOptions) -> TestHub {
        let dir = tempfile::Builder::new()
            .prefix("sandhub-api-test-")
            .tempdir()
            .expect("creating the test dir");
        let state_dir = dir.path().join("state");
        let log = dir.path().join("hub.log");
        if options.api_keys {
            std::fs::write(
                dir.path().join("api-keys"),
                format!("# test keys\n{ALICE_KEY} alice\n{BOB_KEY} bob\n"),
            )
            .unwrap();
        }
        let mut hub = TestHub {
            dir,
            state_dir,
            port: 0,
            options,
            child: None,
            log,
        };
        hub.spawn_healthy().await;
        hub
    }

    /// The unique name of this hub's directory.
    pub fn token(&self) -> String {
        self.dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    /// Where the hub keeps its sandboxes' state dirs on the host: on the
    /// disk volume when it has one.
    pub fn sandboxes_dir(&self) -> PathBuf {
        // A state dir on btrfs with quotas on holds the volume's dirs itself.
        let native = self.state_dir.join("volume");
        disk_volume(&self.state_dir)
            .or_else(|| native.is_dir().then_some(native))
            .unwrap_or_else(|| self.state_dir.clone())
            .join("sandboxes")
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The `Sandboxes` client, with `key` as bearer token when given.
    pub fn client(&self, key: Option<&str>) -> HubClient {
        HubClient::new(self.url(), key.map(str::to_string)).unwrap()
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder().timeout(WAIT).build().unwrap()
    }

    /// The text of `GET /metrics` (no key needed).
    pub async fn metrics(&self) -> String {
        self.http()
            .get(format!("{}/metrics", self.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The hub's whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    fn command(&self) -> Command {
        let mut cmd = match self.options.wrapper.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(EXE);
                cmd
            }
            None => Command::new(EXE),
        };
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--reap-interval")
            .arg("300ms")
            .arg("--template-dirs")
            .arg(self.dir.path());
        if self.options.api_keys {
            cmd.arg("--api-keys-file")
                .arg(self.dir.path().join("api-keys"));
        }
        cmd.args(self.options.extra_args);
        cmd.envs(self.options.extra_env.iter().copied());
        if let Some(n) = self.options.nofile {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe; nothing else runs
            // between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        cmd.current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .env_remove("SANDHUB_API_KEYS_FILE")
            .env_remove("SANDHUB_LISTEN")
            .env_remove("SANDHUB_STATE_DIR")
            .env_remove("SANDHUB_MAX_UPLOAD_BYTES")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        cmd
    }

    /// Starts the hub (on the same port when restarting, if still free)
    /// and waits for `/healthz`.
    async fn spawn_healthy(&mut self) {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        for attempt in 0..3 {
            if self.port == 0 || attempt > 0 {
                self.port = free_port();
            }
            let mut child = self.command().spawn().expect("spawning sandhub serve");
            let deadline = Instant::now() + WAIT;
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    eprintln!(
                        "sandhub serve exited during startup ({status}):\n{}",
                        self.log_tail()
                    );
                    break;
                }
                let url = format!("{}/healthz", self.url());
                if let Ok(r) = http.get(&url).send().await {
                    if r.status().is_success() {
                        self.child = Some(child);
                        return;
                    }
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("sandhub serve not healthy in time:\n{}", self.log_tail());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("sandhub serve would not start:\n{}", self.log_tail());
    }

    /// SIGTERM to the hub (as a kubelet stopping its Pod sends).
    pub fn sigterm(&self) {
        let pid = self.child.as_ref().expect("the hub runs").id();
        // SAFETY: a plain kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    }

    /// Waits up to `timeout` for the hub to exit; its status, if it did.
    pub async fn exited_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The hub's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// `kill -9` of the hub; its sandboxes keep running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The options the next (re)start uses.
    pub fn options_mut(&mut self) -> &mut HubOptions {
        &mut self.options
    }

    /// Starts the hub again on the same state dir.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn_healthy().await;
    }

    /// Deletes every pool and sandbox of every tenant through the API.
    fn delete_everything(&self) {
        if self.child.is_none() {
            return;
        }
        let url = self.url();
        let keys: Vec<Option<String>> = if self.options.api_keys {
            vec![Some(ALICE_KEY.into()), Some(BOB_KEY.into())]
        } else {
            vec![None]
        };
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let work = async {
                    for key in keys {
                        let c = HubClient::new(url.clone(), key).unwrap();
                        for p in c.list_pools().await.unwrap_or_default() {
                            let _ = c.delete_pool(&p.name).await;
                        }
                        for s in c.list(&Default::default()).await.unwrap_or_default() {
                            if let Err(e) = c.delete(&s.id).await {
                                eprintln!("cleanup: deleting {}: {e}", s.id);
                            }
                        }
                    }
                };
                if tokio::time::timeout(WAIT, work).await.is_err() {
                    eprintln!("cleanup: the hub did not delete everything in time");
                }
            })
        });
        let _ = cleanup.join();
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- sandhub serve log ({}) ---\n{}",
                self.url(),
                self.log_tail()
            );
        }
        self.delete_everything();
        self.kill9();
        let volume = disk_volume(&self.state_dir);
        kill_leftovers(&self.token(), &self.state_dir, volume.as_deref());
        if let Some(volume) = volume {
            detach_volume(&volume);
        }
    }
}

/// Where the hub mounted the sandboxes' disk volume for `state_dir` (the
/// hub's default `--disk-volume-dir`), if it is mounted.
pub fn disk_volume(state_dir: &Path) -> Option<PathBuf> {
    let state_dir = state_dir.canonicalize().ok()?;
    let mount_point = sandhub::local::runtime::quota::plan::mount_point(
        Path::new(sandhub::local::runtime::quota::DEFAULT_RUN_DIR),
        &state_dir,
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    sandhub::local::runtime::quota::plan::find_mount(&mountinfo, &mount_point).map(|_| mount_point)
}

/// Unmounts a test hub's disk volume (the hub leaves it mounted when
/// killed, as sandboxes may still use it); its loop device goes with the
/// last user.
pub fn detach_volume(mount_point: &Path) {
    let Ok(path) = std::ffi::CString::new(mount_point.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: umount2 reads a NUL-terminated path and has no other effect
    // on this process's memory.
    unsafe {
        libc::umount2(path.as_ptr(), libc::MNT_DETACH);
    }
    let _ = std::fs::remove_dir(mount_point);
}

/// Host pids whose mount table mentions `needle`: every process of a local
/// sandbox has its state dir (which lies under the test's dir) mounted.
pub fn host_pids_with_mount(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let mounts = std::fs::read_to_string(entry.path().join("mountinfo")).unwrap_or_default();
        if mounts.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// SIGKILLs every process whose mounts mention `needle`, until none is left.
pub fn kill_host_pids_with_mount(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = host_pids_with_mount(needle);
        if pids.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            eprintln!("cleanup: processes of {needle} survive SIGKILL: {pids:?}");
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory effects; the pid was found by
            // this test's own directory in its mount table.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last resort: nothing of this hub may outlive its test.
fn kill_leftovers(token: &str, state_dir: &Path, volume: Option<&Path>) {
    // Cgroups are named after sandbox ids, which are the entries of the
    // sandboxes dir (on the disk volume, or in the state dir without one).
    let sandboxes = volume.unwrap_or(state_dir).join("sandboxes");
    let ids: Vec<std::ffi::OsString> = std::fs::read_dir(sandboxes)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let cgroups: Vec<PathBuf> = ids
        .iter()
        .flat_map(|id| {
            std::iter::once(Path::new("/sys/fs/cgroup/sandhub").join(id))
                .chain(roots.iter().map(move |r| r.join("sandhub").join(id)))
        })
        .filter(|cg| cg.is_dir())
        .collect();
    // A sandbox left paused: a frozen process dies of SIGKILL only once
    // thawed (cgroup v1's freezer).
    for cg in &cgroups {
        let _ = std::fs::write(cg.join("freezer.state"), "THAWED");
        let _ = std::fs::write(cg.join("cgroup.freeze"), "0");
    }
    let leftovers = host_pids_with_mount(token);
    if !leftovers.is_empty() {
        eprintln!("cleanup: killing leftover sandbox processes {leftovers:?}");
        kill_host_pids_with_mount(token);
    }
    for cg in cgroups {
        // Nested cgroups first (a v2 sandbox may have a leaf below).
        if let Ok(children) = std::fs::read_dir(&cg) {
            for c in children.flatten() {
                if c.path().is_dir() {
                    let _ = std::fs::remove_dir(c.path());
                }
            }
        }
        let _ = std::fs::remove_dir(&cg);
    }
}

/// Unmounts the image roots a hub mounted: a test hub ends with `kill -9`,
/// which skips the hub's own unmount at shutdown. Hold it for the test.
pub struct ImageMounts(PathBuf);

impl ImageMounts {
    pub fn of(hub: &TestHub) -> Self {
        ImageMounts(hub.state_dir.join("images/mnt"))
    }
}

impl Drop for ImageMounts {
    fn drop(&mut self) {
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let _ = rustix::mount::unmount(e.path(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}
