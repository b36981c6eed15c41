//! Usage of sandboxd's own container (issue #30 §1, Kubernetes): from its
//! start (or, with `--usage-sampling on-demand`, the first `GET` of
//! [`USAGE_ROUTE`]) sandboxd reads its cgroup (`/sys/fs/cgroup`, the
//! container's own, v2 or v1) once a second into a [`Ring`], and answers
//! the ring as a [`UsageReport`]. Under the hub's local backend (which
//! reads every sandbox's cgroup from the host) nothing samples until
//! someone asks, so those sandboxes pay nothing.
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

/// Where a container sees its own cgroup: the v2 directory itself, or
/// (cgroup v1) one directory per controller under it.
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
    /// The ring's points ending at or after `since` (Unix seconds) in the
    /// report's compact form.
    pub fn points_of(ring: &Ring, since: u64) -> Vec<[u64; 5]> {
        ring.series(since, 1)
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
    /// Starts sampling (once; later calls do nothing).
    pub fn start(&self) {
        self.state();
    }

    fn state(&self) -> Option<&Arc<Mutex<State>>> {
        self.started
            .get_or_init(|| start(Path::new(OWN_CGROUP)))
            .as_ref()
    }

    /// The report so far, its points those ending at or after `since`
    /// (Unix seconds; 0: all of them); starts sampling on the first call.
    /// None when sandboxd sees no cgroup of its own.
    pub fn report(&self, since: u64) -> Option<UsageReport> {
        let state = self.state()?;
        let s = state.lock().unwrap_or_else(|p| p.into_inner());
        Some(UsageReport {
            memory_limit_bytes: s.limits.memory_bytes,
            cpu_limit: s.limits.cpu,
            pids_limit: s.limits.pids,
            memory_peak_bytes: s.peak,
            oom_kills: s.oom_kills,
            points: UsageReport::points_of(&s.ring, since),
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

/// Where sandboxd's own counters are, its files kept open (a handful of
/// fds, read once a second for the daemon's whole life).
enum Source {
    V2(cgroup::Files),
    V1(cgroup::V1Files),
}

impl Source {
    /// The cgroup under `root`: v2 where `cgroup.controllers` is there,
    /// else v1's controller directories (a node still on cgroup v1).
    fn open(root: &Path) -> Option<Source> {
        let fd = open_dir(root).ok()?;
        let mut buf = [0u8; cgroup::READ_BUF];
        if cgroup::read_at(fd.as_fd(), "cgroup.controllers", &mut buf).is_ok() {
            return Some(Source::V2(cgroup::Files::kept(fd)));
        }
        let sub = |name: &str| open_dir(&root.join(name)).ok().map(cgroup::Files::kept);
        // `cpuacct` is most often a symlink to `cpu,cpuacct`; directories
        // are opened without following links, so the real name goes first.
        Some(Source::V1(cgroup::V1Files {
            memory: sub("memory")?,
            pids: sub("pids"),
            cpu: sub("cpu,cpuacct").or_else(|| sub("cpuacct"))?,
            cpuacct: None,
        }))
    }

    fn read(&mut self, buf: &mut [u8; cgroup::READ_BUF]) -> std::io::Result<cgroup::Counters> {
        match self {
            Source::V2(files) => cgroup::read_v2(files, buf, None),
            Source::V1(v1) => v1.read(buf, None),
        }
    }

    fn limits(&self) -> cgroup::CgroupLimits {
        match self {
            Source::V2(files) => cgroup::limits_v2(files.dir()),
            Source::V1(v1) => v1.limits(),
        }
    }
}

/// Opens the cgroup under `root` and samples it each second on a thread of
/// its own.
fn start(root: &Path) -> Option<Arc<Mutex<State>>> {
    start_every(root, Duration::from_secs(1))
}

fn start_every(root: &Path, period: Duration) -> Option<Arc<Mutex<State>>> {
    let mut source = Source::open(root)?;
    let mut buf = [0u8; cgroup::READ_BUF];
    let first = source.read(&mut buf).ok()?;
    let state = Arc::new(Mutex::new(State {
        ring: Ring::new(),
        limits: source.limits(),
        peak: first.memory_peak_bytes.max(first.memory_bytes),
        oom_kills: first.oom_kills,
    }));
    let shared = state.clone();
    std::thread::Builder::new()
        .name("sandboxd-usage".into())
        .spawn(move || sample(source, first, shared, period))
        .ok()?;
    Some(state)
}

fn sample(mut source: Source, first: cgroup::Counters, state: Arc<Mutex<State>>, period: Duration) {
    let mut buf = [0u8; cgroup::READ_BUF];
    let (mut at, mut cpu) = (Instant::now(), first.cpu_usec);
    loop {
        std::thread::sleep(period);
        let Ok(c) = source.read(&mut buf) else {
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

    fn write_all(d: &Path, files: &[(&str, &str)]) {
        for (f, v) in files {
            std::fs::write(d.join(f), v).unwrap();
        }
    }

    /// Samples `root` every 10 ms until the ring holds three points.
    fn sampled(root: &Path) -> Arc<Mutex<State>> {
        let state = start_every(root, Duration::from_millis(10)).expect("a cgroup");
        let until = Instant::now() + Duration::from_secs(5);
        while state.lock().unwrap().ring.len() < 3 {
            assert!(Instant::now() < until);
            std::thread::sleep(Duration::from_millis(5));
        }
        state
    }

    #[test]
    fn samples_a_v2_directory_each_period() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_all(
            d,
            &[
                ("cgroup.controllers", "cpu memory pids\n"),
                ("cpu.stat", "usage_usec 1000\n"),
                ("memory.current", "2097152\n"),
                ("memory.peak", "4194304\n"),
                ("memory.events", "oom_kill 1\n"),
                ("pids.current", "5\n"),
                ("memory.max", "67108864\n"),
                ("cpu.max", "max 100000\n"),
                ("pids.max", "64\n"),
            ],
        );
        let state = sampled(d);
        let s = state.lock().unwrap();
        assert_eq!(s.limits.memory_bytes, Some(64 << 20));
        assert_eq!(s.limits.pids, Some(64));
        assert_eq!(s.limits.cpu, None);
        assert_eq!(s.oom_kills, 1);
        assert_eq!(s.peak, 4 << 20);
        let pts = UsageReport::points_of(&s.ring, 0);
        assert_eq!(pts[0][3], 2048, "KiB");
        assert_eq!(pts[0][4], 5);
        // `since` past the last point: the counters alone (the hub's OOM watch).
        assert!(UsageReport::points_of(&s.ring, u64::MAX).is_empty());
        drop(s);
        // Gone: the thread ends.
        std::fs::remove_file(d.join("cpu.stat")).unwrap();
    }

    /// A node on cgroup v1 mounts one directory per controller, `cpuacct`
    /// a symlink to `cpu,cpuacct`.
    #[test]
    fn samples_v1_controller_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for dir in ["memory", "cpu,cpuacct", "pids"] {
            std::fs::create_dir(d.join(dir)).unwrap();
        }
        std::os::unix::fs::symlink("cpu,cpuacct", d.join("cpuacct")).unwrap();
        write_all(
            &d.join("memory"),
            &[
                ("memory.usage_in_bytes", "3145728\n"),
                ("memory.max_usage_in_bytes", "8388608\n"),
                ("memory.limit_in_bytes", "134217728\n"),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
                ),
            ],
        );
        write_all(
            &d.join("cpu,cpuacct"),
            &[
                ("cpuacct.usage", "5000000\n"),
                ("cpu.cfs_quota_us", "150000\n"),
                ("cpu.cfs_period_us", "100000\n"),
            ],
        );
        write_all(
            &d.join("pids"),
            &[("pids.current", "7\n"), ("pids.max", "max\n")],
        );
        let state = sampled(d);
        let s = state.lock().unwrap();
        assert_eq!(s.limits.memory_bytes, Some(128 << 20));
        assert_eq!(s.limits.cpu, Some(1.5));
        assert_eq!(s.limits.pids, None);
        assert_eq!(s.oom_kills, 2);
        assert_eq!(s.peak, 8 << 20);
        let pts = UsageReport::points_of(&s.ring, 0);
        assert_eq!(pts[0][3], 3072, "KiB");
        assert_eq!(pts[0][4], 7);
    }

    #[test]
    fn no_cgroup_no_sampler() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(start_every(tmp.path(), Duration::from_millis(10)).is_none());
    }
}
