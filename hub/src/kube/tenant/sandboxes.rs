//! [`Sandboxes`] and [`TenantView`] for a [`KubeTenant`]: one method per
//! trait member, most of them a few lines that reach the Pod; the
//! templates' and pools' members are in `templates.rs` and `pools.rs`.

use super::*;

#[async_trait]
impl TenantView for KubeTenant {
    /// The decisions live in `sandhub egress-proxy`'s replicas: asked and
    /// merged (kube/meters.rs); empty for a sandbox without egress.
    async fn egress_log(&self, id: &str) -> Result<Vec<sandhub_api::hub::EgressDecision>> {
        let claim = self.claim(id).await?;
        if !model::is_egress(&claim) {
            return Ok(Vec::new());
        }
        Ok(self.shared.egress_report(id).await.decisions)
    }

    fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Values go to the tenant's Secret (kube/secrets.rs).
    async fn put_secret(
        &self,
        name: &str,
        value: String,
    ) -> Result<sandhub_api::secrets::SecretInfo> {
        self.put_secret_value(name, &value).await
    }

    async fn list_secrets(&self) -> Result<sandhub_api::secrets::SecretList> {
        self.secret_list().await
    }

    async fn delete_secret(&self, name: &str) -> Result<()> {
        self.remove_secret(name).await
    }

    /// PersistentVolumeClaims (kube/tenant/volumes.rs).
    async fn create_volume(
        &self,
        req: sandhub_api::volumes::CreateVolume,
    ) -> Result<sandhub_api::volumes::Volume> {
        self.create_volume_claim(req).await
    }

    async fn list_volumes(&self) -> Result<sandhub_api::volumes::VolumeList> {
        self.volume_list().await
    }

    async fn get_volume(&self, name: &str) -> Result<sandhub_api::volumes::Volume> {
        self.read_volume(name).await
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.remove_volume(name).await
    }

    /// VolumeSnapshots (kube/tenant/volume_snapshots.rs).
    async fn create_volume_snapshot(
        &self,
        volume: &str,
        req: sandhub_api::volumes::CreateVolumeSnapshot,
    ) -> Result<sandhub_api::volumes::VolumeSnapshot> {
        self.snapshot_volume(volume, req).await
    }

    async fn list_volume_snapshots(
        &self,
        volume: &str,
    ) -> Result<sandhub_api::volumes::VolumeSnapshotList> {
        self.volume_snapshot_list(volume).await
    }

    async fn delete_volume_snapshot(&self, volume: &str, name: &str) -> Result<()> {
        self.remove_volume_snapshot(volume, name).await
    }

    /// A helper Pod's (kube/tenant/volume_pod.rs).
    async fn volume_sandboxd(&self, name: &str) -> Result<SandboxdClient> {
        self.helper_pod_sandboxd(name).await
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
        crate::kube::ports::connect(&self.shared.reach, &target, id, port).await
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
        crate::kube::ports::listening(&client).await
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
        if req
            .idle_action
            .is_some_and(|a| a != sandhub_api::hub::IdleAction::Delete)
        {
            return Err(Error::invalid(
                "idle_action is not available on the kubernetes backend (it has no idle timeouts)",
            ));
        }
        if req.auto_resume == Some(true) {
            return Err(Error::invalid(
                "auto_resume is not available on the kubernetes backend: a Pod cannot be paused, \
                 and a suspended claim is resumed with `resume`",
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
        let egress = self.egress_claim(&id, &pool.template, &req).await?;
        let volumes = self
            .request_volumes(&id, &pool.template, &req.volumes)
            .await?;
        let mut claim = model::claim_for(
            &id,
            &self.tenant,
            &pool_object.metadata.name.clone().unwrap_or_default(),
            &pool.template,
            &req,
            SystemTime::now(),
            egress.as_ref(),
        )?;
        // Signed for this claim: the controller makes its Pod with them.
        claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(volumes);
        // From the claim on, the create runs to its end whoever hangs up:
        // a claim that will not come up is deleted even when no caller
        // waits any more for the answer.
        let me = self.clone();
        let claim = self
            .shared
            .changes
            .to_the_end(&self.tenant, async move {
                me.claims()
                    .create(&PostParams::default(), &claim)
                    .await
                    .map_err(|e| kube_error("creating the sandbox claim", e))?;
                match me.wait_ready(&id, true).await {
                    Ok(claim) => Ok(claim),
                    Err(e) => {
                        // A claim that will not come up is not left to hold a Pod.
                        let _ = me.claims().delete(&id, &DeleteParams::background()).await;
                        Err(e)
                    }
                }
            })
            .await?;
        Ok(self.view(&claim).await)
    }

    async fn get(&self, id: &str) -> Result<Sandbox> {
        let claim = self.claim(id).await?;
        let mut sb = self.view(&claim).await;
        if model::is_egress(&claim) {
            // One sandbox's GET, as on the local backend (lists do not ask).
            sb.egress = Some(self.shared.egress_report(id).await.usage);
        }
        Ok(sb)
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<Sandbox>> {
        let params = ListParams::default().labels(&model::selector(&self.tenant, labels));
        let claims = self
            .claims()
            .list(&params)
            .await
            .map_err(|e| kube_error("listing sandboxes", e))?;
        let bound = |c: &SandboxClaim| {
            c.status
                .as_ref()
                .and_then(|s| s.sandbox.as_ref())
                .map(|s| s.name.clone())
        };
        // From the Sandbox watch when it has every bound Sandbox's label
        // (set when the Sandbox is made, never changed); else one list.
        let cached: Option<BTreeMap<String, String>> = claims
            .iter()
            .filter_map(bound)
            .map(|b| {
                let l = self.shared.caches.sandbox_label(&b, names::LAUNCH_TYPE)?;
                Some((b, l))
            })
            .collect();
        let launch = match cached {
            Some(launch) => launch,
            None => self
                .sandboxes()
                .list(&ListParams::default())
                .await
                .map_err(|e| kube_error("listing Sandboxes", e))?
                .into_iter()
                .filter_map(|s| {
                    let l = s.metadata.labels?.get(names::LAUNCH_TYPE).cloned()?;
                    Some((s.metadata.name?, l))
                })
                .collect(),
        };
        Ok(claims
            .into_iter()
            .map(|c| {
                let l = bound(&c).and_then(|b| launch.get(&b).cloned());
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

    /// sandboxd keeps the process past the stream: it outlives this
    /// replica, and `list_kept`/`attach_kept` find it from any other.
    async fn start_kept(
        &self,
        id: &str,
        request: StartProcess,
        label: &str,
        tag: &str,
    ) -> Result<ProcessEvents> {
        let client = self.client(id, "start").await?;
        match client.start_kept(request.clone(), label, tag).await {
            Ok(events) => Ok(kept_process_events(events)),
            // sandboxd keeps at most 32 running processes; past them a
            // process still starts, tied to this replica's stream, as
            // before kept processes existed (`--max-processes` still holds).
            Err(e) if e.code == Code::ResourceExhausted => client.start(request).await,
            Err(e) => Err(e),
        }
    }

    async fn list_kept(&self, id: &str, label: &str) -> Result<Option<Vec<KeptProcess>>> {
        let client = self.client(id, "list processes").await?;
        Ok(Some(client.list_kept(label).await?))
    }

    async fn attach_kept(&self, id: &str, pid: i32, label: &str) -> Result<Option<ProcessEvents>> {
        let client = self.client(id, "connect to a process").await?;
        Ok(Some(kept_process_events(
            client.attach_kept(pid, label).await?,
        )))
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

    /// The node runtime could freeze a Pod's cgroup, but nothing in the
    /// Sandbox API asks it to (agent-sandbox has no pause): `suspend`
    /// (which scales the Pod away, files kept) is what this backend has.
    async fn pause(&self, id: &str) -> Result<Sandbox> {
        Err(Error::new(
            Code::Unimplemented,
            format!(
                "pause of {id} is not available on the kubernetes backend: the node runtime \
                 cannot be asked to freeze a Pod through the Sandbox API (agent-sandbox has \
                 no pause); suspend keeps the files but stops the processes"
            ),
        ))
    }

    async fn resume(&self, id: &str) -> Result<Sandbox> {
        self.set_mode(id, "Running").await?;
        let claim = self.wait_ready(id, false).await?;
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

    /// Rewrites the policy the claim records; `sandhub egress-proxy`
    /// watches claims, so the sandbox's next connection follows it. A bad
    /// body is named first, and another tenant's sandbox is NOT_FOUND, as
    /// on the local backend; a sandbox without a proxy policy (`none`)
    /// cannot change.
    /// sandboxd's ring of its own container, read on demand and clamped
    /// (kube/usage.rs); empty while the sandbox is not Ready.
    async fn metrics(
        &self,
        id: &str,
        query: sandhub_api::usage::MetricsQuery,
    ) -> Result<sandhub_api::usage::SandboxMetrics> {
        let step = crate::usage::check_step(query.step).map_err(Error::invalid)?;
        let claim = self.claim(id).await?;
        let sb = self.hub_view(&claim, None);
        let mut out = sandhub_api::usage::SandboxMetrics {
            step_seconds: step,
            ..Default::default()
        };
        if sb.state != sandhub_api::hub::SandboxState::Ready {
            return Ok(out);
        }
        out.limits = self.usage_limits(&sb.template).await;
        let client = self.client(id, "reading usage").await?;
        if let Some(report) = crate::kube::usage::ask(&client).await {
            let points = crate::kube::usage::points(&report, &out.limits, crate::backend::now_s());
            out.samples = crate::usage::fold(points.iter(), query.since.unwrap_or(0), step)
                .into_iter()
                .map(crate::usage::Point::to_api)
                .collect();
        }
        Ok(out)
    }

    async fn set_network(
        &self,
        id: &str,
        network: sandhub_api::hub::NetworkSpec,
    ) -> Result<Sandbox> {
        use crate::kube::egress::{refuse_patch, Recorded, POLICY_ANNOTATION};
        sandhub_api::validate::network(&network)?;
        let claim = self.claim(id).await?;
        let recorded = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POLICY_ANNOTATION))
            .and_then(|j| Recorded::from_annotation(j));
        let Some(recorded) = recorded else {
            refuse_patch(&network)?;
            return Ok(self.view(&claim).await);
        };
        let next = recorded.patched(network)?;
        // A merge patch guarded by the resourceVersion read: a concurrent
        // PATCH makes this one fail (CONFLICT) instead of being lost.
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": claim.metadata.resource_version,
            "annotations": {POLICY_ANNOTATION: next.to_annotation()},
        }});
        let claim = self
            .claims()
            .patch(id, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| kube_error(&format!("changing sandbox {id}'s network"), e))?;
        Ok(self.view(&claim).await)
    }

    async fn fork(&self, _id: &str, request: ForkRequest) -> Result<Sandbox> {
        // A bad request is refused as the local backend refuses it, before
        // saying this backend has no forks.
        request.validate()?;
        Err(unimplemented("fork"))
    }

    async fn put_template(&self, name: &str, t: Template) -> Result<NamedTemplate> {
        self.apply_template(name, t).await
    }

    async fn get_template(&self, name: &str) -> Result<NamedTemplate> {
        self.read_template(name).await
    }

    async fn list_templates(&self) -> Result<Vec<NamedTemplate>> {
        self.template_list().await
    }

    async fn delete_template(&self, name: &str) -> Result<()> {
        self.remove_template(name).await
    }

    async fn put_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool> {
        self.apply_pool(name, spec).await
    }

    async fn get_pool(&self, name: &str) -> Result<Pool> {
        self.read_pool(name).await
    }

    async fn list_pools(&self) -> Result<Vec<Pool>> {
        self.pool_list().await
    }

    async fn delete_pool(&self, name: &str) -> Result<()> {
        self.remove_pool(name).await
    }

    async fn volumes(&self) -> Result<Vec<sandhub_api::volumes::Volume>> {
        Ok(self.volume_list().await?.volumes)
    }
}

impl KubeTenant {
    /// What the claim of sandbox `id` of template `template` carries when
    /// that template is `network: egress` (kube/egress.rs); `None` else.
    async fn egress_claim(
        &self,
        id: &str,
        template: &str,
        req: &CreateSandbox,
    ) -> Result<Option<model::EgressClaim>> {
        let (t, _) = self.find(&self.templates(), "template", template).await?;
        let net = template::network_of(&t.spec);
        let offline = req
            .network
            .as_ref()
            .is_some_and(|n| n.mode == sandhub_api::hub::Network::None);
        if !req.secrets.is_empty()
            && (offline || net.network.mode != sandhub_api::hub::Network::Egress)
        {
            // The local backend's words: never silently dropped.
            return Err(Error::invalid(
                "secrets need `network: egress`: only the egress gateway can broker them",
            ));
        }
        if net.network.mode != sandhub_api::hub::Network::Egress {
            return Ok(None);
        }
        let Some(tokens) = &self.shared.proxy_tokens else {
            return Err(Error::new(
                Code::FailedPrecondition,
                "network: egress on the kubernetes backend needs the hub's \
                 --sandboxd-token-key-file (the proxy credentials derive from it)",
            ));
        };
        let recorded = crate::kube::egress::Recorded::new(&net, req.network.clone(), &req.secrets)?;
        // Every secret must have a value now, not fail at the first request.
        self.secret_values(recorded.secrets.iter().map(|s| s.name.as_str()))
            .await?;
        let mut env = crate::kube::egress::proxy_env(
            tokens,
            &self.shared.namespace,
            id,
            &self.shared.egress_proxy,
        );
        env.extend(crate::kube::egress::secret_env(&recorded));
        Ok(Some(model::EgressClaim { recorded, env }))
    }
}
