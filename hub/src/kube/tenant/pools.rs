//! A tenant's SandboxWarmPools: its own, sized within the operator's
//! quota, and the operator's, which it may claim from but never change.

use super::*;

impl KubeTenant {
    pub(super) fn pool_view(&self, p: &SandboxWarmPool) -> Pool {
        let mut v = model::pool_of(p);
        if let Some(name) = owner::hub_name(&p.metadata, &self.tenant) {
            v.name = name;
        }
        // The tenant's own templates by the name it gave them.
        v.template = owner::pool_hub_name(&self.tenant, &v.template);
        v
    }

    pub(super) async fn apply_pool(&self, name: &str, spec: PoolSpec) -> Result<Pool> {
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

        let want = owner::tenant_pool(&self.tenant, name, &template, spec.replicas);
        // Read back from the API server for a while, not the watch.
        self.shared.caches.wrote::<SandboxWarmPool>(&object);
        // The controller writes the pool's status as its Pods come and go,
        // which moves its resourceVersion between our read and our write; a
        // few fresh read-check-writes get past that, and a writer that keeps
        // changing it meanwhile gets 409.
        let mut attempt = 0;
        let written = loop {
            attempt += 1;
            let wrote = match pools.get_opt(&object).await.map_err(read)? {
                // The name is ours by construction; anything else there (a
                // 48-bit suffix collision, an operator's object) is left alone.
                Some(have) if owner::owner(&have.metadata, &self.tenant) != Owner::Caller => {
                    return Err(Error::new(
                        Code::Conflict,
                        format!("pool {name}: the cluster name {object} is taken"),
                    ))
                }
                // At the version read: no write lands on what was not checked.
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
                }
                None => pools.create(&PostParams::default(), &want).await,
            };
            if let Some(written) = settle_write(wrote, attempt, "pool", name)? {
                break written;
            }
        };
        Ok(self.pool_view(&written))
    }

    pub(super) async fn read_pool(&self, name: &str) -> Result<Pool> {
        let (p, _) = self.find(&self.pools(), "pool", name).await?;
        Ok(self.pool_view(&p))
    }

    /// The caller's pools and the operator's; the caller's own wins a name
    /// both have.
    pub(super) async fn pool_list(&self) -> Result<Vec<Pool>> {
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

    pub(super) async fn remove_pool(&self, name: &str) -> Result<()> {
        match self.find_fresh(&self.pools(), "pool", name).await? {
            (_, Owner::Operator) => Err(operator_pool(name)),
            (p, _) => {
                self.shared
                    .caches
                    .wrote::<SandboxWarmPool>(p.metadata.name.as_deref().unwrap_or_default());
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

fn operator_pool(name: &str) -> Error {
    Error::new(
        Code::PermissionDenied,
        format!(
            "pool {name} is the operator's: sandboxes can be claimed from it, but it is \
             changed only with kubectl or Helm"
        ),
    )
}
