//! [`TenantHub`]: the local backend as one tenant sees it, the whole
//! [`Sandboxes`] API over the [`Hub`]; and the hub as the front doors'
//! [`Backend`].

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{atomic::Ordering, Arc},
};

use async_trait::async_trait;
use sandhub_api::{
    error::Code,
    hub::{
        CreateSandbox, ExecRequest, ExecResult, ForkRequest, Launch, ListeningPort, NamedTemplate,
        NetworkSpec, Pool, PoolSpec, Sandbox, SandboxState, Snapshot, Template, DEFAULT_TEMPLATE,
    },
    sandboxd::{DirectoryListing, FileEntry},
    secrets::SecretRef,
    validate,
    volumes::VolumeMount,
};
use sandhub_client::{
    sandboxd::SandboxdClient, ByteStream, Error, ProcessEvents, PtySize, Result, Sandboxes, Signal,
    StartProcess, StdinInput, WatchEvents, WriteOptions,
};

use super::{
    hub::{check_template, invalid, snapshot_to_api, to_api, Hub},
    store::{found, Activity, Claim, PoolRow, SandboxRow, SnapshotRow},
};
use crate::{
    backend::{new_id, now_ms, Backend, TenantView},
    events::{DeleteReason, EventType, NewEvent},
};

impl Hub {
    /// The view one API key has.
    pub fn tenant(self: &Arc<Self>, tenant: impl Into<String>) -> TenantHub {
        TenantHub {
            hub: self.clone(),
            tenant: tenant.into(),
        }
    }
}

/// The hub as one tenant sees it.
#[derive(Clone)]
pub struct TenantHub {
    hub: Arc<Hub>,
    tenant: String,
}

impl TenantHub {
    /// Runs a change of this tenant to its end (`crate::changes`).
    async fn to_the_end<T: Send + 'static>(
        &self,
        change: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.hub.changes.to_the_end(&self.tenant, change).await
    }

    /// The sandbox, Ready for `op`, and its sandboxd: one that is Paused
    /// or Suspended with `auto_resume` is resumed first (`Hub::wake`).
    async fn running(&self, id: &str, op: &str) -> Result<(SandboxRow, SandboxdClient)> {
        self.awake(id, || self.hub.running(&self.tenant, id, op))
            .await
    }

    /// The port path's check, per request on a kept connection and per
    /// dial: from memory while the store has not changed since the sandbox
    /// was last read Ready (a lookup otherwise), and a write only when the
    /// recorded activity is a second old (idle timeouts count in seconds),
    /// not one per request. A write per request or dial would also move the
    /// store's generation, and send every kept connection's next request
    /// back to SQLite.
    async fn port_ready(&self, id: &str) -> Result<Activity> {
        let generation = self.hub.store.generation();
        let seen = match self.hub.ready.get(&self.tenant, id, generation) {
            Some(seen) => seen,
            None => {
                let seen = self
                    .awake(id, || {
                        self.hub.ready_activity(&self.tenant, id, "port access")
                    })
                    .await?;
                self.hub.ready.put(&self.tenant, id, generation, seen);
                seen
            }
        };
        let now = now_ms();
        if now - seen.last_activity >= 1000 {
            let _ = self.hub.store.touch(id, now);
        }
        Ok(seen)
    }

    /// `ready`, a check that sandbox `id` is Ready (FAILED_PRECONDITION
    /// when it is not), asked again once the sandbox was woken when it is
    /// Paused or Suspended with `auto_resume`; else its first answer.
    async fn awake<T>(&self, id: &str, ready: impl Fn() -> Result<T>) -> Result<T> {
        match ready() {
            Err(e) if e.code == Code::FailedPrecondition => {
                if self.hub.wake(&self.tenant, id).await? {
                    ready()
                } else {
                    Err(e)
                }
            }
            outcome => outcome,
        }
    }

    /// One call to a Ready sandbox's sandboxd. A sandbox deleted, expired
    /// or suspended while the call was in flight takes its sandboxd with
    /// it: the caller then hears what became of the sandbox (NOT_FOUND,
    /// FAILED_PRECONDITION), as a call made a moment later would, not the
    /// severed connection's UNAVAILABLE.
    async fn through_sandboxd<'a, T, F, Fut>(&self, id: &'a str, op: &str, call: F) -> Result<T>
    where
        F: FnOnce(SandboxdClient) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + 'a,
    {
        let (_, client) = self.running(id, op).await?;
        match call(client).await {
            Err(e) if e.code == Code::Unavailable => {
                // A change in progress holds this lock until it is done.
                drop(self.hub.lifecycle(id).lock_owned().await);
                self.hub.ready_row(&self.tenant, id, op)?;
                Err(e)
            }
            outcome => outcome,
        }
    }

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
            last_error: self.hub.pool_error(&p.tenant, &p.name),
        })
    }
}

#[async_trait]
impl TenantView for TenantHub {
    fn tenant(&self) -> &str {
        &self.tenant
    }

    async fn egress_log(&self, id: &str) -> Result<Vec<sandhub_api::hub::EgressDecision>> {
        found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        Ok(self.hub.backend.egress.decisions(id))
    }

    async fn put_secret(
        &self,
        name: &str,
        value: String,
    ) -> Result<sandhub_api::secrets::SecretInfo> {
        self.hub.put_secret(&self.tenant, name, &value)
    }

    async fn list_secrets(&self) -> Result<sandhub_api::secrets::SecretList> {
        self.hub.list_secrets(&self.tenant)
    }

    async fn delete_secret(&self, name: &str) -> Result<()> {
        self.hub.delete_secret(&self.tenant, name)
    }

    async fn create_volume(
        &self,
        req: sandhub_api::volumes::CreateVolume,
    ) -> Result<sandhub_api::volumes::Volume> {
        // Subvolume and snapshot ioctls commit a btrfs transaction: off
        // the async threads.
        let hub = self.hub.clone();
        let tenant = self.tenant.clone();
        tokio::task::spawn_blocking(move || hub.create_volume(&tenant, req))
            .await
            .map_err(|e| Error::internal(format!("creating the volume: {e}")))?
    }

    async fn list_volumes(&self) -> Result<sandhub_api::volumes::VolumeList> {
        self.hub.list_volumes(&self.tenant)
    }

    async fn get_volume(&self, name: &str) -> Result<sandhub_api::volumes::Volume> {
        self.hub.get_volume(&self.tenant, name)
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        // Refused while the volume has snapshots (they are listed and
        // deleted under its name); checked here, ahead of the delete.
        self.hub.check_no_volume_snapshots(&self.tenant, name)?;
        self.hub.delete_volume(&self.tenant, name)
    }

    async fn volume_dir(&self, name: &str) -> Result<crate::volume_files::VolumeDir> {
        let hub = self.hub.clone();
        let tenant = self.tenant.clone();
        let name = name.to_string();
        tokio::task::spawn_blocking(move || hub.volume_dir(&tenant, &name))
            .await
            .map_err(|e| Error::internal(format!("opening the volume: {e}")))?
    }

    async fn create_volume_snapshot(
        &self,
        volume: &str,
        req: sandhub_api::volumes::CreateVolumeSnapshot,
    ) -> Result<sandhub_api::volumes::VolumeSnapshot> {
        let hub = self.hub.clone();
        let tenant = self.tenant.clone();
        let volume = volume.to_string();
        tokio::task::spawn_blocking(move || hub.create_volume_snapshot(&tenant, &volume, req))
            .await
            .map_err(|e| Error::internal(format!("snapshotting the volume: {e}")))?
    }

    async fn list_volume_snapshots(
        &self,
        volume: &str,
    ) -> Result<sandhub_api::volumes::VolumeSnapshotList> {
        self.hub.list_volume_snapshots(&self.tenant, volume)
    }

    async fn delete_volume_snapshot(&self, volume: &str, name: &str) -> Result<()> {
        self.hub.delete_volume_snapshot(&self.tenant, volume, name)
    }

    async fn sandboxd(&self, id: &str, op: &str) -> Result<SandboxdClient> {
        self.running(id, op).await.map(|(_, c)| c)
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

    async fn port_access(&self, id: &str) -> Result<()> {
        self.port_ready(id).await.map(|_| ())
    }

    async fn connect_port(&self, id: &str, port: u16) -> Result<crate::backend::PortStream> {
        let shim = self
            .port_ready(id)
            .await?
            .shim
            .ok_or_else(|| Error::unavailable(format!("sandbox {id} is not running")))?;
        let ns = self
            .hub
            .namespaces
            .open(id, shim)
            .map_err(|e| super::ports::ns_error(id, e))?;
        super::ports::connect(&ns, id, port)
            .await
            .map(crate::backend::PortStream::direct)
    }

    async fn list_ports(&self, id: &str) -> Result<Vec<ListeningPort>> {
        let (row, _) = self.running(id, "listing ports").await?;
        super::ports::listening(&row).await
    }

    async fn set_deadline(&self, id: &str, seconds: u64) -> Result<Sandbox> {
        let _guard = self.hub.lock_existing(&self.tenant, id).await?;
        let mut row = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        let at = now_ms()
            .saturating_add(i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX));
        self.hub.store.set_shutdown_at(id, Some(at))?;
        row.shutdown_at = Some(at);
        Ok(to_api(&row))
    }
}

#[async_trait]
impl Backend for Arc<Hub> {
    fn tenant(&self, tenant: &str) -> Arc<dyn TenantView> {
        Arc::new(Hub::tenant(self, tenant))
    }

    fn kind(&self) -> &'static str {
        "local"
    }

    /// One process serves every session of a local hub.
    fn shared_mcp_sessions(&self) -> Option<Arc<dyn sandhub_mcp::SharedSessions>> {
        None
    }

    async fn ready(&self) -> Result<()> {
        self.store.list_pools(Some("")).map(|_| ())
    }

    async fn sandbox_count(&self) -> Result<usize> {
        Ok(self.store.all_sandboxes()?.len())
    }

    async fn gauges(&self) -> Result<crate::gauges::Gauges> {
        self.pool_and_tenant_gauges()
    }

    fn egress_usage(&self) -> Vec<crate::backend::TenantEgress> {
        self.backend.egress.usage_by_tenant()
    }

    fn images(&self) -> Option<Arc<dyn crate::backend::ImageService>> {
        let hub = self.clone();
        // What uses images: every tenant's templates, and every sandbox the
        // hub holds (the store keeps a pin per sandbox that runs an image).
        let in_use = move || {
            let templates = hub.store.template_images().map_err(|e| e.body())?;
            let sandboxes = hub.store.all_sandboxes().map_err(|e| e.body())?;
            Ok(super::image::Users {
                templates,
                sandboxes: sandboxes.into_iter().map(|r| r.id).collect(),
            })
        };
        Some(Arc::new(super::image::Images::new(
            self.backend.images.clone(),
            Arc::new(in_use),
        )))
    }
}

/// The runtime JSON of a row not launched yet, when its create request
/// narrowed the network, added secrets or added volumes: what every later
/// launch of it applies on top of its template.
fn pre_launch(
    template: &Template,
    network: Option<NetworkSpec>,
    secrets: Vec<SecretRef>,
    volumes: Vec<VolumeMount>,
) -> Option<serde_json::Value> {
    let mut runtime = (network.is_some() || !secrets.is_empty())
        .then(|| super::egress::Recorded::pre_launch(&template.network, network, secrets));
    if !volumes.is_empty() {
        let obj = runtime.get_or_insert_with(|| serde_json::json!({}));
        obj[super::volumes::REQUEST_KEY] = serde_json::to_value(volumes).unwrap_or_default();
    }
    runtime
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
        let effective = hub.effective_template(&self.tenant, &template)?;
        if let Some(n) = &req.network {
            validate::narrow_network(
                &effective.network,
                n,
                hub.backend.egress.default_allows_all(),
            )?;
        }
        let now = now_ms();
        let shutdown_at = req.shutdown_after_seconds.map(|s| now + (s as i64) * 1000);
        // The request's choice, else its template's.
        let idle_action = req
            .idle_action
            .or(effective.idle_action)
            .unwrap_or_default();
        let auto_resume = req.auto_resume.unwrap_or(effective.auto_resume);
        // Extra environment means a different process tree: never warm.
        // So does a narrowed network (the warm members have the template's).
        // And so do secrets the request adds (placeholders, a gateway).
        hub.check_secrets(&self.tenant, &effective, &req)?;
        // And so do volumes the request adds (warm members mount only the
        // template's).
        if !req.volumes.is_empty() {
            let all: Vec<_> = effective
                .volumes
                .iter()
                .chain(&req.volumes)
                .cloned()
                .collect();
            validate::volume_mounts(&all)?;
        }
        if let (Some(pool), true) = (
            &pool,
            req.env.is_empty()
                && req.network.is_none()
                && req.secrets.is_empty()
                && req.volumes.is_empty(),
        ) {
            let claim = Claim {
                tenant: &self.tenant,
                pool: &pool.name,
                labels: &req.labels,
                shutdown_at,
                idle_timeout_seconds: req.idle_timeout_seconds,
                now,
                idle_action,
                auto_resume,
            };
            if let Some(row) = hub.store.claim_warm(&claim)? {
                hub.pools_changed.notify_one();
                hub.emit(
                    hub.sandbox_event(&row, EventType::Claimed)
                        .with_pool(Some(&pool.name))
                        .detail("template", row.template.as_str()),
                );
                return Ok(hub.view(&row).await);
            }
            hub.emit(
                NewEvent::pool(&self.tenant, EventType::PoolStarved, Some(&pool.name))
                    .detail("template", pool.template.as_str()),
            );
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
            runtime: pre_launch(&effective, req.network, req.secrets, req.volumes),
            idle_action,
            auto_resume,
        };
        let launching = hub.clone();
        let row = self
            .to_the_end(async move { launching.create_cold(row).await })
            .await?;
        Ok(hub.view(&row).await)
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        let row = found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        Ok(self.hub.view(&row).await)
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        Ok(self
            .hub
            .store
            .list_sandboxes(&self.tenant)?
            .iter()
            .filter(|r| labels.iter().all(|(k, v)| r.labels.get(k) == Some(v)))
            .map(|r| {
                let mut sb = to_api(r);
                if r.state == sandhub_api::hub::SandboxState::Ready {
                    sb.usage = self.hub.backend.usage(&r.id);
                }
                sb
            })
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<()> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let _guard = me.hub.lock_existing(&me.tenant, id).await?;
            let row = found(me.hub.store.get_sandbox(&me.tenant, id)?, "sandbox", id)?;
            me.hub.remove(&row).await?;
            me.hub.lifecycle.lock().unwrap().remove(id);
            me.hub.emit(
                me.hub
                    .sandbox_event(&row, EventType::Deleted)
                    .reason(DeleteReason::ByCaller),
            );
            Ok(())
        })
        .await
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult> {
        if let Some(c) = &request.container {
            return Err(invalid(format!(
                "container {c}: a local sandbox has one container (sidecars need the kubernetes backend)"
            )));
        }
        self.through_sandboxd(
            id,
            "exec",
            |client| async move { client.exec(request).await },
        )
        .await
    }

    async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents> {
        self.through_sandboxd(id, "starting a process", |client| async move {
            client.start(request).await
        })
        .await
    }

    async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()> {
        self.through_sandboxd(id, "stdin", |client| async move {
            client.write_stdin(pid, input).await
        })
        .await
    }

    async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()> {
        self.through_sandboxd(id, "signal", |client| async move {
            client.signal(pid, signal).await
        })
        .await
    }

    async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()> {
        self.through_sandboxd(id, "resize", |client| async move {
            client.resize(pid, size).await
        })
        .await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream> {
        self.through_sandboxd(id, "reading files", |client| async move {
            client.read_file(path).await
        })
        .await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        self.through_sandboxd(id, "writing files", |client| async move {
            client.write_file(path, data, options).await
        })
        .await
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing> {
        self.through_sandboxd(id, "listing files", |client| async move {
            client.list_files(path).await
        })
        .await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        self.through_sandboxd(id, "stat", |client| async move { client.stat(path).await })
            .await
    }

    async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        self.through_sandboxd(id, "deleting files", |client| async move {
            client.delete_file(path, recursive).await
        })
        .await
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents> {
        self.through_sandboxd(id, "watching", |client| async move {
            client.watch(path, recursive).await
        })
        .await
    }

    async fn suspend(&self, id: &str) -> Result<Sandbox> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let _guard = me.hub.lock_existing(&me.tenant, id).await?;
            let (mut row, _) = me.hub.running(&me.tenant, id, "suspend")?;
            me.hub.suspend_locked(&mut row).await?;
            me.hub
                .emit(me.hub.sandbox_event(&row, EventType::Suspended));
            Ok(to_api(&row))
        })
        .await
    }

    async fn pause(&self, id: &str) -> Result<Sandbox> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let _guard = me.hub.lock_existing(&me.tenant, id).await?;
            let mut row = me.hub.ready_row(&me.tenant, id, "pause")?;
            me.hub.pause_locked(&mut row).await?;
            me.hub.emit(me.hub.sandbox_event(&row, EventType::Paused));
            Ok(me.hub.view(&row).await)
        })
        .await
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let _guard = me.hub.lock_existing(&me.tenant, id).await?;
            let mut row = found(me.hub.store.get_sandbox(&me.tenant, id)?, "sandbox", id)?;
            me.hub.resume_locked(&mut row).await?;
            me.hub.emit(me.hub.sandbox_event(&row, EventType::Resumed));
            Ok(me.hub.view(&row).await)
        })
        .await
    }

    async fn snapshot(&self, id: &str) -> Result<Snapshot> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let row = found(me.hub.store.get_sandbox(&me.tenant, id)?, "sandbox", id)?;
            let limit = me.hub.max_snapshot_bytes.load(Ordering::Relaxed);
            if limit > 0 {
                let used = me.hub.store.snapshot_bytes(&me.tenant)?;
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
                tenant: me.tenant.clone(),
                sandbox_id: id.to_string(),
                created_at: now_ms(),
                size_bytes: None,
            };
            snap.size_bytes = Some(me.hub.backend.snapshot(&row, &snap.id).await?);
            me.hub.store.insert_snapshot(&snap)?;
            me.hub.emit(
                me.hub
                    .sandbox_event(&row, EventType::Snapshotted)
                    .detail("snapshot_id", snap.id.as_str())
                    .detail("size_bytes", snap.size_bytes.unwrap_or(0)),
            );
            Ok(snapshot_to_api(snap))
        })
        .await
    }

    async fn delete_snapshot(&self, id: &str, snapshot: &str) -> Result<()> {
        let me = self.clone();
        let id = id.to_string();
        let snapshot = snapshot.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let snapshot: &str = &snapshot;
            let snap = me
                .hub
                .store
                .get_snapshot(&me.tenant, snapshot)?
                .filter(|s| s.sandbox_id == id)
                .ok_or_else(|| {
                    Error::not_found(format!("snapshot {snapshot} of sandbox {id} not found"))
                })?;
            // A fork's workspace lies on the snapshot (its lower layer), also
            // while suspended: deleting it would pull the floor from under it.
            let forks = me.hub.store.forks_of(&snap.id)?;
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
            me.hub.backend.delete_snapshot(&snap.id).await?;
            me.hub.store.delete_snapshot(&me.tenant, &snap.id)?;
            Ok(())
        })
        .await
    }

    async fn reset(&self, id: &str) -> Result<Sandbox> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            let _guard = me.hub.lock_existing(&me.tenant, id).await?;
            let (row, _) = me.hub.running(&me.tenant, id, "reset")?;
            me.hub.backend.reset(&row).await?;
            me.hub.emit(me.hub.sandbox_event(&row, EventType::Reset));
            Ok(me.hub.view(&row).await)
        })
        .await
    }

    async fn metrics(
        &self,
        id: &str,
        query: sandhub_api::usage::MetricsQuery,
    ) -> Result<sandhub_api::usage::SandboxMetrics> {
        let step = crate::usage::check_step(query.step).map_err(invalid)?;
        found(self.hub.store.get_sandbox(&self.tenant, id)?, "sandbox", id)?;
        let series = self
            .hub
            .backend
            .sampler
            .as_ref()
            .and_then(|s| s.series(id, query.since.unwrap_or(0), step));
        let (limits, points) = series.unwrap_or_default();
        Ok(sandhub_api::usage::SandboxMetrics {
            step_seconds: step,
            limits,
            samples: points
                .into_iter()
                .map(crate::usage::Point::to_api)
                .collect(),
        })
    }

    async fn set_network(&self, id: &str, network: NetworkSpec) -> Result<Sandbox> {
        let me = self.clone();
        let id = id.to_string();
        self.to_the_end(async move {
            let id: &str = &id;
            me.hub.set_network(&me.tenant, id, network).await
        })
        .await
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
            idle_action: source.idle_action,
            auto_resume: source.auto_resume,
        };
        let launching = self.hub.clone();
        let row = self
            .to_the_end(async move { launching.create_cold(row).await })
            .await?;
        self.hub.emit(
            self.hub
                .sandbox_event(&source, EventType::Forked)
                .detail("fork_id", row.id.as_str())
                .detail("snapshot_id", row.forked_from.clone().unwrap_or_default()),
        );
        Ok(self.hub.view(&row).await)
    }

    async fn put_template(&self, name: &str, template: Template) -> Result<NamedTemplate> {
        validate::name("template", name)?;
        check_template(&template, &self.hub.template_dirs)?;
        if let Some(image) = &template.image {
            // Named images must be here: a sandbox of it starts in
            // milliseconds, never with a surprise download.
            self.hub.backend.images.get(&self.tenant, image)?;
        }
        self.hub.policy.admit_template(&template)?;
        let replaced = self.hub.store.get_template(&self.tenant, name)?.is_some();
        self.hub.store.put_template(&self.tenant, name, &template)?;
        self.hub.emit(
            NewEvent::pool(&self.tenant, EventType::TemplateChanged, None)
                .detail("template", name)
                .detail("replaced", replaced),
        );
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
                    template: self.hub.builtin_default(),
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
                self.hub.emit(
                    NewEvent::pool(&self.tenant, EventType::TemplateChanged, Some(name))
                        .detail("template", row.template.as_str())
                        .detail("previous", old.template.as_str()),
                );
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

    async fn volumes(&self) -> Result<Vec<sandhub_api::volumes::Volume>> {
        Ok(self.hub.list_volumes(&self.tenant)?.volumes)
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
