//! Changes that run to their end, for both backends: a create, delete or
//! other lifecycle change runs as a task of its own that the caller only
//! waits for.
//!
//! A caller that goes away (an HTTP client that hangs up, a timeout) drops
//! only its wait. What the change has begun (a sandbox launched, a claim
//! made, a row written) is carried to its end, never left half done: a
//! running sandbox behind a row stuck in `Pending` on the local backend, a
//! claim whose Pod can never start on Kubernetes.
//!
//! Each task holds one of its tenant's [`CHANGES_PER_TENANT`] permits,
//! taken while the caller still waits: a caller that hangs up before it
//! has one starts nothing, so hanging up and asking again cannot pile up
//! tasks. These permits, not connections, bound how many changes a tenant
//! has running at once.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
};

use sandhub_client::{Error, Result};
use tokio::sync::Semaphore;
use tracing::Instrument;

/// How many changes of one tenant may run as tasks of their own at once;
/// more wait for a permit while their callers wait.
pub const CHANGES_PER_TENANT: usize = 64;

/// Per tenant, the permits of its changes.
#[derive(Default)]
pub struct Changes(Mutex<HashMap<String, Arc<Semaphore>>>);

impl Changes {
    /// Runs `change` as a task of its own under one of `tenant`'s permits,
    /// and waits for it.
    pub async fn to_the_end<T: Send + 'static>(
        &self,
        tenant: &str,
        change: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        run(self.permits(tenant), change).await
    }

    fn permits(&self, tenant: &str) -> Arc<Semaphore> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(permits) = map.get(tenant) {
            return permits.clone();
        }
        let permits = Arc::new(Semaphore::new(CHANGES_PER_TENANT));
        map.insert(tenant.to_string(), permits.clone());
        permits
    }
}

/// Takes a permit while the caller waits, then runs `change` as a task
/// holding it.
async fn run<T: Send + 'static>(
    permits: Arc<Semaphore>,
    change: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let permit = permits
        .acquire_owned()
        .await
        .map_err(|_| Error::internal("the hub is shutting down"))?;
    let change = async move {
        let _held = permit;
        change.await
    };
    tokio::spawn(change.in_current_span()).await.map_err(|e| {
        // A panic's message may name the hub's internals: it goes to
        // the log (the panic hook printed it), not to the caller.
        tracing::error!(error = %e, "a change to sandboxes did not finish");
        Error::internal("the change did not finish (the hub's log says why)")
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::error::Code;
    use std::time::Duration;

    #[tokio::test]
    async fn one_tenants_changes_are_bounded_and_a_caller_without_a_permit_starts_nothing() {
        let changes = Arc::new(Changes::default());
        let (release, hold) = tokio::sync::watch::channel(false);
        let mut running = Vec::new();
        for _ in 0..CHANGES_PER_TENANT {
            let (changes, mut hold) = (changes.clone(), hold.clone());
            running.push(tokio::spawn(async move {
                changes
                    .to_the_end("alice", async move {
                        let _ = hold.wait_for(|go| *go).await;
                        Ok(())
                    })
                    .await
            }));
        }
        while changes.permits("alice").available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        // The 65th waits for a permit; its caller hangs up and nothing starts.
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = started.clone();
        let extra = changes.to_the_end("alice", async move {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        assert!(tokio::time::timeout(Duration::from_millis(20), extra)
            .await
            .is_err());
        // Another tenant is not held up by alice's.
        changes
            .to_the_end("bob", async { Ok(()) })
            .await
            .expect("bob's change runs");
        release.send(true).unwrap();
        for r in running {
            r.await.unwrap().unwrap();
        }
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(
            changes.permits("alice").available_permits(),
            CHANGES_PER_TENANT
        );
    }

    #[tokio::test]
    async fn a_change_runs_to_its_end_without_its_caller() {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let gate = Arc::new(tokio::sync::Notify::new());
        let opened = gate.clone();
        let waiting = run(Arc::new(Semaphore::new(1)), async move {
            opened.notified().await;
            let _ = done_tx.send(());
            Ok(())
        });
        // The caller gives up (its future dropped) before the change ends.
        let gave_up = tokio::time::timeout(Duration::from_millis(20), waiting).await;
        assert!(gave_up.is_err());
        gate.notify_one();
        tokio::time::timeout(Duration::from_secs(10), done_rx)
            .await
            .expect("the change ran on after its caller went away")
            .unwrap();
    }

    #[tokio::test]
    async fn a_change_that_panics_is_an_internal_error_that_does_not_tell_why() {
        let permits = Arc::new(Semaphore::new(1));
        let err = run::<()>(permits.clone(), async {
            panic!("at /var/lib/sandhub/secret")
        })
        .await
        .unwrap_err();
        assert_eq!(err.code, Code::Internal);
        assert!(!err.message.contains("secret"), "{}", err.message);
        assert_eq!(permits.available_permits(), 1, "the permit is given back");
    }

    #[tokio::test]
    async fn a_caller_that_hangs_up_before_a_permit_starts_nothing() {
        let permits = Arc::new(Semaphore::new(1));
        let gate = Arc::new(tokio::sync::Notify::new());
        let opened = gate.clone();
        let first = tokio::spawn(run(permits.clone(), async move {
            opened.notified().await;
            Ok(())
        }));
        while permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = started.clone();
        let second = run(permits.clone(), async move {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        // The second caller gives up while the first holds the only permit.
        let gave_up = tokio::time::timeout(Duration::from_millis(20), second).await;
        assert!(gave_up.is_err());
        gate.notify_one();
        first.await.unwrap().unwrap();
        assert_eq!(permits.available_permits(), 1);
        tokio::task::yield_now().await;
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
    }
}
