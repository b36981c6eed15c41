//! One fresh namespace per test, so tests never see each other's objects.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::cluster::{client_from_kubeconfig, TestCluster};
use crate::wait;

/// Label on every namespace the kit creates, so leftovers are easy to find.
pub const TEST_NAMESPACE_LABEL: &str = "sandhub.dev/test-namespace";

/// A namespace created for one test. Dropping it deletes the namespace (without waiting);
/// [`TestNamespace::delete`] deletes it and waits until it is gone.
pub struct TestNamespace {
    name: String,
    client: Client,
    kubeconfig: std::path::PathBuf,
    deleted: bool,
}

impl TestNamespace {
    pub(crate) async fn create(cluster: &TestCluster, prefix: &str) -> Result<TestNamespace> {
        let name = unique_name(prefix);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let api: Api<Namespace> = Api::all(cluster.client());
        api.create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(TestNamespace {
            name,
            client: cluster.client(),
            kubeconfig: cluster.kubeconfig().to_path_buf(),
            deleted: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A typed API for namespaced objects of kind `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the namespace and waits (up to `timeout`) until the namespace controller has
    /// emptied and removed it.
    pub async fn delete(mut self, timeout: Duration) -> Result<()> {
        self.deleted = true;
        let api: Api<Namespace> = Api::all(self.client.clone());
        let uid = match api.get_opt(&self.name).await? {
            Some(ns) => ns.metadata.uid.unwrap_or_default(),
            None => return Ok(()),
        };
        api.delete(&self.name, &DeleteParams::background()).await?;
        wait::deleted(&api, &self.name, &uid, timeout).await
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        // The test's runtime may already be shutting down (and with it the client's
        // connection task), so delete from a short-lived runtime of our own.
        let name = self.name.clone();
        let kubeconfig = self.kubeconfig.clone();
        let deleter = std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let client = client_from_kubeconfig(&kubeconfig).await?;
                let api: Api<Namespace> = Api::all(client);
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(e.into()),
                }
            })
        });
        if let Ok(Err(e)) = deleter.join() {
            eprintln!("warning: deleting test namespace {}: {e:#}", self.name);
        }
    }
}

/// `<prefix>-<8 hex chars>`: unique across processes (pid, clock) and within one (counter).
fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    let mixed = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ u64::from(COUNTER.fetch_add(1, Ordering::Relaxed)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // Fold to 32 bits so every input bit reaches the suffix.
    let suffix = (mixed ^ (mixed >> 32)) as u32;
    let prefix: String = prefix.chars().take(40).collect();
    format!("{prefix}-{suffix:08x}")
}

#[cfg(test)]
mod tests {
    use super::unique_name;

    #[test]
    fn names_are_unique_and_valid_dns_labels() {
        let a = unique_name("gc");
        let b = unique_name("gc");
        assert_ne!(a, b);
        assert!(a.starts_with("gc-") && a.len() == "gc-".len() + 8, "{a}");
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    }
}
