//! Coalescing: pulls of one reference by one tenant with the same
//! credentials share a flight, so the second caller gets the first's
//! events and result. A blob is fetched by one pull of the tenant at a
//! time (a lock per tenant and digest), so two pulls of images sharing a
//! layer fetch it once. [`Pulls`] holds this state, and the hub's
//! registry settings.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Instant,
};

use oci_client::secrets::RegistryAuth;
use sandhub_api::{
    error::ErrorBody,
    hub::{Image, PullEvent},
};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{internal, PullOptions};
use crate::local::{image::ImageStore, RegistryArgs};

/// The store's pull state: settings, flights, blob locks.
pub struct Pulls {
    args: Mutex<RegistryArgs>,
    flights: Mutex<HashMap<String, Arc<Flight>>>,
    blob_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Blobs in `partial/` checked whole by this process, not yet moved
    /// into `blobs/`, as `<tenant key>/<hex>`.
    verified: Mutex<HashSet<String>>,
}

impl Default for Pulls {
    fn default() -> Self {
        Pulls {
            args: Mutex::new(RegistryArgs::default()),
            flights: Mutex::default(),
            blob_locks: Mutex::default(),
            verified: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Everyone waiting on one pull: its events so far (enough to catch up)
/// and where to send the next.
#[derive(Default)]
pub(super) struct Flight {
    state: Mutex<FlightState>,
}

#[derive(Default)]
struct FlightState {
    subscribers: Vec<mpsc::UnboundedSender<PullEvent>>,
    /// `resolved` and `layer_done` so far, for a late joiner.
    replay: Vec<PullEvent>,
    last: Option<PullEvent>,
}

impl Flight {
    pub(super) fn emit(&self, event: PullEvent) {
        let mut s = lock(&self.state);
        if matches!(
            event,
            PullEvent::Resolved { .. } | PullEvent::LayerDone { .. }
        ) {
            s.replay.push(event.clone());
        }
        if event.is_final() {
            s.last = Some(event.clone());
        }
        s.subscribers.retain(|tx| tx.send(event.clone()).is_ok());
        if event.is_final() {
            s.subscribers.clear();
        }
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<PullEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut s = lock(&self.state);
        for e in &s.replay {
            let _ = tx.send(e.clone());
        }
        match &s.last {
            Some(last) => {
                let _ = tx.send(last.clone());
            }
            None => s.subscribers.push(tx),
        }
        rx
    }
}

/// Held while one blob is fetched; forgets the blob's lock when no one
/// else waits on it.
pub(super) struct BlobLock<'a> {
    pulls: &'a Pulls,
    hex: String,
    pub(super) lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for BlobLock<'_> {
    fn drop(&mut self) {
        let mut locks = lock(&self.pulls.blob_locks);
        // The map's reference and ours: nobody else holds or waits.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.hex);
        }
    }
}

impl Pulls {
    /// The hub's registry flags (set once at start).
    pub fn configure(&self, args: RegistryArgs) {
        *lock(&self.args) = args;
    }

    pub(super) fn args(&self) -> RegistryArgs {
        lock(&self.args).clone()
    }

    pub(super) fn blob_lock(&self, hex: &str) -> BlobLock<'_> {
        let lock = lock(&self.blob_locks)
            .entry(hex.to_string())
            .or_default()
            .clone();
        BlobLock {
            pulls: self,
            hex: hex.to_string(),
            lock,
        }
    }

    pub(super) fn is_verified(&self, key: &str) -> bool {
        lock(&self.verified).contains(key)
    }

    /// Records a partial blob (`<tenant key>/<hex>`) checked whole.
    pub(super) fn mark_verified(&self, key: String) {
        lock(&self.verified).insert(key);
    }

    /// Forgets a partial blob (`<tenant key>/<hex>`) that was removed.
    pub(in crate::local::image) fn forget(&self, key: &str) {
        lock(&self.verified).remove(key);
    }
}

impl ImageStore {
    /// Pulls `reference` for `tenant` into the store. Events go to
    /// `progress` as they happen, the last being `done` or `error`; a pull
    /// already under way for the same reference, tenant, tag and
    /// credentials is joined instead of repeated. The pull itself runs on
    /// its own task: a caller going away does not cut it short for others.
    pub async fn pull(
        self: &Arc<Self>,
        tenant: &str,
        reference: &str,
        opts: PullOptions,
        progress: Option<mpsc::UnboundedSender<PullEvent>>,
    ) -> Result<Image, ErrorBody> {
        let send = |e: PullEvent| {
            if let Some(tx) = &progress {
                let _ = tx.send(e);
            }
        };
        let prepared = self.prepare(reference, opts);
        let (target, tag, auth) = match prepared {
            Ok(p) => p,
            Err(e) => {
                send(PullEvent::Error {
                    code: e.code,
                    message: e.message.clone(),
                });
                return Err(e);
            }
        };
        let who = match &auth {
            RegistryAuth::Basic(u, p) => {
                hex::encode(Sha256::digest(format!("{u}\0{p}").as_bytes()))
            }
            _ => String::new(),
        };
        let key = format!("{tenant}\0{}\0{tag}\0{who}", target.whole());
        let mut rx = {
            let mut flights = lock(&self.pulls.flights);
            if let Some(flight) = flights.get(&key) {
                tracing::info!(reference, "joining a pull under way");
                flight.subscribe()
            } else {
                let flight = Arc::new(Flight::default());
                flights.insert(key.clone(), flight.clone());
                let rx = flight.subscribe();
                let store = self.clone();
                let tenant = tenant.to_string();
                let reference = reference.to_string();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let result = store
                        .run_pull(&tenant, &reference, &target, &tag, auth, &flight)
                        .await;
                    lock(&store.pulls.flights).remove(&key);
                    match result {
                        Ok(image) => {
                            tracing::info!(reference, id = %image.id, secs = started.elapsed().as_secs_f64(), "image pulled");
                            flight.emit(PullEvent::Done { image });
                        }
                        Err(e) => {
                            tracing::warn!(reference, code = %e.code, error = %e.message, "image pull failed");
                            flight.emit(PullEvent::Error {
                                code: e.code,
                                message: e.message,
                            });
                        }
                    }
                });
                rx
            }
        };
        while let Some(event) = rx.recv().await {
            send(event.clone());
            match event {
                PullEvent::Done { image } => return Ok(image),
                PullEvent::Error { code, message } => return Err(ErrorBody::new(code, message)),
                _ => {}
            }
        }
        let e = internal("the pull task", "ended without an answer");
        send(PullEvent::Error {
            code: e.code,
            message: e.message.clone(),
        });
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use sandhub_api::error::Code;

    use super::*;

    #[test]
    fn a_late_joiner_catches_up() {
        let f = Flight::default();
        let mut early = f.subscribe();
        f.emit(PullEvent::Resolved {
            reference: "r".into(),
            digest: "d".into(),
            layers: vec![],
        });
        f.emit(PullEvent::Layer {
            digest: "l".into(),
            downloaded: 1,
            total: 2,
        });
        let mut late = f.subscribe();
        f.emit(PullEvent::Error {
            code: Code::NotFound,
            message: "m".into(),
        });
        let mut after = f.subscribe();
        let drain = |rx: &mut mpsc::UnboundedReceiver<PullEvent>| {
            let mut v = Vec::new();
            while let Ok(e) = rx.try_recv() {
                v.push(e);
            }
            v
        };
        assert_eq!(drain(&mut early).len(), 3);
        let late = drain(&mut late);
        assert!(matches!(late[0], PullEvent::Resolved { .. }));
        assert!(late[1].is_final() && late.len() == 2);
        assert_eq!(drain(&mut after).len(), 2);
    }
}
