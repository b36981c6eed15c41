//! The local backend's hands: sandboxes are namespaced process trees on
//! this machine, run by [`super::runtime::Runtime`], reached over the Unix
//! sockets of their sandboxd.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::Context;
use http::Method;
use sandhub_api::{
    error::Code,
    hub::{Network, Template},
    validate,
};
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};

use super::{
    disk::DiskArgs,
    egress::{self, Egress, EgressArgs, Recorded},
    runtime::{DiskQuotas, Launched, Runtime, RuntimeError, SandboxSpec, RESET_ROUTE},
    store::SandboxRow,
};

/// The key of a launched sandbox's handle that says whether it runs an
/// entrypoint (see [`LocalBackend::runs_entrypoint`]).
const ENTRYPOINT_KEY: &str = "runs_entrypoint";

/// What to start: the stored row, its template, and the layers that seed
/// its workspace (a fork's snapshot first).
pub struct LaunchRequest<'a> {
    pub row: &'a SandboxRow,
    pub template: &'a Template,
    pub snapshot_layer: Option<PathBuf>,
    /// The values of the secrets the sandbox names (template's and
    /// request's), for its gateway only.
    pub secret_values: BTreeMap<String, String>,
    /// The named volumes it mounts (`Hub::volume_binds`).
    pub volumes: Vec<super::runtime::VolumeBind>,
}

pub struct LocalBackend {
    runtime: Arc<Runtime>,
    /// Each sandbox's sandboxd refuses larger uploads too (a workload can
    /// reach its own sandboxd only through the hub, but the cap holds
    /// whichever door a body comes in by).
    max_upload_bytes: u64,
    /// On the disk-quota volume when there is one.
    sandboxes: PathBuf,
    snapshots: PathBuf,
    /// Where sandboxes and snapshots lived before disk quotas: still found
    /// there (without a quota), never made there.
    legacy: Option<(PathBuf, PathBuf)>,
    seeds: PathBuf,
    quotas: Option<Arc<DiskQuotas>>,
    default_disk_mb: u64,
    /// Images templates name (`image:`), under `<state_dir>/images`.
    pub images: Arc<super::image::ImageStore>,
    /// The gateways of `network: egress` sandboxes.
    pub egress: Arc<Egress>,
    /// Every sandbox's usage, sampled each second; None without cgroups.
    pub sampler: Option<Arc<super::sampler::Sampler>>,
}

fn runtime_error(e: RuntimeError) -> Error {
    let code = match &e {
        RuntimeError::InvalidId(_) => Code::InvalidArgument,
        RuntimeError::MissingFeature { .. } | RuntimeError::NoCgroupLimits(_) => {
            Code::FailedPrecondition
        }
        // The template's `user` is not in the image: the caller's to fix.
        RuntimeError::Start { message, .. }
            if message.contains(sandboxd::identity::UNKNOWN_USER) =>
        {
            Code::FailedPrecondition
        }
        _ => Code::Unavailable,
    };
    Error::new(code, e.to_string())
}

fn join_error(e: tokio::task::JoinError) -> Error {
    Error::internal(format!("runtime task failed: {e}"))
}

impl LocalBackend {
    pub fn new(
        state_dir: &Path,
        allow_no_cgroup_limits: bool,
        max_upload_bytes: u64,
        disk: &DiskArgs,
        egress: &EgressArgs,
    ) -> anyhow::Result<Self> {
        // Re-executing /proc/self/exe (not the path we were started from)
        // means a sandbox always runs this very build of sandboxd.
        let mut runtime = Runtime::new(
            "/proc/self/exe",
            state_dir.join("runtime"),
            allow_no_cgroup_limits,
        )?;
        let egress = Egress::new(egress, state_dir).context("--egress-* flags")?;
        if let Some(pem) = egress.ca_pem() {
            runtime = runtime.with_egress_ca(pem);
        }
        runtime = runtime.begin_egress_etc();
        let quotas = super::disk::open_quotas(state_dir, disk)?;
        let (sandboxes, snapshots, legacy) = match &quotas {
            Some(q) => {
                runtime = runtime.with_disk_quotas(q.clone());
                let legacy = (state_dir.join("sandboxes"), state_dir.join("snapshots"));
                (
                    q.root().join("sandboxes"),
                    q.root().join("snapshots"),
                    Some(legacy),
                )
            }
            None => (
                state_dir.join("sandboxes"),
                state_dir.join("snapshots"),
                None,
            ),
        };
        let backend = LocalBackend {
            runtime: Arc::new(runtime),
            max_upload_bytes,
            sandboxes,
            snapshots,
            legacy,
            seeds: state_dir.join("seeds"),
            quotas,
            default_disk_mb: disk.default_disk_mb,
            egress: Arc::new(egress),
            sampler: None,
            images: Arc::new(
                super::image::ImageStore::open(
                    state_dir,
                    super::runtime::IdMap::for_current_user(),
                )
                .context("opening the image store")?
                .with_tenant_quota(disk.max_image_mb_per_tenant.saturating_mul(1 << 20))
                .with_store_cap(super::disk::image_store_cap(state_dir, disk)),
            ),
        };
        for dir in [&backend.sandboxes, &backend.snapshots, &backend.seeds] {
            std::fs::create_dir_all(dir)?;
        }
        let mut backend = backend;
        backend.sampler = backend.start_sampler()?;
        Ok(backend)
    }

    /// Whether `row`'s sandbox was started with an entrypoint, so whether
    /// its sandboxd has one to tell of. Only a handle that says `false`
    /// is believed (a sandbox started before the hub recorded this is
    /// asked): a view or a watch then skips a round trip to sandboxd,
    /// which was most of a warm claim's time.
    pub(super) fn runs_entrypoint(row: &SandboxRow) -> bool {
        let said = row.runtime.as_ref().and_then(|r| r.get(ENTRYPOINT_KEY));
        said.and_then(|v| v.as_bool()) != Some(false)
    }

    pub(super) fn launched(row: &SandboxRow) -> Result<Launched> {
        let value = row
            .runtime
            .clone()
            .ok_or_else(|| Error::unavailable(format!("sandbox {} is not running", row.id)))?;
        serde_json::from_value(value)
            .map_err(|e| Error::internal(format!("stored runtime of {}: {e}", row.id)))
    }

    fn spec_dir(&self, id: &str) -> PathBuf {
        if let Some((sandboxes, _)) = &self.legacy {
            let old = sandboxes.join(id);
            if old.is_dir() {
                return old;
            }
        }
        self.sandboxes.join(id)
    }

    /// The disk-quota volume, when the hub has one (named volumes need it).
    pub fn quotas(&self) -> Option<&Arc<DiskQuotas>> {
        self.quotas.as_ref()
    }

    /// How sandbox ids map to host ids (one range all sandboxes share).
    pub fn idmap(&self) -> super::runtime::IdMap {
        self.runtime.idmap()
    }

    /// Whether a sandbox's files are on the quota volume (sandboxes made
    /// before the hub had disk quotas keep running without one).
    fn on_volume(&self, dir: &Path) -> bool {
        self.quotas
            .as_ref()
            .is_some_and(|q| dir.starts_with(q.root()))
    }

    fn snapshot_dir(&self, snapshot_id: &str) -> PathBuf {
        if let Some((_, snapshots)) = &self.legacy {
            let old = snapshots.join(snapshot_id);
            if old.is_dir() {
                return old;
            }
        }
        self.snapshots.join(snapshot_id)
    }

    /// A private, id-shifted copy of a template's seed directory, made once:
    /// the template's own directory is never chowned or written.
    fn seed_layer(&self, tenant: &str, template: &str, seed: &Path) -> Result<PathBuf> {
        let key = format!(
            "{:016x}",
            fnv1a(format!("{tenant}\0{template}\0{}", seed.display()).as_bytes())
        );
        let layer = self.seeds.join(&key);
        if layer.is_dir() {
            return Ok(layer);
        }
        let staging = self.seeds.join(format!("{key}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg("--reflink=auto")
            .arg(seed)
            .arg(&staging)
            .status()
            .map_err(|e| Error::internal(format!("copying seed {}: {e}", seed.display())))?;
        if !status.success() {
            return Err(Error::internal(format!(
                "copying seed {} failed",
                seed.display()
            )));
        }
        self.runtime
            .prepare_layer(&staging)
            .map_err(runtime_error)?;
        std::fs::rename(&staging, &layer)
            .or_else(|e| if layer.is_dir() { Ok(()) } else { Err(e) })
            .map_err(|e| Error::internal(format!("installing seed layer: {e}")))?;
        Ok(layer)
    }

    fn spec(&self, request: &LaunchRequest<'_>, network: Network) -> Result<SandboxSpec> {
        let (row, t) = (request.row, request.template);
        let mut lower_layers = Vec::new();
        if let Some(snapshot) = &request.snapshot_layer {
            lower_layers.push(snapshot.clone());
        }
        if let Some(seed) = &t.seed_dir {
            lower_layers.push(self.seed_layer(&row.tenant, &row.template, Path::new(seed))?);
        }
        // The image's Env, then the template's, then the sandbox's: the
        // most specific wins per key.
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        let mut root_fs = t.root_fs.as_ref().map(PathBuf::from);
        let mut workdir = t.workdir.clone();
        let mut user = t.user.clone();
        let mut entrypoint = t.entrypoint.clone();
        if let Some(reference) = &t.image {
            let (image, root) = self
                .images
                .root_of(&row.tenant, reference, &row.id)
                .map_err(Error::from)?;
            // An image's config is untrusted: no empty names, no NULs.
            env.extend(
                image
                    .config
                    .env
                    .iter()
                    .filter(|kv| !kv.contains('\0'))
                    .filter_map(|kv| kv.split_once('='))
                    .filter(|(k, _)| !k.is_empty())
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            root_fs = Some(root);
            // The image's WorkingDir is untrusted too: used only if sane.
            workdir = workdir.or(image
                .config
                .workdir
                .filter(|w| validate::workdir(w).is_ok()));
            user = user.or(image.config.user.filter(|u| validate::user(u).is_ok()));
            let argv: Vec<String> = image
                .config
                .entrypoint
                .iter()
                .chain(&image.config.cmd)
                .cloned()
                .collect();
            entrypoint = entrypoint.or(Some(argv).filter(|a| validate::entrypoint(a).is_ok()));
        }
        env.extend(t.env.clone());
        env.extend(row.env.clone());
        let state_dir = self.spec_dir(&row.id);
        let disk_mb = self
            .on_volume(&state_dir)
            .then(|| t.disk_mb.unwrap_or(self.default_disk_mb));
        Ok(SandboxSpec {
            id: row.id.clone(),
            state_dir,
            lower_layers,
            root_fs,
            env,
            workdir,
            user,
            entrypoint: entrypoint.unwrap_or_default(),
            cpu: t.cpu,
            memory_mb: t.memory_mb,
            pids: t.pids,
            network_host: network == Network::Host,
            max_upload_bytes: self.max_upload_bytes,
            disk_mb,
            egress: network == Network::Egress,
            volumes: request.volumes.clone(),
        })
    }
}

/// FNV-1a, 64-bit: a stable short name for a seed layer.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// What the hub asks of its sandboxes, each a row of its store.
impl LocalBackend {
    /// Starts a sandbox and returns once its sandboxd answers; the value is
    /// the backend's handle, stored with the row so a restarted hub can
    /// find the sandbox again.
    ///
    /// An egress sandbox gets its gateway before this returns; if that
    /// fails, the sandbox is stopped and the launch fails.
    pub async fn launch(&self, request: LaunchRequest<'_>) -> Result<serde_json::Value> {
        let recorded = Recorded::for_launch(request.row, request.template)?;
        let mode = recorded.mode();
        if !recorded.secrets.is_empty() && mode != Network::Egress {
            return Err(Error::new(
                Code::InvalidArgument,
                "secrets need `network: egress`: only the egress gateway can broker them",
            ));
        }
        // Parsed before anything starts: a bad list is the caller's 400,
        // a secret without a value its FAILED_PRECONDITION.
        let policy = match mode {
            Network::Egress => Some(recorded.policy()?),
            _ => None,
        };
        let secrets = super::secrets::for_gateway(
            &recorded.secrets,
            &recorded.placeholders,
            &request.secret_values,
        )?;
        let mut spec = self.spec(&request, mode)?;
        // Placeholders last: they win over any env of the same name.
        spec.env.extend(recorded.secret_env());
        let runs_entrypoint = !spec.entrypoint.is_empty();
        let runtime = self.runtime.clone();
        // The gateway needs only the sandbox's network namespace: it is
        // attached while the sandbox builds its root and starts sandboxd.
        let (shim_tx, shim_rx) = tokio::sync::oneshot::channel();
        let launching = tokio::task::spawn_blocking(move || {
            runtime.launch_then(&spec, move |l| {
                let _ = shim_tx.send(l.clone());
            })
        });
        let attaching = async {
            let (Some(policy), Ok(early)) = (policy, shim_rx.await) else {
                return None;
            };
            let (tenant, id) = (&request.row.tenant, &request.row.id);
            Some(
                self.egress
                    .attach(tenant, id, &early, policy, recorded.egress_mb, secrets)
                    .await,
            )
        };
        let (launched, attached) = tokio::join!(launching, attaching);
        let launched = match launched
            .map_err(join_error)
            .and_then(|r| r.map_err(runtime_error))
        {
            Ok(l) => l,
            Err(e) => {
                if let Some(Ok(())) = attached {
                    self.egress.detach(&request.row.id);
                }
                return Err(e);
            }
        };
        if let Some(Err(e)) = attached {
            let (runtime, id, l) = (self.runtime.clone(), request.row.id.clone(), launched);
            let _ = tokio::task::spawn_blocking(move || runtime.stop(&id, &l)).await;
            return Err(e);
        }
        let mut value =
            serde_json::to_value(&launched).map_err(|e| Error::internal(e.to_string()))?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert(ENTRYPOINT_KEY.into(), runs_entrypoint.into());
        }
        if mode == Network::Egress || recorded.sandbox.is_some() || !recorded.secrets.is_empty() {
            if let (Some(obj), Ok(r)) = (value.as_object_mut(), serde_json::to_value(&recorded)) {
                obj.insert(egress::RECORD_KEY.into(), r);
            }
        }
        Ok(value)
    }

    /// After a hub restart: gives a running egress sandbox its gateway
    /// back, with the policy it was started with. Until then (and if this
    /// fails) it is offline: its TUN device went with the old hub.
    /// `values`: the values of the secrets it was started with (a secret
    /// whose value is gone fails the re-attach: the sandbox stays offline).
    pub async fn reattach(
        &self,
        row: &SandboxRow,
        values: &BTreeMap<String, String>,
    ) -> Result<()> {
        let Some(recorded) = Recorded::of_row(row) else {
            return Ok(());
        };
        if recorded.mode() != Network::Egress {
            return Ok(());
        }
        let secrets =
            super::secrets::for_gateway(&recorded.secrets, &recorded.placeholders, values)?;
        let launched = Self::launched(row)?;
        self.egress
            .attach(
                &row.tenant,
                &row.id,
                &launched,
                recorded.policy()?,
                recorded.egress_mb,
                secrets,
            )
            .await
    }

    /// A client for the sandbox's sandboxd.
    pub fn connect(&self, row: &SandboxRow) -> Result<SandboxdClient> {
        Ok(SandboxdClient::unix(&Self::launched(row)?.socket_dir))
    }

    /// Stops every process; the workspace stays (suspend). Also when the
    /// row has no runtime recorded (a launch the hub died during).
    pub async fn stop(&self, row: &SandboxRow) -> Result<()> {
        self.egress.detach(&row.id);
        let launched = Self::launched(row).ok();
        let id = row.id.clone();
        self.on_runtime(move |runtime| match launched {
            Some(l) => runtime.stop(&id, &l),
            // A launch the hub died during: whatever its cgroup holds.
            None => runtime.kill_all(&id),
        })
        .await
    }

    /// Freezes every process of the sandbox (pause); see
    /// `Runtime::freeze`.
    pub async fn freeze(&self, row: &SandboxRow) -> Result<()> {
        let id = row.id.clone();
        self.on_runtime(move |runtime| runtime.freeze(&id)).await
    }

    /// Thaws a paused sandbox.
    pub async fn thaw(&self, row: &SandboxRow) -> Result<()> {
        let id = row.id.clone();
        self.on_runtime(move |runtime| runtime.thaw(&id)).await
    }

    /// Runs `f`, which blocks for as long as a start, stop or freeze
    /// takes, on the blocking pool, and answers its error in the API's
    /// words.
    async fn on_runtime<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Runtime) -> std::result::Result<T, RuntimeError> + Send + 'static,
    ) -> Result<T> {
        let runtime = self.runtime.clone();
        tokio::task::spawn_blocking(move || f(&runtime))
            .await
            .map_err(join_error)?
            .map_err(runtime_error)
    }

    /// Whether the sandbox's processes are frozen (or being frozen).
    pub fn is_frozen(&self, row: &SandboxRow) -> bool {
        self.runtime.is_frozen(&row.id)
    }

    /// Stops and removes everything the sandbox had.
    pub async fn destroy(&self, row: &SandboxRow) -> Result<()> {
        self.egress.detach(&row.id);
        let launched = Self::launched(row).ok();
        let spec = SandboxSpec::new(row.id.clone(), self.spec_dir(&row.id));
        let runtime = self.runtime.clone();
        let quotas = self
            .quotas
            .clone()
            .filter(|_| self.on_volume(&spec.state_dir));
        tokio::task::spawn_blocking(move || {
            // A subvolume goes at once, whatever it holds; but only once
            // nothing of the sandbox runs any more.
            if let Some(quotas) = quotas {
                if let Some(l) = &launched {
                    runtime.stop(&spec.id, l)?;
                }
                if let Err(e) = quotas.release(&spec.state_dir) {
                    tracing::warn!(id = %spec.id, error = %e, "deleting the sandbox's subvolume");
                }
                return runtime.remove(&spec, None);
            }
            runtime.remove(&spec, launched.as_ref())
        })
        .await
        .map_err(join_error)?
        .map_err(runtime_error)?;
        // Gone: its image may be removed now.
        let (images, id) = (self.images.clone(), row.id.clone());
        tokio::task::spawn_blocking(move || images.unpin(&id))
            .await
            .map_err(join_error)
    }

    /// The kernel's OOM kills in the sandbox's cgroup; None where there
    /// are no cgroups or the count cannot be read.
    pub fn oom_kills(&self, row: &SandboxRow) -> Option<u64> {
        self.runtime.oom_kills(&row.id).ok().flatten()
    }

    /// Kills every process and restores the workspace to its seed state.
    pub async fn reset(&self, row: &SandboxRow) -> Result<()> {
        let client = self.connect(row)?;
        let response = client
            .forward(
                Method::POST,
                RESET_ROUTE,
                http::HeaderMap::new(),
                http_body_util::Empty::<bytes::Bytes>::new(),
            )
            .await?;
        if response.status().is_success() {
            Ok(())
        } else {
            use http_body_util::BodyExt;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Err(
                match serde_json::from_slice::<sandhub_api::error::ErrorBody>(&body) {
                    Ok(b) => b.into(),
                    Err(_) => Error::internal(format!("reset answered {status}")),
                },
            )
        }
    }

    /// Keeps a copy of the workspace's changes under `snapshot_id`;
    /// returns the bytes the copy takes on disk.
    pub async fn snapshot(&self, row: &SandboxRow, snapshot_id: &str) -> Result<u64> {
        let state_dir = self.spec_dir(&row.id);
        let dest = self.snapshots.join(snapshot_id);
        let runtime = self.runtime.clone();
        let stats = tokio::task::spawn_blocking(move || runtime.snapshot(&state_dir, &dest, None))
            .await
            .map_err(join_error)?
            .map_err(|e| match e {
                RuntimeError::Io { ref source, .. }
                    if source.kind() == std::io::ErrorKind::InvalidData =>
                {
                    Error::new(
                        Code::FailedPrecondition,
                        format!("snapshot of {}: {e}", row.id),
                    )
                }
                e => Error::internal(format!("snapshot of {}: {e}", row.id)),
            })?;
        // Every data byte it holds (hard links once): what it keeps taking
        // once the sandbox's files change.
        Ok(stats.bytes)
    }

    /// Deletes a snapshot's stored layer (one already gone is fine).
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        let dir = self.snapshot_dir(snapshot_id);
        tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            // remove_dir_all never follows the links a layer may hold.
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .map_err(join_error)?
        .map_err(|e| Error::internal(format!("deleting snapshot {snapshot_id}: {e}")))
    }

    /// Where a snapshot's layer lives, if the backend has it.
    pub fn snapshot_layer(&self, snapshot_id: &str) -> Option<PathBuf> {
        // Only a real directory that the hub made: never a link.
        let dir = self.snapshot_dir(snapshot_id);
        self.runtime.check_layer(&dir).ok().map(|()| dir)
    }

    /// The usage sampler over every sandbox's cgroup, disk quota (on the
    /// quota volume) and gateway counters; None without cgroups.
    fn start_sampler(&self) -> anyhow::Result<Option<Arc<super::sampler::Sampler>>> {
        use super::sampler::{DiskLookup, NetLookup, Owns, Sampler, Sources};
        let Some(cgroups) = self.runtime.cgroup_tree() else {
            return Ok(None);
        };
        let disk: Option<DiskLookup> = self.quotas.clone().map(|q| {
            let sandboxes = self.sandboxes.clone();
            Arc::new(move |id: &str| {
                let qid = q.quota_of(&sandboxes.join(id)).ok()?;
                q.qgroup_dir(qid).ok()
            }) as DiskLookup
        });
        let (dirs, legacy) = (self.sandboxes.clone(), self.legacy.clone());
        let owns: Owns = Arc::new(move |id: &str| {
            dirs.join(id).is_dir() || legacy.as_ref().is_some_and(|(l, _)| l.join(id).is_dir())
        });
        let egress = self.egress.clone();
        let net: NetLookup =
            Arc::new(move |id: &str| egress.usage(id).map(|u| (u.bytes_in, u.bytes_out)));
        let sampler = Sampler::start(
            Sources {
                cgroups,
                owns: Some(owns),
                disk,
                net: Some(net),
            },
            std::time::Duration::from_secs(1),
        )
        .context("starting the usage sampler")?;
        Ok(Some(Arc::new(sampler)))
    }

    /// The latest usage sample of a sandbox, and its limits.
    pub fn usage(&self, id: &str) -> Option<sandhub_api::usage::SandboxUsage> {
        self.sampler.as_ref()?.latest(id)
    }

    /// The hub is stopping: let go of what only a running hub needs (the
    /// disk volume's mount). Sandboxes keep running.
    pub fn shutdown(&self) {
        if let Some(s) = &self.sampler {
            s.stop();
        }
        self.images.unmount_all();
        if let Some(q) = &self.quotas {
            if let Err(e) = q.detach() {
                tracing::warn!(error = %e, "detaching the disk volume");
            }
        }
    }

    /// Whether the sandbox described by the row still runs.
    pub fn is_alive(&self, row: &SandboxRow) -> bool {
        Self::launched(row).is_ok_and(|l| self.runtime.is_alive(&l))
    }

    /// Whether any process of the sandbox (its own machinery included)
    /// still exists, with or without a recorded runtime.
    pub fn has_processes(&self, row: &SandboxRow) -> bool {
        self.runtime.processes(&row.id).is_ok_and(|p| !p.is_empty()) || self.is_alive(row)
    }

    /// Whether any workload process runs (an idle timeout must not fire).
    pub fn busy(&self, row: &SandboxRow) -> bool {
        // The shim and sandboxd are the sandbox itself; anything more is a
        // workload.
        self.runtime
            .processes(&row.id)
            .is_ok_and(|p| p.len() > super::runtime::OWN_PROCESSES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(runtime: Option<serde_json::Value>) -> SandboxRow {
        SandboxRow::for_tests(runtime)
    }

    #[test]
    fn only_a_handle_that_says_no_entrypoint_skips_the_asking() {
        let said =
            |v: serde_json::Value| row(Some(serde_json::json!({"shim_pid": 1, ENTRYPOINT_KEY: v})));
        assert!(!LocalBackend::runs_entrypoint(&said(false.into())));
        assert!(LocalBackend::runs_entrypoint(&said(true.into())));
        // Started before handles said, or a value that is not a bool: asked.
        assert!(LocalBackend::runs_entrypoint(&row(Some(
            serde_json::json!({"shim_pid": 1})
        ))));
        assert!(LocalBackend::runs_entrypoint(&said("no".into())));
        assert!(LocalBackend::runs_entrypoint(&row(None)));
    }
}
