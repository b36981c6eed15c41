//! `sandhub-fake-node`: a fake kubelet for the test cluster (see `sandhub_testkit::fake_node`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use sandhub_testkit::cluster::client_from_kubeconfig;
use sandhub_testkit::fake_node::{self, FakeNodeConfig, PodCidr};

/// Registers a Ready Node and takes the Pods bound to it to Running/Ready with a pod IP,
/// finishes their deletions, and fails Pods annotated `sandhub.dev/fake-node-fail`
/// (ImagePullBackOff | OOMKilled | Unschedulable).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Kubeconfig of the cluster (default: kube's usual lookup, $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "SANDHUB_FAKE_NODE_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Name of the Node to register.
    #[arg(long, env = "SANDHUB_FAKE_NODE_NAME", default_value = "fake-node-0")]
    node_name: String,
    /// Pod IPs are handed out from this IPv4 CIDR.
    #[arg(
        long,
        env = "SANDHUB_FAKE_NODE_POD_CIDR",
        default_value = "10.244.0.0/16"
    )]
    pod_cidr: PodCidr,
    /// Pod status writes and deletions in flight at once.
    #[arg(long, env = "SANDHUB_FAKE_NODE_CONCURRENCY", default_value_t = 64)]
    concurrency: usize,
    /// Register the node cordoned: the scheduler never picks it, only Pods that name it in
    /// spec.nodeName run there.
    #[arg(long, env = "SANDHUB_FAKE_NODE_UNSCHEDULABLE")]
    unschedulable: bool,
    /// Seconds between Lease and Ready-condition renewals.
    #[arg(
        long,
        env = "SANDHUB_FAKE_NODE_HEARTBEAT_SECONDS",
        default_value_t = 10
    )]
    heartbeat_seconds: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    sandhub_common::Logging::new("text")
        .ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let client = match &args.kubeconfig {
        Some(path) => client_from_kubeconfig(path).await?,
        None => kube::Client::try_default()
            .await
            .context("no --kubeconfig and no default kube config")?,
    };
    let config = FakeNodeConfig {
        node_name: args.node_name,
        pod_cidr: args.pod_cidr,
        concurrency: args.concurrency,
        heartbeat: Duration::from_secs(args.heartbeat_seconds.max(1)),
        unschedulable: args.unschedulable,
    };
    tokio::select! {
        r = fake_node::run(client, config) => r,
        r = sandhub_common::terminated() => r.map(drop).context("SIGTERM/SIGINT handler"),
    }
}
