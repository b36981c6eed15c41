//! Finding the test cluster and connecting to it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

use crate::namespace::TestNamespace;

/// Path of the kubeconfig written by `dev/k8s/cluster.sh up DIR` (`DIR/kubeconfig`).
pub const KUBECONFIG_ENV: &str = "SANDHUB_TEST_KUBECONFIG";

/// The running test cluster.
#[derive(Clone)]
pub struct TestCluster {
    kubeconfig: PathBuf,
    client: Client,
}

impl TestCluster {
    /// The cluster named by `SANDHUB_TEST_KUBECONFIG`, or `None` (with a message on stderr)
    /// when it is unset outside CI. Under `CI=true` a missing cluster panics: CI never skips.
    pub async fn from_env() -> Option<TestCluster> {
        match std::env::var_os(KUBECONFIG_ENV) {
            Some(path) if !path.is_empty() => Some(
                Self::connect(Path::new(&path))
                    .await
                    .unwrap_or_else(|e| panic!("{KUBECONFIG_ENV}={path:?}: {e:#}")),
            ),
            _ if is_ci() => panic!(
                "{KUBECONFIG_ENV} is not set and CI=true: start the test cluster \
                 (bash dev/k8s/cluster.sh up DIR) and export {KUBECONFIG_ENV}=DIR/kubeconfig"
            ),
            _ => {
                eprintln!(
                    "skipping: {KUBECONFIG_ENV} is not set (bash dev/k8s/cluster.sh up DIR starts a cluster)"
                );
                None
            }
        }
    }

    /// Connects with the kubeconfig at `path` and checks that the apiserver answers.
    pub async fn connect(path: &Path) -> Result<TestCluster> {
        let client = client_from_kubeconfig(path).await?;
        client
            .apiserver_version()
            .await
            .with_context(|| format!("apiserver of {} does not answer", path.display()))?;
        Ok(TestCluster {
            kubeconfig: path.to_path_buf(),
            client,
        })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A new namespace named `<prefix>-<unique suffix>`, deleted when the returned value drops.
    pub async fn fresh_namespace(&self, prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create(self, prefix).await
    }
}

/// Whether the run is CI, where a test that needs a missing service must fail.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A client for the current context of the kubeconfig file at `path`.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    if !path.is_file() {
        bail!("kubeconfig {} does not exist", path.display());
    }
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", path.display()))?;
    Client::try_from(config).context("building the Kubernetes client")
}
