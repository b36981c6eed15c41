//! The local backend's model of sandboxes: the [`Hub`] over its store and
//! its [`LocalBackend`], with creation (admission within quotas, cold start),
//! templates and the per-sandbox client cache. Its tenant view is in
//! `tenant.rs`, recovery and reaping in `lifecycle.rs`, warm pools in
//! `pools.rs`; the decisions those two take are the pure ones of `plan.rs`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use sandhub_api::{
    error::Code,
    hub::{IdleAction, Sandbox, SandboxState, Snapshot, Template, DEFAULT_TEMPLATE},
};
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};
use tokio::sync::Notify;

use super::{
    runtime_adapter::{LaunchRequest, LocalBackend},
    store::{found, Activity, SandboxRow, SnapshotRow, Store},
};
use crate::{
    backend::{now_ms, rfc3339},
    events::{DeleteReason, EventLog, EventType, NewEvent},
    policy::Policy,
};

/// The local hub. Its parts are `pub(super)`: `tenant.rs`, `lifecycle.rs`
/// and `pools.rs` are this one type's other files.
pub struct Hub {
    pub store: Store,
    pub(super) template_dirs: Vec<PathBuf>,
    pub(super) policy: Policy,
    /// Held from a quota check to the insert of the row it admitted, so
    /// two concurrent creates cannot both take the last slot.
    pub(super) admission: Mutex<()>,
    /// Held across a named volume's row change and its disk step, so a
    /// create and a delete of one name never interleave (`volumes.rs`).
    pub(super) volumes: Mutex<()>,
    pub(super) backend: LocalBackend,
    pub(super) clients: Mutex<HashMap<String, SandboxdClient>>,
    /// The network namespaces the port proxy dials into, by sandbox.
    pub(super) namespaces: super::ports::Namespaces,
    /// Wakes the pool refiller after a claim or a pool change.
    pub pools_changed: Notify,
    /// Ids being launched for pools right now, so a refill pass never
    /// double-counts a member that is still starting.
    pub(super) launching: Mutex<HashMap<(String, String), u32>>,
    /// Pools whose warm starts keep failing: no start before `retry_at`.
    pub(super) pool_failures: Mutex<HashMap<(String, String), PoolFailure>>,
    /// One lock per sandbox id, held across a lifecycle change (suspend,
    /// resume, reset, delete, the reaper's verdicts), so the reaper never
    /// judges a row that a suspend/resume is replacing: stopping the stale
    /// process tree would sweep the new one's cgroup.
    pub(super) lifecycle: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per tenant, the permits of changes running as tasks of their own
    /// (`crate::changes`): a caller that hangs up leaves its change
    /// running, so these, not its connection, bound how many one tenant
    /// has at once.
    pub(super) changes: crate::changes::Changes,
    /// Most bytes of snapshots one tenant may keep; 0: no limit.
    pub(super) max_snapshot_bytes: AtomicU64,
    /// Lifecycle events, emitted where each action happens.
    pub(super) events: Arc<EventLog>,
    /// The tenants' webhooks of those events.
    pub(super) webhooks: Arc<crate::webhooks::Webhooks>,
    /// Sandboxes seen Ready through a port, per store generation.
    pub(super) ready: super::ready::ReadyCache,
}

/// A pool's run of failed warm starts.
pub(super) struct PoolFailure {
    pub failures: u32,
    pub retry_at: std::time::Instant,
    pub error: String,
}

pub(super) fn to_api(row: &SandboxRow) -> Sandbox {
    Sandbox {
        id: row.id.clone(),
        template: row.template.clone(),
        state: row.state,
        labels: row.labels.clone(),
        launch: row.launch,
        created_at: rfc3339(row.created_at),
        shutdown_at: row.shutdown_at.map(rfc3339),
        idle_timeout_seconds: row.idle_timeout_seconds,
        idle_action: (row.idle_action != IdleAction::Delete).then_some(row.idle_action),
        auto_resume: row.auto_resume,
        pool: row.pool.clone(),
        forked_from: row.forked_from.clone(),
        entrypoint: None,
        egress: None,
        network: super::egress::Recorded::of_row(row).and_then(|r| r.sandbox),
        usage: None,
    }
}

pub(super) fn snapshot_to_api(s: SnapshotRow) -> Snapshot {
    Snapshot {
        id: s.id,
        sandbox_id: s.sandbox_id,
        created_at: rfc3339(s.created_at),
        size_bytes: s.size_bytes,
    }
}

pub(super) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Code::InvalidArgument, msg)
}

/// The shared rules ([`Template::validate`]) and this host's: the
/// directories a template names must exist and be allowed.
pub(super) fn check_template(t: &Template, template_dirs: &[PathBuf]) -> Result<()> {
    t.validate()?;
    if !t.sidecars.is_empty() {
        return Err(invalid(
            "sidecars are not available on the local backend: a local sandbox is one container \
             (the kubernetes backend runs them in the sandbox's Pod)",
        ));
    }
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
    secrets_need_host_root(t)
}

/// Brokered secrets need the hub's CA in the sandbox's trust store, which
/// the hub writes into the `/etc` it gives sandboxes of the host's root;
/// an image's or a `root_fs`'s `/etc` is their own (not done yet).
pub(super) fn secrets_need_host_root(t: &Template) -> Result<()> {
    if !t.secrets.is_empty() && (t.image.is_some() || t.root_fs.is_some()) {
        return Err(invalid(
            "secrets: not yet with `image` or `root_fs` (the hub's CA goes into the /etc of \
             sandboxes of the host's root only)",
        ));
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
        backend: LocalBackend,
        template_dirs: Vec<PathBuf>,
        policy: Policy,
        events: Arc<EventLog>,
        webhooks: Arc<crate::webhooks::Webhooks>,
    ) -> Arc<Self> {
        Arc::new(Hub {
            store,
            backend,
            template_dirs,
            policy,
            admission: Mutex::new(()),
            volumes: Mutex::new(()),
            clients: Mutex::new(HashMap::new()),
            namespaces: super::ports::Namespaces::default(),
            pools_changed: Notify::new(),
            launching: Mutex::new(HashMap::new()),
            pool_failures: Mutex::new(HashMap::new()),
            lifecycle: Mutex::new(HashMap::new()),
            changes: crate::changes::Changes::default(),
            max_snapshot_bytes: AtomicU64::new(0),
            events,
            webhooks,
            ready: Default::default(),
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

    pub fn template(&self, tenant: &str, name: &str) -> Result<Template> {
        match self.store.get_template(tenant, name)? {
            Some(t) => Ok(t),
            None if name == DEFAULT_TEMPLATE => Ok(self.builtin_default()),
            None => Err(Error::not_found(format!(
                "template {name} not found; create it with PUT /v1/templates/{name}"
            ))),
        }
    }

    /// The `default` template of a tenant that stored none: the host's
    /// root filesystem with the network of `--default-network` (`none`
    /// where this hub cannot run gateways), so `GET` shows what runs.
    pub(super) fn builtin_default(&self) -> Template {
        Template {
            network: self.backend.egress.default_network().into(),
            ..Template::default()
        }
    }

    /// `row` as one sandbox's GET answers it: a Ready sandbox with an
    /// entrypoint says how that is doing (see [`crate::entrypoint`]).
    pub(super) async fn view(&self, row: &SandboxRow) -> Sandbox {
        let mut view = to_api(row);
        if !matches!(row.state, SandboxState::Ready | SandboxState::Paused) {
            return view;
        }
        // A paused sandbox's counters read as any other's (the kernel's
        // files do not wait for a frozen cgroup).
        view.egress = self.backend.egress.usage(&row.id);
        view.usage = self.backend.usage(&row.id);
        if row.state == SandboxState::Paused {
            // Its sandboxd is frozen too: it would not answer.
            return view;
        }
        if !LocalBackend::runs_entrypoint(row) {
            return view;
        }
        let Ok(client) = self.client(row) else {
            return view;
        };
        if let Some(record) = crate::entrypoint::ask(&client).await {
            let oom_kills = self.backend.oom_kills(row).unwrap_or(0);
            view.entrypoint = Some(crate::entrypoint::status(&record, oom_kills, now_ms()));
        }
        view
    }

    /// The usage sampler's alerts from now on (a sandbox's OOM kills rose,
    /// its disk reached its quota): the hook the event log subscribes to.
    /// None without cgroups (nothing is sampled).
    pub fn usage_alerts(
        &self,
    ) -> Option<tokio::sync::broadcast::Receiver<crate::usage::UsageAlert>> {
        self.backend.sampler.as_ref().map(|s| s.subscribe())
    }

    /// The usage sampler's CPU time so far and its ticks (for `/metrics`
    /// and the bench); None without cgroups.
    pub fn sampler_cost(&self) -> Option<(Duration, u64)> {
        self.backend.sampler.as_ref().map(|s| s.cost())
    }

    pub(super) fn client(&self, row: &SandboxRow) -> Result<SandboxdClient> {
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

    /// Lets go of what the hub keeps open to reach sandbox `id` (its
    /// sandboxd client, its network namespace): when it stops, sleeps or goes.
    /// Called before the stop (nothing new is sent to a sandbox on its way
    /// out) and again after it: a dial that read the shim before the first
    /// call may have kept its namespace since (`ports::Namespaces::open`).
    pub(super) fn forget_handles(&self, id: &str) {
        self.clients.lock().unwrap().remove(id);
        self.namespaces.forget(id);
    }

    /// A template as its sandboxes run: the operator's defaults fill the
    /// limits it leaves open, and what the operator does not allow (any
    /// more) is refused.
    pub(super) fn effective_template(&self, tenant: &str, name: &str) -> Result<Template> {
        let t = self.template(tenant, name)?;
        self.policy.admit_template(&t)?;
        Ok(self.policy.effective(&t))
    }

    /// Inserts a new sandbox row if the tenant's quota has room for it.
    pub(super) fn admit(&self, row: &SandboxRow) -> Result<()> {
        let more = self
            .effective_template(&row.tenant, &row.template)?
            .memory_mb
            .unwrap_or(0);
        let _one_at_a_time = self.admission.lock().unwrap_or_else(|p| p.into_inner());
        let (mut have, mut memory) = (0u64, 0u64);
        // Counted by template in SQL: the tenant's rows only, none decoded.
        for (template, n) in self
            .store
            .count_by_template(&row.tenant, &COUNTS_AGAINST_QUOTA)?
        {
            have = have.saturating_add(n);
            let each = self.template_memory_mb(&row.tenant, &template);
            memory = memory.saturating_add(each.saturating_mul(n));
        }
        self.policy.admit_sandbox(have, memory, more)?;
        self.store.insert_sandbox(row)
    }

    /// The memory limit `row`'s template gives its sandboxes (0 where the
    /// template is gone), looked up once per template in `seen`, which
    /// holds one tenant's templates by name.
    pub(super) fn memory_limit_mb(&self, row: &SandboxRow, seen: &mut HashMap<String, u64>) -> u64 {
        if let Some(mb) = seen.get(&row.template) {
            return *mb;
        }
        let mb = self.template_memory_mb(&row.tenant, &row.template);
        seen.insert(row.template.clone(), mb);
        mb
    }

    /// The memory limit template `name` of `tenant` gives a sandbox (0
    /// where the template is gone).
    fn template_memory_mb(&self, tenant: &str, name: &str) -> u64 {
        self.template(tenant, name)
            .map(|t| self.policy.effective(&t).memory_mb.unwrap_or(0))
            .unwrap_or(0)
    }

    /// Starts the sandbox a row describes and records it Ready.
    pub(super) async fn start(&self, row: &mut SandboxRow) -> Result<()> {
        let template = self.effective_template(&row.tenant, &row.template)?;
        let snapshot_layer = match &row.forked_from {
            Some(snap) => Some(self.snapshot_path(snap)?),
            None => None,
        };
        // The values of every secret it names, looked up now: a secret
        // without one fails the start, naming it.
        let request_secrets = super::egress::Recorded::of_row(row)
            .map(|r| r.request_secrets)
            .unwrap_or_default();
        let secret_values = self.secret_values(
            &row.tenant,
            template
                .secrets
                .iter()
                .chain(&request_secrets)
                .map(|s| s.name.as_str()),
        )?;
        let (volumes, mounted) = self.volume_binds(row, &template)?;
        let mut handle = self
            .backend
            .launch(LaunchRequest {
                row,
                template: &template,
                snapshot_layer,
                secret_values,
                volumes,
            })
            .await?;
        Self::record_volumes(row, &mounted, &mut handle);
        Self::failpoint_launched_not_recorded().await;
        row.runtime = Some(handle);
        row.state = SandboxState::Ready;
        self.store
            .set_runtime(&row.id, SandboxState::Ready, row.runtime.as_ref())
    }

    pub(super) fn snapshot_path(&self, snapshot_id: &str) -> Result<PathBuf> {
        self.backend
            .snapshot_layer(snapshot_id)
            .ok_or_else(|| Error::not_found(format!("snapshot {snapshot_id} has no stored layer")))
    }

    /// Creates a cold sandbox row (within the tenant's quota) and starts
    /// it; on failure nothing is left.
    /// Claimed rows (a caller's) emit `created`, then `ready` or `deleted`
    /// (`start_failed`); a warm member is the tenant's only once claimed.
    pub(super) async fn create_cold(&self, mut row: SandboxRow) -> Result<SandboxRow> {
        self.admit(&row)?;
        if row.claimed {
            self.emit(
                self.sandbox_event(&row, EventType::Created)
                    .detail("template", row.template.as_str())
                    .detail("launch", "cold"),
            );
        }
        if let Err(e) = self.start(&mut row).await {
            let _ = self.backend.destroy(&row).await;
            let _ = self.store.delete_sandbox(&row.id);
            if row.claimed {
                self.emit(
                    self.sandbox_event(&row, EventType::Deleted)
                        .reason(DeleteReason::StartFailed)
                        .detail("last_error", e.to_string()),
                );
            }
            return Err(e);
        }
        if row.claimed {
            self.emit(self.sandbox_event(&row, EventType::Ready));
        }
        Ok(row)
    }

    /// Records a lifecycle event (see [`EventLog::emit`]: never waits).
    pub fn emit(&self, event: NewEvent) {
        self.events.emit(event);
    }

    /// The event log, for the front doors' `GET /v1/events`.
    pub fn events(&self) -> &Arc<EventLog> {
        &self.events
    }

    /// The webhooks, for `/v1/webhooks` and `sandhub serve`'s setup.
    pub fn webhooks(&self) -> &Arc<crate::webhooks::Webhooks> {
        &self.webhooks
    }

    /// An event of `row`'s sandbox, with its tenant and labels.
    pub(super) fn sandbox_event(&self, row: &SandboxRow, kind: EventType) -> NewEvent {
        NewEvent::sandbox(&row.tenant, kind, &row.id, &row.labels)
    }

    pub(super) async fn remove(&self, row: &SandboxRow) -> Result<()> {
        self.forget_handles(&row.id);
        let destroyed = self.backend.destroy(row).await;
        self.forget_handles(&row.id);
        destroyed?;
        self.store.delete_sandbox(&row.id)
    }

    /// A claimed sandbox of `tenant`, which must be running for `op`.
    pub(super) fn running(
        &self,
        tenant: &str,
        id: &str,
        op: &str,
    ) -> Result<(SandboxRow, SandboxdClient)> {
        let row = self.ready_row(tenant, id, op)?;
        let _ = self.store.touch(id, now_ms());
        let client = self.client(&row)?;
        Ok((row, client))
    }

    /// `tenant`'s sandbox `id` as stored, if it is Ready for `op`.
    pub(super) fn ready_row(&self, tenant: &str, id: &str, op: &str) -> Result<SandboxRow> {
        let row = found(self.store.get_sandbox(tenant, id)?, "sandbox", id)?;
        if row.state != SandboxState::Ready {
            return Err(not_ready(id, row.state, op));
        }
        Ok(row)
    }

    /// As [`Hub::ready_row`], reading only the sandbox's last activity and
    /// shim (the check every proxied request and port dial makes).
    pub(super) fn ready_activity(&self, tenant: &str, id: &str, op: &str) -> Result<Activity> {
        let activity = found(self.store.activity_of(tenant, id)?, "sandbox", id)?;
        if activity.state != SandboxState::Ready {
            return Err(not_ready(id, activity.state, op));
        }
        Ok(activity)
    }
}

fn not_ready(id: &str, state: SandboxState, op: &str) -> Error {
    Error::new(
        Code::FailedPrecondition,
        format!(
            "sandbox {id} is {}; {op} needs it Ready{}",
            state.as_str(),
            if matches!(state, SandboxState::Suspended | SandboxState::Paused) {
                format!(" (POST /v1/sandboxes/{id}/resume first)")
            } else {
                String::new()
            }
        ),
    )
}

/// Whether a sandbox in `state` counts against its tenant's quota: it holds
/// (or will hold) memory and disk. Admission and the tenant gauges agree.
pub(super) fn counts_against_quota(state: SandboxState) -> bool {
    COUNTS_AGAINST_QUOTA.contains(&state)
}

/// The states in which a sandbox counts against its tenant's quota.
const COUNTS_AGAINST_QUOTA: [SandboxState; 4] = [
    SandboxState::Pending,
    SandboxState::Ready,
    SandboxState::Paused,
    SandboxState::Suspended,
];
