//! One tenant's sandboxes on Kubernetes: [`Sandboxes`] over SandboxClaims,
//! with processes and files sent to the Pod's sandboxd.
//!
//! Here: [`KubeTenant`] and what its parts share (the tenant's APIs, claim
//! lookups, views, waiting for Ready, reaching the Pod). The trait members
//! are split by what they act on, as `local/` splits its model:
//!
//! - [`sandboxes`]: `impl Sandboxes` and `impl TenantView` (the sandbox
//!   members; the template and pool members call the two below);
//! - [`templates`]: the tenant's SandboxTemplates;
//! - [`pools`]: the tenant's SandboxWarmPools;
//! - [`secrets`]: `/v1/secrets` over the tenant's values Secret;
//! - [`volumes`]: `/v1/volumes` over PersistentVolumeClaims;
//! - [`volume_snapshots`]: their snapshots (VolumeSnapshots) and clones;
//! - [`volume_pod`]: a volume's files through a helper Pod's sandboxd.

mod pools;
mod sandboxes;
mod secrets;
mod templates;
mod volume_pod;
mod volume_snapshots;
mod volumes;

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::wait::await_condition,
    Api,
};
use sandhub_api::{
    error::Code,
    hub::{
        CreateSandbox, ExecRequest, ExecResult, ForkRequest, NamedTemplate, Pool, PoolSpec,
        Sandbox, Snapshot, Template,
    },
    k8s::{names, Sandbox as SandboxCr, SandboxClaim, SandboxTemplate, SandboxWarmPool},
    sandboxd::{DirectoryListing, FileEntry},
    validate,
};
use sandhub_client::{
    sandboxd::{kept_process_events, SandboxdClient},
    ByteStream, Error, KeptProcess, ProcessEvents, PtySize, Result, Sandboxes, Signal,
    StartProcess, StdinInput, WatchEvents, WriteOptions,
};

use super::{
    caches::Watched,
    model,
    owner::{self, Owner},
    reach::Target,
    sidecar_exec,
    startup::{self, StartProblem},
    template, Shared,
};
use crate::backend::{new_id, TenantView};

/// How often a starting sandbox's Pod status is read for a reason it
/// cannot start (two or three API reads each time): most Pods are Ready
/// before the first read.
const POD_STATUS_POLL: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
pub struct KubeTenant {
    pub(super) shared: Arc<Shared>,
    pub(super) tenant: String,
}

/// Kubernetes API errors in the hub's code words.
pub(super) fn kube_error(what: &str, e: kube::Error) -> Error {
    match &e {
        kube::Error::Api(status) => {
            let code = match status.code {
                400 | 422 => Code::InvalidArgument,
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::NotFound,
                409 => Code::Conflict,
                429 => Code::ResourceExhausted,
                _ => Code::Unavailable,
            };
            Error::new(code, format!("{what}: {}", status.message))
        }
        _ => Error::unavailable(format!("{what}: the Kubernetes API did not answer: {e}")),
    }
}

/// Read-check-writes of one pool or template PUT before a conflict is the
/// caller's.
const WRITE_ATTEMPTS: u32 = 3;

/// What attempt `attempt` of a read-check-write of `kind` `name` came to:
/// the object written, `None` to read it again and retry (a conflict, while
/// attempts remain), or the caller's error.
pub(super) fn settle_write<K>(
    wrote: kube::Result<K>,
    attempt: u32,
    kind: &str,
    name: &str,
) -> Result<Option<K>> {
    match wrote {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(s)) if s.code == 409 && attempt < WRITE_ATTEMPTS => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::new(
            Code::Conflict,
            format!("{kind} {name} changed meanwhile; try again"),
        )),
        Err(e) => Err(kube_error(&format!("writing {kind} {name}"), e)),
    }
}

fn unimplemented(what: &str) -> Error {
    Error::new(
        Code::Unimplemented,
        format!("{what} is not available on the kubernetes backend (Pods have no workspace layers to keep or drop)"),
    )
}

impl KubeTenant {
    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    fn sandboxes(&self) -> Api<SandboxCr> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    fn pools(&self) -> Api<SandboxWarmPool> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    fn owns(&self, claim: &SandboxClaim) -> bool {
        let labels = claim.metadata.labels.as_ref();
        labels
            .and_then(|l| l.get(model::TENANT_LABEL))
            .map(String::as_str)
            == Some(model::tenant_label_value(&self.tenant).as_str())
            && labels
                .and_then(|l| l.get(names::CREATED_BY))
                .map(String::as_str)
                == Some(model::CREATED_BY_HUB)
    }

    /// The tenant's claim; another tenant's is simply not found.
    async fn claim(&self, id: &str) -> Result<SandboxClaim> {
        let not_found = || Error::not_found(format!("sandbox {id} not found"));
        if !sandhub_api::hub::is_dns_label(id) {
            return Err(not_found());
        }
        match self.claims().get_opt(id).await {
            Ok(Some(c)) if self.owns(&c) => Ok(c),
            Ok(_) => Err(not_found()),
            Err(e) => Err(kube_error(&format!("reading sandbox {id}"), e)),
        }
    }

    /// Set when the Sandbox is made and never changed: the watch's copy
    /// answers when it has the label.
    async fn launch_type(&self, claim: &SandboxClaim) -> Option<String> {
        let name = claim.status.as_ref()?.sandbox.as_ref()?.name.clone();
        if let Some(l) = self.shared.caches.sandbox_label(&name, names::LAUNCH_TYPE) {
            return Some(l);
        }
        let sb = self.sandboxes().get_opt(&name).await.ok()??;
        sb.metadata.labels?.get(names::LAUNCH_TYPE).cloned()
    }

    /// One sandbox as its GET answers it: with its entrypoint's status when
    /// it is Ready and has one (see [`crate::entrypoint`]).
    async fn view(&self, claim: &SandboxClaim) -> Sandbox {
        let launch = self.launch_type(claim).await;
        let mut view = self.hub_view(claim, launch.as_deref());
        if view.state == sandhub_api::hub::SandboxState::Ready {
            if let Ok(client) = self.client(&view.id, "get").await {
                let (record, usage, limits) = tokio::join!(
                    crate::entrypoint::ask(&client),
                    crate::kube::usage::ask(&client),
                    self.usage_limits(&view.template)
                );
                if let Some(record) = record {
                    let now = crate::backend::now_ms();
                    view.entrypoint = Some(crate::entrypoint::status(&record, 0, now));
                }
                view.usage = usage
                    .and_then(|r| crate::kube::usage::latest(&r, &limits, crate::backend::now_s()));
            }
        }
        view
    }

    /// What a sandbox's usage is measured against: its template's limits
    /// (never what sandboxd reports); none where the template is gone.
    pub(super) async fn usage_limits(&self, template: &str) -> sandhub_api::usage::UsageLimits {
        match sandhub_client::Sandboxes::get_template(self, template).await {
            Ok(t) => sandhub_api::usage::UsageLimits {
                memory_mb: t.template.memory_mb,
                disk_mb: t.template.disk_mb,
                cpu: t.template.cpu,
                pids: t.template.pids,
            },
            Err(_) => Default::default(),
        }
    }

    /// [`model::sandbox_of`], with the pool under the name this tenant knows.
    fn hub_view(&self, claim: &SandboxClaim, launch: Option<&str>) -> Sandbox {
        let mut s = model::sandbox_of(claim, launch);
        s.pool = s.pool.map(|p| owner::pool_hub_name(&self.tenant, &p));
        s.template = owner::pool_hub_name(&self.tenant, &s.template);
        s
    }

    pub(super) fn templates(&self) -> Api<SandboxTemplate> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    /// The object `name` means to this tenant: its own (cluster name
    /// [`owner::object_name`]), else the operator's; never another tenant's.
    /// Read from the watch when it has the object (see kube/caches.rs),
    /// else from the API server.
    pub(super) async fn find<K>(&self, api: &Api<K>, kind: &str, name: &str) -> Result<(K, Owner)>
    where
        K: Watched + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match self.find_cached::<K>(name) {
            Some(found) => Ok(found),
            None => self.find_fresh(api, kind, name).await,
        }
    }

    /// [`Self::find`] in the watch's copy; `None` where only the API server
    /// can say (nothing this tenant may use is there, or the watch may not
    /// be relied on).
    fn find_cached<K: Watched>(&self, name: &str) -> Option<(K, Owner)> {
        if !sandhub_api::hub::is_dns_label(name) {
            return None;
        }
        let caches = &self.shared.caches;
        if name.len() <= owner::MAX_TENANT_NAME {
            let own = owner::object_name(&self.tenant, name);
            if let Some(o) = caches.lookup::<K>(&own)? {
                if owner::owner(o.meta(), &self.tenant) == Owner::Caller {
                    return Some(((*o).clone(), Owner::Caller));
                }
            }
        }
        match caches.lookup::<K>(name)? {
            Some(o) if owner::owner(o.meta(), &self.tenant) == Owner::Operator => {
                Some(((*o).clone(), Owner::Operator))
            }
            _ => None,
        }
    }

    /// [`Self::find`] from the API server: for what is about to be changed
    /// on the strength of it (a delete's preconditions).
    pub(super) async fn find_fresh<K>(
        &self,
        api: &Api<K>,
        kind: &str,
        name: &str,
    ) -> Result<(K, Owner)>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let not_found = || Error::not_found(format!("{kind} {name} not found"));
        if !sandhub_api::hub::is_dns_label(name) {
            return Err(not_found());
        }
        let read = |e| kube_error(&format!("reading {kind} {name}"), e);
        if name.len() <= owner::MAX_TENANT_NAME {
            let own = owner::object_name(&self.tenant, name);
            if let Some(o) = api.get_opt(&own).await.map_err(read)? {
                if owner::owner(o.meta(), &self.tenant) == Owner::Caller {
                    return Ok((o, Owner::Caller));
                }
            }
        }
        match api.get_opt(name).await.map_err(read)? {
            Some(o) if owner::owner(o.meta(), &self.tenant) == Owner::Operator => {
                Ok((o, Owner::Operator))
            }
            _ => Err(not_found()),
        }
    }

    /// Waits (a watch, not a poll) until the claim is Ready or can never be.
    /// A claim this create just made is waited for on the claim watch every
    /// claim shares (no copy there can predate it); any other, on a watch of
    /// its own from a fresh list.
    async fn wait_ready(&self, id: &str, made_now: bool) -> Result<SandboxClaim> {
        let timeout = self.shared.ready_timeout;
        let settled = |c: &SandboxClaim| model::is_ready(c) || model::terminal_reason(c).is_some();
        let wait = async {
            if made_now {
                Ok(self.watched_until(id, settled).await)
            } else {
                await_condition(self.claims(), id, |c: Option<&SandboxClaim>| {
                    c.is_none_or(settled)
                })
                .await
            }
        };
        // Meanwhile its Pod's status says early why it cannot start: a fatal
        // reason ends the wait now, any other is kept for the timeout's answer.
        let last_problem = std::sync::Mutex::new(None::<StartProblem>);
        let watch_pod = async {
            loop {
                tokio::time::sleep(POD_STATUS_POLL).await;
                match self.start_problem(id).await {
                    Some(p) if p.fatal => return p,
                    Some(p) => *last_problem.lock().unwrap_or_else(|e| e.into_inner()) = Some(p),
                    None => {}
                }
            }
        };
        let raced = async {
            tokio::select! {
                claim = wait => Ok(claim),
                fatal = watch_pod => Err(fatal),
            }
        };
        let claim = match tokio::time::timeout(timeout, raced).await {
            Err(_) => {
                let why = last_problem
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .map(|p| format!(": {p}"))
                    .unwrap_or_default();
                return Err(Error::unavailable(format!(
                    "sandbox {id} was not Ready within {}s{why}",
                    timeout.as_secs()
                )));
            }
            Ok(Err(fatal)) => {
                return Err(Error::new(
                    Code::FailedPrecondition,
                    format!("sandbox {id} failed to start: {fatal}"),
                ))
            }
            Ok(Ok(Err(e))) => {
                return Err(Error::unavailable(format!("watching sandbox {id}: {e}")))
            }
            Ok(Ok(Ok(None))) => {
                return Err(Error::not_found(format!(
                    "sandbox {id} was deleted while starting"
                )))
            }
            Ok(Ok(Ok(Some(c)))) => c,
        };
        if let Some((reason, message)) = model::terminal_reason(&claim) {
            let code = match reason.as_str() {
                "WarmPoolNotFound" | "TemplateNotFound" => Code::NotFound,
                "InvalidMetadata" | "EnvVarsInjectionRejected" | "VolumeClaimTemplatesError" => {
                    Code::InvalidArgument
                }
                _ => Code::FailedPrecondition,
            };
            return Err(Error::new(
                code,
                format!("sandbox {id}: {reason}: {message}"),
            ));
        }
        Ok(claim)
    }

    /// Claim `id` once the claim watch has it `settled`; `None` once it
    /// is gone after the watch had seen it.
    async fn watched_until(
        &self,
        id: &str,
        settled: impl Fn(&SandboxClaim) -> bool,
    ) -> Option<SandboxClaim> {
        let wait = self.shared.claim_waiters.wait(id);
        let key = kube::runtime::reflector::ObjectRef::new(id).within(&self.shared.namespace);
        let mut seen = false;
        loop {
            match self.shared.claim_cache.get(&key) {
                Some(c) if settled(&c) => return Some((*c).clone()),
                Some(_) => seen = true,
                None if seen => return None,
                None => {}
            }
            wait.changed().await;
        }
    }

    /// Why starting sandbox `id`'s Pod is not coming up, if its status
    /// says. Best effort: a Pod not made yet, or one the hub may not read
    /// (an older Role without `pods: get`), says nothing.
    async fn start_problem(&self, id: &str) -> Option<StartProblem> {
        // The watch's copy when it has one: many starting sandboxes, few GETs.
        let claim = match self.shared.cached_claim(id) {
            Some(c) => c,
            None => Arc::new(self.claims().get_opt(id).await.ok()??),
        };
        let pod = self.pod_name(&model::sandbox_name(&claim, id)).await;
        let pods: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.shared.namespace);
        match pods.get_opt(&pod).await {
            Ok(Some(pod)) => startup::problem(&pod),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(%id, error = %e, "reading a starting sandbox's Pod");
                None
            }
        }
    }

    /// The Pod of Sandbox `sandbox` (see [`Shared::pod_name`]).
    async fn pod_name(&self, sandbox: &str) -> String {
        self.shared.pod_name(sandbox).await
    }

    /// A client for the sandbox's sandboxd, cached while its Pod stays.
    async fn client(&self, id: &str, op: &str) -> Result<SandboxdClient> {
        let (pod, pod_ip) = self.ready_pod(id, op).await?;
        let key = format!("{id}/{pod}/{}", pod_ip.as_deref().unwrap_or(""));
        if let Some(c) = self.shared.cached_client(&key) {
            return Ok(c);
        }
        let client = self.shared.reach.client(&Target {
            namespace: &self.shared.namespace,
            sandbox: &pod,
            pod_ip: pod_ip.as_deref(),
        })?;
        self.shared.cache_client(key, client.clone());
        Ok(client)
    }

    /// The Pod of this tenant's Ready sandbox `id`: its name and IP.
    pub(super) async fn ready_pod(&self, id: &str, op: &str) -> Result<(String, Option<String>)> {
        let claim = match self.shared.cached_claim(id) {
            Some(c)
                if self.owns(&c)
                    && model::state_of(&c) == sandhub_api::hub::SandboxState::Ready =>
            {
                (*c).clone()
            }
            // Not (yet) in the watch's view, or not Ready there: the API
            // server decides, with its precise errors.
            _ => self.claim(id).await?,
        };
        // A deleted claim lingers while its Pod goes (foreground deletion);
        // to its tenant the sandbox is gone already.
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(Error::not_found(format!("sandbox {id} is being deleted")));
        }
        let state = model::state_of(&claim);
        if state != sandhub_api::hub::SandboxState::Ready {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("sandbox {id} is {}; {op} needs it Ready", state.as_str()),
            ));
        }
        let bound = claim.status.as_ref().and_then(|s| s.sandbox.as_ref());
        let pod = bound
            .map(|b| b.name.clone())
            .unwrap_or_else(|| id.to_string());
        let pod_ip = bound.and_then(|b| b.pod_ips.first().cloned());
        Ok((pod, pod_ip))
    }

    async fn set_mode(&self, id: &str, mode: &str) -> Result<SandboxClaim> {
        let claim = self.claim(id).await?;
        let name = claim
            .status
            .as_ref()
            .and_then(|s| s.sandbox.as_ref())
            .map(|s| s.name.clone())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                Error::new(
                    Code::FailedPrecondition,
                    format!("sandbox {id} has no Sandbox yet"),
                )
            })?;
        let patch = serde_json::json!({"spec": {"operatingMode": mode}});
        self.sandboxes()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| kube_error(&format!("setting sandbox {id} {mode}"), e))?;
        Ok(claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("it changed", "Conflict")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_conflict_is_retried_until_the_last_attempt_then_is_the_callers() {
        assert_eq!(settle_write(Ok(7), 1, "pool", "p").unwrap(), Some(7));
        for attempt in 1..WRITE_ATTEMPTS {
            assert_eq!(
                settle_write::<u8>(Err(status(409)), attempt, "pool", "p").unwrap(),
                None
            );
        }
        let last = settle_write::<u8>(Err(status(409)), WRITE_ATTEMPTS, "pool", "p").unwrap_err();
        assert_eq!(last.code, Code::Conflict);
        assert_eq!(last.message, "pool p changed meanwhile; try again");
        // Anything else is never retried.
        let other = settle_write::<u8>(Err(status(403)), 1, "template", "t").unwrap_err();
        assert_eq!(other.code, Code::PermissionDenied);
        assert!(
            other.message.starts_with("writing template t: "),
            "{}",
            other.message
        );
    }
}
