//! One tenant's sandboxes on Kubernetes: [`Sandboxes`] over SandboxClaims,
//! with processes and files sent to the Pod's sandboxd.
//!
//! A little over 600 lines on purpose: it is one `impl Sandboxes` (a method
//! per trait member, most of them a few lines that reach the Pod), and one
//! trait impl split over several files reads worse than one long file.

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
    sandboxd::SandboxdClient, ByteStream, Error, ProcessEvents, PtySize, Result, Sandboxes, Signal,
    StartProcess, StdinInput, WatchEvents, WriteOptions,
};

use super::{
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

    async fn launch_type(&self, claim: &SandboxClaim) -> Option<String> {
        let name = claim.status.as_ref()?.sandbox.as_ref()?.name.clone();
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
                if let Some(record) = crate::entrypoint::ask(&client).await {
                    let now = crate::backend::now_ms();
                    view.entrypoint = Some(crate::entrypoint::status(&record, 0, now));
                }
            }
        }
        view
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
    pub(super) async fn find<K>(&self, api: &Api<K>, kind: &str, name: &str) -> Result<(K, Owner)>
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

    fn pool_view(&self, p: &SandboxWarmPool) -> Pool {
        let mut v = model::pool_of(p);
        if let Some(name) = owner::hub_name(&p.metadata, &self.tenant) {
            v.name = name;
        }
        // The tenant's own templates by the name it gave them.
        v.template = owner::pool_hub_name(&self.tenant, &v.template);
        v
    }

    /// Waits (a watch, not a poll) until the claim is Ready or can never be.
    async fn wait_ready(&self, id: &str) -> Result<SandboxClaim> {
        let timeout = self.shared.ready_timeout;
        let wait = await_condition(self.claims(), id, |c: Option<&SandboxClaim>| {
            c.is_none_or(|c| model::is_ready(c) || model::terminal_reason(c).is_some())
        });
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

    /// Why starting sandbox `id`'s Pod is not coming up, if its status
    /// says. Best effort: a Pod not made yet, or one the hub may not read
    /// (an older Role without `pods: get`), says nothing.
    async fn start_problem(&self, id: &str) -> Option<StartProblem> {
        // The watch's copy when it has one: many starting sandboxes, few GETs.
        let claim = match self.shared.cached_claim(id) {
            Some(c) => c,
            None => Arc::new(self.claims().get_opt(id).await.ok()??),
        };
        let sandbox = claim
            .status
            .as_ref()
            .and_then(|s| s.sandbox.as_ref())
            .map(|s| s.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| id.to_string());
        let pod = self.pod_name(&sandbox).await;
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

    /// The Pod of Sandbox `sandbox`: its pod-name annotation (an adopted
    /// warm Pod keeps its own name), else the Sandbox's name.
    async fn pod_name(&self, sandbox: &str) -> String {
        match self.sandboxes().get_opt(sandbox).await {
            Ok(Some(sb)) => sb
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::POD_NAME_ANNOTATION).cloned())
                .unwrap_or_else(|| sandbox.to_string()),
            _ => sandbox.to_string(),
        }
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

    /// What tenants' templates start from: the operator's `--base-template`
    /// if there is one, else the built-in sandboxd template.
    async fn base_template(&self) -> Result<sandhub_api::k8s::SandboxTemplateSpec> {
        let name = &self.shared.base_template;
        match self.templates().get_opt(name).await {
            Ok(Some(t)) if owner::owner(&t.metadata, &self.tenant) == Owner::Operator => Ok(t.spec),
            Ok(_) => Ok(template::builtin_base(&self.shared.prepull_images.sandboxd)),
            Err(e) => Err(kube_error(&format!("reading the base template {name}"), e)),
        }
    }

    fn template_view(&self, name: &str, t: &SandboxTemplate) -> NamedTemplate {
        NamedTemplate {
            name: name.to_string(),
            template: template::template_of(&t.spec, &self.shared.prepull_images.sandboxd),
        }
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

#[async_trait]
impl TenantView for KubeTenant {
    fn tenant(&self) -> &str {
        &self.tenant
    }

    async fn sandboxd(&self, id: &str, op: &str) -> Result<SandboxdClient> {
        self.client(id, op).await
    }

    async fn list_snapshots(&self, id: &str) -> Result<Vec<Snapshot>> {
        self.claim(id).await?;
        Ok(Vec::new())
    }

    async fn connect_port(&self, id: &str, port: u16) -> Result<crate::backend::PortStream> {
        let (pod, pod_ip) = self.ready_pod(id, "port access").await?;
        let target = Target {
            namespace: &self.shared.namespace,
            sandbox: &pod,
            pod_ip: pod_ip.as_deref(),
        };
        super::ports::connect(&self.shared.reach, &target, id, port).await
    }

    async fn set_deadline(&self, id: &str, seconds: u64) -> Result<Sandbox> {
        self.claim(id).await?;
        let patch = serde_json::json!({"spec": {"lifecycle": model::deadline(seconds)?}});
        let claim = self
            .claims()
            .patch(id, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| kube_error(&format!("moving sandbox {id}'s deadline"), e))?;
        Ok(self.view(&claim).await)
    }

    async fn list_ports(&self, id: &str) -> Result<Vec<sandhub_api::hub::ListeningPort>> {
        let client = self.client(id, "listing ports").await?;
        super::ports::listening(&client).await
    }
}

#[async_trait]
impl Sandboxes for KubeTenant {
    async fn create(&self, req: CreateSandbox) -> Result<Sandbox> {
        // The shared rules (api's validate): both backends refuse the same.
        req.validate()?;
        if req.idle_timeout_seconds.is_some() {
            return Err(Error::invalid(
                "idle_timeout_seconds is not available on the kubernetes backend; use shutdown_after_seconds",
            ));
        }
        let pool_name = req
            .pool
            .clone()
            .or_else(|| req.template.clone())
            .unwrap_or_else(|| sandhub_api::hub::DEFAULT_TEMPLATE.to_string());
        let (pool_object, _) = self.find(&self.pools(), "pool", &pool_name).await?;
        let pool = self.pool_view(&pool_object);
        if let Some(t) = &req.template {
            if req.pool.is_some() && &pool.template != t {
                return Err(Error::invalid(format!(
                    "pool {pool_name} serves template {}, not {t}",
                    pool.template
                )));
            }
        }
        let id = new_id("sb");
        let claim = model::claim_for(
            &id,
            &self.tenant,
            &pool_object.metadata.name.clone().unwrap_or_default(),
            &pool.template,
            &req,
            SystemTime::now(),
        )?;
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|e| kube_error("creating the sandbox claim", e))?;
        match self.wait_ready(&id).await {
            Ok(claim) => Ok(self.view(&claim).await),
            Err(e) => {
                // A claim that will not come up is not left to hold a Pod.
                let _ = self.claims().delete(&id, &DeleteParams::background()).await;
                Err(e)
            }
        }
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        let claim = self.claim(id).await?;
        Ok(self.view(&claim).await)
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        let params = ListParams::default().labels(&model::selector(&self.tenant, labels));
        let claims = self
            .claims()
            .list(&params)
            .await
            .map_err(|e| kube_error("listing sandboxes", e))?;
        let launch: BTreeMap<String, String> = self
            .sandboxes()
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing Sandboxes", e))?
            .into_iter()
            .filter_map(|s| {
                let l = s.metadata.labels?.get(names::LAUNCH_TYPE).cloned()?;
                Some((s.metadata.name?, l))
            })
            .collect();
        Ok(claims
            .into_iter()
            .map(|c| {
                let bound = c
                    .status
                    .as_ref()
                    .and_then(|s| s.sandbox.as_ref())
                    .map(|s| s.name.clone());
                let l = bound.and_then(|b| launch.get(&b).cloned());
                self.hub_view(&c, l.as_deref())
            })
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<()> {
        self.claim(id).await?;
        self.shared.forget_clients(id);
        // Foreground: the claim goes only after its Sandbox and Pod, so a
        // listing never shows a sandbox whose Pod still runs unaccounted.
        self.claims()
            .delete(id, &DeleteParams::foreground())
            .await
            .map_err(|e| kube_error(&format!("deleting sandbox {id}"), e))?;
        Ok(())
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> Result<ExecResult> {
        if let Some(container) = request.container.clone() {
            let (sandbox, _) = self.ready_pod(id, "exec").await?;
            let pod_name = self.pod_name(&sandbox).await;
            let pods: Api<Pod> =
                Api::namespaced(self.shared.client.clone(), &self.shared.namespace);
            let pod = pods
                .get(&pod_name)
                .await
                .map_err(|e| kube_error(&format!("reading sandbox {id}'s Pod"), e))?;
            // A bad name, not a missing sandbox: NOT_FOUND would read as "gone".
            if !sidecar_exec::is_sidecar(&pod, &container) {
                return Err(Error::invalid(format!(
                    "sandbox {id} has no sidecar {container}"
                )));
            }
            return sidecar_exec::exec(&pods, &pod_name, &container, request).await;
        }
        self.client(id, "exec").await?.exec(request).await
    }

    async fn start(&self, id: &str, request: StartProcess) -> Result<ProcessEvents> {
        self.client(id, "start").await?.start(request).await
    }

    async fn write_stdin(&self, id: &str, pid: i32, input: StdinInput) -> Result<()> {
        self.client(id, "stdin")
            .await?
            .write_stdin(pid, input)
            .await
    }

    async fn signal(&self, id: &str, pid: i32, signal: Signal) -> Result<()> {
        self.client(id, "signal").await?.signal(pid, signal).await
    }

    async fn resize(&self, id: &str, pid: i32, size: PtySize) -> Result<()> {
        self.client(id, "resize").await?.resize(pid, size).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream> {
        self.client(id, "file access").await?.read_file(path).await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<()> {
        self.client(id, "file access")
            .await?
            .write_file(path, data, options)
            .await
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<DirectoryListing> {
        self.client(id, "file access").await?.list_files(path).await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<Option<FileEntry>> {
        self.client(id, "file access").await?.stat(path).await
    }

    async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        self.client(id, "file access")
            .await?
            .delete_file(path, recursive)
            .await
    }

    async fn watch(&self, id: &str, path: &str, recursive: bool) -> Result<WatchEvents> {
        self.client(id, "watch").await?.watch(path, recursive).await
    }

    async fn suspend(&self, id: &str) -> Result<Sandbox> {
        self.shared.forget_clients(id);
        let claim = self.set_mode(id, "Suspended").await?;
        let wait = await_condition(self.claims(), id, |c: Option<&SandboxClaim>| {
            c.is_none_or(|c| model::state_of(c) == sandhub_api::hub::SandboxState::Suspended)
        });
        let claim = match tokio::time::timeout(self.shared.ready_timeout, wait).await {
            Ok(Ok(Some(c))) => c,
            _ => claim,
        };
        Ok(self.view(&claim).await)
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        self.set_mode(id, "Running").await?;
        let claim = self.wait_ready(id).await?;
        Ok(self.view(&claim).await)
    }

    async fn snapshot(&self, _id: &str) -> Result<Snapshot> {
        Err(unimplemented("snapshot"))
    }

    async fn delete_snapshot(&self, _id: &str, _snapshot: &str) -> Result<()> {
        Err(unimplemented("snapshot"))
    }

    async fn reset(&self, _id: &str) -> Result<Sandbox> {
        Err(unimplemented("reset"))
    }

    async fn fork(&self, _id: &str, request: ForkRequest) -> Result<Sandbox> {
        // A bad request is refused as the local backend refuses it, before
        // saying this backend has no forks.
        request.validate()?;
        Err(unimplemented("fork"))
    }

    async fn put_template(&self, name: &str, t: Template) -> Result<NamedTemplate> {
        // The shared rules first, so a template out of range gets the same
        // answer on both backends.
        validate::name("template", name)?;
        t.validate()?;
        template::refuse_local_only(&t)?;
        if name.len() > owner::MAX_TENANT_NAME {
            return Err(Error::invalid(format!(
                "template name `{name}` must be a DNS-1123 label of at most {} characters",
                owner::MAX_TENANT_NAME
            )));
        }
        let templates = self.templates();
        let read = |e| kube_error(&format!("reading template {name}"), e);
        if templates
            .get_opt(name)
            .await
            .map_err(read)?
            .is_some_and(|t| owner::owner(&t.metadata, &self.tenant) == Owner::Operator)
        {
            return Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "template {name} is the operator's: pools can use it, but it is changed \
                     only with kubectl or Helm"
                ),
            ));
        }
        let mut want = template::tenant_template(
            &self.tenant,
            name,
            self.base_template().await?,
            &t,
            &self.shared.prepull_images.sandboxd,
            self.shared.image_pull_policy,
        )?;
        let object = owner::object_name(&self.tenant, name);
        let conflict = |e: kube::Error| match &e {
            kube::Error::Api(s) if s.code == 409 => Error::new(
                Code::Conflict,
                format!("template {name} changed meanwhile; try again"),
            ),
            _ => kube_error(&format!("writing template {name}"), e),
        };
        match templates.get_opt(&object).await.map_err(read)? {
            // The name is ours by construction; anything else there is
            // left alone.
            Some(have) if owner::owner(&have.metadata, &self.tenant) != Owner::Caller => {
                return Err(Error::new(
                    Code::Conflict,
                    format!("template {name}: the cluster name {object} is taken"),
                ))
            }
            // At the version read: no write lands on what was not checked.
            Some(have) => want.metadata.resource_version = have.metadata.resource_version,
            None => {}
        }
        // Server-side apply, always by one field manager: what a new
        // version of the template no longer sets is removed.
        let written = templates
            .patch(
                &object,
                &PatchParams::apply(TEMPLATE_FIELD_MANAGER).force(),
                &Patch::Apply(&want),
            )
            .await
            .map_err(conflict)?;
        Ok(self.template_view(name, &written))
    }

    async fn get_template(&self, name: &str) -> Result<NamedTemplate> {
        let (t, _) = self.find(&self.templates(), "template", name).await?;
        Ok(self.template_view(name, &t))
    }

    /// The caller's templates and the operator's; the caller's own wins a
    /// name both have.
    async fn list_templates(&self) -> Result<Vec<NamedTemplate>> {
        let mut listed = self
            .templates()
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing templates", e))?
            .items;
        listed.retain(|t| owner::owner(&t.metadata, &self.tenant) != Owner::Other);
        listed.sort_by_key(|t| owner::owner(&t.metadata, &self.tenant) == Owner::Caller);
        let mut by_name = BTreeMap::new();
        for t in &listed {
            if let Some(name) = owner::hub_name(&t.metadata, &self.tenant) {
                let v = self.template_view(&name, t);
                by_name.insert(name, v);
            }
        }
        Ok(by_name.into_values().collect())
    }

    async fn delete_template(&self, name: &str) -> Result<()> {
        let (t, who) = self.find(&self.templates(), "template", name).await?;
        if who == Owner::Operator {
            return Err(Error::new(
                Code::PermissionDenied,
                format!("template {name} is the operator's: delete it with kubectl or Helm"),
            ));
        }
        let object = t.metadata.name.clone().unwrap_or_default();
        let users: Vec<String> = self
            .pools()
            .list(&ListParams::default().labels(&owner::tenant_selector(&self.tenant)))
            .await
            .map_err(|e| kube_error("listing pools", e))?
            .iter()
            .filter(|p| p.spec.sandbox_template_ref.name == object)
            .map(|p| self.pool_view(p).name)
            .collect();
        if !users.is_empty() {
            return Err(Error::new(
                Code::Conflict,
                format!("template {name} is used by pool {}", users.join(", ")),
            ));
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: t.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.templates()
            .delete(&object, &params)
            .await
            .map(|_| ())
            .map_err(|e| kube_error(&format!("deleting template {name}"), e))
    }

    async fn put_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool> {
        validate::name("pool", name)?;
        // Shorter than the shared rule: the cluster object's name adds the
        // tenant's digest to it.
        if name.len() > owner::MAX_TENANT_NAME {
            return Err(Error::invalid(format!(
                "pool name `{name}` must be a DNS-1123 label of at most {} characters",
                owner::MAX_TENANT_NAME
            )));
        }
        let pools = self.pools();
        let read = |e| kube_error(&format!("reading pool {name}"), e);
        if pools
            .get_opt(name)
            .await
            .map_err(read)?
            .is_some_and(|p| owner::owner(&p.metadata, &self.tenant) == Owner::Operator)
        {
            return Err(operator_pool(name));
        }
        // Only the operator's templates and the caller's own.
        let (template, _) = self
            .find(&self.templates(), "template", &spec.template)
            .await?;
        let template = template.metadata.name.unwrap_or_default();
        let object = owner::object_name(&self.tenant, name);

        let _admission = self.shared.pool_writes.lock().await;
        let others: u64 = pools
            .list(&ListParams::default().labels(&owner::tenant_selector(&self.tenant)))
            .await
            .map_err(|e| kube_error("listing pools", e))?
            .iter()
            .filter(|p| owner::owner(&p.metadata, &self.tenant) == Owner::Caller)
            .filter(|p| p.metadata.name.as_deref() != Some(object.as_str()))
            .map(|p| p.spec.replicas.max(0) as u64)
            .sum();
        self.shared
            .policy
            .admit_replicas(others + spec.replicas as u64)?;
        // The shared cap comes after the tenant's quota here: a request
        // over the quota has always been 429 on this backend (and
        // tests/k8s_e2e/test_k8s_security.py pins that).
        spec.validate()?;

        let conflict = |e: kube::Error| match &e {
            kube::Error::Api(s) if s.code == 409 => Error::new(
                Code::Conflict,
                format!("pool {name} changed meanwhile; try again"),
            ),
            _ => kube_error(&format!("writing pool {name}"), e),
        };
        let want = owner::tenant_pool(&self.tenant, name, &template, spec.replicas);
        let written = match pools.get_opt(&object).await.map_err(read)? {
            // The name is ours by construction; anything else there (a
            // 48-bit suffix collision, an operator's object) is left alone.
            Some(have) if owner::owner(&have.metadata, &self.tenant) != Owner::Caller => {
                return Err(Error::new(
                    Code::Conflict,
                    format!("pool {name}: the cluster name {object} is taken"),
                ))
            }
            // The resourceVersion makes the patch fail if the pool changed
            // since it was read: no write lands on what was not checked.
            Some(have) => {
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": have.metadata.resource_version},
                    "spec": {
                        "replicas": want.spec.replicas,
                        "sandboxTemplateRef": {"name": template},
                    },
                });
                pools
                    .patch(&object, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(conflict)?
            }
            None => pools
                .create(&PostParams::default(), &want)
                .await
                .map_err(conflict)?,
        };
        Ok(self.pool_view(&written))
    }

    async fn get_pool(&self, name: &str) -> Result<Pool> {
        let (p, _) = self.find(&self.pools(), "pool", name).await?;
        Ok(self.pool_view(&p))
    }

    /// The caller's pools and the operator's; the caller's own wins a name
    /// both have.
    async fn list_pools(&self) -> Result<Vec<Pool>> {
        let mut listed = self
            .pools()
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing pools", e))?
            .items;
        listed.retain(|p| owner::owner(&p.metadata, &self.tenant) != Owner::Other);
        listed.sort_by_key(|p| owner::owner(&p.metadata, &self.tenant) == Owner::Caller);
        let mut by_name = BTreeMap::new();
        for p in &listed {
            let v = self.pool_view(p);
            by_name.insert(v.name.clone(), v);
        }
        Ok(by_name.into_values().collect())
    }

    async fn delete_pool(&self, name: &str) -> Result<()> {
        match self.find(&self.pools(), "pool", name).await? {
            (_, Owner::Operator) => Err(operator_pool(name)),
            (p, _) => {
                let params = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: p.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                self.pools()
                    .delete(&p.metadata.name.unwrap_or_default(), &params)
                    .await
                    .map(|_| ())
                    .map_err(|e| kube_error(&format!("deleting pool {name}"), e))
            }
        }
    }
}

/// The field manager of tenants' SandboxTemplates (server-side apply).
const TEMPLATE_FIELD_MANAGER: &str = "sandhub-hub";

fn operator_pool(name: &str) -> Error {
    Error::new(
        Code::PermissionDenied,
        format!(
            "pool {name} is the operator's: sandboxes can be claimed from it, but it is \
             changed only with kubectl or Helm"
        ),
    )
}
