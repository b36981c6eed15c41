//! The fake Node: registration, Ready status, Lease heartbeat.

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::status::now;
use super::FakeNodeConfig;

/// Field manager of every write the fake node makes.
pub const MANAGER: &str = "sandhub-fake-node";
/// Label on the fake node, so tests and tools can tell it from a real one.
pub const FAKE_NODE_LABEL: &str = "sandhub.dev/fake-node";
/// Taints the apiserver or the node lifecycle controller put on nodes that never reported;
/// the fake node reports Ready at once, so it drops them.
const NOT_READY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// Creates (or takes over) the Node, marks it Ready and renews its Lease once.
pub async fn register(client: &Client, config: &FakeNodeConfig) -> Result<()> {
    let name = &config.node_name;
    let nodes: Api<Node> = Api::all(client.clone());
    let cidr = config.pod_cidr.to_string();
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "fake",
                FAKE_NODE_LABEL: "true",
            },
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "unschedulable": config.unschedulable},
    });
    let applied = nodes
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&node),
        )
        .await
        .with_context(|| format!("registering node {name}"))?;

    let taints = applied
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if taints
        .iter()
        .any(|t| NOT_READY_TAINTS.contains(&t.key.as_str()))
    {
        let kept: Vec<_> = taints
            .into_iter()
            .filter(|t| !NOT_READY_TAINTS.contains(&t.key.as_str()))
            .collect();
        nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": kept}})),
            )
            .await
            .with_context(|| format!("removing the not-ready taint of node {name}"))?;
    }

    let resources =
        json!({"cpu": "64", "memory": "256Gi", "pods": "1000", "ephemeral-storage": "1Ti"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "architecture": "amd64", "operatingSystem": "linux", "osImage": "sandhub fake node",
            "kernelVersion": "", "containerRuntimeVersion": "fake://0", "kubeletVersion": "v0.0.0-fake",
            "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": "",
        },
        "conditions": conditions(),
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("reporting node {name} Ready"))?;
    renew_lease(client, config).await
}

/// Keeps the Lease and the Ready condition fresh, as a kubelet does.
pub async fn heartbeat(client: Client, config: FakeNodeConfig) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut tick = tokio::time::interval(config.heartbeat);
    tick.tick().await; // the first tick is immediate; register() just renewed everything
    loop {
        tick.tick().await;
        if let Err(e) = renew_lease(&client, &config).await {
            tracing::warn!("renewing lease: {e:#}");
        }
        let status = json!({"status": {"conditions": conditions()}});
        if let Err(e) = nodes
            .patch_status(
                &config.node_name,
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
        {
            tracing::warn!("node heartbeat: {e}");
        }
    }
}

fn conditions() -> serde_json::Value {
    let now = now();
    let c = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        c("Ready", "True", "KubeletReady"),
        c("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        c("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        c("PIDPressure", "False", "KubeletHasSufficientPID"),
    ])
}

async fn renew_lease(client: &Client, config: &FakeNodeConfig) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(config.node_name.clone()),
            namespace: Some("kube-node-lease".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.node_name.clone()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    let mut lease = serde_json::to_value(&lease)?;
    lease["apiVersion"] = json!("coordination.k8s.io/v1");
    lease["kind"] = json!("Lease");
    leases
        .patch(
            &config.node_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await
        .with_context(|| format!("renewing lease kube-node-lease/{}", config.node_name))?;
    Ok(())
}
