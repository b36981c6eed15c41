//! The hub under test: a release `sandhub serve` on loopback with a fresh
//! state dir, a JSON client for its REST API, and the teardown that leaves
//! no sandbox, pool, env or process behind.

use std::{
    collections::BTreeSet,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// No single API call of this suite should take anywhere near this; one
/// that does means the hub is stuck, and the bench must not hang on it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Hub {
    child: Child,
    pub bin: PathBuf,
    pub url: String,
    pub state_dir: PathBuf,
    pub http: reqwest::Client,
    /// What this run created, so teardown deletes exactly that.
    sandboxes: BTreeSet<String>,
    pools: BTreeSet<String>,
    envs: BTreeSet<String>,
}

impl Hub {
    /// Starts `sandhub serve` with `extra` flags after the suite's own
    /// (e.g. `--insecure-registry HOST:PORT` for the pull phase).
    pub async fn start(
        bin: &Path,
        state_dir: &Path,
        log: &Path,
        extra: &[String],
    ) -> anyhow::Result<Hub> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log_file = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--reap-interval", "1s"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .env_remove("SANDHUB_API_KEYS_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone()?))
            .stderr(Stdio::from(log_file))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut hub = Hub {
            child,
            bin: bin.to_path_buf(),
            url: format!("http://127.0.0.1:{port}"),
            state_dir: state_dir.to_path_buf(),
            http: reqwest::Client::builder().timeout(CALL_TIMEOUT).build()?,
            sandboxes: BTreeSet::new(),
            pools: BTreeSet::new(),
            envs: BTreeSet::new(),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = hub.child.try_wait()? {
                bail!(
                    "sandhub serve exited during startup ({status}); log: {}",
                    log.display()
                );
            }
            let ok = hub
                .http
                .get(format!("{}/healthz", hub.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok(hub);
            }
            if Instant::now() > deadline {
                hub.stop().await;
                bail!("sandhub serve not healthy after {STARTUP_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One JSON call; a non-2xx status is an error carrying the body.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{method} {path}: {status}: {text}");
        }
        if text.is_empty() || status == StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("{method} {path}: body {text}"))
    }

    /// `POST /v1/sandboxes {}`: the new sandbox's id and how it was launched.
    pub async fn create(&mut self) -> anyhow::Result<(String, String)> {
        self.create_with(json!({})).await
    }

    /// The same from a named template.
    pub async fn create_from(&mut self, template: &str) -> anyhow::Result<(String, String)> {
        self.create_with(json!({ "template": template })).await
    }

    pub async fn create_with(&mut self, body: Value) -> anyhow::Result<(String, String)> {
        let v = self.call(Method::POST, "/v1/sandboxes", Some(body)).await?;
        let id = str_field(&v, "id")?;
        self.sandboxes.insert(id.clone());
        let launch = match v.get("launch") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => "?".into(),
        };
        Ok((id, launch))
    }

    pub async fn delete(&mut self, id: &str) -> anyhow::Result<()> {
        self.call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await?;
        self.sandboxes.remove(id);
        Ok(())
    }

    /// Registers a sandbox made some other way (MCP, Gym) for teardown.
    pub fn track_sandbox(&mut self, id: String) {
        self.sandboxes.insert(id);
    }

    pub fn track_env(&mut self, id: String) {
        self.envs.insert(id);
    }

    /// Deletes every Gym env this run made (and with it its sandbox).
    pub async fn delete_envs(&mut self) {
        for env in std::mem::take(&mut self.envs) {
            if let Err(e) = self
                .call(Method::DELETE, &format!("/gym/v1/envs/{env}"), None)
                .await
            {
                eprintln!("deleting env {env}: {e:#}");
            }
        }
    }

    pub async fn put_pool(&mut self, name: &str, replicas: u32) -> anyhow::Result<()> {
        self.pools.insert(name.to_string());
        self.call(
            Method::PUT,
            &format!("/v1/pools/{name}"),
            Some(json!({"template": "default", "replicas": replicas})),
        )
        .await?;
        Ok(())
    }

    /// `(ready, total)` of a pool.
    pub async fn pool(&self, name: &str) -> anyhow::Result<(u64, u64)> {
        let v = self
            .call(Method::GET, &format!("/v1/pools/{name}"), None)
            .await?;
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        Ok((n("ready"), n("total")))
    }

    pub async fn delete_pool(&mut self, name: &str) -> anyhow::Result<()> {
        self.call(Method::DELETE, &format!("/v1/pools/{name}"), None)
            .await?;
        self.pools.remove(name);
        Ok(())
    }

    /// Where the sandbox's sandboxd listens on the host.
    pub fn socket_dir(&self, id: &str) -> PathBuf {
        // A hub with disk quotas keeps its sandboxes on its quota volume
        // (`/run/sandhub/volumes/<hash>/`, or `volume/` in a btrfs state
        // dir); older hubs and --allow-no-disk-quota in the state dir.
        let volumes = std::fs::read_dir("/run/sandhub/volumes")
            .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        std::iter::once(self.state_dir.clone())
            .chain(std::iter::once(self.state_dir.join("volume")))
            .chain(volumes)
            .map(|root| root.join("sandboxes").join(id).join("sock"))
            .find(|sock| sock.is_dir())
            .unwrap_or_else(|| self.state_dir.join("sandboxes").join(id).join("sock"))
    }

    /// Deletes every env, pool and sandbox this run made (and any sandbox
    /// the hub still lists), then SIGTERMs the hub. Never fails: a leftover
    /// is reported on stderr and [`super::procs::kill_leftovers`] follows.
    pub async fn teardown(&mut self) {
        self.delete_envs().await;
        for pool in self.pools.clone() {
            if let Err(e) = self.delete_pool(&pool).await {
                eprintln!("teardown: pool {pool}: {e:#}");
            }
        }
        if let Ok(list) = self.call(Method::GET, "/v1/sandboxes", None).await {
            for s in list["sandboxes"].as_array().into_iter().flatten() {
                if let Some(id) = s["id"].as_str() {
                    self.sandboxes.insert(id.to_string());
                }
            }
        }
        let ids: Vec<String> = self.sandboxes.iter().cloned().collect();
        for id in ids {
            match self.delete(&id).await {
                Ok(()) => {}
                Err(e) if e.to_string().contains("404") => {
                    self.sandboxes.remove(&id);
                }
                Err(e) => eprintln!("teardown: sandbox {id}: {e:#}"),
            }
        }
        self.stop().await;
    }

    async fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A path segment for a reference such as `bench/pull:1` (its `/` and
/// `:` escaped, as the client's `remove_image` does).
pub fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub fn str_field(v: &Value, key: &str) -> anyhow::Result<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("no string {key:?} in {v}"))
}
