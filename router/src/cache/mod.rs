//! The Pod cache: a watch on sandbox Pods (label
//! `agents.x-k8s.io/sandbox-name-hash`) feeding [`index::PodIndex`], so most
//! requests reach their Pod by IP without a DNS lookup.

pub mod index;

use std::{
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    runtime::watcher::{self, Event},
    Api,
};
use sandhub_api::k8s::names::{SANDBOX_NAME_HASH, WARM_POOL_SANDBOX};

use crate::metrics::Metrics;
pub use index::{PodEntry, PodIndex};

pub struct PodCache {
    index: RwLock<PodIndex>,
    synced: AtomicBool,
    metrics: Arc<Metrics>,
}

impl PodCache {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            index: RwLock::new(PodIndex::default()),
            synced: AtomicBool::new(false),
            metrics,
        }
    }

    /// Whether the first full list has arrived.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn by_uid(&self, uid: &str) -> Option<(IpAddr, String)> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.by_uid(uid).map(|p| (p.ip, p.uid.clone()))
    }

    pub fn by_name(&self, namespace: &str, name: &str) -> Option<(IpAddr, String)> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.by_name(namespace, name).map(|p| (p.ip, p.uid.clone()))
    }

    /// Drops a Pod whose address did not answer; the next watch event for it
    /// puts it back if it is still there.
    pub fn evict(&self, uid: &str) {
        let mut idx = self.index.write().unwrap_or_else(|e| e.into_inner());
        if idx.remove(uid).is_some() {
            self.metrics.cache_invalidations.inc();
            tracing::info!(uid, "evicted unreachable Pod from the cache");
        }
    }

    pub fn len(&self) -> usize {
        self.index.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn apply(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut idx = self.index.write().unwrap_or_else(|e| e.into_inner());
        match entry(pod) {
            Some(e) => idx.upsert(e),
            None => {
                idx.remove(&uid);
            }
        }
    }

    fn delete(&self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.index
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(uid);
        }
    }

    /// Keeps the index in step with the API server until the task is dropped.
    /// The watcher relists after errors on its own (with backoff).
    pub async fn run(self: Arc<Self>, client: kube::Client, namespace: Option<String>) {
        let api: Api<Pod> = match &namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let config = watcher::Config::default().labels(SANDBOX_NAME_HASH);
        let mut stream = watcher::watcher(api, config).boxed();
        let mut staging: Option<PodIndex> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Init) => staging = Some(PodIndex::default()),
                Ok(Event::InitApply(pod)) => {
                    if let (Some(s), Some(e)) = (staging.as_mut(), entry(&pod)) {
                        s.upsert(e);
                    }
                }
                Ok(Event::InitDone) => {
                    if let Some(s) = staging.take() {
                        let n = s.len();
                        *self.index.write().unwrap_or_else(|e| e.into_inner()) = s;
                        tracing::info!(pods = n, "Pod cache synced");
                    }
                    self.synced.store(true, Ordering::Release);
                }
                Ok(Event::Apply(pod)) => self.apply(&pod),
                Ok(Event::Delete(pod)) => self.delete(&pod),
                Err(e) => {
                    tracing::warn!(error = %e, "Pod watch failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// A routable Pod: labelled, not being deleted, Ready, with an IP.
pub fn entry(pod: &Pod) -> Option<PodEntry> {
    let meta = &pod.metadata;
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let labels = meta.labels.as_ref()?;
    let name_hash = labels.get(SANDBOX_NAME_HASH)?.clone();
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    Some(PodEntry {
        uid: meta.uid.clone()?,
        owner_uids: meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone()?,
        name_hash,
        warm_pool: labels.contains_key(WARM_POOL_SANDBOX),
        ip,
    })
}
