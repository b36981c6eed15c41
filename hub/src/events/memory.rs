//! A bounded in-memory event ring: the kubernetes backend's log, one per
//! replica. Its events come with their ids (`kube/events.rs` derives them
//! from resourceVersions, so every replica names an event alike): the ring
//! keeps them in id order, stores an id once, and forgets the lowest ids
//! first. An event without an id gets the next one above the highest.

use std::{collections::VecDeque, sync::Mutex};

use sandhub_client::Result;

use super::{Event, NewEvent, Sink, SHARED};

pub struct MemoryLog {
    ring: Mutex<(u64, VecDeque<Event>)>,
    capacity: usize,
}

impl MemoryLog {
    pub fn new(capacity: u64) -> MemoryLog {
        MemoryLog {
            ring: Mutex::new((0, VecDeque::new())),
            capacity: capacity.max(1) as usize,
        }
    }
}

impl Sink for MemoryLog {
    fn append(&self, batch: Vec<NewEvent>) -> Result<Vec<Event>> {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut stored = Vec::with_capacity(batch.len());
        for e in batch {
            let id = e.id.unwrap_or(ring.0 + 1);
            // Where it belongs: almost always the end (events come in id
            // order but for a lagging watch's).
            let at = ring.1.partition_point(|x| x.id < id);
            if ring.1.get(at).is_some_and(|x| x.id == id)
                || (at == 0 && ring.1.len() >= self.capacity)
            {
                // Stored already, or older than everything a full ring keeps.
                continue;
            }
            ring.0 = ring.0.max(id);
            let e = Event::stored(id, e);
            ring.1.insert(at, e.clone());
            if ring.1.len() > self.capacity {
                ring.1.pop_front();
            }
            stored.push(e);
        }
        Ok(stored)
    }

    fn after(&self, tenant: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let start = ring.1.partition_point(|e| e.id <= after);
        Ok(ring
            .1
            .range(start..)
            .filter(|e| e.tenant == tenant || e.tenant == SHARED)
            .take(limit)
            .cloned()
            .collect())
    }

    fn newest(&self) -> Result<u64> {
        Ok(self.ring.lock().unwrap_or_else(|p| p.into_inner()).0)
    }

    fn prune(&self, before_ms: i64, _keep: u64) -> Result<u64> {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let before = crate::backend::rfc3339(before_ms);
        let mut n = 0;
        // RFC 3339 times of one format compare as strings.
        while ring.1.front().is_some_and(|e| e.time < before) {
            ring.1.pop_front();
            n += 1;
        }
        Ok(n)
    }
}
