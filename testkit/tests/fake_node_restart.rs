//! The `sandhub-fake-node` binary as its own process: a second fake node registers, and after
//! a restart it keeps the addresses its Pods hold (it re-reads them) instead of reusing them.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use sandhub_testkit::wait::{self, pod_is_ready};
use sandhub_testkit::TestCluster;
use serde_json::json;
use tokio::process::{Child, Command};

fn start_node(cluster: &TestCluster, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sandhub-fake-node"))
        // Cordoned, so the scheduler never puts other tests' Pods there.
        .args([
            "--node-name",
            name,
            "--pod-cidr",
            "10.250.0.0/29",
            "--unschedulable",
        ])
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start sandhub-fake-node")
}

async fn ready_pod_ip(pods: &Api<Pod>, name: &str, node: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "sandhub/never-pulled:1"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = wait::until(pods, name, Duration::from_secs(30), "Ready", pod_is_ready)
        .await
        .unwrap();
    pod.status.unwrap().pod_ip.unwrap()
}

#[tokio::test]
async fn restarted_node_keeps_its_pods_addresses() {
    let Some(cluster) = TestCluster::from_env().await else {
        return;
    };
    let ns = cluster.fresh_namespace("fake-restart").await.unwrap();
    let node = format!("{}-node", ns.name());
    let pods: Api<Pod> = ns.api();

    let _cleanup = NodeCleanup {
        name: node.clone(),
        kubeconfig: cluster.kubeconfig().to_path_buf(),
    };
    let mut process = start_node(&cluster, &node);
    let first = ready_pod_ip(&pods, "a", &node).await;
    let second = ready_pod_ip(&pods, "b", &node).await;
    process.kill().await.unwrap();

    let mut process = start_node(&cluster, &node);
    let mut seen = HashSet::from([first.clone(), second.clone()]);
    assert_eq!(seen.len(), 2);
    // A /29 has five usable addresses: with the two held ones reserved, three new Pods
    // must get the other three.
    for name in ["c", "d", "e"] {
        let ip = ready_pod_ip(&pods, name, &node).await;
        assert!(
            seen.insert(ip.clone()),
            "{ip} handed out twice after the restart"
        );
    }
    let a = pods.get("a").await.unwrap();
    assert_eq!(
        a.status.unwrap().pod_ip,
        Some(first),
        "a Pod's address survives the restart"
    );

    // Finish the Pods while the node runs; the node itself goes with `_cleanup`.
    ns.delete(Duration::from_secs(60)).await.unwrap();
    process.kill().await.unwrap();
}

/// Deletes the extra Node when the test ends, passed or not, from a runtime of its own (the
/// test's may be gone by then).
struct NodeCleanup {
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        let (name, kubeconfig) = (self.name.clone(), self.kubeconfig.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let client = sandhub_testkit::cluster::client_from_kubeconfig(&kubeconfig).await?;
                let nodes: Api<Node> = Api::all(client);
                nodes.delete(&name, &DeleteParams::default()).await?;
                anyhow::Ok(())
            })
        })
        .join();
    }
}
