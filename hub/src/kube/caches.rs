//! What a create reads from the hub's watches instead of asking the API
//! server: pools and templates by name, each Sandbox's labels, and a
//! wake-up for the claim a create waits on.
//!
//! On the test cluster's real node these reads were most of a warm
//! create's time in the hub (docs/benchmarks.md): six GETs before the claim
//! POST (a 404 on the tenant's scoped name, then the plain name, for the
//! pool twice and the template once), a list and a watch per create to
//! wait for Ready, whose connection is dropped when the wait ends (so the
//! next request paid a TLS handshake), then a Sandbox GET and two more
//! template GETs.
//!
//! A cache answers only what it is sure of; every miss asks the API server,
//! which has the precise answer (a name created a moment ago, or none):
//! - a store whose first list has not finished answers nothing;
//! - a pool or template this hub wrote in the last [`WRITTEN_TTL`] is read
//!   from the API server, so a caller reads its own writes (a tenant's new
//!   template that shadows the operator's of the same name is used at once);
//! - which object a name means to a tenant is decided as before, by
//!   [`super::owner::owner`] on what was found, so a cache can never show
//!   one tenant another's object.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{FutureExt, StreamExt};
use kube::{
    api::PartialObjectMeta,
    runtime::{
        reflector::{self, ObjectRef, Store},
        watcher, WatchStreamExt,
    },
    Api,
};
use sandhub_api::k8s::{Sandbox as SandboxCr, SandboxClaim, SandboxTemplate, SandboxWarmPool};
use tokio::sync::Notify;

/// How long a pool or template this hub wrote is read from the API server
/// rather than a watch (far longer than any watch lag).
const WRITTEN_TTL: Duration = Duration::from_secs(30);

/// The watched kinds' stores (see the module's comment).
pub(crate) struct Caches {
    namespace: String,
    pools: Store<SandboxWarmPool>,
    templates: Store<SandboxTemplate>,
    /// Sandboxes' metadata only: their labels are all the hub reads.
    sandboxes: Store<PartialObjectMeta<SandboxCr>>,
    /// Cluster names of pools and templates this hub wrote lately.
    written: Mutex<HashMap<String, Instant>>,
}

/// What can be looked up by cluster name: the pools' and templates' stores.
pub(crate) trait Watched: kube::Resource<DynamicType = ()> + Clone + 'static {
    fn store(caches: &Caches) -> &Store<Self>;
    /// Keys [`Caches::written`] (a pool and a template may share a name).
    const KIND: &'static str;
}

impl Watched for SandboxWarmPool {
    fn store(caches: &Caches) -> &Store<Self> {
        &caches.pools
    }
    const KIND: &'static str = "pool";
}

impl Watched for SandboxTemplate {
    fn store(caches: &Caches) -> &Store<Self> {
        &caches.templates
    }
    const KIND: &'static str = "template";
}

/// True once `store`'s first list is in.
fn ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

impl Caches {
    pub fn new(
        namespace: &str,
        pools: Store<SandboxWarmPool>,
        templates: Store<SandboxTemplate>,
        sandboxes: Store<PartialObjectMeta<SandboxCr>>,
    ) -> Self {
        Caches {
            namespace: namespace.to_string(),
            pools,
            templates,
            sandboxes,
            written: Mutex::default(),
        }
    }

    /// The watch's copy of the pool or template `object` (a cluster name):
    /// `Some(None)` when the watch is sure there is none, `None` when only
    /// the API server can say (not listed yet, or written here lately).
    pub fn lookup<K: Watched>(&self, object: &str) -> Option<Option<Arc<K>>> {
        let store = K::store(self);
        if !ready(store) || self.written_lately(K::KIND, object) {
            return None;
        }
        Some(store.get(&ObjectRef::new(object).within(&self.namespace)))
    }

    /// The hub just wrote (or deleted) pool or template `object`.
    pub fn wrote<K: Watched>(&self, object: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.retain(|_, at| at.elapsed() < WRITTEN_TTL);
        written.insert(format!("{}/{object}", K::KIND), Instant::now());
    }

    fn written_lately(&self, kind: &str, object: &str) -> bool {
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&format!("{kind}/{object}"))
            .is_some_and(|at| at.elapsed() < WRITTEN_TTL)
    }

    /// Label `key` of Sandbox `name`, as the watch last saw it; `None`
    /// when the watch has not seen the Sandbox or the label (the caller
    /// asks the API server).
    pub fn sandbox_label(&self, name: &str, key: &str) -> Option<String> {
        let sb = self
            .sandboxes
            .get(&ObjectRef::new(name).within(&self.namespace))?;
        sb.metadata.labels.as_ref()?.get(key).cloned()
    }
}

/// A store of `K` in `namespace` kept by a watch, and the stream that keeps
/// it (the caller polls it, and may look at each event on the way).
pub(crate) fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync,
    K: 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    (reader, stream)
}

/// The Sandboxes' metadata, kept by a watch of its own.
pub(crate) fn sandbox_metadata(
    client: &kube::Client,
    namespace: &str,
) -> Store<PartialObjectMeta<SandboxCr>> {
    let api: Api<PartialObjectMeta<SandboxCr>> = Api::namespaced(client.clone(), namespace);
    let (store, stream) = reflect(api, watcher::Config::default());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "Sandbox metadata watch");
            }
        }
    });
    store
}

/// Wakes the creates waiting on a claim when the claim watch sees it
/// change, so a create waits on the one watch every claim shares instead of
/// a list and a watch of its own.
#[derive(Default)]
pub(crate) struct ClaimWaiters(Mutex<HashMap<String, Arc<Notify>>>);

impl ClaimWaiters {
    /// Registers a wait on claim `name`, until the guard is dropped.
    pub fn wait(self: &Arc<Self>, name: &str) -> ClaimWait {
        let notify = Arc::new(Notify::new());
        self.lock().insert(name.to_string(), notify.clone());
        ClaimWait {
            waiters: self.clone(),
            name: name.to_string(),
            notify,
        }
    }

    /// What the claim watch saw: the claim it names changed (its copy in
    /// the store already is the new one); a relist may have changed any.
    pub fn saw(&self, ev: &watcher::Event<SandboxClaim>) {
        let waiters = self.lock();
        if waiters.is_empty() {
            return;
        }
        match ev {
            watcher::Event::Apply(c) | watcher::Event::Delete(c) => {
                if let Some(n) = c.metadata.name.as_ref().and_then(|n| waiters.get(n)) {
                    n.notify_one();
                }
            }
            watcher::Event::InitDone => waiters.values().for_each(|n| n.notify_one()),
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One create's wait on its claim (see [`ClaimWaiters::wait`]).
pub(crate) struct ClaimWait {
    waiters: Arc<ClaimWaiters>,
    name: String,
    notify: Arc<Notify>,
}

impl ClaimWait {
    /// Returns once the claim watch has seen the claim change since the
    /// last call (a change before the first call counts: its wake-up is
    /// kept).
    pub async fn changed(&self) {
        self.notify.notified().await
    }
}

impl Drop for ClaimWait {
    fn drop(&mut self) {
        let mut waiters = self.waiters.lock();
        if waiters
            .get(&self.name)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            waiters.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> SandboxClaim {
        let mut c = SandboxClaim::new(name, Default::default());
        c.metadata.namespace = Some("ns".into());
        c
    }

    #[tokio::test]
    async fn a_change_seen_before_the_wait_is_not_lost() {
        let waiters = Arc::new(ClaimWaiters::default());
        let wait = waiters.wait("sb-1");
        waiters.saw(&watcher::Event::Apply(claim("sb-1")));
        tokio::time::timeout(Duration::from_secs(5), wait.changed())
            .await
            .expect("the kept wake-up");
    }

    #[tokio::test]
    async fn only_the_named_claim_and_a_relist_wake_a_wait() {
        let waiters = Arc::new(ClaimWaiters::default());
        let wait = waiters.wait("sb-1");
        waiters.saw(&watcher::Event::Apply(claim("sb-2")));
        waiters.saw(&watcher::Event::InitApply(claim("sb-1")));
        let quiet = tokio::time::timeout(Duration::from_millis(50), wait.changed()).await;
        assert!(quiet.is_err(), "woken by another claim");
        waiters.saw(&watcher::Event::InitDone);
        tokio::time::timeout(Duration::from_secs(5), wait.changed())
            .await
            .expect("a relist wakes every wait");
        waiters.saw(&watcher::Event::Delete(claim("sb-1")));
        tokio::time::timeout(Duration::from_secs(5), wait.changed())
            .await
            .expect("a delete wakes its wait");
    }

    #[test]
    fn a_dropped_wait_is_forgotten() {
        let waiters = Arc::new(ClaimWaiters::default());
        drop(waiters.wait("sb-1"));
        assert!(waiters.lock().is_empty());
    }

    #[tokio::test]
    async fn a_store_not_listed_yet_and_a_name_written_lately_ask_the_api_server() {
        let (pools, mut pool_writer) = reflector::store::<SandboxWarmPool>();
        let (templates, mut template_writer) = reflector::store::<SandboxTemplate>();
        let (sandboxes, _) = reflector::store::<PartialObjectMeta<SandboxCr>>();
        let caches = Caches::new("ns", pools, templates, sandboxes);
        assert!(caches.lookup::<SandboxWarmPool>("python").is_none());

        let mut pool = SandboxWarmPool::new("python", Default::default());
        pool.metadata.namespace = Some("ns".into());
        pool_writer.apply_watcher_event(&watcher::Event::Init);
        pool_writer.apply_watcher_event(&watcher::Event::InitApply(pool));
        pool_writer.apply_watcher_event(&watcher::Event::InitDone);
        template_writer.apply_watcher_event(&watcher::Event::Init);
        template_writer.apply_watcher_event(&watcher::Event::InitDone);
        let found = caches.lookup::<SandboxWarmPool>("python");
        assert!(matches!(found, Some(Some(p)) if p.metadata.name.as_deref() == Some("python")));
        assert!(matches!(
            caches.lookup::<SandboxWarmPool>("other"),
            Some(None)
        ));
        // A template of the same name is another object.
        assert!(matches!(
            caches.lookup::<SandboxTemplate>("python"),
            Some(None)
        ));

        caches.wrote::<SandboxWarmPool>("python");
        assert!(caches.lookup::<SandboxWarmPool>("python").is_none());
        assert!(caches.lookup::<SandboxTemplate>("python").is_some());
    }
}
