//! Metering and the decision log of one sandbox's gateway (issue #27
//! part 4).
//!
//! Counted in the loop, read by the hub through [`Meter`] at any time
//! (atomics and one short lock; the loop never waits on a reader for
//! long).
//!
//! What a byte is: **payload** bytes of TCP flows, as the workload wrote
//! them (`bytes_out`: what the gateway took from the sandbox's socket for
//! upstream) and as it can read them (`bytes_in`: what the gateway put
//! into the sandbox's socket from upstream), and of UDP flows the payload
//! of each datagram relayed. No IP, TCP, UDP or TLS framing of either
//! side is counted, and neither are DNS answers of the gateway's own
//! responder. A UDP flow counts as a connection (opened or refused) once,
//! on its first datagram.

use std::{
    collections::VecDeque,
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{SystemTime, UNIX_EPOCH},
};

/// Decisions kept per sandbox; older ones fall off.
pub const LOG_CAPACITY: usize = 256;

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Connections the gateway carried (upstream connected).
    pub connections_opened: u64,
    /// Connections refused: by policy, by a closed range, by a limit, or
    /// because upstream could not be reached.
    pub connections_refused: u64,
}

/// One decision on one connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The name the workload resolved, when it dialled a fake IP.
    pub name: Option<String>,
    /// The address the workload dialled (a fake IP for names).
    pub address: IpAddr,
    pub port: u16,
    pub allowed: bool,
    /// Why it was refused (empty when allowed).
    pub reason: String,
    /// Payload bytes of the flow so far (allowed ones only).
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// The gateway terminated its TLS to broker a secret (the bytes are
    /// still the workload's own, as it wrote and read them).
    pub brokered: bool,
    /// A UDP flow (`udp:` entries); TCP otherwise.
    pub udp: bool,
}

#[derive(Debug, Default)]
struct Ring {
    /// Sequence number of `entries[0]`.
    first: u64,
    entries: VecDeque<Decision>,
}

/// A sandbox's counters and log; shared between its loop and the hub.
#[derive(Debug, Default)]
pub struct Meter {
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    opened: AtomicU64,
    refused: AtomicU64,
    ring: Mutex<Ring>,
    /// The proxy's `--egress-rate-mbit` window: (its start, total bytes
    /// then); `None` until the first check.
    rate_window: Mutex<Option<(std::time::Instant, u64)>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Meter {
    pub fn totals(&self) -> Totals {
        Totals {
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            connections_opened: self.opened.load(Ordering::Relaxed),
            connections_refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// The kept decisions, oldest first.
    pub fn decisions(&self) -> Vec<Decision> {
        self.ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .iter()
            .cloned()
            .collect()
    }

    /// Payload bytes both ways (what `egress_mb` caps).
    pub fn total_bytes(&self) -> u64 {
        self.bytes_out
            .load(Ordering::Relaxed)
            .saturating_add(self.bytes_in.load(Ordering::Relaxed))
    }

    fn push(&self, d: Decision) -> u64 {
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if r.entries.len() >= LOG_CAPACITY {
            r.entries.pop_front();
            r.first += 1;
        }
        r.entries.push_back(d);
        r.first + r.entries.len() as u64 - 1
    }

    pub(crate) fn refused(&self, name: Option<&str>, address: IpAddr, port: u16, why: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.push(denial(name, address, port, why, false));
    }

    /// A UDP flow refused on its first datagram.
    pub(crate) fn refused_udp(&self, name: Option<&str>, address: IpAddr, port: u16, why: &str) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.push(denial(name, address, port, why, true));
    }

    /// An open flow the gateway closed (a `PATCH` narrowed the policy): a
    /// decision of its own in the log, not counted as a refused connection
    /// (it was opened).
    pub(crate) fn closed(
        &self,
        name: Option<&str>,
        address: IpAddr,
        port: u16,
        why: &str,
        udp: bool,
    ) {
        self.push(denial(name, address, port, why, udp));
    }

    pub(crate) fn closed_udp(&self, name: Option<&str>, address: IpAddr, port: u16, why: &str) {
        self.closed(name, address, port, why, true);
    }

    /// An allowed UDP flow whose socket is open; the answer names its entry.
    pub(crate) fn opened_udp(&self, name: Option<&str>, address: IpAddr, port: u16) -> u64 {
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.push(denial(name, address, port, "", true).allow())
    }

    /// An allowed, connected flow; the answer names its log entry.
    pub(crate) fn opened(
        &self,
        name: Option<&str>,
        address: IpAddr,
        port: u16,
        brokered: bool,
    ) -> u64 {
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.push(Decision {
            at_ms: now_ms(),
            name: name.map(str::to_string),
            address,
            port,
            allowed: true,
            reason: String::new(),
            bytes_out: 0,
            bytes_in: 0,
            brokered,
            udp: false,
        })
    }

    /// Counts `out`/`in_` payload bytes of the flow whose entry is `seq`
    /// (which may have fallen off the log: the totals count them anyway).
    pub(crate) fn moved(&self, seq: u64, out: u64, in_: u64) {
        self.bytes_out.fetch_add(out, Ordering::Relaxed);
        self.bytes_in.fetch_add(in_, Ordering::Relaxed);
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = seq.checked_sub(r.first) {
            if let Some(d) = r.entries.get_mut(i as usize) {
                d.bytes_out += out;
                d.bytes_in += in_;
            }
        }
    }
}

impl Meter {
    /// Why a new connection is refused under `--egress-rate-mbit` `cap`,
    /// if it is: the payload rate (both ways) since the start of the
    /// current window (renewed each second) is above it. The TUN loop
    /// keeps its own window; the proxy, whose connections of one sandbox
    /// arrive on many tasks, keeps it here.
    pub fn over_rate(&self, cap: u64) -> Option<String> {
        let total = self.total_bytes();
        let mut w = self.rate_window.lock().unwrap_or_else(|p| p.into_inner());
        let (start, at_start) = *w.get_or_insert((std::time::Instant::now(), total));
        let secs = start.elapsed().as_secs_f64().max(0.001);
        let mbit = total.saturating_sub(at_start) as f64 * 8.0 / 1e6 / secs;
        if start.elapsed() >= std::time::Duration::from_secs(1) {
            *w = Some((std::time::Instant::now(), total));
        }
        (mbit > cap as f64).then(|| {
            format!(
                "--egress-rate-mbit: the sandbox moves {mbit:.1} Mbit/s, above the cap of {cap}"
            )
        })
    }
}

fn denial(name: Option<&str>, address: IpAddr, port: u16, why: &str, udp: bool) -> Decision {
    Decision {
        at_ms: now_ms(),
        name: name.map(str::to_string),
        address,
        port,
        allowed: false,
        reason: why.to_string(),
        bytes_out: 0,
        bytes_in: 0,
        brokered: false,
        udp,
    }
}

impl Decision {
    fn allow(self) -> Decision {
        Decision {
            allowed: true,
            reason: String::new(),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_window_refuses_while_above_the_cap() {
        let m = Meter::default();
        assert_eq!(m.over_rate(1), None); // opens the window
        let seq = m.opened(None, "203.0.113.1".parse().unwrap(), 80, false);
        m.moved(seq, 1_000_000, 1_000_000); // 16 Mbit within a few microseconds
        let why = m.over_rate(1).unwrap();
        assert!(
            why.contains("--egress-rate-mbit") && why.contains("cap of 1"),
            "{why}"
        );
        assert_eq!(m.over_rate(u64::MAX), None);
    }

    #[test]
    fn the_log_keeps_the_last_entries_and_bytes_reach_theirs() {
        let m = Meter::default();
        let a: IpAddr = "203.0.113.1".parse().unwrap();
        let first = m.opened(Some("a.test"), a, 443, true);
        for i in 0..LOG_CAPACITY as u16 {
            m.refused(None, a, i, "denied");
        }
        let last = m.opened(None, a, 80, false);
        m.moved(first, 5, 6); // fell off: totals only
        m.moved(last, 7, 8);
        let log = m.decisions();
        assert_eq!(log.len(), LOG_CAPACITY);
        assert_eq!(log[0].port, 1);
        let l = log.last().unwrap();
        assert!(l.allowed && !l.brokered);
        assert_eq!((l.bytes_out, l.bytes_in), (7, 8));
        assert_eq!(
            m.totals(),
            Totals {
                bytes_out: 12,
                bytes_in: 14,
                connections_opened: 2,
                connections_refused: LOG_CAPACITY as u64
            }
        );
        assert_eq!(m.total_bytes(), 26);
    }
}
