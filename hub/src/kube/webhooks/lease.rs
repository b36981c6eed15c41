//! Which replica delivers: the one holding the `coordination.k8s.io/v1`
//! Lease [`LEASE_NAME`](super::record::LEASE_NAME).
//!
//! [`Elector`] is the decision, pure: a candidate takes a Lease that is
//! missing, released, or unchanged (same holder, same `renewTime`) for its
//! `leaseDurationSeconds` *as this replica's own clock measured since it
//! saw that value*, so replicas whose clocks disagree never take a Lease
//! early (client-go's leader election does the same). The holder renews
//! every third of the duration and stops delivering two thirds of it after
//! its last successful write, before anyone may take over. Every write is
//! a merge patch at the resourceVersion read: of two candidates, one wins.
//!
//! [`run`] is the loop around it.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    Api,
};

/// What one look at the Lease says to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// There is none: create it, held by us.
    Create,
    /// Ours (renew) or free or expired (take): write it, held by us.
    Claim { taking: bool },
    /// Someone else holds it.
    Wait,
}

/// The parts of a Lease the decision reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seen {
    pub holder: String,
    pub renew: String,
    pub duration: Option<Duration>,
}

impl Seen {
    pub fn of(spec: &LeaseSpec) -> Seen {
        Seen {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew: spec
                .renew_time
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            duration: spec
                .lease_duration_seconds
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(s as u64)),
        }
    }
}

pub struct Elector {
    pub me: String,
    pub duration: Duration,
    /// The other holder's record we last saw change, and when (our clock).
    seen: Option<(Seen, Instant)>,
    /// Deliveries may go until then.
    held_until: Option<Instant>,
    /// This replica is stopping: it never claims again.
    resigned: bool,
}

impl Elector {
    pub fn new(me: String, duration: Duration) -> Elector {
        Elector {
            me,
            duration: duration.max(Duration::from_secs(1)),
            seen: None,
            held_until: None,
            resigned: false,
        }
    }

    /// Stops holding at once and for good (the replica is stopping).
    pub fn resign(&mut self) {
        self.resigned = true;
        self.held_until = None;
    }

    /// What to do about the Lease as read at `now` (`None`: it does not exist).
    pub fn step(&mut self, lease: Option<&Seen>, now: Instant) -> Step {
        if self.resigned {
            return Step::Wait;
        }
        let Some(l) = lease else {
            self.held_until = None;
            return Step::Create;
        };
        if l.holder == self.me {
            return Step::Claim { taking: false };
        }
        // Someone else's (or no one's): whatever we held is gone.
        self.held_until = None;
        if l.holder.is_empty() {
            return Step::Claim { taking: true };
        }
        match &self.seen {
            Some((s, _)) if s == l => {}
            _ => {
                self.seen = Some((l.clone(), now));
                return Step::Wait;
            }
        }
        let since = self.seen.as_ref().map_or(now, |(_, at)| *at);
        if now.saturating_duration_since(since) >= l.duration.unwrap_or(self.duration) {
            Step::Claim { taking: true }
        } else {
            Step::Wait
        }
    }

    /// A write that made us the holder was sent at `sent`.
    pub fn won(&mut self, sent: Instant) {
        if self.resigned {
            return;
        }
        self.held_until = Some(sent + self.duration * 2 / 3);
        self.seen = None;
    }

    /// Whether deliveries may go at `now`.
    pub fn holding(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|t| now < t)
    }
}

/// The Lease spec we write: held by `me` since `acquired`.
fn spec(me: &str, duration: Duration, acquired: MicroTime, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration.as_secs().clamp(1, i32::MAX as u64) as i32),
        acquire_time: Some(acquired),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// Write conflicts [`release`] reads the Lease again after.
const RELEASE_ATTEMPTS: usize = 3;

/// Frees the Lease if `me` holds it (at the version read), so another
/// replica takes it at its next look instead of after the duration;
/// `true` when it did. A renewal the loop had already started may land
/// between the read and the write (409): the Lease is read again then,
/// since after `resign` the loop writes no more.
pub async fn release(api: &Api<Lease>, name: &str, me: &str) -> kube::Result<bool> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(lease) = api.get_opt(name).await? else {
            return Ok(false);
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(me) {
            return Ok(false);
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {"holderIdentity": null},
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < RELEASE_ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Looks at the Lease every third of its duration and acts, forever.
pub async fn run(api: Api<Lease>, name: String, elector: Arc<Mutex<Elector>>) {
    let (me, duration) = {
        let e = elector.lock().unwrap_or_else(|p| p.into_inner());
        (e.me.clone(), e.duration)
    };
    let mut was_holding = false;
    loop {
        let sent = Instant::now();
        match api.get_opt(&name).await {
            Err(e) => tracing::warn!(error = %e, "reading the webhook Lease"),
            Ok(lease) => {
                let current = lease.as_ref().and_then(|l| l.spec.clone());
                let seen = lease
                    .as_ref()
                    .map(|_| Seen::of(&current.clone().unwrap_or_default()));
                let step = elector
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .step(seen.as_ref(), Instant::now());
                let wrote = match (step, lease) {
                    (Step::Wait, _) => Ok(false),
                    (Step::Create, _) | (_, None) => {
                        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
                        let lease = Lease {
                            metadata: ObjectMeta {
                                name: Some(name.clone()),
                                ..Default::default()
                            },
                            spec: Some(spec(&me, duration, now, 0)),
                        };
                        api.create(&PostParams::default(), &lease)
                            .await
                            .map(|_| true)
                    }
                    (Step::Claim { taking }, Some(lease)) => {
                        let cur = current.unwrap_or_default();
                        let transitions = cur.lease_transitions.unwrap_or(0);
                        let (acquired, transitions) = match (taking, cur.acquire_time) {
                            (false, Some(t)) => (t, transitions),
                            _ => (
                                MicroTime(k8s_openapi::jiff::Timestamp::now()),
                                transitions.saturating_add(1),
                            ),
                        };
                        let patch = serde_json::json!({
                            "metadata": {"resourceVersion": lease.metadata.resource_version},
                            "spec": spec(&me, duration, acquired, transitions),
                        });
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                            .map(|_| true)
                    }
                };
                match wrote {
                    Ok(true) => elector.lock().unwrap_or_else(|p| p.into_inner()).won(sent),
                    Ok(false) => {}
                    // Another replica wrote first: it holds it.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => tracing::warn!(error = %e, "writing the webhook Lease"),
                }
            }
        }
        let holding = elector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .holding(Instant::now());
        if holding != was_holding {
            tracing::info!(identity = %me, holding, "webhook delivery Lease");
            was_holding = holding;
        }
        tokio::time::sleep(duration / 3).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn held_by(h: &str, renew: &str) -> Seen {
        Seen {
            holder: h.into(),
            renew: renew.into(),
            duration: Some(D),
        }
    }

    #[test]
    fn a_missing_or_free_lease_is_taken_and_ours_is_renewed() {
        let t0 = Instant::now();
        let mut e = Elector::new("me".into(), D);
        assert_eq!(e.step(None, t0), Step::Create);
        assert_eq!(
            e.step(Some(&held_by("", "")), t0),
            Step::Claim { taking: true }
        );
        assert!(!e.holding(t0));
        e.won(t0);
        assert!(e.holding(t0 + D / 2));
        assert!(
            !e.holding(t0 + D * 2 / 3),
            "it stops before anyone may take over"
        );
        assert_eq!(
            e.step(Some(&held_by("me", "t1")), t0),
            Step::Claim { taking: false }
        );
    }

    #[test]
    fn anothers_lease_is_taken_only_after_it_stood_still_for_its_duration_on_our_clock() {
        let t0 = Instant::now();
        let mut e = Elector::new("me".into(), Duration::from_secs(60));
        // The other's own duration counts, not ours.
        assert_eq!(e.step(Some(&held_by("a", "r1")), t0), Step::Wait);
        assert_eq!(e.step(Some(&held_by("a", "r1")), t0 + D / 2), Step::Wait);
        // Renewed: the wait starts again.
        assert_eq!(
            e.step(Some(&held_by("a", "r2")), t0 + D - Duration::from_millis(1)),
            Step::Wait
        );
        assert_eq!(
            e.step(Some(&held_by("a", "r2")), t0 + D + D / 2),
            Step::Wait
        );
        assert_eq!(
            e.step(Some(&held_by("a", "r2")), t0 + D * 2),
            Step::Claim { taking: true }
        );
    }

    #[test]
    fn a_replica_that_resigned_never_holds_again() {
        let t0 = Instant::now();
        let mut e = Elector::new("me".into(), D);
        e.won(t0);
        e.resign();
        assert!(!e.holding(t0));
        assert_eq!(e.step(None, t0), Step::Wait);
        assert_eq!(e.step(Some(&held_by("", "")), t0), Step::Wait);
        e.won(t0);
        assert!(!e.holding(t0));
    }

    #[test]
    fn a_holder_that_sees_another_holder_stops_at_once() {
        let t0 = Instant::now();
        let mut e = Elector::new("me".into(), D);
        e.won(t0);
        assert!(e.holding(t0));
        assert_eq!(e.step(Some(&held_by("b", "r")), t0), Step::Wait);
        assert!(!e.holding(t0));
    }
}
