//! The Pod loop: one watch on the Pods bound to this node; every needed write runs as its
//! own task (bounded by a semaphore), so a burst of Pods becomes Ready in parallel.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Semaphore;

use super::ipam::Ipam;
use super::status::{status_patch, want, Want};
use super::FakeNodeConfig;

struct Shared {
    client: Client,
    ipam: Mutex<Ipam>,
    /// (pod uid, action) pairs being written right now: a watch event that arrives before
    /// our own write shows up must not start the same write again.
    in_flight: Mutex<HashSet<(String, Want)>>,
    permits: Semaphore,
}

pub async fn run(client: Client, config: FakeNodeConfig) -> Result<()> {
    let shared = Arc::new(Shared {
        client: client.clone(),
        ipam: Mutex::new(Ipam::new(config.pod_cidr)),
        in_flight: Mutex::new(HashSet::new()),
        permits: Semaphore::new(config.concurrency.max(1)),
    });
    let api: Api<Pod> = Api::all(client);
    let selector = format!("spec.nodeName={}", config.node_name);
    let mut events = watcher::watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    // Pods listed after a (re)start are buffered until the list is complete, so addresses
    // they already hold are reserved before any new Pod gets one.
    let mut listed: Vec<Pod> = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(pod)) => listed.push(pod),
            Ok(Event::InitDone) => {
                shared.relist(&listed);
                for pod in listed.drain(..) {
                    shared.handle(pod);
                }
            }
            Ok(Event::Apply(pod)) => shared.handle(pod),
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = pod.uid() {
                    shared.ipam.lock().unwrap().release(&uid);
                }
            }
            Err(e) => tracing::warn!("pod watch: {e} (retrying)"),
        }
    }
    bail!("the pod watch ended")
}

impl Shared {
    /// Brings the address book in line with a full list: Pods gone meanwhile give their
    /// address back; addresses listed Pods hold (or were just assigned) stay taken.
    fn relist(&self, pods: &[Pod]) {
        let listed: HashSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
        let mut ipam = self.ipam.lock().unwrap();
        ipam.retain(|uid| listed.contains(uid));
        for pod in pods {
            let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
            if let (Some(uid), Some(ip)) =
                (pod.uid(), ip.and_then(|ip| ip.parse::<Ipv4Addr>().ok()))
            {
                ipam.reserve(&uid, ip);
            }
        }
    }

    fn handle(self: &Arc<Self>, pod: Pod) {
        let wanted = want(&pod);
        let (Some(uid), Some(ns)) = (pod.uid(), pod.namespace()) else {
            return;
        };
        if wanted == Want::Nothing || !self.in_flight.lock().unwrap().insert((uid.clone(), wanted))
        {
            return;
        }
        let ip = match wanted {
            Want::Delete => None,
            _ => match self.ipam.lock().unwrap().assign(&uid) {
                Some(ip) => Some(ip),
                None => {
                    tracing::error!(pod = %pod.name_any(), "pod CIDR exhausted");
                    self.in_flight.lock().unwrap().remove(&(uid, wanted));
                    return;
                }
            },
        };
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            let _permit = shared.permits.acquire().await;
            let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
            let name = pod.name_any();
            let result = match ip {
                None => finish_deletion(&api, &name, &uid).await,
                Some(ip) => {
                    let patch = status_patch(&pod, wanted, ip);
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(|_| ())
                }
            };
            match result {
                Ok(()) => tracing::debug!(pod = %format!("{ns}/{name}"), ?wanted, "done"),
                // Gone meanwhile (404) or replaced by a new Pod of that name (409): nothing to do.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), ?wanted, "write failed: {e}")
                }
            }
            shared.in_flight.lock().unwrap().remove(&(uid, wanted));
        });
    }
}

/// Deletes with grace period 0, as a kubelet does once the containers stopped; the uid
/// precondition keeps a new Pod of the same name safe.
async fn finish_deletion(api: &Api<Pod>, name: &str, uid: &str) -> Result<(), kube::Error> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete(name, &params).await.map(|_| ())
}
