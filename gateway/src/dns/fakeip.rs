//! Fake IPs: each name the responder allows gets an address of its own
//! from a per-sandbox range, so the gateway knows the name behind every
//! connection (TLS or not, HTTP or SSH) without reading a byte of it.
//!
//! Bounded: at most `capacity` names. When full, the name used least
//! recently gives up its address; a flow already open to it keeps its name
//! (the flow holds it), only a later connect to the old address is refused.

use std::{collections::HashMap, net::Ipv4Addr};

#[derive(Debug)]
pub struct FakePool {
    base: u32,
    capacity: u32,
    next: u32,
    clock: u64,
    by_name: HashMap<String, u32>,
    /// Offset -> (name, last use).
    by_offset: HashMap<u32, (String, u64)>,
}

impl FakePool {
    /// Addresses `net + 1 ..= net + capacity`; `capacity` must fit the
    /// range (the caller sizes it from the prefix).
    pub fn new(net: Ipv4Addr, capacity: u32) -> Self {
        FakePool {
            base: u32::from(net),
            capacity: capacity.max(1),
            next: 0,
            clock: 0,
            by_name: HashMap::new(),
            by_offset: HashMap::new(),
        }
    }

    /// The address for `name`, new or kept.
    pub fn assign(&mut self, name: &str) -> Ipv4Addr {
        self.clock += 1;
        if let Some(&off) = self.by_name.get(name) {
            if let Some(e) = self.by_offset.get_mut(&off) {
                e.1 = self.clock;
            }
            return self.addr(off);
        }
        let off = if (self.by_offset.len() as u32) < self.capacity {
            // Fresh offsets first; after a wrap, the first free one.
            loop {
                self.next = self.next % self.capacity + 1;
                if !self.by_offset.contains_key(&self.next) {
                    break self.next;
                }
            }
        } else {
            let (&off, _) = self
                .by_offset
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .expect("a full pool has entries");
            if let Some((old, _)) = self.by_offset.remove(&off) {
                self.by_name.remove(&old);
            }
            off
        };
        self.by_name.insert(name.to_string(), off);
        self.by_offset.insert(off, (name.to_string(), self.clock));
        self.addr(off)
    }

    /// The name an address was given to, if it still is.
    pub fn lookup(&self, ip: Ipv4Addr) -> Option<&str> {
        let off = u32::from(ip).checked_sub(self.base)?;
        self.by_offset.get(&off).map(|(n, _)| n.as_str())
    }

    pub fn len(&self) -> usize {
        self.by_offset.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_offset.is_empty()
    }

    fn addr(&self, off: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.base + off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_their_address_and_a_full_pool_recycles_the_least_used() {
        let mut p = FakePool::new(Ipv4Addr::new(100, 127, 128, 0), 3);
        let a = p.assign("a.test");
        let b = p.assign("b.test");
        let c = p.assign("c.test");
        assert_eq!(a, Ipv4Addr::new(100, 127, 128, 1));
        assert_eq!(p.assign("a.test"), a);
        assert_eq!(p.lookup(b), Some("b.test"));
        // b is now the least recently used: d takes its address.
        let d = p.assign("d.test");
        assert_eq!(d, b);
        assert_eq!(p.lookup(b), Some("d.test"));
        assert_eq!(p.len(), 3);
        assert_eq!(p.lookup(c), Some("c.test"));
        assert_eq!(p.lookup(Ipv4Addr::new(100, 127, 128, 9)), None);
        assert_eq!(p.lookup(Ipv4Addr::new(1, 1, 1, 1)), None);
        for i in 0..100 {
            p.assign(&format!("n{i}.test"));
            assert!(p.len() <= 3);
        }
    }
}
