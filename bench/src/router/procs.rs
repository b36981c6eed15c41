//! The processes of the router suite: an nginx serving a fixed answer (the
//! upstream both proxies forward to), nginx as a reverse proxy (the
//! baseline), and sandhub-router (under test). Each is stopped by its PID.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A child process that gets SIGTERM (then SIGKILL) when dropped.
pub struct Proc {
    pub name: &'static str,
    child: Child,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> anyhow::Result<Proc> {
        let out = std::fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone()?))
            .stderr(Stdio::from(out))
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Proc { name, child })
    }

    /// Waits until `port` accepts connections (or the process exits).
    fn wait_listening(mut self, port: u16, log: &Path) -> anyhow::Result<Proc> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited during startup ({status}); log: {}",
                    self.name,
                    log.display()
                );
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(self);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not listening on {port} after {STARTUP_TIMEOUT:?}; log: {}",
                    self.name,
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nginx binary: `SANDHUB_BENCH_NGINX`, else on PATH, else /usr/sbin/nginx.
pub fn find(name: &str, explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!("{name} not found (apt-get install {name}; scripts/test-deps.sh lists it)")
        })
}

/// nginx in the foreground with a config of our own, in `dir`.
fn nginx(
    bin: &Path,
    dir: &Path,
    name: &'static str,
    server: &str,
    port: u16,
) -> anyhow::Result<Proc> {
    std::fs::create_dir_all(dir)?;
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes auto;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
         fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
         keepalive_requests 1000000;\n{server}\n}}\n",
        dir = dir.display()
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf)?;
    let log = dir.join("stderr.log");
    let proc = Proc::spawn(
        name,
        Command::new(bin)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path),
        &log,
    )?;
    proc.wait_listening(port, &log)
}

/// The upstream: a fixed small JSON answer, as cheap as a server gets, so
/// the proxies' own costs dominate.
pub fn upstream(bin: &Path, dir: &Path, port: u16) -> anyhow::Result<Proc> {
    let server = format!(
        "  server {{\n    listen 127.0.0.1:{port} reuseport backlog=4096;\n    location / {{\n      default_type application/json;\n      return 200 '{{\"status\":\"ok\"}}';\n    }}\n  }}"
    );
    nginx(bin, dir, "upstream nginx", &server, port)
}

/// The baseline: nginx as a reverse proxy with pooled keep-alive upstream
/// connections (nginx at its best; without `keepalive` it would dial per request).
pub fn nginx_proxy(bin: &Path, dir: &Path, port: u16, upstream_port: u16) -> anyhow::Result<Proc> {
    let server = format!(
        "  upstream sandbox {{\n    server 127.0.0.1:{upstream_port};\n    keepalive 512;\n  }}\n\
         server {{\n    listen 127.0.0.1:{port} reuseport backlog=4096;\n    location / {{\n\
         proxy_pass http://sandbox;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
         proxy_set_header Host $proxy_host;\n      proxy_set_header Authorization \"\";\n\
         proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n      proxy_set_header X-Forwarded-Host $host;\n\
         proxy_set_header X-Forwarded-Proto $scheme;\n      proxy_buffering off;\n    }}\n  }}"
    );
    nginx(bin, dir, "nginx proxy", &server, port)
}

/// sandhub-router routing by `X-Sandbox-Pod-IP` (loopback allowed for the bench).
pub fn router(bin: &Path, dir: &Path, port: u16, access_log: bool) -> anyhow::Result<Proc> {
    std::fs::create_dir_all(dir)?;
    let log = dir.join("router.log");
    let mut cmd = Command::new(bin);
    cmd.args(["--http-bind-address", &format!("127.0.0.1:{port}")])
        .args([
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ])
        .args([
            "--allow-loopback-pod-ip",
            &format!("--access-log={access_log}"),
        ])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    Proc::spawn("sandhub-router", &mut cmd, &log)?.wait_listening(port, &log)
}
