//! Expectations: the creates and deletes a pool has issued but its Sandbox
//! cache has not shown yet. While any are outstanding the pool does not scale,
//! so a reconcile that runs off a stale cache never creates (or deletes) twice.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unobserved write may hold a pool back. A watch that lost an
/// event relists well within this; past it the pool trusts its cache again.
pub const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Pending {
    creates: HashSet<String>,
    deletes: HashSet<String>,
    since: Instant,
}

/// What the cache currently says about one expected name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    Absent,
    Present,
    /// Present with a deletionTimestamp.
    Terminating,
}

#[derive(Default, Debug)]
pub struct Expectations {
    pools: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn expect_creates(
        &self,
        pool: &str,
        names: impl IntoIterator<Item = String>,
        now: Instant,
    ) {
        self.entry(pool, now, |p| p.creates.extend(names));
    }

    pub fn expect_deletes(
        &self,
        pool: &str,
        names: impl IntoIterator<Item = String>,
        now: Instant,
    ) {
        self.entry(pool, now, |p| p.deletes.extend(names));
    }

    fn entry(&self, pool: &str, now: Instant, f: impl FnOnce(&mut Pending)) {
        let mut m = self.pools.lock().expect("expectations poisoned");
        let p = m.entry(pool.to_string()).or_insert_with(|| Pending {
            creates: HashSet::new(),
            deletes: HashSet::new(),
            since: now,
        });
        p.since = now;
        f(p);
    }

    /// True when every expected write of `pool` is visible through `seen`
    /// (creates present or already terminating, deletes gone or terminating),
    /// or the wait timed out. Observed writes are forgotten.
    pub fn satisfied(&self, pool: &str, now: Instant, seen: impl Fn(&str) -> Seen) -> bool {
        let mut m = self.pools.lock().expect("expectations poisoned");
        let Some(p) = m.get_mut(pool) else {
            return true;
        };
        p.creates.retain(|n| seen(n) == Seen::Absent);
        p.deletes.retain(|n| seen(n) == Seen::Present);
        if (p.creates.is_empty() && p.deletes.is_empty())
            || now.duration_since(p.since) >= EXPECTATION_TIMEOUT
        {
            m.remove(pool);
            return true;
        }
        false
    }

    /// The pool is gone: drop its bookkeeping.
    pub fn forget(&self, pool: &str) {
        self.pools
            .lock()
            .expect("expectations poisoned")
            .remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_hold_the_pool_until_the_cache_shows_them() {
        let e = Expectations::new();
        let t0 = Instant::now();
        e.expect_creates("ns/p", ["a".to_string(), "b".to_string()], t0);
        let only_a = |n: &str| {
            if n == "a" {
                Seen::Present
            } else {
                Seen::Absent
            }
        };
        assert!(!e.satisfied("ns/p", t0, only_a));
        // "a" was observed and forgotten: a later cache without it does not matter.
        let only_b = |n: &str| {
            if n == "b" {
                Seen::Present
            } else {
                Seen::Absent
            }
        };
        assert!(e.satisfied("ns/p", t0, only_b));
        assert!(e.satisfied("ns/p", t0, |_| Seen::Absent));
    }

    #[test]
    fn deletes_hold_the_pool_until_the_cache_drops_them() {
        let e = Expectations::new();
        let t0 = Instant::now();
        e.expect_deletes("ns/p", ["a".to_string()], t0);
        assert!(!e.satisfied("ns/p", t0, |_| Seen::Present));
        assert!(e.satisfied("ns/p", t0, |_| Seen::Terminating));
    }

    #[test]
    fn an_event_lost_for_good_times_out() {
        let e = Expectations::new();
        let t0 = Instant::now();
        e.expect_creates("ns/p", ["a".to_string()], t0);
        assert!(!e.satisfied("ns/p", t0 + Duration::from_secs(29), |_| Seen::Absent));
        assert!(e.satisfied("ns/p", t0 + EXPECTATION_TIMEOUT, |_| Seen::Absent));
    }

    #[test]
    fn pools_are_independent() {
        let e = Expectations::new();
        let t0 = Instant::now();
        e.expect_creates("ns/p", ["a".to_string()], t0);
        assert!(e.satisfied("ns/q", t0, |_| Seen::Absent));
        e.forget("ns/p");
        assert!(e.satisfied("ns/p", t0, |_| Seen::Absent));
    }
}
