//! A sandbox's bounded ring of usage samples: 15 minutes at 1 s, then an
//! hour at 10 s (issue #30 §1). Both sides keep one: the hub's local
//! sampler per sandbox, and sandboxd for its own container on Kubernetes
//! (where the hub reads it on demand, as untrusted input).
//!
//! [`Ring`] keeps the last [`FINE`] samples at 1 s (15 minutes), and
//! behind them [`COARSE`] samples at 10 s (1 hour): a 1 s sample that
//! falls out of the fine part is folded into the coarse one, ten at a
//! time. A [`Point`] is 32 bytes of integers, so a ring is at most
//! (900 + 360) x 32 B = 40,320 B; its fine part is allocated when it is
//! made, its coarse part after 15 minutes.

use std::collections::VecDeque;

use sandhub_api::usage::UsageSample;

/// 1 s samples kept: 15 minutes.
pub const FINE: usize = 900;
/// 10 s samples kept behind them: 1 hour.
pub const COARSE: usize = 360;
/// 1 s samples folded into one coarse sample.
pub const FOLD: u16 = 10;

/// Absent (`disk_kib`, `rx_bytes`, `tx_bytes`).
const NONE: u32 = u32::MAX;

/// One interval's usage, compact: integers, saturating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Unix seconds at the end of the interval.
    pub t: u32,
    /// Seconds the interval spans.
    pub span: u16,
    /// CPU microseconds used over the interval.
    pub cpu_us: u32,
    /// Memory at most over the interval, KiB.
    pub mem_kib: u32,
    /// Processes at most over the interval.
    pub pids: u32,
    /// Disk use at the end, KiB (`u32::MAX`: no quota).
    pub disk_kib: u32,
    /// Network bytes over the interval (`u32::MAX`: no network).
    pub rx_bytes: u32,
    pub tx_bytes: u32,
}

fn clamp32(v: u64) -> u32 {
    v.min(u64::from(NONE - 1)) as u32
}

fn add(a: u32, b: u32) -> u32 {
    match (a, b) {
        (NONE, NONE) => NONE,
        (NONE, v) | (v, NONE) => v,
        (a, b) => clamp32(u64::from(a) + u64::from(b)),
    }
}

impl Point {
    /// A point from raw readings (bytes, microseconds), clamped to fit.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        t: u64,
        span: u64,
        cpu_us: u64,
        mem_bytes: u64,
        pids: u64,
        disk_bytes: Option<u64>,
        net: Option<(u64, u64)>,
    ) -> Point {
        Point {
            t: clamp32(t),
            span: span.clamp(1, u64::from(u16::MAX)) as u16,
            cpu_us: clamp32(cpu_us),
            mem_kib: clamp32(mem_bytes.div_ceil(1024)),
            pids: clamp32(pids),
            disk_kib: disk_bytes.map_or(NONE, |b| clamp32(b.div_ceil(1024))),
            rx_bytes: net.map_or(NONE, |(rx, _)| clamp32(rx)),
            tx_bytes: net.map_or(NONE, |(_, tx)| clamp32(tx)),
        }
    }

    /// `self` followed by `later`, as one interval.
    fn merge(self, later: Point) -> Point {
        Point {
            t: later.t,
            span: self.span.saturating_add(later.span),
            cpu_us: clamp32(u64::from(self.cpu_us) + u64::from(later.cpu_us)),
            mem_kib: self.mem_kib.max(later.mem_kib),
            pids: self.pids.max(later.pids),
            disk_kib: if later.disk_kib == NONE {
                self.disk_kib
            } else {
                later.disk_kib
            },
            rx_bytes: add(self.rx_bytes, later.rx_bytes),
            tx_bytes: add(self.tx_bytes, later.tx_bytes),
        }
    }

    /// CPU cores used on average over the interval.
    pub fn cpu_cores(&self) -> f64 {
        f64::from(self.cpu_us) / (f64::from(self.span.max(1)) * 1e6)
    }

    pub fn memory_bytes(&self) -> u64 {
        u64::from(self.mem_kib) * 1024
    }

    pub fn disk_bytes(&self) -> Option<u64> {
        (self.disk_kib != NONE).then(|| u64::from(self.disk_kib) * 1024)
    }

    pub fn to_api(self) -> UsageSample {
        let opt = |v: u32| (v != NONE).then_some(u64::from(v));
        UsageSample {
            timestamp: humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::from(self.t)),
            )
            .to_string(),
            cpu_cores: (self.cpu_cores() * 1000.0).round() / 1000.0,
            memory_bytes: self.memory_bytes(),
            pids: u64::from(self.pids),
            disk_bytes: self.disk_bytes(),
            net_rx_bytes: opt(self.rx_bytes),
            net_tx_bytes: opt(self.tx_bytes),
        }
    }
}

/// One sandbox's samples: 15 minutes at 1 s, then an hour at 10 s.
#[derive(Debug)]
pub struct Ring {
    fine: VecDeque<Point>,
    coarse: VecDeque<Point>,
    /// The coarse sample being folded, and how many 1 s samples it holds.
    folding: Option<(Point, u16)>,
}

impl Default for Ring {
    fn default() -> Self {
        Ring::new()
    }
}

impl Ring {
    pub fn new() -> Ring {
        Ring {
            fine: VecDeque::with_capacity(FINE),
            coarse: VecDeque::new(),
            folding: None,
        }
    }

    pub fn push(&mut self, p: Point) {
        if self.fine.len() == FINE {
            if let Some(old) = self.fine.pop_front() {
                self.fold(old);
            }
        }
        self.fine.push_back(p);
    }

    fn fold(&mut self, old: Point) {
        let (acc, n) = match self.folding.take() {
            Some((acc, n)) => (acc.merge(old), n + 1),
            None => (old, 1),
        };
        if n < FOLD {
            self.folding = Some((acc, n));
            return;
        }
        if self.coarse.capacity() == 0 {
            self.coarse.reserve_exact(COARSE);
        }
        if self.coarse.len() == COARSE {
            self.coarse.pop_front();
        }
        self.coarse.push_back(acc);
    }

    pub fn latest(&self) -> Option<Point> {
        self.fine.back().copied()
    }

    pub fn len(&self) -> usize {
        self.coarse.len() + usize::from(self.folding.is_some()) + self.fine.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the ring holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        (self.fine.capacity() + self.coarse.capacity()) * std::mem::size_of::<Point>()
    }

    /// The samples ending at or after `since` (Unix seconds), oldest
    /// first, folded into buckets of `step` seconds aligned to the epoch
    /// (a point is never split: coarse points stay 10 s wide under a
    /// smaller step).
    pub fn series(&self, since: u64, step: u64) -> Vec<Point> {
        let all = self
            .coarse
            .iter()
            .chain(self.folding.as_ref().map(|(p, _)| p))
            .chain(self.fine.iter());
        fold(all, since, step)
    }
}

/// Points (oldest first) ending at or after `since`, folded into buckets
/// of `step` seconds aligned to the epoch; a point is never split.
pub fn fold<'a>(points: impl Iterator<Item = &'a Point>, since: u64, step: u64) -> Vec<Point> {
    let step = step.max(1);
    let mut out: Vec<Point> = Vec::new();
    let mut bucket = u64::MAX;
    for p in points.filter(|p| u64::from(p.t) >= since) {
        let b = u64::from(p.t).div_ceil(step);
        match out.last_mut() {
            Some(last) if b == bucket => *last = last.merge(*p),
            _ => out.push(*p),
        }
        bucket = b;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: u64, cpu_us: u64, mem: u64) -> Point {
        Point::new(t, 1, cpu_us, mem, 3, Some(2048), Some((10, 20)))
    }
    #[test]
    fn a_point_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Point>(), 32);
    }

    #[test]
    fn the_ring_is_bounded_and_folds_into_ten_second_points() {
        let mut r = Ring::new();
        let start = 1_000_000;
        // Two hours at 1 s: far more than the ring keeps.
        for i in 0..7200u64 {
            r.push(p(start + i, 500_000, (i % 100) << 20));
        }
        assert!(r.len() <= FINE + COARSE + 1, "{}", r.len());
        let all = r.series(0, 1);
        assert_eq!(all.iter().filter(|p| p.span == 1).count(), FINE);
        let coarse: Vec<_> = all.iter().filter(|p| p.span == 10).collect();
        assert_eq!(coarse.len(), COARSE);
        // A coarse point: ten seconds at half a core is half a core.
        assert!((coarse[0].cpu_cores() - 0.5).abs() < 1e-9);
        assert_eq!(coarse[0].rx_bytes, 100, "network adds up");
        assert_eq!(coarse[0].mem_kib % 1024, 0);
        // Oldest first, no gaps between the tiers.
        assert!(all.windows(2).all(|w| w[0].t < w[1].t));
        assert!(r.heap_bytes() <= (FINE + COARSE) * 32 + 32 * 32);
        assert_eq!(r.latest().unwrap().t as u64, start + 7199);
    }

    #[test]
    fn series_folds_to_the_step_and_starts_at_since() {
        let mut r = Ring::new();
        for i in 1..=20u64 {
            r.push(p(100 + i, 1_000_000, i << 20));
        }
        let s = r.series(0, 5);
        assert_eq!(
            s.len(),
            4,
            "101..=120 in buckets ending at 105, 110, 115, 120"
        );
        let full = s[1];
        assert_eq!(full.span, 5);
        assert!((full.cpu_cores() - 1.0).abs() < 1e-9);
        assert_eq!(
            full.memory_bytes(),
            10 << 20,
            "memory is the step's highest"
        );
        assert_eq!(r.series(115, 1).len(), 6);
        assert!(r.series(200, 1).is_empty());
    }

    #[test]
    fn values_are_clamped_not_wrapped() {
        let p = Point::new(u64::MAX, 0, u64::MAX, u64::MAX, u64::MAX, None, None);
        assert_eq!(p.span, 1);
        assert_eq!(p.cpu_us, u32::MAX - 1);
        assert_eq!(p.disk_bytes(), None);
        assert_eq!(p.to_api().net_rx_bytes, None);
    }
}
