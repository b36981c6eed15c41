//! Size: the REST API's whole wire contract, one plain type after another.
//!
//! JSON bodies of the hub's REST API (`/v1/...`). The hub serves them, the
//! client crate sends them, and the OpenAPI document describes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Code;
pub use crate::network::{Network, NetworkSpec};

/// Sandbox ids are DNS-1123 labels, so one id can name a SandboxClaim, a Pod
/// and a hostname.
pub const MAX_ID_LEN: usize = 63;
pub const DEFAULT_TEMPLATE: &str = "default";

/// The largest `egress_mb` (1 PiB).
pub const MAX_EGRESS_MB: u64 = 1 << 30;

/// Template limits beyond which no kernel can enforce the value (`pids.max`
/// stops at the kernel's PID_MAX_LIMIT; 16 TiB of memory, 1024 cores).
/// Below these a sandbox cannot even start its own daemon (the shim, PID 1
/// and sandboxd count against `pids`, and sandboxd needs some memory and
/// CPU to answer in time), so a template asking for less is refused.
pub const MIN_PIDS: u64 = 16;
pub const MIN_MEMORY_MB: u64 = 32;
pub const MIN_CPU: f64 = 0.05;
pub const MAX_PIDS: u64 = 4_194_304;
pub const MAX_MEMORY_MB: u64 = 1 << 24;
pub const MAX_CPU: f64 = 1024.0;
/// Disk quota bounds for a sandbox's writable files (its workspace layer,
/// logs and sockets), in MiB: 16 MiB holds sandboxd's own files with room
/// to spare; 16 TiB is far beyond any single machine's local disk.
pub const MIN_DISK_MB: u64 = 16;
pub const MAX_DISK_MB: u64 = 1 << 24;

/// True for a DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, 1..=63 chars.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_ID_LEN
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Label key prefixes (DNS domains, and their subdomains) a caller may not
/// set: the agent-sandbox controllers' bookkeeping (`agents.x-k8s.io/...`,
/// `extensions.agents.x-k8s.io/...`) and Kubernetes' (`kubernetes.io`,
/// `k8s.io`). Both backends refuse them, so a label can never pose as a
/// controller's. (`sandhub.io/` stays open: the MCP server tags its
/// session's sandboxes with it, and the tenant label is always overwritten.)
pub const RESERVED_LABEL_DOMAINS: [&str; 3] = ["agents.x-k8s.io", "kubernetes.io", "k8s.io"];

/// Whether label `key` lies under a [`RESERVED_LABEL_DOMAINS`] prefix.
pub fn is_reserved_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    let prefix = prefix.to_ascii_lowercase();
    RESERVED_LABEL_DOMAINS.iter().any(|d| {
        prefix == *d
            || prefix
                .strip_suffix(d)
                .is_some_and(|head| head.ends_with('.'))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SandboxState {
    Pending,
    Ready,
    /// Frozen in place (`pause`): every process keeps its memory, sockets
    /// and open files but gets no CPU until `resume` thaws it.
    Paused,
    /// Stopped (`suspend`): no process runs, the files stay.
    Suspended,
    Finished,
    Expired,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Pending => "Pending",
            SandboxState::Ready => "Ready",
            SandboxState::Paused => "Paused",
            SandboxState::Suspended => "Suspended",
            SandboxState::Finished => "Finished",
            SandboxState::Expired => "Expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "Pending" => SandboxState::Pending,
            "Ready" => SandboxState::Ready,
            "Paused" => SandboxState::Paused,
            "Suspended" => SandboxState::Suspended,
            "Finished" => SandboxState::Finished,
            "Expired" => SandboxState::Expired,
            _ => return None,
        })
    }
}

/// What a sandbox's idle timeout does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum IdleAction {
    /// Delete it (files and all).
    #[default]
    Delete,
    /// Stop its processes, keep its files (`Suspended`).
    Suspend,
    /// Freeze its processes in place (`Paused`; local backend).
    Pause,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Delete => "delete",
            IdleAction::Suspend => "suspend",
            IdleAction::Pause => "pause",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "delete" => IdleAction::Delete,
            "suspend" => IdleAction::Suspend,
            "pause" => IdleAction::Pause,
            _ => return None,
        })
    }
}

/// Whether a sandbox came from a warm pool (a state change) or was started
/// for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Launch {
    Warm,
    Cold,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateSandbox {
    /// Template name; a pool of the same name is claimed from first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Claim from this pool (its template applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Environment for every process in the sandbox. Forces a cold start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Absolute deadline, counted from creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_after_seconds: Option<u64>,
    /// After this long with no API calls and no running process, what
    /// `idle_action` says is done (deleted, by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
    /// What the idle timeout does: `delete` (the default), `suspend` or
    /// `pause` (local backend). Overrides the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// Whether a call that needs the sandbox running (exec, files,
    /// processes, ports, E2B's envd calls) resumes it first when it is
    /// Paused or Suspended, instead of answering 412 (local backend).
    /// Overrides the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// Narrows the template's `network` for this sandbox, never widens it:
    /// `none`, or the template's mode with `allow_out` entries inside the
    /// template's (docs/networking.md). Forces a cold start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// More brokered secrets than the template's (`network: egress`
    /// only; docs/networking.md). Forces a cold start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::secrets::SecretRef>,
    /// More named volumes than the template's, mounted where each says.
    /// Forces a cold start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volumes::VolumeMount>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sandbox {
    pub id: String,
    pub template: String,
    pub state: SandboxState,
    pub labels: BTreeMap<String, String>,
    pub launch: Launch,
    /// RFC 3339, UTC.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
    /// What its idle timeout does, when not `delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// Whether calls that need it running resume it first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_resume: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The snapshot this sandbox was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    /// How its entrypoint (the template's, else its image's) is doing, on
    /// one sandbox's GET or create answer while it is Ready; absent when it
    /// has none, in lists, and where the backend cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<EntrypointStatus>,
    /// What its egress gateway counted (`network: egress`, on one
    /// sandbox's GET while the gateway runs; absent otherwise). Counted
    /// since the gateway last started (a hub restart starts from zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressUsage>,
    /// The sandbox's own narrowing of its template's `network`, as its
    /// create request or the last `PATCH /v1/sandboxes/{id}/network` set
    /// it; absent when it has none (it runs with the template's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// Its latest resource sample and the limits it is measured against,
    /// while it runs and the backend has one (see `GET .../metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::usage::SandboxUsage>,
}

/// An egress sandbox's counters. Bytes are TCP **payload** bytes: what the
/// workload wrote to its connections (`bytes_out`) and what it could read
/// from them (`bytes_in`); no IP/TCP headers, no DNS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressUsage {
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Connections the gateway carried (upstream connected).
    pub connections_opened: u64,
    /// Connections refused (policy, closed range, a limit, `egress_mb`, or
    /// upstream unreachable).
    pub connections_refused: u64,
}

/// One decision of an egress gateway on a connection attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressDecision {
    /// RFC 3339, UTC.
    pub at: String,
    /// The name the workload resolved, when it dialled one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The address it dialled (for a name: the gateway's synthetic one).
    pub address: String,
    pub port: u16,
    pub allowed: bool,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Payload bytes of an allowed connection so far.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// The gateway terminated its TLS to put a secret's value in
    /// (brokered secrets); absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub brokered: bool,
    /// A UDP flow (a `udp:` entry's); absent for TCP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub udp: bool,
}

/// `GET /v1/sandboxes/{id}/egress`: the last decisions (at most 256),
/// oldest first. Empty for a sandbox without an egress gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EgressLog {
    pub decisions: Vec<EgressDecision>,
}

/// A sandbox's entrypoint: running, or how it ended. The words are
/// Kubernetes' container-state reasons, so a caller judges both backends
/// alike: `OOMKilled` and `Error` at start mean the sandbox will not serve;
/// `Completed` is normal for an image whose command is a shell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntrypointStatus {
    pub state: EntrypointState,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// How long it ran: until now while `Running`, else until it ended.
    pub running_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it could not be started (`StartError`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EntrypointState {
    Running,
    /// Exited 0.
    Completed,
    /// Exited non-zero, or a signal other than the OOM killer's ended it.
    Error,
    /// The kernel's OOM killer ended it (or the process it waited for).
    #[serde(rename = "OOMKilled")]
    OomKilled,
    /// It could not be started at all (no such program, not executable).
    StartError,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// A command: a shell string (run with `/bin/sh -c`) or an argv array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Command {
    Shell(String),
    Argv(Vec<String>),
}

impl Command {
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            Command::Argv(v) => v.clone(),
        }
    }
}

/// `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecRequest {
    pub command: Command,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the workspace; empty means the workspace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cwd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Bytes written to the process's stdin, then closed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stdin: String,
    /// Kubernetes: run in this container of the sandbox's Pod, one of its
    /// template's `sidecars` (through the Pod's exec API, no `env` or
    /// `cwd`); unset: the sandbox's own container, through its sandboxd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

/// `PUT /v1/templates/{name}`: what a sandbox is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Template {
    /// Image reference (`name:tag` or `sha256:<id>`) whose filesystem is
    /// the sandbox's read-only root; its config's `Env` is the default
    /// environment (the template's `env` wins per key). On the local
    /// backend the image must be in the hub's store (`sandhub image
    /// import`). Not together with `root_fs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Host directory used as the read-only root filesystem instead of the
    /// host's allowlisted `/usr`, `/bin`, `/lib*`, `/sbin` and stripped `/etc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_fs: Option<String>,
    /// Host directory whose contents seed `/workspace` (the overlay's lower layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_dir: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Absolute path where commands run when they name no `cwd`; with an
    /// image, its config's `WorkingDir` when unset; else `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Who commands run as: `user[:group]`, names (from the sandbox's own
    /// `/etc/passwd` and `/etc/group`) or numbers; with an image, its
    /// config's `User` when unset; else the sandbox's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Started in the background when the sandbox starts and after each
    /// reset (its output in `/tmp/sandhub-entrypoint.log`); with an image,
    /// its `Entrypoint` + `Cmd` when unset; `[]`: nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// CPU limit in cores (e.g. 0.5), [`MIN_CPU`] to [`MAX_CPU`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.05, maximum = 1024))]
    pub cpu: Option<f64>,
    /// Memory limit in MiB, [`MIN_MEMORY_MB`] to [`MAX_MEMORY_MB`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 32, maximum = 16777216))]
    pub memory_mb: Option<u64>,
    /// Most processes (and threads) at once, [`MIN_PIDS`] to [`MAX_PIDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 16, maximum = 4194304))]
    pub pids: Option<u64>,
    /// Disk quota in MiB for everything the sandbox writes (its workspace
    /// layer included), [`MIN_DISK_MB`] to [`MAX_DISK_MB`]; the hub's
    /// operator default when unset. Writes past it fail with `ENOSPC` or
    /// `EDQUOT` inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 16, maximum = 16777216))]
    pub disk_mb: Option<u64>,
    /// `network: egress` only: MiB of TCP payload (out and in together)
    /// the sandbox may move through its gateway, 1 to [`MAX_EGRESS_MB`];
    /// past it new connections are refused (open ones continue). Counted
    /// since the gateway started (a hub restart starts again from zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1073741824))]
    pub egress_mb: Option<u64>,
    /// `"none"`, `"host"`, `"egress"`, or `{mode, allow_out, deny_out}`
    /// (docs/networking.md).
    #[serde(default)]
    pub network: NetworkSpec,
    /// Secrets its sandboxes use without holding them (`network: egress`
    /// only): the environment gets a placeholder, the gateway puts the
    /// value in one header of requests to the secret's hosts
    /// (docs/networking.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::secrets::SecretRef>,
    /// What its sandboxes' idle timeout does: `delete` (the default),
    /// `suspend` or `pause` (local backend). A create request's wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// Whether a call that needs a sandbox running resumes it first when
    /// it is Paused or Suspended (exactly once, however many calls come
    /// at once), instead of answering 412 (local backend). A create
    /// request's wins.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_resume: bool,
    /// Named volumes its sandboxes mount (`[{name, path, read_only}]`,
    /// local backend): the tenant's own, or one the operator shares with
    /// every tenant (read-only). A create request may add more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volumes::VolumeMount>,
    /// Kubernetes only: more containers in the sandbox's Pod (a grader, a
    /// service the task needs), at most [`MAX_SIDECARS`]. They share the
    /// Pod's network and, with `image`, its `/workspace`; `exec` reaches
    /// one by its name (`container`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sidecars: Vec<Sidecar>,
}

/// Most sidecars one template may have.
pub const MAX_SIDECARS: usize = 4;

/// A container beside the sandbox's own in its Pod (Kubernetes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sidecar {
    /// A DNS label, unique in the template, not `sandboxd`.
    pub name: String,
    pub image: String,
    /// Its argv; unset: the image's own entrypoint and command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its own limits, in the template's units and ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// A template and its name. Its OpenAPI schema is written by hand below:
/// the derived one would be `allOf: [Template, {name}]`, and Template's
/// `additionalProperties: false` (from `deny_unknown_fields`) rejects `name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedTemplate {
    pub name: String,
    #[serde(flatten)]
    pub template: Template,
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for NamedTemplate {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::{
            schema::{Object, Schema, Type},
            RefOr,
        };
        // Template's own object with `name` added: one object, so its
        // `additionalProperties: false` still holds for everything else.
        let mut object = match <Template as utoipa::PartialSchema>::schema() {
            RefOr::T(Schema::Object(o)) => o,
            _ => Object::new(),
        };
        object
            .properties
            .insert("name".into(), Object::with_type(Type::String).into());
        object.required.insert(0, "name".into());
        object.description = Some("A template and its name.".into());
        RefOr::T(Schema::Object(object))
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for NamedTemplate {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <Template as utoipa::ToSchema>::schemas(schemas);
    }
}

/// `PUT /v1/pools/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolSpec {
    pub template: String,
    pub replicas: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Pool {
    pub name: String,
    pub template: String,
    pub replicas: u32,
    /// Warm sandboxes ready to be claimed.
    pub ready: u32,
    /// Warm sandboxes ready or starting.
    pub total: u32,
    /// Why the last warm start failed, while starts keep failing (each
    /// retry waits longer, up to 30 s); absent once one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Snapshot {
    pub id: String,
    pub sandbox_id: String,
    pub created_at: String,
    /// Disk space the snapshot's layer takes, in bytes (it counts toward
    /// its tenant's disk use); absent for snapshots taken before sizes
    /// were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/fork`: a new sandbox from a snapshot of this
/// one (a fresh snapshot when none is named).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// One line of the NDJSON stream `POST /v1/sandboxes/{id}/processes`
/// answers with. Output bytes are base64 (standard alphabet, padded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ProcessEventWire {
    Started { pid: i32 },
    Stdout { data: String },
    Stderr { data: String },
    Exited { exit_code: i32 },
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignalRequest {
    /// `SIGINT`, `SIGTERM` or `SIGKILL`.
    pub signal: String,
}

/// `POST /v1/sandboxes/{id}/processes/{pid}/resize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResizeRequest {
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateList {
    pub templates: Vec<NamedTemplate>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolList {
    pub pools: Vec<Pool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

/// One TCP socket listening inside a sandbox's network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ListeningPort {
    pub port: u16,
    /// The address it is bound to (`0.0.0.0`, `127.0.0.1`, `::`, ...).
    pub address: String,
}

/// `GET /v1/sandboxes/{id}/ports`: what listens inside the sandbox, by port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PortList {
    pub ports: Vec<ListeningPort>,
}

/// A browser link to a sandbox port (`POST /v1/sandboxes/{id}/port-urls/{port}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PortUrl {
    /// `http://{port}-{id}.<domain>/?sandhub_token=...`
    pub url: String,
    /// RFC 3339, UTC: the link opens the port until then.
    pub expires_at: String,
}

/// The `Upgrade` protocol of `GET /v1/sandboxes/{id}/port-forward/{port}`:
/// after 101 the connection carries raw TCP to that port in the sandbox.
pub const PORT_FORWARD_UPGRADE: &str = "sandhub-tcp";

/// What an image's config says a sandbox runs with (OCI `config`), the
/// defaults a template with `image:` falls back on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageRunConfig {
    /// `KEY=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
}

/// An image in the local store (`GET /v1/images`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Image {
    /// `sha256:<hex>` of the image config: the image's identity.
    pub id: String,
    /// `name:tag` references naming it.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Layer digests, bottom first.
    pub layers: Vec<String>,
    /// Bytes of the layers' compressed blobs.
    pub size_bytes: u64,
    #[serde(default)]
    pub config: ImageRunConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageList {
    pub items: Vec<Image>,
}

/// What `POST /v1/images/prune` removed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PruneResult {
    /// Ids of the untagged images removed.
    pub images: Vec<String>,
    /// Unpacked layers removed (no image uses them any more).
    pub layers: u64,
    /// Blobs removed.
    pub blobs: u64,
}

/// `POST /v1/images/pull`: pull an image from an OCI / Docker v2 registry
/// into the hub's store.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullRequest {
    /// `[registry/]repository[:tag|@sha256:<hex>]`, e.g.
    /// `ghcr.io/org/app:1.2` (no registry: Docker Hub).
    pub reference: String,
    /// `name:tag` to give the image in the store (default: `reference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Registry credentials for this pull (else the hub's
    /// `--registry-config`, else anonymous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl std::fmt::Debug for PullRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullRequest")
            .field("reference", &self.reference)
            .field("tag", &self.tag)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A blob an image is made of: its digest and its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullLayer {
    pub digest: String,
    pub size: u64,
}

/// One line of `POST /v1/images/pull`'s NDJSON stream. The last line is
/// `done` or `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PullEvent {
    /// The reference resolved to this platform's manifest.
    Resolved {
        /// The reference as the registry knows it (`registry/repo:tag`).
        reference: String,
        /// The manifest's digest.
        digest: String,
        /// Layers, bottom first.
        layers: Vec<PullLayer>,
    },
    /// Download progress of one layer (at most every 256 KiB or 100 ms).
    Layer {
        digest: String,
        downloaded: u64,
        total: u64,
    },
    /// A layer is in the store: downloaded and checked, or `cached`
    /// (already there, nothing fetched).
    LayerDone { digest: String, cached: bool },
    /// The image is in the store.
    Done { image: Image },
    /// The pull failed; nothing of it is in the store's image list.
    Error { code: Code, message: String },
}

impl PullEvent {
    /// Whether this is the stream's last line.
    pub fn is_final(&self) -> bool {
        matches!(self, PullEvent::Done { .. } | PullEvent::Error { .. })
    }
}

/// `POST /v1/images/prepull`: pull images onto the machines that run
/// sandboxes before they are needed (on Kubernetes, every node the
/// template's Pods may run on, by DaemonSets).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrepullRequest {
    /// Image references, e.g. `docker.io/library/python:3.12`; 1 to
    /// [`MAX_PREPULL_REFERENCES`].
    pub references: Vec<String>,
    /// A template whose placement the pulls follow (on Kubernetes: its Pod
    /// template's tolerations, node selector and runtime class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Images pulled by one DaemonSet (Kubernetes), 1 to
    /// [`MAX_PREPULL_IMAGES_PER_POD`]; default [`DEFAULT_PREPULL_IMAGES_PER_POD`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub images_per_pod: Option<u32>,
    /// DaemonSets in flight at once (Kubernetes), 1 to
    /// [`MAX_PREPULL_PARALLEL`]; default [`DEFAULT_PREPULL_PARALLEL`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 64))]
    pub max_parallel: Option<u32>,
    /// Delete each DaemonSet once its pulls are done (Kubernetes); default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_when_done: Option<bool>,
    /// How long the whole pre-pull may take, in seconds; default
    /// [`DEFAULT_PREPULL_TIMEOUT_SECONDS`], at most [`MAX_PREPULL_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86400))]
    pub timeout_seconds: Option<u64>,
}

pub const MAX_PREPULL_REFERENCES: usize = 1000;
pub const DEFAULT_PREPULL_IMAGES_PER_POD: u32 = 25;
pub const MAX_PREPULL_IMAGES_PER_POD: u32 = 100;
pub const DEFAULT_PREPULL_PARALLEL: u32 = 4;
pub const MAX_PREPULL_PARALLEL: u32 = 64;
pub const DEFAULT_PREPULL_TIMEOUT_SECONDS: u64 = 1800;
pub const MAX_PREPULL_TIMEOUT_SECONDS: u64 = 86400;

/// What `POST /v1/images/prepull` did: every reference's outcome, and on
/// Kubernetes each DaemonSet's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrepullResult {
    /// True when every image was pulled everywhere it was meant to be.
    pub ok: bool,
    pub images: Vec<PrepullImage>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub daemonsets: Vec<PrepullDaemonSet>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrepullImage {
    pub reference: String,
    pub ok: bool,
    /// The image's id in the hub's store (local backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The DaemonSet that pulled it (Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemonset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One pre-pull DaemonSet (Kubernetes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrepullDaemonSet {
    pub name: String,
    pub images: Vec<String>,
    /// Nodes it was scheduled on (`desiredNumberScheduled`).
    pub nodes: i32,
    /// Nodes where every image is pulled (`numberReady`).
    pub ready: i32,
    /// Every scheduled node had pulled every image.
    pub completed: bool,
    /// Deleted afterwards (`delete_when_done`).
    pub deleted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds from creation to completion (or to giving up).
    pub seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_label_prefixes_cover_their_subdomains_only() {
        for key in [
            "agents.x-k8s.io/sandbox-name-hash",
            "extensions.agents.x-k8s.io/anything",
            "Agents.X-K8s.io/created-by",
            "kubernetes.io/metadata.name",
            "node-role.kubernetes.io/x",
            "k8s.io/x",
        ] {
            assert!(is_reserved_label(key), "{key}");
        }
        for key in [
            "team",
            "x-k8s.io/a",
            "notagents.x-k8s.io/a",
            "sandhub.io/mcp-session",
            "example.com/agents.x-k8s.io",
        ] {
            assert!(!is_reserved_label(key), "{key}");
        }
    }

    #[test]
    fn dns_labels() {
        assert!(is_dns_label("sb-1a2b"));
        assert!(is_dns_label("a"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label("a_b"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }

    #[test]
    fn command_accepts_string_or_argv() {
        let s: ExecRequest = serde_json::from_str(r#"{"command":"echo hi"}"#).unwrap();
        assert_eq!(s.command.argv(), ["/bin/sh", "-c", "echo hi"]);
        let a: ExecRequest = serde_json::from_str(r#"{"command":["ls","-l"]}"#).unwrap();
        assert_eq!(a.command.argv(), ["ls", "-l"]);
    }
}
