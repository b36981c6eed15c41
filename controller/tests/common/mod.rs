//! Shared by the sandbox_*, template_* and binary tests: a fresh namespace on the test
//! cluster, the CRDs applied, and the real `sandhub-controller` binary restricted to that
//! namespace (`--watch-namespace`), with metrics and probes on free loopback ports.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{Container, ContainerPort};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use sandhub_api::k8s::common::PodMetadata;
use sandhub_api::k8s::conditions::types;
use sandhub_api::k8s::{Sandbox, SandboxSpec};
use sandhub_testkit::{TestCluster, TestNamespace};

pub const WAIT: Duration = Duration::from_secs(60);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Env {
    pub cluster: TestCluster,
    pub ns: TestNamespace,
    pub controllers: Vec<Controller>,
}

pub struct Controller {
    pub child: Child,
    pub metrics_port: u16,
    pub health_port: u16,
    pub log: std::path::PathBuf,
}

impl Controller {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Env {
    /// `None` (after a message) when no cluster is configured outside CI.
    pub async fn start(prefix: &str) -> Option<Env> {
        let mut env = Env::bare(prefix).await?;
        env.spawn_controller(&["--leader-elect=false"]);
        Some(env)
    }

    /// Cluster, CRDs and namespace, but no controller yet.
    pub async fn bare(prefix: &str) -> Option<Env> {
        let cluster = TestCluster::from_env().await?;
        install_crds(&cluster.client())
            .await
            .expect("installing the CRDs");
        let ns = cluster
            .fresh_namespace(prefix)
            .await
            .expect("creating a namespace");
        Some(Env {
            cluster,
            ns,
            controllers: vec![],
        })
    }

    pub fn client(&self) -> Client {
        self.cluster.client()
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        self.ns.api()
    }

    /// Starts one more controller process for this namespace; returns its index.
    pub fn spawn_controller(&mut self, extra: &[&str]) -> usize {
        let metrics_port = free_port();
        let health_port = free_port();
        let idx = self.controllers.len();
        let log =
            std::env::temp_dir().join(format!("sandhub-controller-{}-{idx}.log", self.ns.name()));
        let file = std::fs::File::create(&log).expect("controller log");
        let child = Command::new(env!("CARGO_BIN_EXE_sandhub-controller"))
            .args([
                "--watch-namespace",
                self.ns.name(),
                "--controller-namespace",
                self.ns.name(),
            ])
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
            .arg(format!(
                "--health-probe-bind-address=127.0.0.1:{health_port}"
            ))
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig())
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawning sandhub-controller");
        self.controllers.push(Controller {
            child,
            metrics_port,
            health_port,
            log,
        });
        idx
    }

    pub fn kill_controller(&mut self, idx: usize) {
        let c = &mut self.controllers[idx];
        let _ = c.child.kill();
        let _ = c.child.wait();
    }

    pub async fn create_sandbox(&self, sb: Sandbox) -> Sandbox {
        self.api::<Sandbox>()
            .create(&PostParams::default(), &sb)
            .await
            .expect("creating the sandbox")
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

    pub async fn sandbox_until(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(&Sandbox) -> bool,
    ) -> Sandbox {
        match sandhub_testkit::wait::until(&self.api::<Sandbox>(), name, WAIT, what, cond).await {
            Ok(sb) => sb,
            Err(e) => panic!("{e:#}\ncontroller log:\n{}", self.logs()),
        }
    }

    pub async fn sandbox_ready(&self, name: &str) -> Sandbox {
        self.sandbox_until(name, "Ready", |sb| {
            ready(sb).is_some_and(|(s, _, _)| s == "True")
        })
        .await
    }

    pub async fn sandbox_reason(&self, name: &str, reason: &str) -> Sandbox {
        self.sandbox_until(name, reason, |sb| {
            ready(sb).is_some_and(|(_, r, _)| r == reason)
        })
        .await
    }

    pub fn logs(&self) -> String {
        self.controllers
            .iter()
            .map(|c| c.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for i in 0..self.controllers.len() {
            self.kill_controller(i);
        }
    }
}

/// `(status, reason, message)` of the Sandbox's Ready condition.
pub fn ready(sb: &Sandbox) -> Option<(String, String, String)> {
    condition(sb, types::READY)
}

pub fn condition(sb: &Sandbox, type_: &str) -> Option<(String, String, String)> {
    sb.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Sandbox running busybox, with container ports `ports`.
pub fn sandbox(name: &str, ports: &[i32]) -> Sandbox {
    let mut spec = SandboxSpec::default();
    spec.blueprint.pod_template.spec.containers = vec![Container {
        name: "main".into(),
        image: Some("busybox".into()),
        command: Some(vec!["sleep".into(), "infinity".into()]),
        ports: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|p| ContainerPort {
                    container_port: *p,
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    }];
    Sandbox::new(name, spec)
}

pub fn with_pod_metadata(
    mut sb: Sandbox,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Sandbox {
    sb.spec.blueprint.pod_template.metadata = Some(PodMetadata {
        labels: Some(map(labels)),
        annotations: Some(map(annotations)),
    });
    sb
}

/// The CRDs, applied and established (see `sandhub_testkit::crds`).
pub async fn install_crds(client: &Client) -> Result<()> {
    sandhub_testkit::crds::install_crds(client, "sandhub-tests").await
}

#[allow(unused_imports)] // not every test that includes this module polls
pub use sandhub_testkit::wait::eventually;
