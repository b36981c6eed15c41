//! The hub's model of sandboxes: creation (warm claim or cold start),
//! tenancy, lifecycle, templates and pools, on top of a [`Backend`].
//! [`TenantHub`] is the [`Sandboxes`] implementation each API key sees.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use sandhub_api::{
    error::Code,
    hub::{
        CreateSandbox, ExecRequest, ExecResult, ForkRequest, Launch, NamedTemplate, Pool, PoolSpec,
        Sandbox, SandboxState, Snapshot, Template, DEFAULT_TEMPLATE,
    },
    sandboxd::{DirectoryListing, FileEntry},
    validate,
};
use sandhub_client::{
    sandboxd::SandboxdClient, ByteStream, Error, ProcessEvents, PtySize, Result, Sandboxes, Signal,
    StartProcess, StdinInput, WatchEvents, WriteOptions,
};
use tokio::sync::Notify;

use crate::{
    backend::{Backend, LaunchRequest},
    policy::Policy,
    store::{found, Claim, PoolRow, SandboxRow, SnapshotRow, Store},
};

/// How long a Finished sandbox's row and files are kept (for `get` and a
/// post-mortem look) before the reaper removes them.
const FINISHED_TTL_MS: i64 = 3600 * 1000;

pub struct Hub {
    pub store: Store,
    template_dirs: Vec<PathBuf>,
    policy: Policy,
    /// Held from a quota check to the insert of the row it admitted, so
    /// two concurrent creates cannot both take the last slot.
    admission: Mutex<()>,
    backend: Arc<dyn Backend>,
    clients: Mutex<HashMap<String, SandboxdClient>>,
    /// Wakes the pool refiller after a claim or a pool change.
    pub pools_changed: Notify,
    /// Ids being launched for pools right now, so a refill pass never
    /// double-counts a member that is still starting.
    launching: Mutex<HashMap<(String, String), u32>>,
    /// One lock per sandbox id, held across a lifecycle change (suspend,
    /// resume, reset, delete, the reaper's verdicts), so the reaper never
    /// judges a row that a suspend/resume is replacing: stopping the stale
    /// process tree would sweep the new one's cgroup.
    lifecycle: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Most bytes of snapshots one tenant may keep; 0: no limit.
    max_snapshot_bytes: AtomicU64,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `prefix-` plus 10 random `[a-z0-9]`: a DNS-1123 label, unguessable
/// enough that ids leak nothing about other tenants.
pub fn new_id(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let suffix: String = (0..10)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}-{suffix}")
}

fn to_api(row: &SandboxRow) -> Sandbox {
    Sandbox {
        id: row.id.clone(),
        template: row.template.clone(),
        state: row.state,
        labels: row.labels.clone(),
        launch: row.launch,
        created_at: rfc3339(row.created_at),
        shutdown_at: row.shutdown_at.map(rfc3339),
        idle_timeout_seconds: row.idle_timeout_seconds,
        pool: row.pool.clone(),
        forked_from: row.forked_from.clone(),
    }
}

fn snapshot_to_api(s: SnapshotRow) -> Snapshot {
    Snapshot {
        id: s.id,
        sandbox_id: s.sandbox_id,
        created_at: rfc3339(s.created_at),
        size_bytes: s.size_bytes,
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Code::InvalidArgument, msg)
}

/// The shared rules ([`Template::validate`]) and this host's: the
/// directories a template names must exist and be allowed.
fn check_template(t: &Template, template_dirs: &[PathBuf]) -> Result<()> {
    t.validate()?;
    for (what, dir) in [("root_fs", &t.root_fs), ("seed_dir", &t.seed_dir)] {
        if let Some(dir) = dir {
            let p = std::path::Path::new(dir);
            if !p.is_absolute() || !p.is_dir() {
                return Err(invalid(format!(
                    "{what} must be an absolute path to an existing directory on the hub's host: {dir}"
                )));
            }
            check_template_dir(what, p, template_dirs)?;
        }
    }
    Ok(())
}

/// A template may only name host directories the operator allowed: any
/// other (`/`, `/root`) would hand a tenant the host's files.
fn check_template_dir(what: &str, dir: &Path, allowed: &[PathBuf]) -> Result<()> {
    let real = dir
        .canonicalize()
        .map_err(|e| invalid(format!("{what} {}: {e}", dir.display())))?;
    if allowed.iter().any(|a| real.starts_with(a)) {
        return Ok(());
    }
    Err(Error::new(
        Code::PermissionDenied,
        if allowed.is_empty() {
            format!(
                "{what} {} is not allowed: this hub was started without --template-dirs, \
                 so templates cannot name host directories",
                dir.display()
            )
        } else {
            format!(
                "{what} {} is not under any of the hub's --template-dirs ({})",
                dir.display(),
                allowed
                    .iter()
                    .map(|a| a.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    ))
}

impl Hub {
    /// `template_dirs`: the host directories templates may name as
    /// `root_fs` or `seed_dir` (canonical paths).
    pub fn new(
        store: Store,
        backend: Arc<dyn Backend>,
        template_dirs: Vec<PathBuf>,
        policy: Policy,
    ) -> Arc<Self> {
        Arc::new(Hub {
            store,
            backend,
            template_dirs,
            policy,
            admission: Mutex::new(()),
            clients: Mutex::new(HashMap::new()),
            pools_changed: Notify::new(),
            launching: Mutex::new(HashMap::new()),
            lifecycle: Mutex::new(HashMap::new()),
            max_snapshot_bytes: AtomicU64::new(0),
        })
    }

    /// Caps the bytes of snapshots each tenant keeps (0: no cap). Snapshots
    /// live outside every sandbox's disk quota, so without a cap one tenant
    /// could fill the disk volume for all.
    pub fn set_max_snapshot_bytes(&self, bytes: u64) {
        self.max_snapshot_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The hub is stopping: the backend lets go of what only a running hub
    /// needs (the local disk volume's mount). Sandboxes keep running.
    pub fn shutdown(&self) {
        self.backend.shutdown();
    }

    /// The lifecycle lock of a sandbox that exists (unknown ids get none,
    /// so made-up ids leave nothing behind).
    async fn lock_existing(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        found(self.store.get_sandbox(tenant, id)?, "sandbox", id)?;
        Ok(self.lifecycle(id).lock_owned().await)
    }

    fn lifecycle(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.lifecycle
            .lock()
            .unwrap()
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Fault injection for the crash-recovery tests: with
    /// `SANDHUB_FAILPOINT_LAUNCHED_NOT_RECORDED_MS` set, every launch waits
    /// that long between the sandbox running and its runtime being recorded,
    /// the window in which a hub killed there leaves a sandbox it never
    /// learnt of. Unset (always, outside tests) it costs one env lookup.
    async fn failpoint_launched_not_recorded() {
        if let Some(ms) = std::env::var("SANDHUB_FAILPOINT_LAUNCHED_NOT_RECORDED_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
        }
    }

    /// The view one API key has.
    pub fn tenant(self: &Arc<Self>, tenant: impl Into<String>) -> TenantHub {
        TenantHub {
            hub: self.clone(),
            tenant: tenant.into(),
        }
    }

    pub fn template(&self, tenant: &str, name: &str) -> Result<Template> {
        match self.store.get_template(tenant, name)? {
            Some(t) => Ok(t),
            None if name == DEFAULT_TEMPLATE => Ok(Template::default()),
            None => Err(Error::not_found(format!(
                "template {name} not found; create it with PUT /v1/templates/{name}"
            ))),
        }
    }

    fn client(&self, row: &SandboxRow) -> Result<SandboxdClient> {
        if let Some(c) = self.clients.lock().unwrap().get(&row.id) {
            return Ok(c.clone());
        }
        let c = self.backend.connect(row)?;
        self.clients
            .lock()
            .unwrap()
            .insert(row.id.clone(), c.clone());
        Ok(c)
    }

    fn forget_client(&self, id: &str) {
        self.clients.lock().unwrap().remove(id);
    }

    /// A template as its sandboxes run: the operator's defaults fill the
    /// limits it leaves open, and what the operator does not allow (any
    /// more) is refused.
    fn effective_template(&self, tenant: &str, name: &str) -> Result<Template> {
        let t = self.template(tenant, name)?;
        self.policy.admit_template(&t)?;
        Ok(self.policy.effective(&t))
    }

    /// Inserts a new sandbox row if the tenant's quota has room for it.
    fn admit(&self, row: &SandboxRow) -> Result<()> {
        let more = self
            .effective_template(&row.tenant, &row.template)?
            .memory_mb
            .unwrap_or(0);
        let _one_at_a_time = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        let (mut have, mut memory) = (0u64, 0u64);
        let mut templates: HashMap<String, u64> = HashMap::new();
        for r in self.store.all_sandboxes()? {
            let live = matches!(
                r.state,
                SandboxState::Pending | SandboxState::Ready | SandboxState::Suspended
            );
            if r.tenant != row.tenant || !live {
                continue;
            }
            have += 1;
            let mb = match templates.get(&r.template) {
                Some(mb) => *mb,
                None => {
                    let mb = self
                        .template(&r.tenant, &r.template)
                        .map(|t| self.policy.effective(&t).memory_mb.unwrap_or(0))
                        .unwrap_or(0);
                    templates.insert(r.template.clone(), mb);
                    mb
                }
            };
            memory = memory.saturating_add(mb);
        }
        self.policy.admit_sandbox(have, memory, more)?;
        self.store.insert_sandbox(row)
    }

    /// Starts the sandbox a row describes and records it Ready.
    async fn start(&self, row: &mut SandboxRow) -> Result<()> {
        let template = self.effective_template(&row.tenant, &row.template)?;
        let snapshot_layer = match &row.forked_from {
            Some(snap) => Some(self.snapshot_path(snap)?),
            None => None,
        };
        let handle = self
            .backend
            .launch(LaunchRequest {
                row,
                template: &template,
                snapshot_layer,
            })
            .await?;
        Self::failpoint_launched_not_recorded().await;
        row.runtime = Some(handle);
        row.state = SandboxState::Ready;
        self.store
            .set_runtime(&row.id, SandboxState::Ready, row.runtime.as_ref())
    }

    fn snapshot_path(&self, snapshot_id: &str) -> Result<PathBuf> {
        self.backend
            .snapshot_layer(snapshot_id)
            .ok_or_else(|| Error::not_found(format!("snapshot {snapshot_id} has no stored layer")))
    }

    /// Creates a cold sandbox row (within the tenant's quota) and starts
    /// it; on failure nothing is left.
    async fn create_cold(&self, mut row: SandboxRow) -> Result<SandboxRow> {
        self.admit(&row)?;
        if let Err(e) = self.start(&mut row).await {
            let _ = self.backend.destroy(&row).await;
            let _ = self.store.delete_sandbox(&row.id);
            return Err(e);
        }
        Ok(row)
    }

    async fn remove(&self, row: &SandboxRow) -> Result<()> {
        self.forget_client(&row.id);
        self.backend.destroy(row).await?;
        self.store.delete_sandbox(&row.id)
    }

    /// A claimed sandbox of `tenant`, which must be running for `op`.
    fn running(&self, tenant: &str, id: &str, op: &str) -> Result<(SandboxRow, SandboxdClient)> {
        let row = found(self.store.get_sandbox(tenant, id)?, "sandbox", id)?;
        if row.state != SandboxState::Ready {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!(
                    "sandbox {id} is {}; {op} needs it Ready{}",
                    row.state.as_str(),
                    if row.state == SandboxState::Suspended {
                        format!(" (POST /v1/sandboxes/{id}/resume first)")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        let _ = self.store.touch(id, now_ms());
        let client = self.client(&row)?;
        Ok((row, client))
    }

    // ---- background work ------------------------------------------------

    /// After a restart: keep what still runs, mark what died.
    pub async fn recover(&self) -> Result<()> {
        for row in self.store.all_sandboxes()? {
            if row.state != SandboxState::Ready && row.state != SandboxState::Pending {
                continue;
            }
            if row.runtime.is_some() && self.backend.is_alive(&row) {
                tracing::info!(id = %row.id, "re-attached to running sandbox");
                continue;
            }
            // Stopped even without a recorded runtime: a hub killed mid-launch
            // leaves a sandbox whose processes it never learnt of (the
            // backend sweeps by id).
            tracing::warn!(id = %row.id, "sandbox died or was never finished while the hub was away");
            if let Err(e) = self.backend.stop(&row).await {
                tracing::warn!(id = %row.id, error = %e, "stopping the remains of a sandbox");
            }
            if row.claimed {
                self.finish(&row.id, now_ms())?;
            } else {
                // A dead warm member is worth nothing; the refiller replaces it.
                let _ = self.remove(&row).await;
            }
        }
        Ok(())
    }

    /// One pass of the lifecycle: deadlines, idle timeouts, dead sandboxes,
    /// and Finished ones (which must have no process left, and go after
    /// [`FINISHED_TTL_MS`]).
    pub async fn reap(&self) -> Result<()> {
        let now = now_ms();
        for row in self.store.all_sandboxes()? {
            if row.state == SandboxState::Finished {
                self.reap_finished(&row, now).await;
                continue;
            }
            if !row.claimed {
                continue;
            }
            // A sandbox in the middle of a change is judged on a later pass,
            // and on its row as it is now, not as the listing read it.
            let Ok(_guard) = self.lifecycle(&row.id).try_lock_owned() else {
                continue;
            };
            let Some(row) = self.store.get_any(&row.id)? else {
                continue;
            };
            let expired = row.shutdown_at.is_some_and(|t| t <= now);
            let idle = row.state == SandboxState::Ready
                && row
                    .idle_timeout_seconds
                    .is_some_and(|s| row.last_activity + (s as i64) * 1000 <= now)
                && !self.backend.busy(&row);
            if expired || idle {
                tracing::info!(id = %row.id, expired, idle, "sandbox reached its end of life");
                match self.remove(&row).await {
                    Ok(()) => {
                        self.lifecycle.lock().unwrap().remove(&row.id);
                    }
                    Err(e) => {
                        tracing::warn!(id = %row.id, error = %e, "removing an expired sandbox")
                    }
                }
                continue;
            }
            if row.state == SandboxState::Ready && !self.backend.is_alive(&row) {
                tracing::warn!(id = %row.id, "sandbox died");
                self.forget_client(&row.id);
                let _ = self.backend.stop(&row).await;
                self.finish(&row.id, now)?;
            } else if row.state == SandboxState::Ready && self.backend.busy(&row) {
                // A running process is activity: an idle clock restarts.
                let _ = self.store.touch(&row.id, now);
            }
        }
        Ok(())
    }

    /// Marks a sandbox Finished; its finishing time is its last activity.
    fn finish(&self, id: &str, now: i64) -> Result<()> {
        self.store.set_state(id, SandboxState::Finished)?;
        self.store.touch(id, now)
    }

    /// A Finished sandbox has no process: any found is killed (a stop that
    /// failed earlier). After its time to live it is removed.
    async fn reap_finished(&self, row: &SandboxRow, now: i64) {
        let Ok(_guard) = self.lifecycle(&row.id).try_lock_owned() else {
            return;
        };
        if self.backend.has_processes(row) {
            tracing::warn!(id = %row.id, "a Finished sandbox still had processes; stopping them");
            if let Err(e) = self.backend.stop(row).await {
                tracing::warn!(id = %row.id, error = %e, "stopping a Finished sandbox");
            }
        }
        if row.last_activity + FINISHED_TTL_MS <= now {
            tracing::info!(id = %row.id, "removing a Finished sandbox past its time to live");
            if self.remove(row).await.is_ok() {
                self.lifecycle.lock().unwrap().remove(&row.id);
            }
        }
    }

    /// One pass of every pool: start missing members, remove extra ones.
    pub async fn refill_pools(self: &Arc<Self>) -> Result<()> {
        for pool in self.store.list_pools(None)? {
            let members = self.store.pool_members(&pool.tenant, &pool.name)?;
            let key = (pool.tenant.clone(), pool.name.clone());
            let starting = *self.launching.lock().unwrap().get(&key).unwrap_or(&0);
            let have = members.len() as u32 + starting;
            if have < pool.replicas {
                for _ in 0..(pool.replicas - have) {
                    *self
                        .launching
                        .lock()
                        .unwrap()
                        .entry(key.clone())
                        .or_default() += 1;
                    let hub = self.clone();
                    let (pool, key) = (pool.clone(), key.clone());
                    tokio::spawn(async move {
                        if let Err(e) = hub.add_pool_member(&pool).await {
                            tracing::warn!(pool = %pool.name, error = %e, "starting a warm sandbox");
                        }
                        if let Some(n) = hub.launching.lock().unwrap().get_mut(&key) {
                            *n = n.saturating_sub(1);
                        }
                        hub.pools_changed.notify_one();
                    });
                }
            } else if (members.len() as u32) > pool.replicas {
                let extra = members.len() - pool.replicas as usize;
                // Not-ready members go first, then the newest.
                let mut victims: Vec<_> = members.iter().collect();
                victims.sort_by_key(|m| {
                    (
                        m.state == SandboxState::Ready,
                        std::cmp::Reverse(m.created_at),
                    )
                });
                for m in victims.into_iter().take(extra) {
                    let _ = self.remove(m).await;
                }
            }
        }
        Ok(())
    }

    async fn add_pool_member(&self, pool: &PoolRow) -> Result<()> {
        let now = now_ms();
        let row = SandboxRow {
            id: new_id("sb"),
            tenant: pool.tenant.clone(),
            template: pool.template.clone(),
            state: SandboxState::Pending,
            labels: BTreeMap::new(),
            env: BTreeMap::new(),
            launch: Launch::Warm,
            created_at: now,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: now,
            pool: Some(pool.name.clone()),
            claimed: false,
            forked_from: None,
            runtime: None,
        };
        self.create_cold(row).await.map(|_| ())
    }

    /// Runs the refiller and the reaper until the process ends.
    pub fn spawn_background(self: &Arc<Self>, reap_every: Duration) {
        let hub = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = hub.refill_pools().await {
                    tracing::warn!(error = %e, "refilling pools");
                }
                tokio::select! {
                    _ = hub.pools_changed.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        });
        let hub = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(reap_every);
            loop {
                tick.tick().await;
                if let Err(e) = hub.reap().await {
                    tracing::warn!(error = %e, "reaping sandboxes");
                }
            }
        });
    }
}

/// The hub as one tenant sees it.
#[derive(Clone)]
pub struct TenantHub {
    hub: Arc<Hub>,
    tenant: String,
}

impl TenantHub {
    fn pool_status(&self, p: &PoolRow) -> Result<Pool> {
        let members = self.hub.store.pool_members(&p.tenant, &p.name)?;
        let ready = members
            .iter()
            .filter(|m| m.state == SandboxState::Ready)
            .count() as u32;
        Ok(Pool {
            name: p.name.clone(),
            template: p.template.clone(),
            replicas: p.replicas,
            ready,
            total: members.len() as u32,
        })
    }
}

#[async_trait]
impl crate::tenancy::TenantView for TenantHub {
    fn tenant(&self) -> &str {
        &self.tenant
    }

    async fn sandboxd(&self, id: &str, op: &str) -> Result<SandboxdClient> {
        self.hub.running(&self.tenant, id, op).map(|(_, c)| c)
    }

    async fn list_snapshots(&self, id: &str) -> Result<Vec<Snapshot>> {
        let rows = self.hub.store.list_snapshots(&self.tenant, id)?;
        // Snapshots outlive their sandbox (and stay listed, to be deleted);
        // with none, an unknown sandbox is NOT_FOUND.
        if rows.is_empty() {
            self.get(id).await?;
        }
        Ok(rows.into_iter().map(snapshot_to_api).collect())
    }
}

#[async_trait]
impl crate::tenancy::Tenancy for Arc<Hub> {
    fn tenant(&self, tenant: &str) -> Arc<dyn crate::tenancy::TenantView> {
        Arc::new(Hub::tenant(self, tenant))
    }

    async fn ready(&self) -> Result<()> {
        self.store.list_pools(Some("")).map(|_| ())
    }

    async fn sandbox_count(&self) -> Result<usize> {
        Ok(self.store.all_sandboxes()?.len())
    }
}

#[async_trait]
impl Sandboxes for TenantHub {
    async fn create(&self, req: CreateSandbox) -> Result<Sandbox> {
        // The guard in front checks this too; the model never trusts it.
        req.validate()?;
        let hub = &self.hub;
        let pool = match (&req.pool, &req.template) {
            (Some(p), _) => Some(found(hub.store.get_pool(&self.tenant, p)?, "pool", p)?),
            // A pool named like the template is the template's warm supply.
            (None, Some(t)) => hub.store.get_pool(&self.tenant, t)?,
            (None, None) => hub.store.get_pool(&self.tenant, DEFAULT_TEMPLATE)?,
        };
        let template = match (&pool, &req.template) {
            (Some(p), Some(t)) if &p.template != t => {
                return Err(invalid(format!(
                    "pool {} serves template {}, not {t}",
                    p.name, p.template
                )))
            }
            (Some(p), _) => p.template.clone(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TEMPLATE.to_string(),
        };
        // Fails early with NOT_FOUND for an unknown template, and
        // PERMISSION_DENIED for one the operator no longer allows.
        hub.effective_template(&self.tenant, &template)?;
        let now = now_ms();
        let shutdown_at = req.shutdown_after_seconds.map(|s| now + (s as i64) * 1000);
        // Extra environment means a different process tree: never warm.
        if let (Some(pool), true) = (&pool, req.env.is_empty()) {
            let claim = Claim {
                tenant: &self.tenant,
                pool: &pool.name,
                labels: &req.labels,
                shutdown_at,
                idle_timeout_seconds: req.idle_timeout_seconds,
                now,
            };
            if let Some(row) = hub.store.claim_warm(&claim)? {
                hub.pools_changed.notify_one();
                return Ok(to_api(&row));
            }
        }
        let row = SandboxRow {
            id: new_id("sb"),
            tenant: self.tenant.clone(),
            template,
            state: SandboxState::Pending,
            labels: req.labels,
            env: req.env,
            launch: Launch::Cold,
            created_at: now,
            shutdown_at,
            idle_timeout_seconds: req.idle_timeout_seconds,
            last_activity: now,
            pool: None,
            claimed: true,
            forked_from: None,
            runtime: None,
        };
        let row = hub.create_cold(row).await?;
        Ok(to_api(&row))
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        let row = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        Ok(to_api(&row))
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        Ok(self
            .hub
            .store
            .list_sandboxes(&self.tenant)?
            .iter()
            .filter(|r| labels.iter().all(|(k, v)| r.labels.get(k) == Some(v)))
            .map(to_api)
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<()> {
        let _guard = self.hub.lock_existing(&self.tenant, id).await?;
        let row = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        self.hub.remove(&row).await?;
        self.hub.lifecycle.lock().unwrap().remove(id);
        Ok(())
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult> {
        let (_, client) = self.hub.running(&self.tenant, id, "exec")?;
        client.exec(request).await
    }

    async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents> {
        let (_, client) = self.hub.running(&self.tenant, id, "starting a process")?;
        client.start(request).await
    }

    async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()> {
        let (_, client) = self.hub.running(&self.tenant, id, "stdin")?;
        client.write_stdin(pid, input).await
    }

    async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()> {
        let (_, client) = self.hub.running(&self.tenant, id, "signal")?;
        client.signal(pid, signal).await
    }

    async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()> {
        let (_, client) = self.hub.running(&self.tenant, id, "resize")?;
        client.resize(pid, size).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream> {
        let (_, client) = self.hub.running(&self.tenant, id, "reading files")?;
        client.read_file(path).await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        let (_, client) = self.hub.running(&self.tenant, id, "writing files")?;
        client.write_file(path, data, options).await
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing> {
        let (_, client) = self.hub.running(&self.tenant, id, "listing files")?;
        client.list_files(path).await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        let (_, client) = self.hub.running(&self.tenant, id, "stat")?;
        client.stat(path).await
    }

    async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        let (_, client) = self.hub.running(&self.tenant, id, "deleting files")?;
        client.delete_file(path, recursive).await
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents> {
        let (_, client) = self.hub.running(&self.tenant, id, "watching")?;
        client.watch(path, recursive).await
    }

    async fn suspend(&self, id: &str) -> Result<Sandbox> {
        let _guard = self.hub.lock_existing(&self.tenant, id).await?;
        let (mut row, _) = self.hub.running(&self.tenant, id, "suspend")?;
        self.hub.forget_client(id);
        self.hub.backend.stop(&row).await?;
        row.state = SandboxState::Suspended;
        self.hub
            .store
            .set_runtime(id, SandboxState::Suspended, row.runtime.as_ref())?;
        Ok(to_api(&row))
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        let _guard = self.hub.lock_existing(&self.tenant, id).await?;
        let mut row = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        if row.state != SandboxState::Suspended {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("sandbox {id} is {}, not Suspended", row.state.as_str()),
            ));
        }
        self.hub.start(&mut row).await?;
        let _ = self.hub.store.touch(id, now_ms());
        Ok(to_api(&row))
    }

    async fn snapshot(&self, id: &str) -> Result<Snapshot> {
        let row = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        let limit = self.hub.max_snapshot_bytes.load(Ordering::Relaxed);
        if limit > 0 {
            let used = self.hub.store.snapshot_bytes(&self.tenant)?;
            if used >= limit {
                return Err(Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "snapshots take {used} bytes, at the limit of {limit} bytes per tenant; \
                         delete some (DELETE /v1/sandboxes/{{id}}/snapshots/{{snapshot}})"
                    ),
                ));
            }
        }
        let mut snap = SnapshotRow {
            id: new_id("snap"),
            tenant: self.tenant.clone(),
            sandbox_id: id.to_string(),
            created_at: now_ms(),
            size_bytes: None,
        };
        snap.size_bytes = Some(self.hub.backend.snapshot(&row, &snap.id).await?);
        self.hub.store.insert_snapshot(&snap)?;
        Ok(snapshot_to_api(snap))
    }

    async fn delete_snapshot(&self, id: &str, snapshot: &str) -> Result<()> {
        let snap = self
            .hub
            .store
            .get_snapshot(&self.tenant, snapshot)?
            .filter(|s| s.sandbox_id == id)
            .ok_or_else(|| {
                Error::not_found(format!("snapshot {snapshot} of sandbox {id} not found"))
            })?;
        // A fork's workspace lies on the snapshot (its lower layer), also
        // while suspended: deleting it would pull the floor from under it.
        let forks = self.hub.store.forks_of(&snap.id)?;
        if !forks.is_empty() {
            return Err(Error::new(
                Code::Conflict,
                format!(
                    "snapshot {snapshot} is the base of sandbox {}; delete the fork first",
                    forks.join(", ")
                ),
            ));
        }
        // The layer first: a failure leaves the row, so a retry finishes.
        self.hub.backend.delete_snapshot(&snap.id).await?;
        self.hub.store.delete_snapshot(&self.tenant, &snap.id)?;
        Ok(())
    }

    async fn reset(&self, id: &str) -> Result<Sandbox> {
        let _guard = self.hub.lock_existing(&self.tenant, id).await?;
        let (row, _) = self.hub.running(&self.tenant, id, "reset")?;
        self.hub.backend.reset(&row).await?;
        Ok(to_api(&row))
    }

    async fn fork(&self, id: &str, request: ForkRequest) -> Result<Sandbox> {
        request.validate()?;
        let source = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        let snapshot = match request.snapshot {
            Some(snap) => {
                let s = found(
                    self.hub.store.get_snapshot(&self.tenant, &snap)?,
                    "snapshot",
                    &snap,
                )?;
                if s.sandbox_id != id {
                    return Err(invalid(format!(
                        "snapshot {snap} was taken of {}, not {id}",
                        s.sandbox_id
                    )));
                }
                s.id
            }
            None => self.snapshot(id).await?.id,
        };
        let now = now_ms();
        let row = SandboxRow {
            id: new_id("sb"),
            tenant: self.tenant.clone(),
            template: source.template.clone(),
            state: SandboxState::Pending,
            labels: if request.labels.is_empty() {
                source.labels.clone()
            } else {
                request.labels
            },
            env: source.env.clone(),
            launch: Launch::Cold,
            created_at: now,
            shutdown_at: None,
            idle_timeout_seconds: source.idle_timeout_seconds,
            last_activity: now,
            pool: None,
            claimed: true,
            forked_from: Some(snapshot),
            runtime: None,
        };
        let row = self.hub.create_cold(row).await?;
        Ok(to_api(&row))
    }

    async fn put_template(&self, name: &str, template: Template) -> Result<NamedTemplate> {
        validate::name("template", name)?;
        check_template(&template, &self.hub.template_dirs)?;
        self.hub.policy.admit_template(&template)?;
        self.hub.store.put_template(&self.tenant, name, &template)?;
        Ok(NamedTemplate {
            name: name.to_string(),
            template,
        })
    }

    async fn get_template(&self, name: &str) -> Result<NamedTemplate> {
        Ok(NamedTemplate {
            name: name.to_string(),
            template: self.hub.template(&self.tenant, name)?,
        })
    }

    async fn list_templates(&self) -> Result<Vec<NamedTemplate>> {
        let mut out: Vec<NamedTemplate> = self
            .hub
            .store
            .list_templates(&self.tenant)?
            .into_iter()
            .map(|(name, template)| NamedTemplate { name, template })
            .collect();
        if !out.iter().any(|t| t.name == DEFAULT_TEMPLATE) {
            out.insert(
                0,
                NamedTemplate {
                    name: DEFAULT_TEMPLATE.into(),
                    template: Template::default(),
                },
            );
        }
        Ok(out)
    }

    async fn delete_template(&self, name: &str) -> Result<()> {
        let in_use = self
            .hub
            .store
            .list_pools(Some(&self.tenant))?
            .into_iter()
            .find(|p| p.template == name);
        if let Some(p) = in_use {
            return Err(Error::new(
                Code::Conflict,
                format!(
                    "template {name} is used by pool {}; delete the pool first",
                    p.name
                ),
            ));
        }
        if self.hub.store.delete_template(&self.tenant, name)? {
            Ok(())
        } else {
            Err(Error::not_found(format!("template {name} not found")))
        }
    }

    async fn put_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool> {
        validate::name("pool", name)?;
        spec.validate()?;
        self.hub.effective_template(&self.tenant, &spec.template)?;
        let others: u64 = self
            .hub
            .store
            .list_pools(Some(&self.tenant))?
            .iter()
            .filter(|p| p.name != name)
            .map(|p| p.replicas as u64)
            .sum();
        self.hub
            .policy
            .admit_replicas(others + spec.replicas as u64)?;
        let row = PoolRow {
            tenant: self.tenant.clone(),
            name: name.to_string(),
            template: spec.template,
            replicas: spec.replicas,
        };
        // A template change makes existing members stale: replace them.
        if let Some(old) = self.hub.store.get_pool(&self.tenant, name)? {
            if old.template != row.template {
                for m in self.hub.store.pool_members(&self.tenant, name)? {
                    let _ = self.hub.remove(&m).await;
                }
            }
        }
        self.hub.store.put_pool(&row)?;
        self.hub.pools_changed.notify_one();
        self.pool_status(&row)
    }

    async fn get_pool(&self, name: &str) -> Result<Pool> {
        let p = found(self.hub.store.get_pool(&self.tenant, name)?, "pool", name)?;
        self.pool_status(&p)
    }

    async fn list_pools(&self) -> Result<Vec<Pool>> {
        self.hub
            .store
            .list_pools(Some(&self.tenant))?
            .iter()
            .map(|p| self.pool_status(p))
            .collect()
    }

    async fn delete_pool(&self, name: &str) -> Result<()> {
        if !self.hub.store.delete_pool(&self.tenant, name)? {
            return Err(Error::not_found(format!("pool {name} not found")));
        }
        for m in self.hub.store.pool_members(&self.tenant, name)? {
            let _ = self.hub.remove(&m).await;
        }
        Ok(())
    }
}
