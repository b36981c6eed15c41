//! The kubernetes backend: each hub sandbox is a SandboxClaim that
//! `sandhub-controller` serves from a SandboxWarmPool, and processes and
//! files go to the Pod's sandboxd. The cluster holds all the state (the
//! tenant and MCP session are labels on the claim), so a restarted hub
//! finds every sandbox again and keeps nothing of its own.

mod asking;
mod caches;
pub mod egress;
mod entrypoints;
mod events;
mod evictions;
mod gauges;
pub mod gym;
mod images;
pub mod mcp_sessions;
mod meters;
mod model;
mod oom;
mod owner;
mod ports;
mod prepull;
mod reach;
pub mod secrets;
mod sidecar_exec;
pub mod signing;
mod startup;
mod template;
mod tenant;
pub mod usage;
mod webhooks;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use async_trait::async_trait;
use clap::{Args, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{api::ListParams, Api};
use sandhub_api::{k8s::SandboxClaim, scoped_token::ScopedTokens};
use sandhub_client::{sandboxd::SandboxdClient, Result};

use self::{
    images::KubeImages,
    reach::{Reach, SandboxdAuth},
    tenant::KubeTenant,
};
pub use self::{
    model::{tenant_label_value, TEMPLATE_ANNOTATION, TENANT_LABEL},
    reach::SANDBOXD_TOKEN_HEADER,
    webhooks::KubeWebhooks,
};
use crate::{
    backend::{Backend, ImageService, TenantView},
    policy::Policy,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Connect {
    /// To the Pod IP (the hub runs where Pod IPs route).
    Direct,
    /// Through sandhub-router (the hub runs outside the cluster).
    Router,
}

/// `imagePullPolicy` of the container that runs a tenant template's `image`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PullPolicy {
    #[value(name = "Always")]
    Always,
    #[value(name = "IfNotPresent")]
    IfNotPresent,
    #[value(name = "Never")]
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig to use; default: in-cluster config, else $KUBECONFIG or ~/.kube/config.
    #[arg(long, env = "SANDHUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the claims, pools and templates.
    #[arg(long, env = "SANDHUB_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// StorageClass of the PersistentVolumeClaims that named volumes are
    /// (`/v1/volumes`); unset: the cluster's default class.
    #[arg(long, env = "SANDHUB_VOLUME_STORAGE_CLASS")]
    pub volume_storage_class: Option<String>,

    /// VolumeSnapshotClass of volume snapshots (`POST
    /// /v1/volumes/{name}/snapshots`, where the cluster has the
    /// VolumeSnapshot CRDs); unset: the cluster's default class.
    #[arg(long, env = "SANDHUB_VOLUME_SNAPSHOT_CLASS")]
    pub volume_snapshot_class: Option<String>,

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
    /// (`sandboxd --auth-token-file`): one token for every Pod that mounts
    /// it, so any workload that reads it opens them all. Prefer
    /// --sandboxd-token-key-file.
    #[arg(long, env = "SANDHUB_SANDBOXD_TOKEN_SECRET")]
    pub sandboxd_token_secret: Option<String>,

    /// File with the key sandhub-controller derives each Sandbox's own
    /// sandboxd token from (its --sandboxd-token-key-file): the hub presents
    /// each Pod its own token, which opens that Pod and no other. Takes
    /// precedence over --sandboxd-token-secret.
    #[arg(long, env = "SANDHUB_SANDBOXD_TOKEN_KEY_FILE")]
    pub sandboxd_token_key_file: Option<PathBuf>,

    /// How long `create` and `resume` wait for a claim to become Ready.
    #[arg(long, env = "SANDHUB_READY_TIMEOUT", default_value = "180s", value_parser = sandhub_common::parse_duration)]
    pub ready_timeout: Duration,

    /// The image holding the static sandboxd (at /usr/local/bin/sandboxd,
    /// with busybox at /bin/busybox, as dev/k8s/build-image.sh builds it):
    /// templates with `image:` and pre-pull DaemonSets copy sandboxd from it.
    #[arg(
        long,
        env = "SANDHUB_SANDBOXD_IMAGE",
        default_value = "sandhub/sandboxd:dev"
    )]
    pub sandboxd_image: String,

    /// How the container of a template's `image` is pulled. `Never` suits
    /// nodes that get images only by pre-loading or pre-pull (`POST
    /// /v1/images/prepull`): a missing image then fails its create at once
    /// (ErrImageNeverPull) instead of retrying a registry.
    #[arg(long, env = "SANDHUB_IMAGE_PULL_POLICY", value_enum, default_value_t = PullPolicy::IfNotPresent)]
    pub image_pull_policy: PullPolicy,

    /// The operator's SandboxTemplate (in --namespace) that tenants'
    /// templates start from: its scheduling, runtime class, security context
    /// and sandboxd container. Without it, a built-in template that runs
    /// --sandboxd-image.
    #[arg(long, env = "SANDHUB_BASE_TEMPLATE", default_value = sandhub_api::hub::DEFAULT_TEMPLATE)]
    pub base_template: String,

    /// `host:port` of the `sandhub-egress` Service (`sandhub
    /// egress-proxy`) that `network: egress` Pods use as their proxy; a
    /// short name resolves in --namespace. Egress sandboxes also need
    /// --sandboxd-token-key-file: their proxy credentials derive from it.
    #[arg(
        long,
        env = "SANDHUB_EGRESS_PROXY",
        default_value = "sandhub-egress:3128"
    )]
    pub egress_proxy: String,

    /// The Service of the `sandhub egress-proxy` replicas: the hub asks each
    /// of its endpoints (port `metrics`) for an egress sandbox's counters
    /// and decisions, and merges them.
    #[arg(
        long,
        env = "SANDHUB_EGRESS_PROXY_SERVICE",
        default_value = sandhub_api::k8s::egress::PROXY_APP
    )]
    pub egress_proxy_service: String,

    /// The main container of pre-pull DaemonSets (it only waits).
    #[arg(
        long,
        env = "SANDHUB_PREPULL_PAUSE_IMAGE",
        default_value = "registry.k8s.io/pause:3.10"
    )]
    pub prepull_pause_image: String,

    /// Pre-pull DaemonSets this hub runs at once, over all tenants (each
    /// tenant runs one pre-pull at a time).
    #[arg(long, env = "SANDHUB_MAX_PREPULL_DAEMONSETS", default_value_t = 16)]
    pub max_prepull_daemonsets: usize,

    /// MCP session records (ConfigMaps every replica reads) one tenant
    /// keeps at most: a new session past it evicts that tenant's least
    /// recently used records, whose sessions then work only on a replica
    /// that still holds them (docs/security.md says why evict).
    #[arg(
        long,
        env = "SANDHUB_MCP_SESSIONS_PER_TENANT",
        default_value_t = mcp_sessions::DEFAULT_PER_TENANT,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub mcp_sessions_per_tenant: u32,
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
    /// The hub's claims, kept by a watch: process and file calls read the
    /// claim here instead of a GET each (2–3 ms of every exec).
    claim_cache: Store<SandboxClaim>,
    /// Woken when the claim watch sees a claim a create waits on.
    claim_waiters: Arc<caches::ClaimWaiters>,
    /// Pools, templates and Sandboxes as their watches last saw them.
    caches: caches::Caches,
    /// Claims this hub suspended or deleted lately: their cached copy may
    /// still name the old Pod, so calls read them from the API server.
    changed: Mutex<HashMap<String, Instant>>,
    /// The operator's quotas (`--tenant-max-pool-replicas`).
    policy: Policy,
    /// Per tenant, the permits of creates running to their end
    /// (`crate::changes`): a caller that hangs up does not leave a claim
    /// whose Pod cannot start.
    changes: crate::changes::Changes,
    /// Held from a pool quota check to the write it admitted, so two
    /// concurrent puts of one hub cannot both take the last replicas.
    pool_writes: tokio::sync::Mutex<()>,
    /// `--sandboxd-image` and the pre-pull pause image.
    prepull_images: prepull::Images,
    /// `--base-template`.
    base_template: String,
    /// `--image-pull-policy`.
    image_pull_policy: PullPolicy,
    /// Pre-pull DaemonSets in flight over all tenants (`--max-prepull-daemonsets`).
    prepull_slots: tokio::sync::Semaphore,
    /// Tenants with a pre-pull running (one each).
    prepulls: Mutex<std::collections::HashSet<String>>,
    /// `--egress-proxy`, and the key egress sandboxes' proxy credentials
    /// derive from (`--sandboxd-token-key-file`; none: egress refused).
    egress_proxy: String,
    proxy_tokens: Option<sandhub_api::sandboxd_token::SandboxdTokens>,
    /// MCP session records every replica reads (`mcp_sessions.rs`).
    mcp_sessions: Arc<mcp_sessions::KubeMcpSessions>,
    /// `--secrets-file`: the operator's values (the tenants' own are in
    /// Secrets, kube/secrets.rs).
    operator_secrets: Arc<crate::secrets_file::OperatorSecrets>,
    /// `--egress-proxy-service`: whose EndpointSlices name the proxy
    /// replicas the hub asks for counters (kube/meters.rs).
    egress_service: String,
    /// `--volume-storage-class`.
    volume_storage_class: Option<String>,
    /// `--volume-snapshot-class`.
    volume_snapshot_class: Option<String>,
}

impl Shared {
    /// The Pod of Sandbox `sandbox`: its pod-name annotation (an adopted
    /// warm Pod keeps its own name), else the Sandbox's name.
    async fn pod_name(&self, sandbox: &str) -> String {
        let sandboxes: Api<sandhub_api::k8s::Sandbox> =
            Api::namespaced(self.client.clone(), &self.namespace);
        match sandboxes.get_opt(sandbox).await {
            Ok(Some(sb)) => sb
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(sandhub_api::k8s::names::POD_NAME_ANNOTATION).cloned())
                .unwrap_or_else(|| sandbox.to_string()),
            _ => sandbox.to_string(),
        }
    }

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

    /// The sandbox `id` is about to lose its Pod (suspend, delete).
    fn forget_clients(&self, id: &str) {
        let prefix = format!("{id}/");
        self.clients
            .lock()
            .unwrap()
            .retain(|k, _| !k.starts_with(&prefix));
        let mut changed = self.changed.lock().unwrap();
        changed.retain(|_, at| at.elapsed() < CHANGED_TTL);
        changed.insert(id.to_string(), Instant::now());
    }

    /// The watch's copy of claim `id`, unless this hub changed it lately.
    fn cached_claim(&self, id: &str) -> Option<Arc<SandboxClaim>> {
        if self
            .changed
            .lock()
            .unwrap()
            .get(id)
            .is_some_and(|at| at.elapsed() < CHANGED_TTL)
        {
            return None;
        }
        self.claim_cache
            .get(&ObjectRef::new(id).within(&self.namespace))
    }
}

/// How long a claim this hub suspended or deleted is read from the API
/// server rather than the watch (far longer than any watch lag).
const CHANGED_TTL: Duration = Duration::from_secs(30);

/// The reflector behind [`Shared::cached_claim`]: claims created by hubs.
/// The hub's claims in `namespace`, kept by a watch (the hub's own reads,
/// and `sandhub egress-proxy`'s policies).
/// With `events`, the same watch feeds the lifecycle events (kube/events.rs);
/// with `waiters`, it wakes the creates waiting on a claim.
pub(crate) fn claim_cache(
    client: &kube::Client,
    namespace: &str,
    events: Option<events::Feed>,
    waiters: Option<Arc<caches::ClaimWaiters>>,
) -> Store<SandboxClaim> {
    let api: Api<SandboxClaim> = Api::namespaced(client.clone(), namespace);
    let selector = format!(
        "{}={}",
        sandhub_api::k8s::names::CREATED_BY,
        model::CREATED_BY_HUB
    );
    let (reader, stream) = caches::reflect(api, watcher::Config::default().labels(&selector));
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut events = events.map(|feed| (feed, events::ClaimTracker::default()));
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { continue };
            if let Some(waiters) = &waiters {
                waiters.saw(&ev);
            }
            let Some((feed, tracker)) = &mut events else {
                continue;
            };
            let derived = tracker.observe(&ev);
            if !derived.is_empty() && feed.send(derived).await.is_err() {
                events = None;
            }
        }
    });
    reader
}

pub struct KubeTenancy {
    shared: Arc<Shared>,
    /// This replica's lifecycle events, derived from its watches (kube/events.rs).
    events: Arc<crate::events::EventLog>,
}

/// A client from `kubeconfig`, else in-cluster, else $KUBECONFIG or
/// ~/.kube/config.
pub(crate) async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("finding a kube config")?,
    };
    Ok(kube::Client::try_from(config)?)
}

impl KubeTenancy {
    /// `operator_secrets`: the hub's `--secrets-file` (values the hub only
    /// checks exist; the proxy reads the same file for the values).
    /// `events`: the bounds of this replica's event ring and streams.
    pub async fn connect(
        args: &KubeArgs,
        policy: Policy,
        operator_secrets: crate::secrets_file::OperatorSecrets,
        events: &crate::events::EventArgs,
    ) -> anyhow::Result<Self> {
        let client = client(args.kubeconfig.as_deref()).await?;
        let events = crate::events::EventLog::memory(events, tenant_label_value);
        let watched = events::spawn(&client, &args.namespace, events.clone());
        let claim_waiters = Arc::new(caches::ClaimWaiters::default());
        let proxy_tokens = match &args.sandboxd_token_key_file {
            Some(path) => Some(
                sandhub_api::sandboxd_token::SandboxdTokens::from_file(path)
                    .map_err(|e| anyhow::anyhow!("--sandboxd-token-key-file: {e}"))?,
            ),
            None => None,
        };
        let auth = match (&proxy_tokens, &args.sandboxd_token_secret) {
            (Some(tokens), _) => SandboxdAuth::PerSandbox(tokens.clone()),
            (None, Some(name)) => {
                tracing::warn!(
                    secret = %name,
                    "one sandboxd token for every Pod: a workload that reads it opens every \
                     sandbox; --sandboxd-token-key-file gives each Pod its own"
                );
                SandboxdAuth::Shared(read_token(&client, &args.namespace, name).await?)
            }
            (None, None) => SandboxdAuth::None,
        };
        let reach = match args.connect {
            Connect::Direct => Reach::Direct { auth },
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
                auth,
            },
        };
        let mcp_sessions = Arc::new(mcp_sessions::KubeMcpSessions::new(
            client.clone(),
            &args.namespace,
            args.mcp_sessions_per_tenant as usize,
        ));
        spawn_mcp_session_sweeper(mcp_sessions.clone());
        let shared = Arc::new(Shared {
            mcp_sessions,
            namespace: args.namespace.clone(),
            reach,
            ready_timeout: args.ready_timeout,
            clients: Mutex::default(),
            claim_cache: claim_cache(
                &client,
                &args.namespace,
                Some(watched.feed),
                Some(claim_waiters.clone()),
            ),
            claim_waiters,
            caches: caches::Caches::new(
                &args.namespace,
                watched.pools,
                watched.templates,
                caches::sandbox_metadata(&client, &args.namespace),
            ),
            changed: Mutex::default(),
            policy,
            changes: crate::changes::Changes::default(),
            pool_writes: tokio::sync::Mutex::default(),
            prepull_images: prepull::Images {
                sandboxd: args.sandboxd_image.clone(),
                pause: args.prepull_pause_image.clone(),
            },
            base_template: args.base_template.clone(),
            image_pull_policy: args.image_pull_policy,
            prepull_slots: tokio::sync::Semaphore::new(args.max_prepull_daemonsets.max(1)),
            prepulls: Mutex::default(),
            egress_proxy: args.egress_proxy.clone(),
            proxy_tokens,
            operator_secrets: Arc::new(operator_secrets),
            egress_service: args.egress_proxy_service.clone(),
            volume_storage_class: args.volume_storage_class.clone(),
            volume_snapshot_class: args.volume_snapshot_class.clone(),

            client,
        });
        // `entrypoint_exited`: exits recorded on claims (kube/entrypoints.rs).
        entrypoints::spawn(shared.clone());
        // `oom_killed`: kill counts recorded on claims (kube/oom.rs).
        oom::spawn(shared.clone());
        // `disk_quota_exceeded`: Pods the kubelet evicted for local
        // storage, recorded on claims (kube/evictions.rs).
        evictions::spawn(shared.clone());
        Ok(KubeTenancy { shared, events })
    }
}

/// Every replica sweeps the records of vanished MCP sessions now and then;
/// two sweeping at once delete nothing twice (404 is fine).
fn spawn_mcp_session_sweeper(sessions: Arc<mcp_sessions::KubeMcpSessions>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(600));
        loop {
            tick.tick().await;
            match sessions.sweep(crate::backend::now_ms()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(records = n, "swept the records of idle MCP sessions"),
                Err(e) => tracing::warn!(error = %e, "sweeping MCP session records"),
            }
        }
    });
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
impl Backend for KubeTenancy {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

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

    fn images(&self) -> Option<Arc<dyn ImageService>> {
        Some(Arc::new(KubeImages {
            shared: self.shared.clone(),
        }))
    }

    fn shared_mcp_sessions(&self) -> Option<Arc<dyn sandhub_mcp::SharedSessions>> {
        Some(self.shared.mcp_sessions.clone())
    }

    async fn gauges(&self) -> Result<crate::gauges::Gauges> {
        self.pool_and_tenant_gauges().await
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
    /// This replica's lifecycle events, for `GET /v1/events`.
    pub fn events(&self) -> Arc<crate::events::EventLog> {
        self.events.clone()
    }

    /// `/v1/webhooks` on this backend: registrations and delivery state in
    /// objects the hub owns, deliveries by the replica holding a Lease
    /// (kube/webhooks/). Not started until [`KubeWebhooks::spawn`].
    pub fn webhooks(&self, args: &crate::webhooks::WebhookArgs) -> anyhow::Result<KubeWebhooks> {
        KubeWebhooks::new(
            self.shared.client.clone(),
            &self.shared.namespace,
            self.events.clone(),
            args,
        )
    }

    /// Where this backend keeps Gym environments: ConfigMaps every replica reads.
    pub fn env_store(&self) -> gym::KubeEnvStore {
        gym::KubeEnvStore::new(self.shared.client.clone(), &self.shared.namespace)
    }

    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }
}
