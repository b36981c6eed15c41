//! The real node (`dev/k8s/cluster.sh up-real-node`): kubelet + containerd + runc run our
//! locally built image `sandhub/sandboxd:dev` (static sandboxd + busybox), and sandboxd in
//! the Pod answers on the pod IP. Runs when SANDHUB_TEST_REAL_NODE=1; under CI=true it must.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{LogParams, PostParams};
use kube::Api;
use sandhub_testkit::cluster::is_ci;
use sandhub_testkit::wait::{self, pod_is_ready};
use sandhub_testkit::TestCluster;
use serde_json::{json, Value};

fn real_node_wanted() -> bool {
    if std::env::var("SANDHUB_TEST_REAL_NODE").as_deref() == Ok("1") {
        return true;
    }
    assert!(
        !is_ci(),
        "CI=true but SANDHUB_TEST_REAL_NODE is not 1: start the cluster with \
         `dev/k8s/cluster.sh up-real-node DIR` and export SANDHUB_TEST_REAL_NODE=1"
    );
    eprintln!("skipping: SANDHUB_TEST_REAL_NODE is not 1 (dev/k8s/cluster.sh up-real-node DIR)");
    false
}

#[tokio::test]
async fn sandboxd_image_runs_on_the_real_node() {
    if !real_node_wanted() {
        return;
    }
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("real-node").await.unwrap();
    let pods: Api<Pod> = ns.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sandboxd"},
        "spec": {
            "nodeSelector": {"sandhub.dev/real-node": "true"},
            "tolerations": [{"key": "sandhub.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "sandboxd",
                "image": "sandhub/sandboxd:dev",
                "imagePullPolicy": "IfNotPresent",
                "args": ["--listen-host", "0.0.0.0"],
                "readinessProbe": {"httpGet": {"path": "/v1/health", "port": 8080}, "periodSeconds": 1},
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = wait::until(
        &pods,
        "sandboxd",
        Duration::from_secs(60),
        "Ready",
        pod_is_ready,
    )
    .await
    .unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("localhost")
    );
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .unwrap();
    let health = http
        .get(format!("http://{ip}:8080/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200, "sandboxd health on the pod IP");

    // A command through sandboxd's legacy API (argv split like a shell, no shell: hence sh -c)
    // runs inside the Pod: its hostname is the Pod's, busybox provides sh.
    let out: Value = http
        .post(format!("http://{ip}:8888/execute"))
        .json(&json!({"command": "sh -c 'echo \"hello from $(hostname)\"; ls /usr/local/bin'"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(out["exit_code"], 0, "{out}");
    let stdout = out["stdout"].as_str().unwrap();
    assert!(stdout.contains("hello from sandboxd"), "{out}");
    assert!(stdout.contains("sandboxd"), "{out}");

    // Logs travel apiserver -> kubelet on loopback (--hostname-override=localhost).
    pods.logs("sandboxd", &LogParams::default())
        .await
        .expect("pod logs through the apiserver");

    ns.delete(Duration::from_secs(60)).await.unwrap();
}
