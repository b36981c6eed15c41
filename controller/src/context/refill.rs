//! When a pool may create the members that replace claimed ones.
//!
//! Claims come first. Replacing one adopted member costs about six API
//! writes (Sandbox, Pod, binding, Pod status, two Sandbox statuses) against
//! the three an adoption needs, and the API server is the bottleneck of a
//! claim burst. So while a pool is handing out members, its refills wait
//! until claims have been quiet for [`CLAIM_QUIET`], but never longer than
//! [`MAX_HOLD`], so a steady stream of claims still gets its pool back.
//!
//! On top of that come upstream's two knobs:
//! `--sandbox-warm-pool-replenish-delay` holds refills for that long after
//! each adoption (no cap: the operator asked for it), and
//! `--sandbox-warm-pool-max-refill-rate` is a token bucket over creates
//! (the same [`Bucket`] as `--kube-api-qps`).
//!
//! Pure: every call takes `now`, so the tests drive the clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ratelimit::Bucket;

/// Refills wait until no claim adopted from the pool for this long.
pub const CLAIM_QUIET: Duration = Duration::from_millis(300);
/// ... but the claims-first hold never lasts longer than this.
pub const MAX_HOLD: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct RefillGate {
    delay: Duration,
    /// Creates per second per pool; 0 = unlimited.
    rate: f64,
    pools: Mutex<HashMap<String, PoolState>>,
}

#[derive(Debug)]
struct PoolState {
    last_adoption: Option<Instant>,
    held_since: Option<Instant>,
    /// `--sandbox-warm-pool-max-refill-rate`, when set.
    bucket: Option<Bucket>,
}

impl RefillGate {
    pub fn new(delay: Duration, rate: f64) -> Self {
        Self {
            delay,
            rate: if rate.is_finite() && rate > 0.0 {
                rate
            } else {
                0.0
            },
            pools: Mutex::new(HashMap::new()),
        }
    }

    fn state<'a>(
        &self,
        pools: &'a mut HashMap<String, PoolState>,
        pool: &str,
        now: Instant,
    ) -> &'a mut PoolState {
        // The bucket holds one second's worth of creates (at least one).
        pools.entry(pool.to_string()).or_insert_with(|| PoolState {
            last_adoption: None,
            held_since: None,
            bucket: (self.rate > 0.0).then(|| {
                Bucket::with_capacity(
                    self.rate,
                    self.rate.max(1.0),
                    tokio::time::Instant::from_std(now),
                )
            }),
        })
    }

    /// A claim took a member of `pool` (`namespace/name`).
    pub fn adopted(&self, pool: &str, now: Instant) {
        let mut pools = self.pools.lock().expect("refill gate poisoned");
        self.state(&mut pools, pool, now).last_adoption = Some(now);
    }

    /// The pool is gone: drop its state.
    pub fn forget(&self, pool: &str) {
        self.pools
            .lock()
            .expect("refill gate poisoned")
            .remove(pool);
    }

    /// How many of `want` creates may be sent now, and when to look again if
    /// some were held back.
    pub fn admit(&self, pool: &str, want: usize, now: Instant) -> (usize, Option<Duration>) {
        if want == 0 {
            return (0, None);
        }
        let mut pools = self.pools.lock().expect("refill gate poisoned");
        let st = self.state(&mut pools, pool, now);

        if let Some(last) = st.last_adoption {
            let since = now.saturating_duration_since(last);
            if since < self.delay {
                return (0, Some(self.delay - since));
            }
            if since < CLAIM_QUIET {
                let held_since = *st.held_since.get_or_insert(now);
                let held = now.saturating_duration_since(held_since);
                if held < MAX_HOLD {
                    let wait = (CLAIM_QUIET - since).min(MAX_HOLD - held);
                    return (0, Some(wait));
                }
            }
        }
        st.held_since = None;

        match &mut st.bucket {
            None => (want, None),
            Some(b) => {
                let (n, next) = b.take_up_to(want, tokio::time::Instant::from_std(now));
                (n, next.map(|d| d.max(Duration::from_millis(1))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: &str = "ns/pool";
    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_pool_nobody_claimed_from_fills_at_once() {
        let g = RefillGate::new(Duration::ZERO, 0.0);
        assert_eq!(g.admit(POOL, 300, Instant::now()), (300, None));
    }

    #[test]
    fn refills_wait_until_claims_are_quiet() {
        let g = RefillGate::new(Duration::ZERO, 0.0);
        let t = Instant::now();
        g.adopted(POOL, t);
        assert_eq!(g.admit(POOL, 5, t + ms(100)), (0, Some(ms(200))));
        g.adopted(POOL, t + ms(200));
        assert_eq!(g.admit(POOL, 5, t + ms(300)), (0, Some(ms(200))));
        assert_eq!(g.admit(POOL, 5, t + ms(500)), (5, None));
    }

    #[test]
    fn a_steady_claim_stream_holds_refills_at_most_max_hold() {
        let g = RefillGate::new(Duration::ZERO, 0.0);
        let t = Instant::now();
        let mut now = t;
        let mut admitted_at = None;
        while now < t + MAX_HOLD + ms(500) {
            g.adopted(POOL, now);
            if g.admit(POOL, 1, now + ms(10)).0 == 1 {
                admitted_at = Some(now);
                break;
            }
            now += ms(100);
        }
        let at = admitted_at.expect("refill was starved");
        assert!(
            at.duration_since(t) >= MAX_HOLD - ms(100),
            "{:?}",
            at.duration_since(t)
        );
        assert!(
            at.duration_since(t) <= MAX_HOLD + ms(100),
            "{:?}",
            at.duration_since(t)
        );
        // The hold starts over after a refill went out.
        g.adopted(POOL, now + ms(20));
        assert_eq!(g.admit(POOL, 1, now + ms(30)).0, 0);
    }

    #[test]
    fn the_replenish_delay_holds_without_a_cap() {
        let g = RefillGate::new(Duration::from_secs(10), 0.0);
        let t = Instant::now();
        g.adopted(POOL, t);
        assert_eq!(
            g.admit(POOL, 3, t + Duration::from_secs(9)),
            (0, Some(Duration::from_secs(1)))
        );
        assert_eq!(g.admit(POOL, 3, t + Duration::from_secs(10)), (3, None));
    }

    #[test]
    fn the_refill_rate_is_a_token_bucket() {
        let g = RefillGate::new(Duration::ZERO, 4.0);
        let t = Instant::now();
        let (n, wait) = g.admit(POOL, 10, t);
        assert_eq!(n, 4);
        assert_eq!(wait, Some(ms(250)));
        assert_eq!(g.admit(POOL, 6, t + ms(250)).0, 1);
        assert_eq!(g.admit(POOL, 5, t + ms(1250)).0, 4);
        // Pools have separate buckets.
        assert_eq!(g.admit("ns/other", 4, t).0, 4);
    }

    #[test]
    fn nonsense_rates_mean_unlimited() {
        for r in [f64::NAN, -1.0, f64::INFINITY] {
            assert_eq!(
                RefillGate::new(Duration::ZERO, r).admit(POOL, 7, Instant::now()),
                (7, None)
            );
        }
    }
}
