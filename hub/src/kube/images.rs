//! The images side of the kubernetes backend: the nodes hold images, so
//! there is no store to list, import into or prune; pre-pull puts images
//! on the nodes ([`super::prepull`]).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{Image, PrepullRequest, PrepullResult, PruneResult},
};

use super::{
    prepull::{self, Options, Placement},
    tenant::KubeTenant,
    Shared,
};
use crate::backend::ImageService;

pub struct KubeImages {
    pub(super) shared: Arc<Shared>,
}

fn no_store(what: &str) -> ErrorBody {
    ErrorBody::new(
        Code::Unimplemented,
        format!(
            "{what} is not available on the kubernetes backend: the nodes' container runtimes \
             hold the images (pull them there with POST /v1/images/prepull)"
        ),
    )
}

#[async_trait]
impl ImageService for KubeImages {
    async fn list(&self, _tenant: &str) -> Result<Vec<Image>, ErrorBody> {
        Err(no_store("listing images"))
    }

    async fn import(
        &self,
        _tenant: &str,
        _input: Box<dyn std::io::Read + Send>,
        _tag: Option<String>,
        _pick: Option<String>,
    ) -> Result<Image, ErrorBody> {
        Err(no_store("importing images"))
    }

    async fn remove(&self, _tenant: &str, _reference: String) -> Result<Image, ErrorBody> {
        Err(no_store("removing images"))
    }

    async fn prune(&self, _tenant: &str) -> Result<PruneResult, ErrorBody> {
        Err(no_store("pruning images"))
    }

    async fn prepull(&self, tenant: &str, req: PrepullRequest) -> Result<PrepullResult, ErrorBody> {
        req.validate()?;
        // One pre-pull per tenant at a time: DaemonSets are a resource a
        // tenant could otherwise grow without bound.
        let running = Running::claim(&self.shared, tenant).ok_or_else(|| {
            ErrorBody::new(
                Code::ResourceExhausted,
                "a pre-pull of yours is still running; wait for its answer",
            )
        })?;
        let placement = match &req.template {
            None => Placement::default(),
            Some(name) => {
                // The caller's own template or the operator's, never another
                // tenant's (the same lookup pools use).
                let view = KubeTenant {
                    shared: self.shared.clone(),
                    tenant: tenant.to_string(),
                };
                let (t, _) = view
                    .find(&view.templates(), "template", name)
                    .await
                    .map_err(|e| e.body())?;
                Placement::of(&t.spec.blueprint.pod_template.spec)
            }
        };
        let defaults = Options::default();
        let options = Options {
            images_per_pod: req
                .images_per_pod
                .map_or(defaults.images_per_pod, |n| n as usize),
            max_parallel: req
                .max_parallel
                .map_or(defaults.max_parallel, |n| n as usize),
            delete_when_done: req.delete_when_done.unwrap_or(defaults.delete_when_done),
            timeout: req
                .timeout_seconds
                .map_or(defaults.timeout, Duration::from_secs),
        };
        let api: Api<DaemonSet> =
            Api::namespaced(self.shared.client.clone(), &self.shared.namespace);
        let with = self.shared.prepull_images.clone();
        let tenant = tenant.to_string();
        // Its own task: a caller that hangs up does not strand DaemonSets
        // half way (they are still waited for and deleted).
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let _running = running;
            prepull::run(
                api,
                &tenant,
                &req.references,
                &placement,
                &with,
                &options,
                &shared.prepull_slots,
            )
            .await
        })
        .await
        .map_err(|e| ErrorBody::new(Code::Internal, format!("pre-pull task: {e}")))
    }
}

/// A tenant's running pre-pull, released when dropped.
struct Running {
    shared: Arc<Shared>,
    tenant: String,
}

impl Running {
    fn claim(shared: &Arc<Shared>, tenant: &str) -> Option<Self> {
        shared
            .prepulls
            .lock()
            .unwrap()
            .insert(tenant.to_string())
            .then(|| Running {
                shared: shared.clone(),
                tenant: tenant.to_string(),
            })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shared.prepulls.lock().unwrap().remove(&self.tenant);
    }
}
