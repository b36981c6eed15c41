//! The kubernetes backend: each hub sandbox is a SandboxClaim that
//! `sandhub-controller` serves from a SandboxWarmPool, and processes and
//! files go to the Pod's sandboxd. The cluster holds all the state (the
//! tenant and MCP session are labels on the claim), so a restarted hub
//! finds every sandbox again and keeps nothing of its own.

mod model;
mod reach;
mod tenant;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use async_trait::async_trait;
use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::Secret;
use kube::{api::ListParams, Api};
use sandhub_api::{k8s::SandboxClaim, scoped_token::ScopedTokens};
use sandhub_client::{sandboxd::SandboxdClient, Result};

pub use self::{
    model::{TEMPLATE_ANNOTATION, TENANT_LABEL},
    reach::SANDBOXD_TOKEN_HEADER,
};
use self::{reach::Reach, tenant::KubeTenant};
use crate::tenancy::{Tenancy, TenantView};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Connect {
    /// To the Pod IP (the hub runs where Pod IPs route).
    Direct,
    /// Through sandhub-router (the hub runs outside the cluster).
    Router,
}

#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig to use; default: in-cluster config, else $KUBECONFIG or ~/.kube/config.
    #[arg(long, env = "SANDHUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the claims, pools and templates.
    #[arg(long, env = "SANDHUB_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// How the hub reaches each Pod's sandboxd.
    #[arg(long, env = "SANDHUB_CONNECT", value_enum, default_value_t = Connect::Direct)]
    pub connect: Connect,

    /// sandhub-router's URL (with --connect router), e.g. http://127.0.0.1:8080.
    #[arg(long, env = "SANDHUB_ROUTER_URL")]
    pub router_url: Option<String>,

    /// The router's --authz-scoped-token-secret-file: the hub mints one token per sandbox.
    #[arg(long, env = "SANDHUB_ROUTER_SCOPED_TOKEN_SECRET_FILE")]
    pub router_scoped_token_secret_file: Option<PathBuf>,

    /// Secret (in --namespace) whose `token` key the pools' sandboxd require
    /// (`sandboxd --auth-token-file`).
    #[arg(long, env = "SANDHUB_SANDBOXD_TOKEN_SECRET")]
    pub sandboxd_token_secret: Option<String>,

    /// How long `create` and `resume` wait for a claim to become Ready.
    #[arg(long, env = "SANDHUB_READY_TIMEOUT", default_value = "180s", value_parser = humantime::parse_duration)]
    pub ready_timeout: Duration,
}

/// A cached sandboxd client is rebuilt after this long (router tokens
/// expire; Pods move).
const CLIENT_TTL: Duration = Duration::from_secs(600);

pub(crate) struct Shared {
    client: kube::Client,
    namespace: String,
    reach: Reach,
    ready_timeout: Duration,
    clients: Mutex<HashMap<String, (Instant, SandboxdClient)>>,
}

impl Shared {
    fn cached_client(&self, key: &str) -> Option<SandboxdClient> {
        let clients = self.clients.lock().unwrap();
        clients
            .get(key)
            .filter(|(at, _)| at.elapsed() < CLIENT_TTL)
            .map(|(_, c)| c.clone())
    }

    fn cache_client(&self, key: String, client: SandboxdClient) {
        let mut clients = self.clients.lock().unwrap();
        clients.retain(|_, (at, _)| at.elapsed() < CLIENT_TTL);
        clients.insert(key, (Instant::now(), client));
    }

    fn forget_clients(&self, id: &str) {
        let prefix = format!("{id}/");
        self.clients
            .lock()
            .unwrap()
            .retain(|k, _| !k.starts_with(&prefix));
    }
}

pub struct KubeTenancy {
    shared: Arc<Shared>,
}

impl KubeTenancy {
    pub async fn connect(args: &KubeArgs) -> anyhow::Result<Self> {
        let config = match &args.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
            }
            None => kube::Config::infer()
                .await
                .context("finding a kube config")?,
        };
        let client = kube::Client::try_from(config)?;
        let sandboxd_token = match &args.sandboxd_token_secret {
            Some(name) => Some(read_token(&client, &args.namespace, name).await?),
            None => None,
        };
        let reach = match args.connect {
            Connect::Direct => Reach::Direct { sandboxd_token },
            Connect::Router => Reach::Router {
                url: args
                    .router_url
                    .clone()
                    .context("--connect router needs --router-url")?,
                tokens: match &args.router_scoped_token_secret_file {
                    Some(path) => Some(
                        ScopedTokens::new(
                            std::fs::read(path)
                                .with_context(|| format!("reading {}", path.display()))?,
                        )
                        .map_err(anyhow::Error::msg)?,
                    ),
                    None => None,
                },
                sandboxd_token,
            },
        };
        Ok(KubeTenancy {
            shared: Arc::new(Shared {
                client,
                namespace: args.namespace.clone(),
                reach,
                ready_timeout: args.ready_timeout,
                clients: Mutex::default(),
            }),
        })
    }
}

async fn read_token(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("reading Secret {namespace}/{name}"))?;
    let bytes = secret
        .data
        .and_then(|mut d| d.remove("token"))
        .with_context(|| format!("Secret {namespace}/{name} has no `token` key"))?;
    let token = String::from_utf8(bytes.0)
        .with_context(|| format!("Secret {namespace}/{name}: `token` is not UTF-8"))?;
    Ok(token.trim().to_string())
}

#[async_trait]
impl Tenancy for KubeTenancy {
    fn tenant(&self, tenant: &str) -> Arc<dyn TenantView> {
        Arc::new(KubeTenant {
            shared: self.shared.clone(),
            tenant: tenant.to_string(),
        })
    }

    async fn ready(&self) -> Result<()> {
        self.claims()
            .list_metadata(&ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| tenant::kube_error("reaching the Kubernetes API", e))
    }

    async fn sandbox_count(&self) -> Result<usize> {
        let selector = format!(
            "{}={}",
            sandhub_api::k8s::names::CREATED_BY,
            model::CREATED_BY_HUB
        );
        self.claims()
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items.len())
            .map_err(|e| tenant::kube_error("counting sandboxes", e))
    }
}

impl KubeTenancy {
    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }
}
