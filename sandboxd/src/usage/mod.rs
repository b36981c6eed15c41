//! Usage of sandboxd's own container (issue #30 §1, Kubernetes): on the
//! first `GET` of [`USAGE_ROUTE`] sandboxd starts reading its cgroup
//! (`/sys/fs/cgroup`, the container's own under its cgroup namespace) once
//! a second into a [`Ring`], and answers the ring as a [`UsageReport`].
//! Nothing samples until someone asks, so a sandbox whose hub reads its
//! cgroup from the host (the local backend) pays nothing.
//!
//! The report comes from inside the sandbox: a workload that owns sandboxd
//! can make it say anything. The hub bounds its size, clamps every value
//! and measures it against the limits it set itself, never the ones
//! reported here (`sandhub::kube::usage`).

pub mod cgroup;
pub mod ring;

use std::{
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub use ring::{fold, Point, Ring, COARSE, FINE, FOLD};
use serde::{Deserialize, Serialize};

/// `GET` here answers [`UsageReport`]. A Sandhub route: upstream has none.
pub const USAGE_ROUTE: &str = "/v1/_sandhub/usage";

/// The cgroup v2 mount a container sees as its own cgroup.
const OWN_CGROUP: &str = "/sys/fs/cgroup";

/// What sandboxd reports of its container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The limits on the container's cgroup (informative: the hub uses its own).
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    #[serde(default)]
    pub cpu_limit: Option<f64>,
    #[serde(default)]
    pub pids_limit: Option<u64>,
    pub memory_peak_bytes: u64,
    pub oom_kills: u64,
    /// Oldest first: `[unix seconds, span s, cpu µs, memory KiB, pids]`.
    pub points: Vec<[u64; 5]>,
}

impl UsageReport {
    /// The ring's points in the report's compact form.
    pub fn points_of(ring: &Ring) -> Vec<[u64; 5]> {
        ring.series(0, 1)
            .into_iter()
            .map(|p| {
                [
                    u64::from(p.t),
                    u64::from(p.span),
                    u64::from(p.cpu_us),
                    u64::from(p.mem_kib),
                    u64::from(p.pids),
                ]
            })
            .collect()
    }
}

struct State {
    ring: Ring,
    limits: cgroup::CgroupLimits,
    peak: u64,
    oom_kills: u64,
}

/// sandboxd's own sampler, started on first use.
#[derive(Default)]
pub struct OwnUsage {
    started: OnceLock<Option<Arc<Mutex<State>>>>,
}

impl std::fmt::Debug for OwnUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnUsage").finish_non_exhaustive()
    }
}

impl OwnUsage {
    /// The report so far; starts sampling on the first call. None when
    /// sandboxd sees no cgroup v2 of its own.
    pub fn report(&self) -> Option<UsageReport> {
        let state = self
            .started
            .get_or_init(|| start(Path::new(OWN_CGROUP)))
            .as_ref()?;
        let s = state.lock().unwrap_or_else(|p| p.into_inner());
        Some(UsageReport {
            memory_limit_bytes: s.limits.memory_bytes,
            cpu_limit: s.limits.cpu,
            pids_limit: s.limits.pids,
            memory_peak_bytes: s.peak,
            oom_kills: s.oom_kills,
            points: UsageReport::points_of(&s.ring),
        })
    }
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?)
}

/// Opens `dir` and samples it each second on a thread of its own.
fn start(dir: &Path) -> Option<Arc<Mutex<State>>> {
    let fd = open_dir(dir).ok()?;
    let mut buf = [0u8; cgroup::READ_BUF];
    let first = cgroup::read_v2(fd.as_fd(), &mut buf).ok()?;
    let state = Arc::new(Mutex::new(State {
        ring: Ring::new(),
        limits: cgroup::limits_v2(fd.as_fd()),
        peak: first.memory_peak_bytes.max(first.memory_bytes),
        oom_kills: first.oom_kills,
    }));
    let shared = state.clone();
    std::thread::Builder::new()
        .name("sandboxd-usage".into())
        .spawn(move || sample(fd, first, shared, Duration::from_secs(1)))
        .ok()?;
    Some(state)
}

fn sample(fd: OwnedFd, first: cgroup::Counters, state: Arc<Mutex<State>>, period: Duration) {
    let mut buf = [0u8; cgroup::READ_BUF];
    let (mut at, mut cpu) = (Instant::now(), first.cpu_usec);
    loop {
        std::thread::sleep(period);
        let Ok(c) = cgroup::read_v2(fd.as_fd(), &mut buf) else {
            return;
        };
        let now = Instant::now();
        let elapsed_us = now.duration_since(at).as_micros().max(1) as u64;
        let span = ((elapsed_us + 500_000) / 1_000_000).max(1);
        let cpu_us = (u128::from(c.cpu_usec.saturating_sub(cpu)) * u128::from(span * 1_000_000)
            / u128::from(elapsed_us)) as u64;
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        s.ring.push(Point::new(
            t,
            span,
            cpu_us,
            c.memory_bytes,
            c.pids,
            None,
            None,
        ));
        s.peak = s.peak.max(c.memory_peak_bytes).max(c.memory_bytes);
        s.oom_kills = c.oom_kills;
        drop(s);
        (at, cpu) = (now, c.cpu_usec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_a_v2_directory_each_period() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for (f, v) in [
            ("cpu.stat", "usage_usec 1000\n"),
            ("memory.current", "2097152\n"),
            ("memory.peak", "4194304\n"),
            ("memory.events", "oom_kill 1\n"),
            ("pids.current", "5\n"),
            ("memory.max", "67108864\n"),
            ("cpu.max", "max 100000\n"),
            ("pids.max", "64\n"),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
        let fd = open_dir(d).unwrap();
        let mut buf = [0u8; cgroup::READ_BUF];
        let first = cgroup::read_v2(fd.as_fd(), &mut buf).unwrap();
        let state = Arc::new(Mutex::new(State {
            ring: Ring::new(),
            limits: cgroup::limits_v2(fd.as_fd()),
            peak: 0,
            oom_kills: 0,
        }));
        let shared = state.clone();
        std::thread::spawn(move || sample(fd, first, shared, Duration::from_millis(10)));
        let until = Instant::now() + Duration::from_secs(5);
        while state.lock().unwrap().ring.len() < 3 {
            assert!(Instant::now() < until);
            std::thread::sleep(Duration::from_millis(5));
        }
        let s = state.lock().unwrap();
        assert_eq!(s.limits.memory_bytes, Some(64 << 20));
        assert_eq!(s.limits.pids, Some(64));
        assert_eq!(s.oom_kills, 1);
        assert_eq!(s.peak, 4 << 20);
        let pts = UsageReport::points_of(&s.ring);
        assert_eq!(pts[0][3], 2048, "KiB");
        assert_eq!(pts[0][4], 5);
        drop(s);
        // Gone: the thread ends.
        std::fs::remove_file(d.join("cpu.stat")).unwrap();
    }
}
