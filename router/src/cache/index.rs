//! The Pod cache's index: pure data, updated from watch events and queried
//! on every request. No I/O here, so it is unit-tested without a cluster.

use std::{collections::HashMap, net::IpAddr};

/// What the router needs to know about one routable sandbox Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    pub uid: String,
    /// UIDs of the Pod's owners (its Sandbox): an X-Sandbox-UID may name either.
    pub owner_uids: Vec<String>,
    pub namespace: String,
    pub name: String,
    /// The `agents.x-k8s.io/sandbox-name-hash` label.
    pub name_hash: String,
    /// Carries `agents.x-k8s.io/warm-pool-sandbox`: not handed to anyone yet.
    pub warm_pool: bool,
    pub ip: IpAddr,
}

#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<String, PodEntry>,
    by_uid: HashMap<String, String>,
    by_name: HashMap<(String, String), String>,
    by_hash: HashMap<(String, String), String>,
}

impl PodIndex {
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Adds or replaces a routable Pod.
    pub fn upsert(&mut self, pod: PodEntry) {
        self.remove(&pod.uid);
        let uid = pod.uid.clone();
        self.by_uid.insert(uid.clone(), uid.clone());
        for owner in &pod.owner_uids {
            self.by_uid.insert(owner.clone(), uid.clone());
        }
        if !pod.warm_pool {
            self.by_name
                .insert((pod.namespace.clone(), pod.name.clone()), uid.clone());
            self.by_hash
                .insert((pod.namespace.clone(), pod.name_hash.clone()), uid.clone());
        }
        self.pods.insert(uid, pod);
    }

    /// Forgets a Pod (deleted, not Ready, lost its IP, or found unreachable).
    pub fn remove(&mut self, uid: &str) -> Option<PodEntry> {
        let pod = self.pods.remove(uid)?;
        let mine = |v: &String| v.as_str() == uid;
        if self.by_uid.get(uid).is_some_and(mine) {
            self.by_uid.remove(uid);
        }
        for owner in &pod.owner_uids {
            if self.by_uid.get(owner).is_some_and(mine) {
                self.by_uid.remove(owner);
            }
        }
        let name_key = (pod.namespace.clone(), pod.name.clone());
        if self.by_name.get(&name_key).is_some_and(mine) {
            self.by_name.remove(&name_key);
        }
        let hash_key = (pod.namespace.clone(), pod.name_hash.clone());
        if self.by_hash.get(&hash_key).is_some_and(mine) {
            self.by_hash.remove(&hash_key);
        }
        Some(pod)
    }

    /// Drops every entry (a watch restart relists from scratch).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// By Pod UID or owning Sandbox UID, warm-pool Pods included: a UID is
    /// only known to whoever was handed that Pod.
    pub fn by_uid(&self, uid: &str) -> Option<&PodEntry> {
        self.pods.get(self.by_uid.get(uid)?)
    }

    /// By namespace and sandbox (Pod) name, or by the name hash of a sandbox
    /// whose Pod has another name; unclaimed warm-pool Pods never match.
    pub fn by_name(&self, namespace: &str, name: &str) -> Option<&PodEntry> {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(uid) = self.by_name.get(&key) {
            return self.pods.get(uid);
        }
        let hash_key = (key.0, sandhub_api::k8s::names::name_hash(name));
        self.pods.get(self.by_hash.get(&hash_key)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, ns: &str, name: &str, warm: bool, ip: &str) -> PodEntry {
        PodEntry {
            uid: uid.into(),
            owner_uids: vec![format!("sb-{uid}")],
            namespace: ns.into(),
            name: name.into(),
            name_hash: sandhub_api::k8s::names::name_hash(name),
            warm_pool: warm,
            ip: ip.parse().unwrap(),
        }
    }

    #[test]
    fn lookups_and_warm_pool_exclusion() {
        let mut idx = PodIndex::default();
        idx.upsert(pod("u1", "ns", "a", false, "10.0.0.1"));
        idx.upsert(pod("u2", "ns", "warm", true, "10.0.0.2"));
        assert_eq!(idx.by_name("ns", "a").unwrap().ip.to_string(), "10.0.0.1");
        assert!(idx.by_name("other", "a").is_none());
        assert!(idx.by_name("ns", "warm").is_none());
        assert_eq!(idx.by_uid("u2").unwrap().name, "warm");
        assert_eq!(idx.by_uid("sb-u1").unwrap().name, "a");
        // Claimed: the label is gone, the same Pod becomes routable by name.
        idx.upsert(pod("u2", "ns", "warm", false, "10.0.0.2"));
        assert!(idx.by_name("ns", "warm").is_some());
        idx.remove("u1");
        assert!(idx.by_name("ns", "a").is_none());
        assert!(idx.by_uid("sb-u1").is_none());
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn pod_named_differently_from_its_sandbox_is_found_by_name_hash() {
        let mut idx = PodIndex::default();
        let mut p = pod("u1", "ns", "pool-abcde", false, "10.0.0.9");
        p.name_hash = sandhub_api::k8s::names::name_hash("my-sandbox");
        idx.upsert(p);
        assert_eq!(idx.by_name("ns", "my-sandbox").unwrap().uid, "u1");
    }
}
