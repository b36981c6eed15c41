//! The fake node against the real test cluster (apiserver, scheduler, controller-manager):
//! Pods are scheduled onto it, become Ready with unique IPs, their deletions finish, and each
//! requested failure shows up as a kubelet would report it.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use sandhub_testkit::fake_node::FAIL_ANNOTATION;
use sandhub_testkit::wait::{self, pod_condition, pod_is_ready};
use sandhub_testkit::TestCluster;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn pod(name: &str, fail: Option<&str>) -> Pod {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "sandhub/never-pulled:1"}],
            "initContainers": [{"name": "init", "image": "sandhub/never-pulled:1"}],
        },
    });
    if let Some(mode) = fail {
        p["metadata"]["annotations"] = json!({ FAIL_ANNOTATION: mode });
    }
    serde_json::from_value(p).unwrap()
}

async fn create(api: &Api<Pod>, pod: &Pod) -> Pod {
    api.create(&PostParams::default(), pod)
        .await
        .expect("create pod")
}

#[tokio::test]
async fn node_is_ready_untainted_with_capacity_and_a_lease() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let nodes: Api<Node> = Api::all(cluster.client());
    let node = nodes.get("fake-node-0").await.unwrap();
    let spec = node.spec.as_ref().unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.0.0/16"));
    assert!(
        spec.taints.as_ref().is_none_or(|t| t.is_empty()),
        "{:?}",
        spec.taints
    );
    let status = node.status.as_ref().unwrap();
    let ready = status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(capacity["cpu"].0, "64");
    assert_eq!(capacity["memory"].0, "256Gi");
    assert_eq!(
        capacity["pods"].0, "1k",
        "1000, as the apiserver canonicalises it"
    );
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-node-lease");
    let lease = leases.get("fake-node-0").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("fake-node-0")
    );
}

#[tokio::test]
async fn scheduled_pods_become_ready_with_unique_ips() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("fake-ready").await.unwrap();
    let api: Api<Pod> = ns.api();
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    for n in &names {
        create(&api, &pod(n, None)).await;
    }
    let mut ips = HashSet::new();
    for n in &names {
        let p = wait::until(&api, n, WAIT, "Ready", pod_is_ready)
            .await
            .unwrap();
        let spec = p.spec.as_ref().unwrap();
        let node = spec.node_name.as_deref().unwrap_or_default();
        assert!(
            node.starts_with("fake-node-"),
            "bound by the scheduler: {node:?}"
        );
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
        let ip: Ipv4Addr = status.pod_ip.as_deref().unwrap().parse().unwrap();
        // fake-node-N hands out 10.(244+N).0.0/16 (FAKE_NODES in dev/k8s/cluster.sh)
        assert!(
            ip.octets()[0] == 10 && ip.octets()[1] >= 244,
            "{ip} is from a fake node's CIDR"
        );
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, ip.to_string());
        for cond in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert_eq!(
                pod_condition(&p, cond).map(|c| c.0).as_deref(),
                Some("True"),
                "{cond}"
            );
        }
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        assert!(cs.ready && cs.started == Some(true));
        assert!(cs.state.as_ref().unwrap().running.is_some());
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        let done = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (done.exit_code, done.reason.as_deref()),
            (0, Some("Completed"))
        );
        assert!(ips.insert(ip), "{ip} handed out twice");
    }
}

#[tokio::test]
async fn deleting_a_running_pod_finishes() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("fake-delete").await.unwrap();
    let api: Api<Pod> = ns.api();
    create(&api, &pod("doomed", None)).await;
    let p = wait::until(&api, "doomed", WAIT, "Ready", pod_is_ready)
        .await
        .unwrap();
    // Default grace period (30 s): the apiserver only marks the Pod; the node must finish it.
    api.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    wait::deleted(&api, "doomed", &p.uid().unwrap(), Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test]
async fn image_pull_back_off_keeps_the_pod_pending() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("fake-ipbo").await.unwrap();
    let api: Api<Pod> = ns.api();
    create(&api, &pod("nopull", Some("ImagePullBackOff"))).await;
    let waiting_reason = |p: &Pod| {
        p.status.as_ref()?.container_statuses.as_ref()?[0]
            .state
            .as_ref()?
            .waiting
            .as_ref()?
            .reason
            .clone()
    };
    let p = wait::until(&api, "nopull", WAIT, "ImagePullBackOff", |p| {
        waiting_reason(p).as_deref() == Some("ImagePullBackOff")
    })
    .await
    .unwrap();
    let status = p.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert!(!status.container_statuses.as_ref().unwrap()[0].ready);
    assert_eq!(pod_condition(&p, "Ready").unwrap().0, "False");
    assert_eq!(pod_condition(&p, "PodScheduled").unwrap().0, "True");
}

#[tokio::test]
async fn oom_killed_fails_the_pod() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("fake-oom").await.unwrap();
    let api: Api<Pod> = ns.api();
    create(&api, &pod("hog", Some("OOMKilled"))).await;
    let p = wait::until(&api, "hog", WAIT, "Failed", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
    })
    .await
    .unwrap();
    let cs = &p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let t = cs.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("OOMKilled")));
    assert!(!cs.ready);
    assert_eq!(pod_condition(&p, "Ready").unwrap().0, "False");
}

/// Unschedulable comes from the real scheduler: the Pod's nodeSelector matches no node.
#[tokio::test]
async fn unschedulable_pod_is_reported_by_the_scheduler() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("fake-unsched").await.unwrap();
    let api: Api<Pod> = ns.api();
    let mut p = pod("homeless", Some("Unschedulable"));
    p.spec.as_mut().unwrap().node_selector =
        Some([("sandhub.dev/no-such-node".to_string(), "true".to_string())].into());
    create(&api, &p).await;
    let p = wait::until(&api, "homeless", WAIT, "Unschedulable", |p| {
        pod_condition(p, "PodScheduled")
            == Some(("False".to_string(), Some("Unschedulable".to_string())))
    })
    .await
    .unwrap();
    assert_eq!(p.spec.as_ref().unwrap().node_name, None);
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
}
