//! The volume files API on Kubernetes (`/v1/volumes/{name}/files/...`):
//! through a short-lived helper Pod that mounts the volume's claim at
//! `/workspace` and runs only sandboxd, which the hub then talks to as it
//! does to any sandbox's.
//!
//! - **Which Pod.** One per volume, named after its claim, so every
//!   replica finds the same one; made on the first call from the base
//!   template's Pod (its image, node selector and tolerations), with the
//!   claim in place of `/workspace` and nothing else of the base's
//!   volumes. A Pod that ended or is being deleted is replaced.
//! - **Bounded.** `activeDeadlineSeconds` ends it after
//!   [`HELPER_LIFETIME_SECONDS`] whatever the hub does (a replica that
//!   dies leaves nothing running for long); deleting the volume deletes it.
//! - **Trust.** Its sandboxd asks for that Pod's own token (the digest of
//!   `HMAC(key, namespace, pod)`, as the controller gives each Sandbox),
//!   so nothing else opens it. Files are resolved by sandboxd below its
//!   root: a link in the volume that leads out of it is refused there,
//!   and the Pod holds nothing but the volume anyway.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::{
    EnvVar, PersistentVolumeClaimVolumeSource, Pod, Volume, VolumeMount,
};
use kube::{
    api::{DeleteParams, ObjectMeta, PostParams},
    Api,
};
use sandhub_api::{error::Code, k8s::names};
use sandhub_client::{sandboxd::SandboxdClient, Error, Result};

use super::{kube_error, owner, template, KubeTenant, Target};
use crate::kube::model::{tenant_label_value, CREATED_BY_HUB, TENANT_LABEL};

/// Marks helper Pods, with the volume's hub name.
pub const VOLUME_FILES_LABEL: &str = "sandhub.io/volume-files";
/// How long a helper Pod may run at most.
pub const HELPER_LIFETIME_SECONDS: i64 = 600;
/// How long the first call waits for a new helper Pod to be Ready.
const READY_WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(250);
const VOLUME: &str = "sandhub-volume";

fn pod_name(claim: &str) -> String {
    format!("sandhub-volume-files-{claim}")
}

fn ready_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if pod.metadata.deletion_timestamp.is_some() || status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready.then(|| status.pod_ip.clone()).flatten()
}

fn ended(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

impl KubeTenant {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    /// A client for the sandboxd of the helper Pod of the caller's volume
    /// `name` (NOT_FOUND for a volume it does not have).
    pub(super) async fn helper_pod_sandboxd(&self, name: &str) -> Result<SandboxdClient> {
        sandhub_api::validate::name("volume", name)?;
        if self.volume_claim(name).await?.is_none() {
            return Err(Error::not_found(format!("volume {name:?}")));
        }
        let claim = owner::object_name(&self.tenant, name);
        let pod = pod_name(&claim);
        let deadline = tokio::time::Instant::now() + READY_WAIT;
        loop {
            let got = self
                .pods()
                .get_opt(&pod)
                .await
                .map_err(|e| kube_error("reading the volume's helper Pod", e))?;
            match got {
                Some(p) if owner::owner(&p.metadata, &self.tenant) != owner::Owner::Caller => {
                    return Err(Error::new(
                        Code::Conflict,
                        format!("the Pod name {pod} is taken by something else"),
                    ))
                }
                Some(p) => {
                    if let Some(ip) = ready_ip(&p) {
                        return self.shared.reach.client(&Target {
                            namespace: &self.shared.namespace,
                            sandbox: &pod,
                            pod_ip: Some(&ip),
                        });
                    }
                    if ended(&p) && p.metadata.deletion_timestamp.is_none() {
                        let _ = self.pods().delete(&pod, &DeleteParams::default()).await;
                    }
                }
                None => self.start_volume_pod(name, &claim, &pod).await?,
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "the helper Pod {pod} of volume {name:?} is not Ready after {}s",
                    READY_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn start_volume_pod(&self, name: &str, claim: &str, pod: &str) -> Result<()> {
        let mut spec = self.base_template().await?.blueprint.pod_template;
        let p = &mut spec.spec;
        let main = template::main_container(p)
            .ok_or_else(|| Error::internal("the base SandboxTemplate has no container"))?;
        // Only sandboxd, only the volume: no sidecar, init container or
        // volume of the base's comes along.
        let mut c = p.containers.swap_remove(main);
        p.containers = Vec::new();
        p.init_containers = None;
        c.volume_mounts = Some(vec![VolumeMount {
            name: VOLUME.into(),
            mount_path: "/workspace".into(),
            ..Default::default()
        }]);
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| e.name != sandhub_api::sandboxd_token::DIGEST_ENV);
        if let Some(keys) = &self.shared.proxy_tokens {
            env.push(EnvVar {
                name: sandhub_api::sandboxd_token::DIGEST_ENV.into(),
                value: Some(keys.digest(&self.shared.namespace, pod)),
                value_from: None,
            });
        }
        // An image template's base runs sandboxd copied in by an init
        // container; the helper runs the sandboxd image itself.
        c.image = Some(self.shared.prepull_images.sandboxd.clone());
        c.command = None;
        p.containers.push(c);
        p.volumes = Some(vec![Volume {
            name: VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.to_string(),
                read_only: Some(false),
            }),
            ..Default::default()
        }]);
        p.restart_policy = Some("Never".into());
        p.active_deadline_seconds = Some(HELPER_LIFETIME_SECONDS);
        p.automount_service_account_token = Some(false);
        let labels = BTreeMap::from([
            (TENANT_LABEL.to_string(), tenant_label_value(&self.tenant)),
            (names::CREATED_BY.to_string(), CREATED_BY_HUB.to_string()),
            (VOLUME_FILES_LABEL.to_string(), name.to_string()),
        ]);
        let object = Pod {
            metadata: ObjectMeta {
                name: Some(pod.to_string()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(spec.spec),
            status: None,
        };
        match self.pods().create(&PostParams::default(), &object).await {
            Ok(_) => {
                tracing::info!(tenant = %self.tenant, volume = name, pod, "started a volume's helper Pod");
                Ok(())
            }
            // Another call (or replica) made it first.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_error("starting the volume's helper Pod", e)),
        }
    }

    /// Deletes the helper Pod of the caller's volume `name`, if any.
    pub(super) async fn stop_volume_pod(&self, name: &str) {
        let pod = pod_name(&owner::object_name(&self.tenant, name));
        if let Err(e) = self.pods().delete(&pod, &DeleteParams::default()).await {
            if !matches!(&e, kube::Error::Api(s) if s.code == 404) {
                tracing::warn!(error = %e, pod, "deleting a volume's helper Pod");
            }
        }
    }
}
