//! A bounded in-memory event ring: the kubernetes backend's log, one per
//! replica. Ids count from 1 at each start of the replica, so a
//! `Last-Event-ID` is meaningful to the replica that sent it while it
//! runs; a consumer that reconnects to another replica, or after a
//! restart, resumes from whatever that replica's ring holds past the id.

use std::{collections::VecDeque, sync::Mutex};

use sandhub_client::Result;

use super::{Event, NewEvent, Sink};

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
            ring.0 += 1;
            let e = Event::stored(ring.0, e);
            if ring.1.len() >= self.capacity {
                ring.1.pop_front();
            }
            ring.1.push_back(e.clone());
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
            .filter(|e| e.tenant == tenant)
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
