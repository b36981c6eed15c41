//! Pod IPs: unique within the node's pod CIDR for as long as their Pod exists.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An IPv4 CIDR such as `10.244.0.0/16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodCidr {
    base: u32,
    prefix: u8,
}

impl PodCidr {
    /// Usable addresses: all but the network address, the `.1` a bridge would take, and the
    /// broadcast address.
    fn first_last(&self) -> (u32, u32) {
        let size = 1u64 << (32 - u32::from(self.prefix));
        (self.base + 2, (u64::from(self.base) + size - 2) as u32)
    }
}

impl FromStr for PodCidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR like 10.244.0.0/16"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|e| format!("{s:?}: bad IPv4 address: {e}"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|e| format!("{s:?}: bad prefix length: {e}"))?;
        if !(8..=30).contains(&prefix) {
            return Err(format!("{s:?}: prefix length must be 8..=30"));
        }
        let mask = u32::MAX << (32 - prefix);
        Ok(PodCidr {
            base: u32::from(addr) & mask,
            prefix,
        })
    }
}

impl fmt::Display for PodCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// Hands out addresses round-robin so a freed address is not reused at once (a client may
/// still hold the old Pod's IP).
pub struct Ipam {
    cidr: PodCidr,
    next: u32,
    used: HashSet<u32>,
    by_pod: HashMap<String, u32>,
}

impl Ipam {
    pub fn new(cidr: PodCidr) -> Ipam {
        Ipam {
            cidr,
            next: cidr.first_last().0,
            used: HashSet::new(),
            by_pod: HashMap::new(),
        }
    }

    /// The address of Pod `uid`, allocating one if it has none. `None` when the CIDR is full.
    pub fn assign(&mut self, uid: &str) -> Option<Ipv4Addr> {
        if let Some(ip) = self.by_pod.get(uid) {
            return Some(Ipv4Addr::from(*ip));
        }
        let (first, last) = self.cidr.first_last();
        for _ in first..=last {
            let candidate = self.next;
            self.next = if candidate >= last {
                first
            } else {
                candidate + 1
            };
            if self.used.insert(candidate) {
                self.by_pod.insert(uid.to_string(), candidate);
                return Some(Ipv4Addr::from(candidate));
            }
        }
        None
    }

    /// Records an address a Pod already has (after a restart of the fake node).
    pub fn reserve(&mut self, uid: &str, ip: Ipv4Addr) {
        let ip = u32::from(ip);
        let (first, last) = self.cidr.first_last();
        if (first..=last).contains(&ip) && !self.by_pod.contains_key(uid) && self.used.insert(ip) {
            self.by_pod.insert(uid.to_string(), ip);
        }
    }

    /// Releases the addresses of every Pod for which `keep` is false.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let used = &mut self.used;
        self.by_pod.retain(|uid, ip| {
            let kept = keep(uid);
            if !kept {
                used.remove(ip);
            }
            kept
        });
    }

    pub fn release(&mut self, uid: &str) {
        if let Some(ip) = self.by_pod.remove(uid) {
            self.used.remove(&ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises() {
        let c: PodCidr = "10.244.3.7/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.0.0/16");
        assert!("10.244.0.0".parse::<PodCidr>().is_err());
        assert!("10.244.0.0/31".parse::<PodCidr>().is_err());
    }

    #[test]
    fn unique_stable_and_reserved_addresses() {
        let mut ipam = Ipam::new("10.9.0.0/29".parse().unwrap());
        // usable: .2 ..= .6
        ipam.reserve("old", "10.9.0.3".parse().unwrap());
        let a = ipam.assign("a").unwrap();
        assert_eq!(a.to_string(), "10.9.0.2");
        assert_eq!(ipam.assign("a"), Some(a), "same pod, same address");
        let b = ipam.assign("b").unwrap();
        assert_eq!(b.to_string(), "10.9.0.4", "skips the reserved .3");
        assert_eq!(ipam.assign("c").unwrap().to_string(), "10.9.0.5");
        assert_eq!(ipam.assign("d").unwrap().to_string(), "10.9.0.6");
        assert_eq!(ipam.assign("e"), None, "full");
        ipam.release("a");
        assert_eq!(ipam.assign("e").unwrap().to_string(), "10.9.0.2");
        ipam.retain(|uid| uid != "b" && uid != "old");
        assert_eq!(
            ipam.assign("f").unwrap().to_string(),
            "10.9.0.3",
            "old's .3 is free again"
        );
        assert_eq!(
            ipam.assign("g").unwrap().to_string(),
            "10.9.0.4",
            "and b's .4"
        );
        assert_eq!(
            ipam.assign("c").unwrap().to_string(),
            "10.9.0.5",
            "c kept its address"
        );
    }
}
