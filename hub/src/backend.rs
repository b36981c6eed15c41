//! The seam between the front doors (REST, MCP, Gym) and the two backends,
//! `local/` and `kube/`: one view of the sandboxes per tenant
//! ([`TenantView`]) and the backend as a whole ([`Backend`]). Both backends
//! provide it, so every front door works unchanged on either. Also the few
//! conventions both share: ids, and times as Unix milliseconds; and where
//! the Gym keeps its environments across restarts ([`EnvStore`], kept by
//! the local backend's state store).

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use sandhub_api::{
    error::{Code, ErrorBody},
    gym::CreateEnv,
    hub::{
        Image, ListeningPort, PrepullRequest, PrepullResult, PruneResult, PullEvent, PullRequest,
        Sandbox, Snapshot,
    },
};
use sandhub_client::{sandboxd::SandboxdClient, Result, Sandboxes};
use serde::{Deserialize, Serialize};

/// One tenant's sandboxes: the whole [`Sandboxes`] API, plus what the REST
/// layer needs beyond it.
#[async_trait]
pub trait TenantView: Sandboxes {
    fn tenant(&self) -> &str;
    /// The sandboxd of a Ready sandbox, for routes that forward raw HTTP.
    async fn sandboxd(&self, id: &str, op: &str) -> Result<SandboxdClient>;
    /// Snapshots taken of a sandbox this tenant owns.
    async fn list_snapshots(&self, id: &str) -> Result<Vec<Snapshot>>;
    /// A TCP connection to `port` inside a Ready sandbox (its own network,
    /// reached without publishing anything on the host).
    async fn connect_port(&self, id: &str, port: u16) -> Result<PortStream>;
    /// Whether this tenant may reach a port of sandbox `id` now (it is
    /// theirs and Ready): checked before a kept connection is reused, and
    /// counted as activity as a new connection would be.
    async fn port_access(&self, id: &str) -> Result<()> {
        let sb = self.get(id).await?;
        if sb.state != sandhub_api::hub::SandboxState::Ready {
            return Err(sandhub_client::Error::new(
                Code::FailedPrecondition,
                format!(
                    "sandbox {id} is {}; port access needs it Ready",
                    sb.state.as_str()
                ),
            ));
        }
        Ok(())
    }
    /// The TCP ports listening inside a Ready sandbox.
    async fn list_ports(&self, id: &str) -> Result<Vec<ListeningPort>>;
    /// The last decisions of a sandbox's egress gateway, oldest first;
    /// empty when it has none (another tenant's sandbox is NOT_FOUND).
    /// (No default: a wrapper that forgot to forward it would answer
    /// empty.)
    async fn egress_log(&self, id: &str) -> Result<Vec<sandhub_api::hub::EgressDecision>>;
    /// Stores a secret's value for this tenant (`PUT /v1/secrets/{name}`).
    async fn put_secret(
        &self,
        name: &str,
        value: String,
    ) -> Result<sandhub_api::secrets::SecretInfo> {
        let _ = (name, value);
        Err(no_secrets())
    }
    /// This tenant's secret names (never values).
    async fn list_secrets(&self) -> Result<sandhub_api::secrets::SecretList> {
        Err(no_secrets())
    }
    async fn delete_secret(&self, name: &str) -> Result<()> {
        let _ = name;
        Err(no_secrets())
    }
    /// This tenant's named volumes (`/v1/volumes`); the local backend's.
    async fn create_volume(
        &self,
        req: sandhub_api::volumes::CreateVolume,
    ) -> Result<sandhub_api::volumes::Volume> {
        let _ = req;
        Err(no_volumes())
    }
    async fn list_volumes(&self) -> Result<sandhub_api::volumes::VolumeList> {
        Err(no_volumes())
    }
    async fn get_volume(&self, name: &str) -> Result<sandhub_api::volumes::Volume> {
        let _ = name;
        Err(no_volumes())
    }
    async fn delete_volume(&self, name: &str) -> Result<()> {
        let _ = name;
        Err(no_volumes())
    }
    /// The root of one of this tenant's volumes, for the volume files API
    /// (`/v1/volumes/{name}/files`); another tenant's is NOT_FOUND.
    async fn volume_dir(&self, name: &str) -> Result<crate::volume_files::VolumeDir> {
        let _ = name;
        Err(no_volumes())
    }
    /// Where a backend without local volume directories serves a volume's
    /// files: the sandboxd of a Pod that mounts it (Kubernetes). Asked only
    /// when [`TenantView::volume_dir`] is `UNIMPLEMENTED`.
    async fn volume_sandboxd(
        &self,
        name: &str,
    ) -> Result<sandhub_client::sandboxd::SandboxdClient> {
        let _ = name;
        Err(no_volumes())
    }
    /// A read-only snapshot of one of this tenant's volumes.
    async fn create_volume_snapshot(
        &self,
        volume: &str,
        req: sandhub_api::volumes::CreateVolumeSnapshot,
    ) -> Result<sandhub_api::volumes::VolumeSnapshot> {
        let _ = (volume, req);
        Err(no_volumes())
    }
    async fn list_volume_snapshots(
        &self,
        volume: &str,
    ) -> Result<sandhub_api::volumes::VolumeSnapshotList> {
        let _ = volume;
        Err(no_volumes())
    }
    async fn delete_volume_snapshot(&self, volume: &str, name: &str) -> Result<()> {
        let _ = (volume, name);
        Err(no_volumes())
    }
    /// Moves a sandbox's deadline to `seconds` from now (E2B's
    /// `set_timeout`: shorter or longer than before).
    async fn set_deadline(&self, id: &str, seconds: u64) -> Result<Sandbox> {
        let _ = (id, seconds);
        Err(sandhub_client::Error::new(
            Code::Unimplemented,
            "moving a sandbox's deadline is not supported on this backend",
        ))
    }
}

fn no_secrets() -> sandhub_client::Error {
    sandhub_client::Error::new(
        Code::Unimplemented,
        "brokered secrets are not available on this backend",
    )
}

fn no_volumes() -> sandhub_client::Error {
    sandhub_client::Error::new(
        Code::Unimplemented,
        "named volumes are not available on this backend yet (the local backend has them; \
         Kubernetes volumes will be PersistentVolumeClaims)",
    )
}

/// A TCP connection toward a sandbox port, and the headers an HTTP request
/// over it must carry: none when it reaches the port itself; through
/// `sandhub-router`, which sandbox and port, and the scoped token (such a
/// connection carries HTTP only, not raw TCP).
pub struct PortStream {
    pub stream: tokio::net::TcpStream,
    pub headers: http::HeaderMap,
}

impl PortStream {
    pub fn direct(stream: tokio::net::TcpStream) -> Self {
        PortStream {
            stream,
            headers: http::HeaderMap::new(),
        }
    }
}

/// One tenant's egress gateways, for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct TenantEgress {
    pub tenant: String,
    /// What its gateways counted while the hub runs, running and gone.
    pub usage: sandhub_api::hub::EgressUsage,
    /// Gateways running now (0 once all of its are gone).
    pub gateways: usize,
}

/// A backend as the front doors see it.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The view one API key has; `session` tags what an MCP session creates.
    fn tenant(&self, tenant: &str) -> Arc<dyn TenantView>;
    /// `local` or `kubernetes`: the `backend` label of the metrics.
    fn kind(&self) -> &'static str;
    /// Readiness: the state behind the hub answers.
    async fn ready(&self) -> Result<()>;
    /// Sandboxes the hub holds (claimed and warm), for the metrics gauge.
    async fn sandbox_count(&self) -> Result<usize>;
    /// Each pool's and each tenant's gauges, read at every scrape. (No
    /// default: a wrapper that forgot to forward it would report nothing.)
    async fn gauges(&self) -> Result<crate::gauges::Gauges>;
    /// Per tenant, what its egress gateways counted while the hub runs
    /// and how many run now (`/metrics`; empty where there are none).
    fn egress_usage(&self) -> Vec<TenantEgress> {
        Vec::new()
    }
    /// The images side: the local backend's store, or on Kubernetes
    /// pre-pull onto the nodes (which hold the images).
    fn images(&self) -> Option<Arc<dyn ImageService>> {
        None
    }
    /// Where MCP sessions are recorded for the other replicas of this hub
    /// (Kubernetes); none where one process serves everything. (No
    /// default: a wrapper that forgot to forward it would silently tie
    /// every session to one replica.)
    fn shared_mcp_sessions(&self) -> Option<Arc<dyn sandhub_mcp::SharedSessions>>;
}

/// An image store as the front doors use it. Blocking work runs on
/// blocking threads behind it; `import` reads its archive from a reader
/// that may block.
#[async_trait]
pub trait ImageService: Send + Sync {
    /// The images `tenant` holds (imported or pulled), with its tags.
    async fn list(&self, tenant: &str) -> std::result::Result<Vec<Image>, ErrorBody>;
    async fn import(
        &self,
        tenant: &str,
        input: Box<dyn std::io::Read + Send>,
        tag: Option<String>,
        pick: Option<String>,
    ) -> std::result::Result<Image, ErrorBody>;
    async fn remove(
        &self,
        tenant: &str,
        reference: String,
    ) -> std::result::Result<Image, ErrorBody>;
    async fn prune(&self, tenant: &str) -> std::result::Result<PruneResult, ErrorBody>;
    /// Pulls an image from its registry for `tenant`. Events go to
    /// `progress` as they happen; the last is `done` or `error`.
    async fn pull(
        &self,
        _tenant: &str,
        _request: PullRequest,
        _progress: Option<tokio::sync::mpsc::UnboundedSender<PullEvent>>,
    ) -> std::result::Result<Image, ErrorBody> {
        Err(no_pull())
    }
    /// Pulls `req.references` where `tenant`'s sandboxes will run, before
    /// they are needed (`POST /v1/images/prepull`).
    async fn prepull(
        &self,
        tenant: &str,
        req: PrepullRequest,
    ) -> std::result::Result<PrepullResult, ErrorBody> {
        let _ = (tenant, req);
        Err(ErrorBody::new(
            Code::Unimplemented,
            "pre-pull is not available on this backend yet",
        ))
    }
}

fn no_pull() -> ErrorBody {
    ErrorBody::new(
        Code::Unimplemented,
        "this image store cannot pull from registries",
    )
}

/// Where environments are kept across restarts.
#[async_trait]
pub trait EnvStore: Send + Sync + 'static {
    async fn insert(&self, row: &GymEnvRow) -> Result<()>;
    /// The episode state after a call at `now`.
    async fn save(&self, id: &str, episode: &Episode, now: i64) -> Result<()>;
    async fn get(&self, tenant: &str, id: &str) -> Result<Option<GymEnvRow>>;
    async fn delete(&self, id: &str) -> Result<()>;
    /// `(id, tenant)` of every env unused for its idle timeout at `now`.
    async fn idle(&self, now: i64) -> Result<Vec<(String, String)>>;
    /// Other processes (hub replicas) write the same envs: what this hub
    /// holds in memory is re-read before each call instead of trusted.
    fn shared(&self) -> bool {
        false
    }
    /// The env's sandboxes carry the env's idle timeout (a backend without
    /// idle timeouts has the sweeper alone close idle envs).
    fn sandbox_idle_timeouts(&self) -> bool {
        true
    }
}

/// What an environment's next call depends on, beyond its configuration.
/// Kept as JSON in one column, so that it can grow without a migration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Episode {
    /// The sandbox episodes run in; none before the first, or after a close.
    pub sandbox: Option<String>,
    /// The sandbox failed mid-episode: the next reset starts a new one.
    pub broken: bool,
    /// Steps taken in the current episode.
    pub step: u32,
    /// Episodes started (resets).
    pub episode: u32,
    /// The seed of the current episode, handed to commands as `SANDHUB_SEED`.
    pub seed: Option<u64>,
    /// The current episode ended (terminated or truncated): step needs a reset.
    pub done: bool,
}

/// One environment as stored. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct GymEnvRow {
    pub id: String,
    pub tenant: String,
    pub spec: CreateEnv,
    pub episode: Episode,
    pub idle_timeout_seconds: u64,
    pub created_at: i64,
    /// The last reset, step or creation.
    pub last_used: i64,
}

/// Unix seconds, for expiries that travel in tokens.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `prefix-` plus 10 random `[a-z0-9]`: a DNS-1123 label, unguessable
/// enough that ids leak nothing about other tenants.
pub fn new_id(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let suffix: String = (0..10)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}-{suffix}")
}
