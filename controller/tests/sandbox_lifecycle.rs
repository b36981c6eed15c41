//! The Sandbox controller against the real apiserver (fake node): Pod, Service, PVCs,
//! status, propagation, suspend/resume, expiry, failure, adoption, MultiplePods.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, Service, VolumeResourceRequirements,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use sandhub_api::k8s::common::{EmbeddedObjectMetadata, PersistentVolumeClaimTemplate};
use sandhub_api::k8s::conditions::types;
use sandhub_api::k8s::names::{self, name_hash};
use sandhub_api::k8s::Sandbox;
use serde_json::json;

/// The test cluster has no provisioner: a PersistentVolume pre-bound to `<ns>/<claim>` lets
/// the PVC bind and the Pod schedule. The caller deletes it (returned name) at the end.
async fn prebound_volume(env: &Env, claim: &str) -> String {
    let api = kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client());
    let name = format!("{}-{claim}", env.ns.name());
    let pv = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "sandhub-test",
            "hostPath": {"path": format!("/tmp/{name}")},
            "claimRef": {"namespace": env.ns.name(), "name": claim},
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &pv).await.unwrap();
    name
}

fn vct(name: &str) -> PersistentVolumeClaimTemplate {
    PersistentVolumeClaimTemplate {
        metadata: EmbeddedObjectMetadata {
            name: name.into(),
            labels: Some(map(&[("vol", name)])),
            annotations: None,
        },
        spec: PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("sandhub-test".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

#[tokio::test]
async fn sandbox_gets_a_ready_pod_a_headless_service_and_full_status() {
    let Some(env) = Env::start("sb-ready").await else {
        return;
    };
    let mut sb = with_pod_metadata(
        sandbox("web", &[8080, 9090]),
        &[("team", "a"), ("tier", "x"), ("agents.x-k8s.io/spoof", "1")],
        &[("note", "hi")],
    );
    sb.spec.blueprint.service = Some(true);
    env.create_sandbox(sb).await;

    let sb = env.sandbox_ready("web").await;
    let (_, reason, message) = ready(&sb).unwrap();
    assert_eq!(reason, "DependenciesReady");
    assert_eq!(message, "Pod is Ready; Service Exists");
    let st = sb.status.clone().unwrap();
    let ns = env.ns.name();
    assert_eq!(st.service, "web");
    assert_eq!(st.service_fqdn, format!("web.{ns}.svc.cluster.local"));
    assert_eq!(
        st.selector,
        format!("agents.x-k8s.io/sandbox-name-hash={}", name_hash("web"))
    );
    assert_eq!(st.node_name, "fake-node-0");
    assert!(st.pod_ips[0].starts_with("10.244."), "{:?}", st.pod_ips);
    assert_eq!(condition(&sb, types::POD_SCHEDULED).unwrap().0, "True");
    assert!(condition(&sb, types::FINISHED).is_none());
    assert!(
        !sb.annotations().contains_key(names::POD_NAME_ANNOTATION),
        "v1.0.0 no longer writes pod-name"
    );

    let pod = env.api::<Pod>().get("web").await.unwrap();
    let labels = pod.labels();
    assert_eq!(labels[names::SANDBOX_NAME_HASH], name_hash("web"));
    assert_eq!(labels["team"], "a");
    assert!(
        !labels.contains_key("agents.x-k8s.io/spoof"),
        "reserved prefix must not propagate"
    );
    assert_eq!(pod.annotations()[names::PROPAGATED_LABELS], "team,tier");
    assert_eq!(pod.annotations()[names::PROPAGATED_ANNOTATIONS], "note");
    assert_eq!(pod.owner_references()[0].uid, sb.uid().unwrap());

    let svc = env.api::<Service>().get("web").await.unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(
        spec.selector.unwrap()[names::SANDBOX_NAME_HASH],
        name_hash("web")
    );
    let ports: Vec<_> = spec
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port))
        .collect();
    assert_eq!(
        ports,
        vec![
            ("p-8080-tcp".to_string(), 8080),
            ("p-9090-tcp".to_string(), 9090)
        ]
    );

    // Template metadata edits reach the Pod; keys dropped from the template leave it, keys
    // someone else set stay.
    env.patch::<Pod>("web", json!({"metadata": {"labels": {"other": "keep"}}}))
        .await;
    env.patch::<Sandbox>(
        "web",
        json!({"spec": {"podTemplate": {"metadata": {"labels": {"team": "b", "tier": null}}}}}),
    )
    .await;
    let pod = eventually(WAIT, "label propagation", || async {
        let p = env.api::<Pod>().get("web").await.unwrap();
        (p.labels().get("team").map(String::as_str) == Some("b")
            && !p.labels().contains_key("tier"))
        .then_some(p)
    })
    .await;
    assert_eq!(pod.labels()["other"], "keep");
    assert_eq!(pod.annotations()[names::PROPAGATED_LABELS], "team");

    // service: false deletes the owned Service and clears the status fields.
    env.patch::<Sandbox>("web", json!({"spec": {"service": false}}))
        .await;
    let sb = env
        .sandbox_until("web", "no service", |sb| {
            sb.status.as_ref().is_some_and(|s| s.service.is_empty())
        })
        .await;
    assert!(sb.status.unwrap().service_fqdn.is_empty());
    eventually(WAIT, "service deleted", || async {
        env.api::<Service>()
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn suspend_deletes_the_pod_keeps_the_pvcs_and_never_reports_finished() {
    let Some(env) = Env::start("sb-suspend").await else {
        return;
    };
    let pv = prebound_volume(&env, "data-box").await;
    let mut sb = sandbox("box", &[]);
    sb.spec.blueprint.volume_claim_templates = Some(vec![vct("data")]);
    env.create_sandbox(sb).await;
    let sb = env.sandbox_ready("box").await;
    let pvc = env
        .api::<PersistentVolumeClaim>()
        .get("data-box")
        .await
        .unwrap();
    assert_eq!(pvc.owner_references()[0].uid, sb.uid().unwrap());
    assert_eq!(pvc.labels()["vol"], "data");
    assert_eq!(pvc.labels()[names::SANDBOX_NAME_HASH], name_hash("box"));
    let pod = env.api::<Pod>().get("box").await.unwrap();
    let vol = pod
        .spec
        .unwrap()
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "data")
        .unwrap();
    assert_eq!(vol.persistent_volume_claim.unwrap().claim_name, "data-box");

    env.patch::<Sandbox>("box", json!({"spec": {"operatingMode": "Suspended"}}))
        .await;
    // Every version the watch shows on the way is checked, not only the last one.
    let saw_finished = std::sync::atomic::AtomicBool::new(false);
    let sb = env
        .sandbox_until("box", "suspended", |sb| {
            if condition(sb, types::FINISHED).is_some() {
                saw_finished.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            condition(sb, types::SUSPENDED)
                .is_some_and(|(s, r, _)| s == "True" && r == "PodTerminated")
        })
        .await;
    assert!(
        !saw_finished.load(std::sync::atomic::Ordering::SeqCst),
        "Finished appeared during suspend"
    );
    assert!(
        condition(&sb, types::FINISHED).is_none(),
        "suspend must not report Finished (#2079)"
    );
    assert_eq!(
        ready(&sb).unwrap(),
        (
            "False".into(),
            "SandboxSuspended".into(),
            "Sandbox is suspended".into()
        )
    );
    let st = sb.status.clone().unwrap();
    assert!(st.pod_ips.is_empty() && st.node_name.is_empty());
    assert!(condition(&sb, types::POD_SCHEDULED).is_none());
    assert!(env.api::<Pod>().get_opt("box").await.unwrap().is_none());
    let pvc_after = env
        .api::<PersistentVolumeClaim>()
        .get("data-box")
        .await
        .unwrap();
    assert_eq!(pvc_after.uid(), pvc.uid(), "the PVC survives suspend");

    env.patch::<Sandbox>("box", json!({"spec": {"operatingMode": "Running"}}))
        .await;
    let sb = env.sandbox_ready("box").await;
    assert_eq!(condition(&sb, types::SUSPENDED).unwrap().1, "NotSuspended");
    assert_eq!(
        env.api::<PersistentVolumeClaim>()
            .get("data-box")
            .await
            .unwrap()
            .uid(),
        pvc.uid()
    );
    let pvs = kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client());
    let _ = pvs.delete(&pv, &DeleteParams::default()).await;
}

#[tokio::test]
async fn expiry_with_retain_keeps_the_sandbox_and_with_delete_removes_it() {
    let Some(env) = Env::start("sb-expiry").await else {
        return;
    };
    let soon =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(3);
    for (name, policy) in [("keep", "Retain"), ("drop", "Delete")] {
        let mut sb = sandbox(name, &[80]);
        sb.spec.blueprint.service = Some(true);
        env.create_sandbox(sb).await;
        env.sandbox_ready(name).await;
        env.patch::<Sandbox>(
            name,
            json!({"spec": {"shutdownTime": soon.to_string(), "shutdownPolicy": policy}}),
        )
        .await;
    }
    let sb = env.sandbox_reason("keep", "SandboxExpired").await;
    assert_eq!(ready(&sb).unwrap().2, "Sandbox has expired");
    let sb = env
        .sandbox_until("keep", "status reset", |sb| {
            sb.status
                .as_ref()
                .is_some_and(|s| s.conditions.len() == 1 && s.service.is_empty())
        })
        .await;
    assert!(sb.status.unwrap().pod_ips.is_empty());
    eventually(WAIT, "expired pod and service gone", || async {
        let pod = env.api::<Pod>().get_opt("keep").await.unwrap();
        let svc = env.api::<Service>().get_opt("keep").await.unwrap();
        (pod.is_none() && svc.is_none()).then_some(())
    })
    .await;
    eventually(WAIT, "Delete-policy sandbox gone", || async {
        env.api::<Sandbox>()
            .get_opt("drop")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(env
        .api::<Sandbox>()
        .get_opt("keep")
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_failed_pod_reports_pod_failed_and_finished() {
    let Some(env) = Env::start("sb-fail").await else {
        return;
    };
    let sb = with_pod_metadata(
        sandbox("oom", &[]),
        &[],
        &[("sandhub.dev/fake-node-fail", "OOMKilled")],
    );
    env.create_sandbox(sb).await;
    let sb = env.sandbox_reason("oom", "PodFailed").await;
    let fin = env
        .sandbox_until("oom", "Finished", |sb| {
            condition(sb, types::FINISHED).is_some()
        })
        .await;
    assert_eq!(
        condition(&fin, types::FINISHED).unwrap(),
        ("True".into(), "PodFailed".into(), String::new())
    );
    assert_eq!(ready(&sb).unwrap().0, "False");
}

#[tokio::test]
async fn unowned_pods_are_adopted_only_when_labelled() {
    let Some(env) = Env::start("sb-adopt").await else {
        return;
    };
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "pre"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))
    .unwrap();
    env.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    env.create_sandbox(sandbox("pre", &[])).await;
    let sb = env.sandbox_reason("pre", "ReconcilerError").await;
    let msg = ready(&sb).unwrap().2;
    assert!(
        msg.starts_with("Error seen: Pod pre exists") && msg.contains("adoptable=true"),
        "{msg}"
    );

    env.patch::<Pod>(
        "pre",
        json!({"metadata": {"labels": {names::ADOPTABLE: "true"}}}),
    )
    .await;
    let sb = env.sandbox_ready("pre").await;
    pod = env.api::<Pod>().get("pre").await.unwrap();
    assert_eq!(pod.owner_references()[0].uid, sb.uid().unwrap());
    assert_eq!(pod.labels()[names::SANDBOX_NAME_HASH], name_hash("pre"));
}

#[tokio::test]
async fn a_second_controlled_pod_is_reported_as_multiple_pods() {
    let Some(env) = Env::start("sb-multi").await else {
        return;
    };
    env.create_sandbox(sandbox("one", &[])).await;
    let sb = env.sandbox_ready("one").await;
    let extra: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "one-extra",
            "labels": {names::SANDBOX_NAME_HASH: name_hash("one")},
            "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "one",
                                 "uid": sb.uid().unwrap(), "controller": true}]
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))
    .unwrap();
    env.api::<Pod>()
        .create(&PostParams::default(), &extra)
        .await
        .unwrap();
    env.sandbox_reason("one", "MultiplePods").await;
    // Reconciled again and again in that state (each label change wakes
    // the controller): one Warning Event, as upstream words it, not one per pass.
    for i in 0..5 {
        let patch = json!({"metadata": {"labels": {"poke": i.to_string()}}});
        env.api::<Sandbox>()
            .patch("one", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let multiple: Vec<_> = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("MultiplePods"))
        .map(|e| {
            (
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.type_.unwrap_or_default(),
                e.action.unwrap_or_default(),
                e.reporting_controller.unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        multiple,
        [(
            "one".to_string(),
            "Warning".to_string(),
            "Reconciling".to_string(),
            "sandbox-controller".to_string()
        )]
    );
    env.api::<Pod>()
        .delete("one-extra", &DeleteParams::default())
        .await
        .unwrap();
    env.sandbox_ready("one").await;
    let _ = Duration::ZERO;
}
