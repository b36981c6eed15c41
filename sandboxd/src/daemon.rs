//! The state every handler shares: one per sandboxd.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Instant,
};

use tokio::sync::Semaphore;

use crate::{auth::Auth, config::Config, confine::Root, metrics::Metrics, process::ProcessTable};

pub struct Daemon {
    pub config: Config,
    pub root: Root,
    pub auth: Option<Auth>,
    pub metrics: Metrics,
    pub processes: ProcessTable,
    /// One permit per concurrent WatchDir stream.
    pub watches: Arc<Semaphore>,
    pub started: Instant,
    draining: AtomicBool,
}

impl Daemon {
    /// Builds the daemon from its flags: opens the root and loads the token.
    pub fn new(config: Config) -> anyhow::Result<Arc<Self>> {
        let root = Root::open(&config.root_dir)
            .map_err(|e| anyhow::anyhow!("opening root dir {}: {e}", config.root_dir.display()))?;
        let auth = match (&config.auth_token_file, &config.auth_token_sha256) {
            (Some(file), _) => Some(Auth::from_file(file).map_err(anyhow::Error::msg)?),
            (None, Some(hex)) => Some(Auth::from_sha256_hex(hex).map_err(anyhow::Error::msg)?),
            (None, None) => None,
        };
        Ok(Arc::new(Daemon {
            watches: Arc::new(Semaphore::new(config.max_watches)),
            root,
            auth,
            metrics: Metrics::default(),
            processes: ProcessTable::default(),
            started: Instant::now(),
            draining: AtomicBool::new(false),
            config,
        }))
    }

    /// Health answers 503 from now on; work already running may finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}
