//! Pre-pull on Kubernetes, as upstream agent-sandbox's RL example does it:
//! DaemonSets whose init containers each run one image, so every node a
//! template's Pods may land on pulls it before a sandbox needs it.
//!
//! - `images_per_pod` images per DaemonSet (one init container each, in
//!   order), at most `max_parallel` DaemonSets in flight;
//! - an image may have no shell, or no libc: a first init container copies
//!   the sandboxd image's static sandboxd into an emptyDir, and each image's
//!   init container runs `sandboxd --version` from there (the pull is the
//!   point; the run only proves the image starts);
//! - the main container is the pause image, so a Pod is Ready exactly when
//!   every image's init container has run on its node;
//! - a template's tolerations, node selector and runtime class are the
//!   DaemonSet's, so it reaches the nodes the template's Pods reach;
//! - each DaemonSet is the tenant's (labels as pools have, see owner.rs)
//!   and marked with [`PREPULL_LABEL`]; deleted when done if asked.
//!
//! The builders are pure functions; [`run`] talks to the cluster.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, DaemonSetSpec},
        core::v1::{
            Capabilities, Container, PodSpec, PodTemplateSpec, ResourceRequirements,
            SecurityContext, Toleration,
        },
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use kube::{
    api::{DeleteParams, PostParams},
    runtime::wait::await_condition,
    Api,
};
use sandhub_api::hub::{PrepullDaemonSet, PrepullImage, PrepullResult};

use super::{
    owner,
    template::{bin_mount, copy_sandboxd_init, empty_dir, BIN_DIR, BIN_VOLUME},
};

/// On every pre-pull DaemonSet and its Pods: the run it belongs to.
pub const PREPULL_LABEL: &str = "sandhub.io/prepull";
/// The DaemonSet's own name, its Pods' selector.
pub const PREPULL_SET_LABEL: &str = "sandhub.io/prepull-set";

/// What one pre-pull is asked to do, defaults applied.
#[derive(Debug, Clone)]
pub struct Options {
    pub images_per_pod: usize,
    pub max_parallel: usize,
    pub delete_when_done: bool,
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            images_per_pod: sandhub_api::hub::DEFAULT_PREPULL_IMAGES_PER_POD as usize,
            max_parallel: sandhub_api::hub::DEFAULT_PREPULL_PARALLEL as usize,
            delete_when_done: true,
            timeout: Duration::from_secs(sandhub_api::hub::DEFAULT_PREPULL_TIMEOUT_SECONDS),
        }
    }
}

/// Where a template's Pods may run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub tolerations: Option<Vec<Toleration>>,
    pub node_selector: Option<BTreeMap<String, String>>,
    pub runtime_class_name: Option<String>,
}

impl Placement {
    pub fn of(pod: &PodSpec) -> Self {
        Placement {
            tolerations: pod.tolerations.clone(),
            node_selector: pod.node_selector.clone(),
            runtime_class_name: pod.runtime_class_name.clone(),
        }
    }
}

/// The images of the pull, once each in the order given, `per_pod` to a
/// DaemonSet.
pub fn chunks(references: &[String], per_pod: usize) -> Vec<Vec<String>> {
    let mut seen = std::collections::BTreeSet::new();
    let unique: Vec<String> = references
        .iter()
        .filter(|r| seen.insert(r.as_str()))
        .cloned()
        .collect();
    unique
        .chunks(per_pod.max(1))
        .map(<[String]>::to_vec)
        .collect()
}

/// The images DaemonSets run with: the sandboxd image (for the static
/// binary every image's init container runs) and the main container's.
#[derive(Debug, Clone)]
pub struct Images {
    pub sandboxd: String,
    pub pause: String,
}

/// `tenant`'s DaemonSet `name` of run `run`, pulling `images`.
pub fn daemonset(
    tenant: &str,
    run: &str,
    name: &str,
    images: &[String],
    placement: &Placement,
    with: &Images,
) -> DaemonSet {
    let mut labels = owner::tenant_labels(tenant);
    labels.insert(PREPULL_LABEL.into(), run.into());
    labels.insert(PREPULL_SET_LABEL.into(), name.into());
    let small = |memory: &str| {
        Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), quantity("1m")),
                ("memory".into(), quantity("8Mi")),
            ])),
            limits: Some(BTreeMap::from([("memory".into(), quantity(memory))])),
            ..Default::default()
        })
    };
    let locked = Some(SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        // No runAsUser: images need not let any other user in (the
        // sandboxd and pause images dev/k8s builds keep `/` at 0700).
        ..Default::default()
    });
    let mut inits = vec![Container {
        resources: small("64Mi"),
        security_context: locked.clone(),
        ..copy_sandboxd_init(&with.sandboxd)
    }];
    inits.extend(images.iter().enumerate().map(|(i, image)| Container {
        name: format!("pull-{i}"),
        image: Some(image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec![format!("{BIN_DIR}/sandboxd"), "--version".into()]),
        args: Some(Vec::new()),
        volume_mounts: Some(vec![bin_mount(true)]),
        resources: small("64Mi"),
        security_context: locked.clone(),
        ..Default::default()
    }));
    let pod = PodSpec {
        init_containers: Some(inits),
        containers: vec![Container {
            name: "pause".into(),
            image: Some(with.pause.clone()),
            image_pull_policy: Some("IfNotPresent".into()),
            resources: small("32Mi"),
            security_context: locked,
            ..Default::default()
        }],
        volumes: Some(vec![empty_dir(BIN_VOLUME)]),
        tolerations: placement.tolerations.clone(),
        node_selector: placement.node_selector.clone(),
        runtime_class_name: placement.runtime_class_name.clone(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(1),
        ..Default::default()
    };
    let mut meta = owner::tenant_metadata(tenant, name);
    meta.name = Some(name.into());
    meta.labels = Some(labels.clone());
    DaemonSet {
        metadata: meta,
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(PREPULL_SET_LABEL.into(), name.into())])),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    }
}

fn quantity(s: &str) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
    k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.into())
}

/// Scheduled nodes and Ready ones, once the DaemonSet controller has seen
/// the current spec.
pub fn progress(ds: &DaemonSet) -> Option<(i32, i32)> {
    let status = ds.status.as_ref()?;
    let generation = ds.metadata.generation?;
    (status.observed_generation? >= generation)
        .then_some((status.desired_number_scheduled, status.number_ready))
}

/// Every scheduled node runs a Ready Pod of the current spec: each image
/// is pulled (and started) there.
pub fn completed(ds: &DaemonSet) -> bool {
    let Some((desired, ready)) = progress(ds) else {
        return false;
    };
    let updated = ds
        .status
        .as_ref()
        .and_then(|s| s.updated_number_scheduled)
        .unwrap_or(0);
    ready == desired && updated == desired
}

/// Runs the pre-pull of `references` for `tenant`: DaemonSets made, waited
/// for (at most `options.max_parallel` at a time) and deleted if asked.
/// `slots` bounds the DaemonSets in flight over every pre-pull of this hub.
pub async fn run(
    api: Api<DaemonSet>,
    tenant: &str,
    references: &[String],
    placement: &Placement,
    with: &Images,
    options: &Options,
    slots: &tokio::sync::Semaphore,
) -> PrepullResult {
    let run = crate::backend::new_id("prepull");
    let deadline = Instant::now() + options.timeout;
    let sets: Vec<(String, Vec<String>)> = chunks(references, options.images_per_pod)
        .into_iter()
        .enumerate()
        .map(|(i, images)| (format!("{run}-{i}"), images))
        .collect();
    let outcomes: Vec<PrepullDaemonSet> = futures::stream::iter(sets)
        .map(|(name, images)| {
            let ds = daemonset(tenant, &run, &name, &images, placement, with);
            one(&api, ds, images, deadline, options.delete_when_done, slots)
        })
        .buffered(options.max_parallel.max(1))
        .collect()
        .await;
    summarize(references, outcomes)
}

/// Per-image outcomes from the DaemonSets'.
pub fn summarize(references: &[String], daemonsets: Vec<PrepullDaemonSet>) -> PrepullResult {
    let by_image: BTreeMap<&str, &PrepullDaemonSet> = daemonsets
        .iter()
        .flat_map(|d| d.images.iter().map(move |i| (i.as_str(), d)))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let images: Vec<PrepullImage> = references
        .iter()
        .filter(|r| seen.insert(r.as_str()))
        .map(|r| match by_image.get(r.as_str()) {
            Some(d) => PrepullImage {
                reference: r.clone(),
                ok: d.completed && d.error.is_none(),
                daemonset: Some(d.name.clone()),
                error: d.error.clone(),
                id: None,
            },
            None => PrepullImage {
                reference: r.clone(),
                ok: false,
                daemonset: None,
                error: Some("no DaemonSet pulled it".into()),
                id: None,
            },
        })
        .collect();
    PrepullResult {
        ok: images.iter().all(|i| i.ok),
        images,
        daemonsets,
    }
}

async fn one(
    api: &Api<DaemonSet>,
    ds: DaemonSet,
    images: Vec<String>,
    deadline: Instant,
    delete_when_done: bool,
    slots: &tokio::sync::Semaphore,
) -> PrepullDaemonSet {
    let name = ds.metadata.name.clone().unwrap_or_default();
    let started = Instant::now();
    let mut out = PrepullDaemonSet {
        name: name.clone(),
        images,
        ..Default::default()
    };
    let _slot = match tokio::time::timeout_at(deadline.into(), slots.acquire()).await {
        Ok(Ok(permit)) => permit,
        _ => {
            out.error = Some(format!(
                "DaemonSet {name} was never started: the hub's other pre-pulls held every slot \
                 until the timeout"
            ));
            return out;
        }
    };
    if let Err(e) = api.create(&PostParams::default(), &ds).await {
        out.error = Some(format!("creating DaemonSet {name}: {e}"));
        out.seconds = started.elapsed().as_secs_f64();
        return out;
    }
    tracing::info!(daemonset = %name, images = out.images.len(), "pre-pull started");
    let wait = await_condition(api.clone(), &name, |d: Option<&DaemonSet>| {
        d.is_none_or(completed)
    });
    let last = match tokio::time::timeout_at(deadline.into(), wait).await {
        Ok(Ok(Some(d))) => Some(d),
        Ok(Ok(None)) => {
            out.error = Some(format!("DaemonSet {name} was deleted while pulling"));
            None
        }
        Ok(Err(e)) => {
            out.error = Some(format!("watching DaemonSet {name}: {e}"));
            api.get_opt(&name).await.ok().flatten()
        }
        Err(_) => {
            let d = api.get_opt(&name).await.ok().flatten();
            let (nodes, ready) = d.as_ref().and_then(progress).unwrap_or((0, 0));
            out.error = Some(format!(
                "DaemonSet {name}: {ready} of {nodes} nodes had pulled every image when the \
                 pre-pull timed out (an image that cannot be pulled keeps its Pod in Init)"
            ));
            d
        }
    };
    if let Some((nodes, ready)) = last.as_ref().and_then(progress) {
        out.nodes = nodes;
        out.ready = ready;
    }
    out.completed = out.error.is_none() && last.as_ref().is_some_and(completed);
    if out.completed && out.nodes == 0 {
        out.completed = false;
        out.error = Some(format!(
            "DaemonSet {name}: no node matches the placement (node selector, tolerations)"
        ));
    }
    out.seconds = started.elapsed().as_secs_f64();
    if delete_when_done {
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => out.deleted = true,
            Err(kube::Error::Api(s)) if s.code == 404 => out.deleted = true,
            Err(e) => {
                tracing::warn!(daemonset = %name, error = %e, "deleting a pre-pull DaemonSet")
            }
        }
    }
    tracing::info!(daemonset = %name, completed = out.completed, nodes = out.nodes,
        seconds = out.seconds, "pre-pull done");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::model::{tenant_label_value, TENANT_LABEL};

    fn refs(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("registry.example/img{i}:1"))
            .collect()
    }

    fn with() -> Images {
        Images {
            sandboxd: "sandhub/sandboxd:dev".into(),
            pause: "registry.k8s.io/pause:3.10".into(),
        }
    }

    #[test]
    fn references_are_chunked_by_images_per_pod_once_each() {
        let mut r = refs(60);
        r.push(r[0].clone());
        let c = chunks(&r, 25);
        assert_eq!(c.iter().map(Vec::len).collect::<Vec<_>>(), [25, 25, 10]);
        assert_eq!(c[0][0], r[0]);
        assert_eq!(c[2][9], r[59]);
        assert_eq!(chunks(&refs(2), 1).len(), 2);
        assert_eq!(chunks(&refs(3), 0).len(), 3, "0 reads as 1");
    }

    #[test]
    fn a_daemonset_runs_each_image_after_copying_sandboxd() {
        let images = refs(3);
        let ds = daemonset(
            "alice",
            "prepull-x",
            "prepull-x-0",
            &images,
            &Placement::default(),
            &with(),
        );
        let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let inits = pod.init_containers.as_ref().unwrap();
        assert_eq!(inits.len(), 4);
        assert_eq!(inits[0].image.as_deref(), Some("sandhub/sandboxd:dev"));
        for (c, image) in inits[1..].iter().zip(&images) {
            assert_eq!(c.image.as_ref(), Some(image));
            assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
            assert_eq!(
                c.command.as_ref().unwrap(),
                &["/.sandhub/sandboxd", "--version"]
            );
        }
        assert_eq!(
            pod.containers[0].image.as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(pod.automount_service_account_token, Some(false));
    }

    #[test]
    fn labels_mark_the_tenant_and_the_run_and_select_only_this_set() {
        let ds = daemonset(
            "alice",
            "prepull-x",
            "prepull-x-1",
            &refs(1),
            &Placement::default(),
            &with(),
        );
        let labels = ds.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[TENANT_LABEL], tenant_label_value("alice"));
        assert_eq!(labels[PREPULL_LABEL], "prepull-x");
        assert_eq!(labels[sandhub_api::k8s::names::CREATED_BY], "sandhub");
        assert_eq!(ds.metadata.name.as_deref(), Some("prepull-x-1"));
        assert_eq!(owner::owner(&ds.metadata, "alice"), owner::Owner::Caller);
        assert_eq!(owner::owner(&ds.metadata, "bob"), owner::Owner::Other);
        let spec = ds.spec.as_ref().unwrap();
        let selector = spec.selector.match_labels.as_ref().unwrap();
        assert_eq!(selector.len(), 1);
        assert_eq!(selector[PREPULL_SET_LABEL], "prepull-x-1");
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(pod_labels[PREPULL_SET_LABEL], "prepull-x-1");
    }

    #[test]
    fn the_templates_tolerations_selector_and_runtime_class_are_carried() {
        let template = PodSpec {
            tolerations: Some(vec![Toleration {
                key: Some("sandhub.dev/real-node".into()),
                operator: Some("Equal".into()),
                value: Some("true".into()),
                effect: Some("NoSchedule".into()),
                toleration_seconds: None,
            }]),
            node_selector: Some(BTreeMap::from([(
                "sandhub.dev/real-node".into(),
                "true".into(),
            )])),
            runtime_class_name: Some("gvisor".into()),
            ..Default::default()
        };
        let placement = Placement::of(&template);
        let ds = daemonset("a", "r", "r-0", &refs(1), &placement, &with());
        let pod = ds.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.tolerations, template.tolerations);
        assert_eq!(pod.node_selector, template.node_selector);
        assert_eq!(pod.runtime_class_name.as_deref(), Some("gvisor"));
    }

    #[test]
    fn completion_needs_the_current_generation_and_every_node_ready() {
        use k8s_openapi::api::apps::v1::DaemonSetStatus;
        let mut ds = daemonset("a", "r", "r-0", &refs(1), &Placement::default(), &with());
        assert!(!completed(&ds));
        ds.metadata.generation = Some(2);
        let status = |observed, desired, ready, updated| DaemonSetStatus {
            observed_generation: Some(observed),
            desired_number_scheduled: desired,
            number_ready: ready,
            updated_number_scheduled: Some(updated),
            ..Default::default()
        };
        ds.status = Some(status(1, 2, 2, 2));
        assert!(!completed(&ds), "an old generation's status");
        ds.status = Some(status(2, 2, 1, 2));
        assert!(!completed(&ds));
        ds.status = Some(status(2, 2, 2, 2));
        assert!(completed(&ds));
    }

    #[test]
    fn the_summary_says_per_image_which_set_pulled_it() {
        let r = refs(3);
        let sets = vec![
            PrepullDaemonSet {
                name: "s-0".into(),
                images: r[..2].to_vec(),
                nodes: 1,
                ready: 1,
                completed: true,
                deleted: true,
                ..Default::default()
            },
            PrepullDaemonSet {
                name: "s-1".into(),
                images: r[2..].to_vec(),
                error: Some("timed out".into()),
                ..Default::default()
            },
        ];
        let s = summarize(&r, sets);
        assert!(!s.ok);
        assert!(s.images[0].ok && s.images[1].ok && !s.images[2].ok);
        assert_eq!(s.images[2].daemonset.as_deref(), Some("s-1"));
        assert_eq!(s.images[2].error.as_deref(), Some("timed out"));
    }
}
