//! One sandbox's cache of upstream answers: name -> the addresses the
//! operator's resolver gave, for as long as their TTL says (clamped to
//! [`MIN_TTL`]..[`MAX_TTL`]), at most `capacity` names (the least recently
//! used goes first).
//!
//! It caches resolution only, never a decision: the responder judges every
//! query by the policy as it is then (it never reads this cache), and
//! every connection is judged again on the address it actually dials
//! (closed ranges, deny CIDRs), cached or not. It is per sandbox, so one
//! tenant's lookups never answer (or time) another's, and negative
//! answers are not kept: a name that did not resolve is asked again.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

/// Shortest time an answer is kept: a TTL of 0 or 1 would send every
/// connection of a busy workload to the resolver.
pub const MIN_TTL: Duration = Duration::from_secs(5);
/// Longest: a name that moves is seen within this.
pub const MAX_TTL: Duration = Duration::from_secs(300);
/// Names one sandbox keeps.
pub const CAPACITY: usize = 256;
/// Addresses kept per name (the dialer tries four).
const ADDRS_PER_NAME: usize = 8;

struct Entry {
    addrs: Vec<IpAddr>,
    expires: Instant,
    /// The use counter when last read or written (LRU order).
    used: u64,
}

pub struct DnsCache {
    capacity: usize,
    entries: HashMap<String, Entry>,
    clock: u64,
}

impl Default for DnsCache {
    fn default() -> Self {
        DnsCache::new(CAPACITY)
    }
}

impl DnsCache {
    pub fn new(capacity: usize) -> Self {
        DnsCache {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            clock: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The addresses of `name` if an answer for it is still fresh at `now`.
    pub fn get(&mut self, name: &str, now: Instant) -> Option<Vec<IpAddr>> {
        self.clock += 1;
        let e = self.entries.get_mut(name)?;
        if now >= e.expires {
            self.entries.remove(name);
            return None;
        }
        e.used = self.clock;
        Some(e.addrs.clone())
    }

    /// Keeps `addrs` for `name` for `ttl` seconds (clamped). Empty
    /// answers are not kept.
    pub fn put(&mut self, name: &str, addrs: &[IpAddr], ttl: u32, now: Instant) {
        if addrs.is_empty() {
            return;
        }
        self.clock += 1;
        if !self.entries.contains_key(name) && self.entries.len() >= self.capacity {
            // Expired entries first; else the least recently used.
            self.entries.retain(|_, e| now < e.expires);
            if self.entries.len() >= self.capacity {
                if let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| k.clone())
                {
                    self.entries.remove(&oldest);
                }
            }
        }
        let ttl = Duration::from_secs(ttl.into()).clamp(MIN_TTL, MAX_TTL);
        self.entries.insert(
            name.to_string(),
            Entry {
                addrs: addrs.iter().copied().take(ADDRS_PER_NAME).collect(),
                expires: now + ttl,
                used: self.clock,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn answers_live_their_clamped_ttl() {
        let mut c = DnsCache::new(4);
        let t = Instant::now();
        c.put("a.test", &[ip("203.0.113.1")], 60, t);
        assert_eq!(c.get("a.test", t), Some(vec![ip("203.0.113.1")]));
        assert_eq!(
            c.get("a.test", t + Duration::from_secs(59))
                .map(|v| v.len()),
            Some(1)
        );
        assert_eq!(c.get("a.test", t + Duration::from_secs(60)), None);
        assert!(c.is_empty(), "an expired entry is dropped when read");
        // TTL 0 and 1 are kept MIN_TTL; a day is kept MAX_TTL.
        c.put("zero.test", &[ip("203.0.113.2")], 0, t);
        assert!(c
            .get("zero.test", t + MIN_TTL - Duration::from_millis(1))
            .is_some());
        assert!(c.get("zero.test", t + MIN_TTL).is_none());
        c.put("day.test", &[ip("203.0.113.3")], 86_400, t);
        assert!(c
            .get("day.test", t + MAX_TTL - Duration::from_millis(1))
            .is_some());
        assert!(c.get("day.test", t + MAX_TTL).is_none());
        // Nothing to keep: not kept (negative answers are asked again).
        c.put("none.test", &[], 60, t);
        assert_eq!(c.get("none.test", t), None);
    }

    #[test]
    fn it_is_bounded_and_evicts_the_least_recently_used() {
        let mut c = DnsCache::new(3);
        let t = Instant::now();
        for n in ["a", "b", "c"] {
            c.put(n, &[ip("203.0.113.1")], 60, t);
        }
        assert!(c.get("a", t).is_some()); // a is now the most recent
        c.put("d", &[ip("203.0.113.4")], 60, t);
        assert_eq!(c.len(), 3);
        assert!(c.get("b", t).is_none(), "b was the least recently used");
        assert!(c.get("a", t).is_some() && c.get("c", t).is_some() && c.get("d", t).is_some());
        // (read order a, c, d: a is the least recent now) Expired entries
        // go before live ones.
        c.put("short", &[ip("203.0.113.5")], 5, t);
        assert!(c.get("a", t).is_none(), "a was the least recently used");
        let later = t + Duration::from_secs(6);
        c.put("e", &[ip("203.0.113.6")], 60, later);
        assert_eq!(c.len(), 3);
        assert!(c.get("short", later).is_none(), "the expired one went");
        assert!(c.get("c", later).is_some() && c.get("d", later).is_some());
        // Replacing a name does not evict another.
        c.put("e", &[ip("203.0.113.7")], 60, later);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get("e", later), Some(vec![ip("203.0.113.7")]));
        // Many addresses: a bounded number kept.
        let many: Vec<IpAddr> = (1..=40).map(|i| ip(&format!("203.0.113.{i}"))).collect();
        c.put("many", &many, 60, later);
        assert_eq!(c.get("many", later).unwrap().len(), ADDRS_PER_NAME);
    }
}
