//! A fake kubelet: registers a Ready Node and plays the kubelet's part for the Pods bound
//! to it, fast enough for the controller's claim-burst benchmark.
//!
//! * [`node`]: the Node object, its status heartbeat and its Lease.
//! * [`pods`]: the watch on bound Pods and the status/deletion writes.
//! * [`status`]: what each Pod's status should be (Running/Ready, or a requested failure).
//! * [`ipam`]: unique pod IPs from the pod CIDR.

pub mod ipam;
pub mod node;
pub mod pods;
pub mod status;

use std::time::Duration;

use anyhow::Result;
use kube::Client;

pub use ipam::{Ipam, PodCidr};
pub use status::{FailMode, FAIL_ANNOTATION};

/// What the fake node is told at start.
#[derive(Clone, Debug)]
pub struct FakeNodeConfig {
    pub node_name: String,
    pub pod_cidr: PodCidr,
    /// Status writes and deletions in flight at once.
    pub concurrency: usize,
    /// How often the Lease and the Ready condition are renewed.
    pub heartbeat: Duration,
    /// Registered cordoned: the scheduler never picks it; only Pods naming it run there.
    pub unschedulable: bool,
}

/// Registers the node, then runs the heartbeat and the Pod loop until one fails.
pub async fn run(client: Client, config: FakeNodeConfig) -> Result<()> {
    node::register(&client, &config).await?;
    tracing::info!(node = %config.node_name, cidr = %config.pod_cidr, "node registered Ready");
    tokio::select! {
        r = node::heartbeat(client.clone(), config.clone()) => r,
        r = pods::run(client, config) => r,
    }
}
