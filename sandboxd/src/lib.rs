//! sandboxd: the daemon inside every sandbox.
//!
//! It serves the upstream agent-sandbox sandboxd wire protocol (REST files
//! API, gRPC `process.v1`), Sandhub's `keep.v1` (processes that outlive
//! their stream) and `watcher.v1`, its own REST routes under
//! `/v1/_sandhub/` (usage, the entrypoint, code contexts, file metadata:
//! `meta.rs`), and the legacy python runtime endpoints, all confined to
//! one root directory.

pub mod auth;
pub mod code;
pub mod config;
pub mod confine;
pub mod entrypoint;
pub mod error;
pub mod fast_get;
pub mod files;
pub mod identity;
pub mod legacy;
pub mod meta;
pub mod metrics;
pub mod process;
pub mod rest;
pub mod server;
pub mod stop;
pub mod trace;
pub mod transfer;
pub mod trust;
pub mod usage;
pub mod watcher;

pub use config::Config;

// ---------------------------------------------------------------- the shared state
// `Daemon` is what every handler shares, so it lives here, in the parent of
// the modules that use it: `process` both holds a table in it and reads it,
// and as a sibling module it would import `process` back.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
    time::Instant,
};

use tokio::sync::Semaphore;

use crate::{auth::Auth, confine::Root, metrics::Metrics, process::ProcessTable};

/// Runs in every child between fork and exec (async-signal-safe code only).
/// The hub's local backend uses it to confine workloads (seccomp,
/// `no_new_privs`) without confining sandboxd itself.
pub type ChildSetup = fn() -> std::io::Result<()>;

pub struct Daemon {
    pub config: Config,
    /// Swapped when the workspace under the root is replaced (a reset
    /// mounts a fresh overlay on the same path).
    root: RwLock<Arc<Root>>,
    pub child_setup: Option<ChildSetup>,
    /// `--user`, resolved at start.
    pub run_as: Option<identity::RunAs>,
    /// `--entrypoint`, parsed.
    pub entrypoint: Vec<String>,
    /// How its latest start is doing.
    pub entrypoint_tracker: Arc<entrypoint::Tracker>,
    pub auth: Option<Auth>,
    pub metrics: Metrics,
    pub processes: ProcessTable,
    /// Code contexts: kernels this daemon started and speaks to.
    pub code: code::Contexts,
    /// One permit per concurrent WatchDir stream.
    pub watches: Arc<Semaphore>,
    pub started: Instant,
    draining: AtomicBool,
    /// Its own container's usage, sampled once asked (Kubernetes).
    pub usage: usage::OwnUsage,
}

impl Daemon {
    /// Builds the daemon from its flags: opens the root and loads the token.
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        Self::with_child_setup(config, None)
    }

    pub fn with_child_setup(
        config: Config,
        child_setup: Option<ChildSetup>,
    ) -> anyhow::Result<Arc<Self>> {
        let root = Root::open(&config.root_dir)
            .map_err(|e| anyhow::anyhow!("opening root dir {}: {e}", config.root_dir.display()))?;
        let auth = match (&config.auth_token_file, &config.auth_token_sha256) {
            (Some(file), _) => Some(Auth::from_file(file).map_err(anyhow::Error::msg)?),
            (None, Some(hex)) => Some(Auth::from_sha256_hex(hex).map_err(anyhow::Error::msg)?),
            (None, None) => None,
        };
        let auth = match &config.sandbox_token_sha256 {
            Some(hex) => Some(Auth::also_sha256_hex(auth, hex).map_err(anyhow::Error::msg)?),
            None => auth,
        };
        let run_as = match &config.user {
            Some(spec) => Some(
                identity::RunAs::resolve(spec, std::path::Path::new("/etc"))
                    .map_err(anyhow::Error::msg)?,
            ),
            None => None,
        };
        let entrypoint: Vec<String> = match &config.entrypoint {
            Some(json) => serde_json::from_str(json).map_err(|e| {
                anyhow::anyhow!("--entrypoint must be a JSON array of strings: {e}")
            })?,
            None => Vec::new(),
        };
        // Before any workload can touch the sandbox's /dev. Without one,
        // every spawn fails with this error; the daemon still serves files.
        if let Err(e) = process::dev_null() {
            tracing::warn!("opening /dev/null: {e}; no process can be started");
        }
        let daemon = Daemon {
            run_as,
            entrypoint,
            entrypoint_tracker: Arc::default(),
            watches: Arc::new(Semaphore::new(config.max_watches)),
            root: RwLock::new(Arc::new(root)),
            child_setup,
            auth,
            metrics: Metrics::default(),
            processes: ProcessTable::new(config.max_processes),
            code: code::Contexts::new(config.max_code_contexts),
            started: Instant::now(),
            draining: AtomicBool::new(false),
            usage: usage::OwnUsage::default(),
            config,
        };
        daemon.hand_root_to_user();
        if daemon.samples_usage_from_start() {
            daemon.usage.start();
        }
        Ok(Arc::new(daemon))
    }

    fn samples_usage_from_start(&self) -> bool {
        match self.config.usage_sampling.as_str() {
            "start" => true,
            "on-demand" => false,
            _ => self.config.unix_socket.is_none(),
        }
    }

    /// With `--user`, the root dir (the workspace) belongs to that user,
    /// so its workloads can write there. Where sandboxd may not chown (a
    /// non-root container) the root stays as it is.
    fn hand_root_to_user(&self) {
        if let Some(u) = &self.run_as {
            if let Err(e) =
                std::os::unix::fs::chown(&self.config.root_dir, Some(u.uid), Some(u.gid))
            {
                tracing::warn!(error = %e, "could not hand the root dir to --user");
            }
        }
    }

    /// Starts `--entrypoint`, if any, in the background (see
    /// [`entrypoint::start_entrypoint`]). Failures are logged: the sandbox
    /// stays usable without it.
    pub fn start_entrypoint(&self) {
        if self.entrypoint.is_empty() {
            return;
        }
        let cwd = match &self.config.default_cwd {
            Some(d) if d.is_dir() => d.clone(),
            _ => self.config.root_dir.clone(),
        };
        match entrypoint::start_entrypoint(
            &self.entrypoint,
            self.run_as.as_ref(),
            &cwd,
            self.child_setup,
        ) {
            Ok((child, log)) => {
                tracing::info!(pid = child.id(), argv = ?self.entrypoint, "entrypoint started");
                self.entrypoint_tracker.set_log(log);
                self.entrypoint_tracker.watch(child);
            }
            Err(e) => {
                tracing::warn!(error = %e, argv = ?self.entrypoint, "the entrypoint did not start");
                self.entrypoint_tracker.started(Err(e.to_string()));
            }
        }
    }

    /// The root every path resolves against.
    pub fn root(&self) -> Arc<Root> {
        self.root.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reopens the root directory, after something mounted over it.
    pub fn reload_root(&self) -> std::io::Result<()> {
        self.hand_root_to_user();
        let fresh = Arc::new(Root::open(&self.config.root_dir)?);
        *self.root.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// Health answers 503 from now on; work already running may finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}
