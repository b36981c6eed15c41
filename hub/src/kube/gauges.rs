//! The kubernetes backend's pool and tenant gauges (`crate::gauges`): one
//! list of the namespace's SandboxWarmPools and one metadata list of the
//! hub's claims per scrape.
//!
//! The cluster records tenants only as digests (`sandhub.io/tenant`), so
//! the `tenant` label here is that digest, and an operator's pool (no
//! tenant label) is reported under `tenant=""`. Quotas are the local
//! backend's; none are reported here.

use std::collections::BTreeMap;

use kube::{api::ListParams, Api, ResourceExt};
use sandhub_api::k8s::{names, SandboxClaim, SandboxWarmPool};
use sandhub_client::Result;

use super::{model, owner::HUB_NAME_ANNOTATION, tenant::kube_error, KubeTenancy};
use crate::gauges::{Gauges, PoolGauge, TenantGauge};

impl KubeTenancy {
    pub(super) async fn pool_and_tenant_gauges(&self) -> Result<Gauges> {
        let ns = &self.shared.namespace;
        let pools: Api<SandboxWarmPool> = Api::namespaced(self.shared.client.clone(), ns);
        let pools = pools
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing pools", e))?
            .items
            .into_iter()
            .map(|p| {
                let tenant = p
                    .labels()
                    .get(model::TENANT_LABEL)
                    .cloned()
                    .unwrap_or_default();
                let status = p.status.clone().unwrap_or_default();
                let ready = status.ready_replicas.max(0) as u64;
                PoolGauge {
                    pool: p
                        .annotations()
                        .get(HUB_NAME_ANNOTATION)
                        .cloned()
                        .unwrap_or_else(|| p.name_any()),
                    tenant,
                    target: p.spec.replicas.max(0) as u64,
                    ready,
                    starting: (status.replicas.max(0) as u64).saturating_sub(ready),
                    failing: false,
                }
            })
            .collect();
        let selector = format!("{}={}", names::CREATED_BY, model::CREATED_BY_HUB);
        let claims: Api<SandboxClaim> = Api::namespaced(self.shared.client.clone(), ns);
        let mut tenants: BTreeMap<String, TenantGauge> = BTreeMap::new();
        for c in claims
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| kube_error("counting sandboxes", e))?
            .items
        {
            let Some(t) = c.labels().get(model::TENANT_LABEL) else {
                continue;
            };
            tenants
                .entry(t.clone())
                .or_insert_with(|| TenantGauge {
                    tenant: t.clone(),
                    ..Default::default()
                })
                .sandboxes += 1;
        }
        Ok(Gauges {
            pools,
            tenants: tenants.into_values().collect(),
        })
    }
}
