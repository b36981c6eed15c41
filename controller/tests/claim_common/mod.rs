//! Shared by the claim_* and warmpool_* tests: a fresh namespace on the test
//! cluster, the CRDs installed, and the real `sandhub-controller` binary
//! running with `--extensions`, restricted to that namespace.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Container;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use sandhub_api::k8s::claim::PodMetadata;
use sandhub_api::k8s::conditions::types;
use sandhub_api::k8s::warmpool::{UpdateStrategy, UpdateStrategyType};
use sandhub_api::k8s::{
    Sandbox, SandboxClaim, SandboxClaimSpec, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool,
    SandboxWarmPoolSpec,
};
use sandhub_testkit::{TestCluster, TestNamespace};

pub const WAIT: Duration = Duration::from_secs(90);

/// One test's world: cluster, namespace, controller process.
pub struct Env {
    pub cluster: TestCluster,
    pub ns: TestNamespace,
    pub controller: Option<Child>,
    pub extra_args: Vec<String>,
    /// Where the controller serves `/metrics` (the same across restarts).
    pub metrics_port: u16,
}

impl Env {
    /// `None` (after a message) when no cluster is configured outside CI.
    pub async fn start(prefix: &str, extra_args: &[&str]) -> Option<Env> {
        let cluster = TestCluster::from_env().await?;
        install_crds(&cluster.client())
            .await
            .expect("installing the CRDs");
        let ns = cluster
            .fresh_namespace(prefix)
            .await
            .expect("creating a namespace");
        let mut env = Env {
            cluster,
            ns,
            controller: None,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            metrics_port: std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port(),
        };
        env.start_controller();
        Some(env)
    }

    pub fn client(&self) -> Client {
        self.cluster.client()
    }

    /// The controller's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        eventually(WAIT, "the metrics endpoint answers", || async {
            reqwest::get(&url).await.ok()?.text().await.ok()
        })
        .await
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        self.ns.api()
    }

    pub fn start_controller(&mut self) {
        assert!(self.controller.is_none(), "controller already running");
        let log = std::env::temp_dir().join(format!("sandhub-controller-{}.log", self.ns.name()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("controller log");
        let child = Command::new(env!("CARGO_BIN_EXE_sandhub-controller"))
            .args([
                "--extensions",
                "--leader-elect=false",
                "--watch-namespace",
                self.ns.name(),
                "--metrics-bind-address",
                &format!("127.0.0.1:{}", self.metrics_port),
                "--health-probe-bind-address",
                "127.0.0.1:0",
            ])
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig())
            .args(&self.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning sandhub-controller");
        self.controller = Some(child);
    }

    /// SIGKILL, as a crash would: no graceful shutdown of any kind.
    pub fn kill_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn template(
        &self,
        name: &str,
        edit: impl FnOnce(&mut SandboxTemplateSpec),
    ) -> SandboxTemplate {
        let mut spec = SandboxTemplateSpec::default();
        spec.blueprint.pod_template.spec.containers = vec![Container {
            name: "main".into(),
            image: Some("busybox".into()),
            command: Some(vec!["sleep".into(), "infinity".into()]),
            ..Default::default()
        }];
        edit(&mut spec);
        let t = SandboxTemplate::new(name, spec);
        self.api::<SandboxTemplate>()
            .create(&PostParams::default(), &t)
            .await
            .expect("creating the template")
    }

    pub async fn pool(
        &self,
        name: &str,
        template: &str,
        replicas: i32,
        strategy: UpdateStrategyType,
    ) -> SandboxWarmPool {
        let p = SandboxWarmPool::new(
            name,
            SandboxWarmPoolSpec {
                replicas,
                sandbox_template_ref: sandhub_api::k8s::common::LocalRef {
                    name: template.into(),
                },
                update_strategy: Some(UpdateStrategy { type_: strategy }),
            },
        );
        self.api::<SandboxWarmPool>()
            .create(&PostParams::default(), &p)
            .await
            .expect("creating the pool")
    }

    pub fn claim_obj(&self, name: &str, pool: &str) -> SandboxClaim {
        let mut spec = SandboxClaimSpec::default();
        spec.warm_pool_ref.name = pool.into();
        SandboxClaim::new(name, spec)
    }

    pub async fn claim(&self, name: &str, pool: &str) -> SandboxClaim {
        self.create_claim(self.claim_obj(name, pool)).await
    }

    pub async fn create_claim(&self, c: SandboxClaim) -> SandboxClaim {
        self.api::<SandboxClaim>()
            .create(&PostParams::default(), &c)
            .await
            .expect("creating the claim")
    }

    /// Waits until the pool reports `n` ready members.
    pub async fn pool_ready(&self, name: &str, n: i32) -> SandboxWarmPool {
        sandhub_testkit::wait::until(
            &self.api::<SandboxWarmPool>(),
            name,
            WAIT,
            &format!("{n} ready"),
            |p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.ready_replicas == n && s.replicas == n)
            },
        )
        .await
        .unwrap()
    }

    pub async fn claim_ready(&self, name: &str) -> SandboxClaim {
        self.claim_until(name, "Ready with a Sandbox", ready_true)
            .await
    }

    /// Waits until the claim's Ready condition has `reason`.
    pub async fn claim_reason(&self, name: &str, reason: &str) -> SandboxClaim {
        self.claim_until(name, reason, |c| ready_reason(c).as_deref() == Some(reason))
            .await
    }

    pub async fn claim_until(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(&SandboxClaim) -> bool,
    ) -> SandboxClaim {
        sandhub_testkit::wait::until(&self.api::<SandboxClaim>(), name, WAIT, what, cond)
            .await
            .unwrap()
    }

    pub async fn sandboxes(&self) -> Vec<Sandbox> {
        self.api::<Sandbox>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    pub async fn patch<K>(&self, name: &str, patch: serde_json::Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        self.api::<K>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patching")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kill_controller();
    }
}

pub fn ready(c: &SandboxClaim) -> Option<(String, Option<String>)> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == types::READY)
        .map(|x| (x.status.clone(), Some(x.reason.clone())))
}

pub fn ready_true(c: &SandboxClaim) -> bool {
    ready(c).is_some_and(|(s, _)| s == "True")
        && c.status
            .as_ref()
            .and_then(|s| s.sandbox.as_ref())
            .is_some_and(|s| !s.name.is_empty())
}

pub fn ready_reason(c: &SandboxClaim) -> Option<String> {
    ready(c).and_then(|(_, r)| r)
}

pub fn sandbox_ready(sb: &Sandbox) -> bool {
    sb.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == types::READY && c.status == "True")
    })
}

/// Sandboxes whose controller is the claim with `uid`.
pub fn owned_by_claim<'a>(sandboxes: &'a [Sandbox], uid: &str) -> Vec<&'a Sandbox> {
    sandboxes
        .iter()
        .filter(|sb| {
            sb.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.kind == "SandboxClaim" && o.uid == uid)
        })
        .collect()
}

pub fn pod_metadata(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> PodMetadata {
    let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    PodMetadata {
        labels: Some(m(labels)),
        annotations: Some(m(annotations)),
    }
}

/// The CRDs, applied and established (see `sandhub_testkit::crds`).
pub async fn install_crds(client: &Client) -> Result<()> {
    sandhub_testkit::crds::install_crds(client, "sandhub-tests").await
}

#[allow(unused_imports)] // not every test that includes this module polls
pub use sandhub_testkit::wait::eventually;
