//! The controller-manager of the test cluster does its part: owner-reference garbage
//! collection and namespace deletion (which needs Pods on the fake node to be finished).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use sandhub_testkit::wait::{self, pod_is_ready};
use sandhub_testkit::TestCluster;
use serde_json::json;

#[tokio::test]
async fn garbage_collector_deletes_owned_children() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("gc").await.unwrap();
    let cms: Api<ConfigMap> = ns.api();
    let owner = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let child: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "child",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid().unwrap()}],
    }}))
    .unwrap();
    let child = cms.create(&PostParams::default(), &child).await.unwrap();
    let bystander = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "bystander"}})).unwrap(),
        )
        .await
        .unwrap();

    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    wait::deleted(
        &cms,
        "child",
        &child.uid().unwrap(),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let still = cms.get("bystander").await.unwrap();
    assert_eq!(
        still.uid(),
        bystander.uid(),
        "an unowned object is left alone"
    );
}

#[tokio::test]
async fn namespace_deletion_completes_with_running_pods() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("nsdel").await.unwrap();
    let name = ns.name().to_string();
    let pods: Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "runner"},
        "spec": {"containers": [{"name": "main", "image": "sandhub/never-pulled:1"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait::until(
        &pods,
        "runner",
        Duration::from_secs(30),
        "Ready",
        pod_is_ready,
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = ns.api();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "data"}})).unwrap(),
    )
    .await
    .unwrap();

    ns.delete(Duration::from_secs(60)).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    assert!(namespaces.get_opt(&name).await.unwrap().is_none());
}
