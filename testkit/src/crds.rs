//! The project's CRDs on the test cluster.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// Applies (server-side, as `field_manager`) the CRDs generated from the
/// `sandhub-api` types and waits until the API server serves them.
/// Idempotent: every test may call it.
pub async fn install_crds(client: &Client, field_manager: &str) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(field_manager).force();
    for crd in sandhub_api::k8s::all_crds() {
        let name = crd.name_any();
        crds.patch(&name, &pp, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut all = true;
        for crd in sandhub_api::k8s::all_crds() {
            let got = crds.get(&crd.name_any()).await?;
            all &= got
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
        }
        if all {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRDs not established after 30s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
