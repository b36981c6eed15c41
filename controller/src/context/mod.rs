//! What every reconciler shares: API clients, the effective flags, the watched config,
//! metrics and the event recorder. Built once in `main` and passed as `Arc<Context>`.
//!
//! - [`refill`]: when a warm pool may replace claimed members (claims first;
//!   pure). It lives here, not under `warmpool`, because the context holds
//!   the one gate both the claim and the warm-pool controllers use.
//! - [`cache`]: a reflector store kept by a background task, for any
//!   controller.
//! - [`shared_cache`]: the same, plus a stream of the objects it stored, for
//!   a controller whose reconcile reads the store its trigger came from.

pub mod refill;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::config::SharedConfig;
use crate::flags::Flags;
use crate::metrics::Metrics;
use refill::RefillGate;
use sandhub_api::k8s::Sandbox;
use sandhub_api::sandboxd_token::SandboxdTokens;

/// Field manager / event reporter names, as upstream.
pub const SANDBOX_CONTROLLER: &str = "sandbox-controller";
pub const SANDBOX_CLAIM_CONTROLLER: &str = "sandboxclaim-controller";
pub const SANDBOX_WARM_POOL_CONTROLLER: &str = "sandboxwarmpool-controller";
pub const SANDBOX_TEMPLATE_CONTROLLER: &str = "sandboxtemplate-controller";

pub struct Context {
    /// Reads and writes.
    pub client: Client,
    /// Watches; a separate connection pool with `--separate-watch-connection`, else `client`.
    pub watch_client: Client,
    /// Effective flags (command line, environment, then the ConfigMap).
    pub flags: Flags,
    /// Settings that change at run time (label-domain allowlist).
    pub shared: Arc<SharedConfig>,
    pub metrics: Arc<Metrics>,
    /// Set once this replica leads and its controllers have started; `/readyz` reports it.
    pub ready: AtomicBool,
    /// The Sandbox controller's cache, for the `agent_sandboxes` gauge at scrape time.
    pub sandbox_store: OnceLock<Store<Sandbox>>,
    /// Claims tell warm pools when they adopt; pools hold refills meanwhile.
    pub refill: RefillGate,
    /// `--sandboxd-token-key-file`: each Pod gets its own token's digest.
    pub sandboxd_tokens: Option<SandboxdTokens>,
    /// One event recorder per controller, for the life of the process: a
    /// recorder remembers what it published, so an Event repeated by a pass
    /// that read a stale cache becomes one Event with a count, not a second.
    recorders: Mutex<HashMap<String, Recorder>>,
}

impl Context {
    pub fn new(
        client: Client,
        watch_client: Client,
        flags: Flags,
        shared: Arc<SharedConfig>,
    ) -> Self {
        Self {
            client,
            watch_client,
            shared,
            metrics: Arc::new(Metrics::new()),
            ready: AtomicBool::new(false),
            sandbox_store: OnceLock::new(),
            refill: RefillGate::new(
                flags.sandbox_warm_pool_replenish_delay,
                flags.sandbox_warm_pool_max_refill_rate,
            ),
            flags,
            sandboxd_tokens: None,
            recorders: Mutex::default(),
        }
    }

    pub fn with_sandboxd_tokens(mut self, tokens: Option<SandboxdTokens>) -> Self {
        self.sandboxd_tokens = tokens;
        self
    }

    /// `--watch-namespace`, if the controllers are restricted to one namespace.
    pub fn watch_namespace(&self) -> Option<&str> {
        self.flags.watch_namespace.as_deref()
    }

    /// An API over every watched namespace (all, or `--watch-namespace`) for reads/writes.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        match self.watch_namespace() {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// The same scope as [`Context::api`], on the watch client: feed this to watchers.
    pub fn watch_api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        match self.watch_namespace() {
            Some(ns) => Api::namespaced(self.watch_client.clone(), ns),
            None => Api::all(self.watch_client.clone()),
        }
    }

    /// An API in one namespace (for writes to a known object).
    pub fn api_in<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Default watcher config: `any_semantic` lists are served from the apiserver's watch
    /// cache, which keeps a burst of restarts cheap.
    pub fn watcher_config(&self) -> watcher::Config {
        watcher::Config::default().any_semantic()
    }

    /// An event recorder reporting as `controller`.
    /// `controller`'s event recorder (the same one on every call).
    pub fn recorder(&self, controller: &str) -> Recorder {
        let mut recorders = self.recorders.lock().unwrap_or_else(|p| p.into_inner());
        recorders
            .entry(controller.to_string())
            .or_insert_with(|| {
                let reporter = Reporter {
                    controller: controller.to_string(),
                    instance: std::env::var("POD_NAME").ok(),
                };
                Recorder::new(self.client.clone(), reporter)
            })
            .clone()
    }

    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// A reflector store of `K` kept by a background task.
pub(crate) fn cache<K>(api: Api<K>, wc: watcher::Config) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&()).to_string();
    let stream = reflector::reflector(writer, kube::runtime::watcher(api, wc))
        .default_backoff()
        .for_each(move |ev| {
            // The watcher retries with backoff; say why, or a cache that
            // never syncs leaves no trace.
            if let Err(e) = ev {
                tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
            }
            futures::future::ready(())
        });
    tokio::spawn(stream);
    reader
}

/// How many changed objects a [`shared_cache`] holds for a slow consumer
/// before its watch waits (backpressure, not loss).
const SHARED_CACHE_BUFFER: usize = 1024;

/// A reflector store kept by a background task, and a stream of each object
/// *after* the store took it. A controller that reconciles from a store must
/// be triggered by this stream, not by a watch of its own: a separate watch
/// can deliver a change before the store has it, and a reconcile that then
/// reads the old object may conclude there is nothing to do and wait for a
/// change that already came (a warm pool once kept its stale members that
/// way). Deletions are not streamed: use it where they need no trigger.
pub(crate) fn shared_cache<K>(api: Api<K>, wc: watcher::Config) -> (Store<K>, ReflectHandle<K>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store_shared(SHARED_CACHE_BUFFER);
    let changes = writer
        .subscribe()
        .expect("a shared store always has a dispatcher");
    let kind = K::kind(&()).to_string();
    let stream = kube::runtime::watcher(api, wc)
        .default_backoff()
        .reflect_shared(writer)
        .for_each(move |ev| {
            if let Err(e) = ev {
                tracing::warn!(kind = %kind, error = %e, "watch failed; retrying");
            }
            futures::future::ready(())
        });
    tokio::spawn(stream);
    (reader, changes)
}
