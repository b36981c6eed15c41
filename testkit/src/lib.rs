//! Test kit for the project's loopback Kubernetes test cluster (`dev/k8s/cluster.sh`).
//!
//! * [`TestCluster`]: a client for the cluster that `scripts/test.sh` started, found through
//!   `SANDHUB_TEST_KUBECONFIG` (missing: a failure under `CI=true`, a skip otherwise).
//! * [`TestNamespace`]: a fresh namespace per test, deleted when dropped.
//! * [`wait`]: bounded waits on object conditions, and polling.
//! * [`crds`]: the project's CRDs applied and established.
//! * [`fake_node`]: the `sandhub-fake-node` that plays kubelet for Pods bound to it.

pub mod cluster;
pub mod crds;
pub mod fake_node;
pub mod namespace;
pub mod wait;

pub use cluster::{TestCluster, KUBECONFIG_ENV};
pub use namespace::TestNamespace;
