//! Claim events, published one at a time in the background.
//!
//! Events are for humans, and a claim's latency is not theirs to pay. One
//! publisher with a bounded queue keeps them out of a burst's way: a task per
//! event put hundreds of event writes in flight next to the claims' own,
//! and the API server shares its throughput among requests in flight.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::mpsc;

/// Events waiting beyond this are dropped (and logged at debug).
const QUEUE: usize = 4096;

#[derive(Clone)]
pub struct EventQueue {
    tx: mpsc::Sender<(Event, ObjectReference)>,
}

impl EventQueue {
    /// Starts the publisher task.
    pub fn start(recorder: Recorder) -> Self {
        let (tx, mut rx) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        tokio::spawn(async move {
            while let Some((ev, reference)) = rx.recv().await {
                if let Err(e) = recorder.publish(&ev, &reference).await {
                    tracing::debug!(error = %e, "publishing a claim event failed");
                }
            }
        });
        Self { tx }
    }

    pub fn send(&self, ev: Event, reference: ObjectReference) {
        if self.tx.try_send((ev, reference)).is_err() {
            tracing::debug!("claim event queue full; event dropped");
        }
    }
}
