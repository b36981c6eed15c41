//! The warm candidate index: every adoptable Sandbox of every pool, kept from
//! Sandbox watch events (linkerd-style: a pure data structure, no I/O).
//!
//! Claims take candidates from here instead of listing Sandboxes, so a burst of
//! claims hands out distinct Sandboxes without racing each other on the API
//! server: a taken candidate is reserved until the adoption either lands (the
//! watch then drops the Sandbox from the pool) or fails (the claim releases it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// What a claim needs to know about one warm Sandbox to choose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    /// `status.nodeName`; `None` until the Pod is scheduled.
    pub node: Option<String>,
    /// The Sandbox's Ready condition is True.
    pub ready: bool,
    /// `status.podIPs` is not empty. A candidate without IPs is "pending".
    pub has_ip: bool,
    /// The `sandbox-template-hash` label, to skip stale members under Recreate.
    pub template_hash: Option<String>,
    /// The `sandbox-template-ref` annotation (the template the Sandbox was built from).
    pub template_name: Option<String>,
}

/// The outcome of [`WarmIndex::take`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// A reserved candidate: adopt it, then [`WarmIndex::adopted`] or [`WarmIndex::release`].
    Got(Candidate),
    /// Only candidates without pod IPs exist: they may be ready in a moment.
    Pending,
    /// Nothing to adopt.
    Empty,
}

#[derive(Default, Debug)]
struct Pool {
    members: BTreeMap<String, Candidate>,
    reserved: HashSet<String>,
}

#[derive(Default, Debug)]
struct State {
    /// Key `namespace/pool`.
    pools: HashMap<String, Pool>,
    /// `namespace/sandbox` → pool key, so a Sandbox that changes pool or leaves
    /// every pool is removed from the old one.
    pool_of: HashMap<String, String>,
}

/// Thread-safe: claims take candidates from many workers at once.
#[derive(Default, Debug)]
pub struct WarmIndex {
    state: Mutex<State>,
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl WarmIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// A Sandbox was added or changed. `member` is `Some((pool, candidate))` when
    /// it is an adoptable member of `pool`, `None` when it is not (any more).
    pub fn apply(&self, namespace: &str, name: &str, member: Option<(&str, Candidate)>) {
        let mut st = self.state.lock().expect("warm index poisoned");
        let sb_key = key(namespace, name);
        let new_pool = member.as_ref().map(|(pool, _)| key(namespace, pool));
        if let Some(old) = st.pool_of.get(&sb_key).cloned() {
            if Some(&old) != new_pool.as_ref() {
                if let Some(p) = st.pools.get_mut(&old) {
                    p.members.remove(name);
                    p.reserved.remove(name);
                }
                st.pool_of.remove(&sb_key);
            }
        }
        if let (Some(pool_key), Some((_, cand))) = (new_pool, member) {
            st.pool_of.insert(sb_key, pool_key.clone());
            st.pools
                .entry(pool_key)
                .or_default()
                .members
                .insert(name.to_string(), cand);
        }
    }

    /// A Sandbox is gone.
    pub fn delete(&self, namespace: &str, name: &str) {
        self.apply(namespace, name, None);
    }

    /// Forgets everything (a watch relist starts over). Reservations of
    /// Sandboxes that come back stay valid, so they are kept.
    pub fn clear_members(&self) {
        let mut st = self.state.lock().expect("warm index poisoned");
        for p in st.pools.values_mut() {
            p.members.clear();
        }
        st.pool_of.clear();
    }

    /// Reserves the best candidate of `namespace/pool` among those `accept`
    /// allows: a Ready one on the node that holds the most pool members; else
    /// the first non-ready one that already has an IP; else reports whether
    /// pending (IP-less) candidates exist.
    pub fn take(&self, namespace: &str, pool: &str, accept: impl Fn(&Candidate) -> bool) -> Take {
        let mut st = self.state.lock().expect("warm index poisoned");
        let Some(p) = st.pools.get_mut(&key(namespace, pool)) else {
            return Take::Empty;
        };
        // Node density counts every member, reserved or not: taking from the
        // fullest node leaves the sparse nodes free to drain.
        let mut per_node: HashMap<&str, usize> = HashMap::new();
        for c in p.members.values() {
            if let Some(n) = c.node.as_deref() {
                *per_node.entry(n).or_default() += 1;
            }
        }
        let density = |c: &Candidate| c.node.as_deref().map_or(0, |n| per_node[n]);
        let free = || {
            p.members
                .values()
                .filter(|c| !p.reserved.contains(&c.name) && accept(c))
        };
        // BTreeMap order makes ties deterministic (by name).
        let best_ready =
            free()
                .filter(|c| c.ready && c.has_ip)
                .fold(None::<&Candidate>, |best, c| match best {
                    Some(b) if density(b) >= density(c) => Some(b),
                    _ => Some(c),
                });
        let chosen = best_ready.or_else(|| free().find(|c| c.has_ip)).cloned();
        if let Some(c) = chosen {
            p.reserved.insert(c.name.clone());
            return Take::Got(c);
        }
        if free().next().is_some() {
            Take::Pending
        } else {
            Take::Empty
        }
    }

    /// The adoption of a taken candidate failed but the Sandbox may still be
    /// adoptable: give it back.
    pub fn release(&self, namespace: &str, pool: &str, name: &str) {
        let mut st = self.state.lock().expect("warm index poisoned");
        if let Some(p) = st.pools.get_mut(&key(namespace, pool)) {
            p.reserved.remove(name);
        }
    }

    /// A taken candidate is no longer the pool's (adopted, or lost to someone
    /// else): drop it now rather than waiting for the watch to say so.
    pub fn adopted(&self, namespace: &str, pool: &str, name: &str) {
        let mut st = self.state.lock().expect("warm index poisoned");
        let pool_key = key(namespace, pool);
        if let Some(p) = st.pools.get_mut(&pool_key) {
            p.members.remove(name);
            p.reserved.remove(name);
        }
        st.pool_of.remove(&key(namespace, name));
    }

    /// Unreserved members of a pool.
    #[cfg(test)]
    pub fn available(&self, namespace: &str, pool: &str) -> usize {
        let st = self.state.lock().expect("warm index poisoned");
        st.pools.get(&key(namespace, pool)).map_or(0, |p| {
            p.members
                .keys()
                .filter(|n| !p.reserved.contains(*n))
                .count()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(name: &str, node: Option<&str>, ready: bool, has_ip: bool) -> Candidate {
        Candidate {
            name: name.into(),
            node: node.map(Into::into),
            ready,
            has_ip,
            template_hash: Some("h1".into()),
            template_name: Some("tpl".into()),
        }
    }

    fn got(t: Take) -> String {
        match t {
            Take::Got(c) => c.name,
            other => panic!("expected a candidate, got {other:?}"),
        }
    }

    #[test]
    fn prefers_ready_candidates_on_the_densest_node() {
        let idx = WarmIndex::new();
        idx.apply("ns", "a", Some(("p", cand("a", Some("n1"), true, true))));
        idx.apply("ns", "b", Some(("p", cand("b", Some("n2"), true, true))));
        idx.apply("ns", "c", Some(("p", cand("c", Some("n2"), false, true))));
        // n2 holds two members (one not ready), so its Ready member wins.
        assert_eq!(got(idx.take("ns", "p", |_| true)), "b");
        assert_eq!(got(idx.take("ns", "p", |_| true)), "a");
        // No Ready one left: the first non-ready one with an IP.
        assert_eq!(got(idx.take("ns", "p", |_| true)), "c");
        assert_eq!(idx.take("ns", "p", |_| true), Take::Empty);
    }

    #[test]
    fn only_ip_less_candidates_are_pending() {
        let idx = WarmIndex::new();
        idx.apply("ns", "a", Some(("p", cand("a", None, false, false))));
        assert_eq!(idx.take("ns", "p", |_| true), Take::Pending);
        // Once it has an IP (still not Ready) it can be taken.
        idx.apply("ns", "a", Some(("p", cand("a", Some("n"), false, true))));
        assert_eq!(got(idx.take("ns", "p", |_| true)), "a");
    }

    #[test]
    fn a_taken_candidate_is_never_handed_out_twice_until_released() {
        let idx = WarmIndex::new();
        idx.apply("ns", "a", Some(("p", cand("a", Some("n"), true, true))));
        assert_eq!(got(idx.take("ns", "p", |_| true)), "a");
        // A watch update of the reserved Sandbox keeps the reservation.
        idx.apply("ns", "a", Some(("p", cand("a", Some("n"), true, true))));
        assert_eq!(idx.take("ns", "p", |_| true), Take::Empty);
        idx.release("ns", "p", "a");
        assert_eq!(got(idx.take("ns", "p", |_| true)), "a");
        idx.adopted("ns", "p", "a");
        idx.release("ns", "p", "a");
        assert_eq!(idx.take("ns", "p", |_| true), Take::Empty);
    }

    #[test]
    fn concurrent_takers_get_distinct_candidates() {
        let idx = std::sync::Arc::new(WarmIndex::new());
        for i in 0..200 {
            let n = format!("s{i}");
            idx.apply("ns", &n, Some(("p", cand(&n, Some("n"), true, true))));
        }
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let idx = idx.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    while let Take::Got(c) = idx.take("ns", "p", |_| true) {
                        mine.push(c.name);
                    }
                    mine
                })
            })
            .collect();
        let mut all: Vec<String> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort();
        let before = all.len();
        all.dedup();
        assert_eq!((before, all.len()), (200, 200));
    }

    #[test]
    fn leaving_the_pool_or_switching_pools_moves_the_sandbox() {
        let idx = WarmIndex::new();
        idx.apply("ns", "a", Some(("p", cand("a", Some("n"), true, true))));
        idx.apply("ns", "a", Some(("q", cand("a", Some("n"), true, true))));
        assert_eq!(idx.available("ns", "p"), 0);
        assert_eq!(idx.available("ns", "q"), 1);
        idx.apply("ns", "a", None);
        assert_eq!(idx.available("ns", "q"), 0);
        // Same pool name in another namespace is another pool.
        idx.apply("other", "a", Some(("p", cand("a", Some("n"), true, true))));
        assert_eq!(idx.take("ns", "p", |_| true), Take::Empty);
        assert_eq!(got(idx.take("other", "p", |_| true)), "a");
    }

    #[test]
    fn rejected_candidates_are_skipped_and_not_reserved() {
        let idx = WarmIndex::new();
        let mut stale = cand("old", Some("n"), true, true);
        stale.template_hash = Some("h0".into());
        idx.apply("ns", "old", Some(("p", stale)));
        idx.apply("ns", "new", Some(("p", cand("new", Some("m"), true, true))));
        let fresh = |c: &Candidate| c.template_hash.as_deref() == Some("h1");
        assert_eq!(got(idx.take("ns", "p", fresh)), "new");
        assert_eq!(idx.take("ns", "p", fresh), Take::Empty);
        assert_eq!(got(idx.take("ns", "p", |_| true)), "old");
    }
}
