//! The local backend's usage sampler (issue #30 §1): one thread reads
//! every sandbox's cgroup once a second and keeps each sandbox's ring
//! ([`crate::usage::Ring`]).
//!
//! Each second, for every sandbox that has a cgroup: `cpu.stat`,
//! `memory.current`, `memory.peak`, `memory.events` and `pids.current`
//! (through the cgroup dir fd opened when the sandbox was first seen, see
//! `runtime::cgstat`), its disk quota's `referenced` (through its qgroup's
//! sysfs dir fd), and, for a sandbox with a network (`egress`), the
//! payload bytes its gateway counted. The kernel keeps all of these, so a
//! sandbox forking a thousand processes or filling its disk costs the
//! same few syscalls and is sampled on time.
//!
//! Most sandboxes idle, so most of those reads would answer what they did
//! a second ago. While a sandbox's memory has not moved, its high-water
//! mark, OOM count and disk use are taken from the last reading (an OOM
//! kill frees memory, and a write is charged to memory through the page
//! cache); every [`FULL_EVERY`] ticks everything is read whatever the
//! memory says, which bounds how stale a spike that ended at the very same
//! byte count can leave them. An idle sandbox then costs three reads a
//! tick (cgroup v2 and v1 alike) instead of seven.
//!
//! Which sandboxes exist is the cgroup parent's listing: a sandbox is
//! sampled from its first second and forgotten (its ring freed) at the
//! first tick after its cgroup is removed (stop, suspend, delete). A
//! sandbox resumed gets a new cgroup and starts a new ring.
//!
//! Alerts ([`UsageAlert`]) go to every [`Sampler::subscribe`]r: an OOM
//! kill count that rose, a disk that reached its quota. The count a
//! sandbox already had when first seen (after a hub restart) raises none.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use sandboxd::usage::cgroup::Files;
use sandhub_api::usage::{SandboxUsage, UsageLimits};
use tokio::sync::broadcast;

use super::runtime::{
    cgstat::{CgroupLimits, CgroupStats, CgroupTree, Counters, MAX_HELD, READ_BUF},
    quota::{read_qgroup, read_qgroup_used},
};
use crate::usage::{disk_full, Latest, Point, Ring, UsageAlert};

/// Every this many ticks a sandbox's every file is read; in between, the
/// memory high-water mark, the OOM count and the disk quota are read only
/// when its memory moved (see [`Counters`]' readers), which is most of the
/// cost of idle sandboxes saved.
const FULL_EVERY: u32 = 10;

/// Alerts buffered for a slow subscriber before it starts missing them.
const ALERT_BUFFER: usize = 256;

/// Files one sandbox's probe holds open when kept: its cgroup's, and its
/// qgroup's two.
const FILES_PER_SANDBOX: usize = MAX_HELD + 2;

/// The most fds the sampler holds open in all: an eighth of the hub's
/// `RLIMIT_NOFILE` (the port proxy has a quarter, the API half), at most
/// 16,384. Sandboxes past it are read with an `openat` a file a tick.
fn fd_budget() -> usize {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(16_384 * 8);
    (nofile / 8).min(16_384) as usize
}

/// A sandbox's qgroup sysfs dir, found when it is first seen.
pub type DiskLookup = Arc<dyn Fn(&str) -> Option<OwnedFd> + Send + Sync>;
/// Cumulative network payload bytes `(in, out)` of a sandbox with a network.
pub type NetLookup = Arc<dyn Fn(&str) -> Option<(u64, u64)> + Send + Sync>;

/// Whether a cgroup under the shared parent is one of this hub's
/// sandboxes (several hubs on one machine share the parent).
pub type Owns = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What the sampler reads.
pub struct Sources {
    pub cgroups: CgroupTree,
    /// None: every cgroup under the parent.
    pub owns: Option<Owns>,
    pub disk: Option<DiskLookup>,
    pub net: Option<NetLookup>,
}

/// One sandbox as the REST layer sees it.
struct Series {
    ring: Ring,
    latest: Option<Latest>,
    limits: UsageLimits,
}

struct Shared {
    series: Mutex<HashMap<String, Series>>,
    alerts: broadcast::Sender<UsageAlert>,
    /// CPU time the sampling thread has used, ns (for the bench and `/metrics`).
    busy_ns: AtomicU64,
    ticks: AtomicU64,
}

/// The sampler thread and what it has gathered. Stops when dropped.
pub struct Sampler {
    shared: Arc<Shared>,
    stop: Mutex<Option<mpsc::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("ticks", &self.shared.ticks.load(Ordering::Relaxed))
            .finish()
    }
}

/// The last reading of a sandbox: when, its counters, network bytes (in,
/// out).
type Reading = (Instant, Counters, Option<(u64, u64)>);

/// The sampling thread's own state of one sandbox.
struct Probe {
    stats: CgroupStats,
    qgroup: Option<Files>,
    /// Its files are kept open (it counts against the fd budget).
    kept: bool,
    prev: Option<Reading>,
    /// The last `(used, limit)` of its qgroup.
    disk: Option<(u64, Option<u64>)>,
    /// Where it is in its [`FULL_EVERY`] cycle: everything is read at 0.
    phase: u32,
    oom_seen: u64,
    disk_was_full: bool,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, nothing else.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

fn limits_of(c: &CgroupLimits, disk_limit: Option<u64>) -> UsageLimits {
    UsageLimits {
        memory_mb: c.memory_bytes.map(|b| b >> 20),
        disk_mb: disk_limit.map(|b| b >> 20),
        cpu: c.cpu.map(|v| (v * 1000.0).round() / 1000.0),
        pids: c.pids,
    }
}

impl Sampler {
    /// Starts sampling every `period` (one second in the hub).
    pub fn start(sources: Sources, period: Duration) -> std::io::Result<Sampler> {
        let (alerts, _) = broadcast::channel(ALERT_BUFFER);
        let shared = Arc::new(Shared {
            series: Mutex::new(HashMap::new()),
            alerts,
            busy_ns: AtomicU64::new(0),
            ticks: AtomicU64::new(0),
        });
        let (stop, stopped) = mpsc::channel();
        let worker = Worker {
            sources,
            shared: shared.clone(),
            probes: HashMap::new(),
            foreign: std::collections::HashSet::new(),
            listing_failed: false,
            kept: 0,
            keep_at_most: fd_budget() / FILES_PER_SANDBOX,
        };
        let thread = std::thread::Builder::new()
            .name("sandhub-sampler".into())
            .spawn(move || worker.run(period, stopped))?;
        Ok(Sampler {
            shared,
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the thread (idempotent); what was gathered stays readable.
    pub fn stop(&self) {
        drop(self.stop.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }

    /// The hook for the event log: every alert from now on. A subscriber
    /// more than [`ALERT_BUFFER`] alerts behind misses the oldest (and is
    /// told so by `RecvError::Lagged`); the sampler never waits for one.
    pub fn subscribe(&self) -> broadcast::Receiver<UsageAlert> {
        self.shared.alerts.subscribe()
    }

    /// The latest sample of sandbox `id` and its limits, once it has one.
    pub fn latest(&self, id: &str) -> Option<SandboxUsage> {
        let series = self.shared.series.lock().unwrap_or_else(|p| p.into_inner());
        series.get(id)?.latest.as_ref().map(Latest::to_api)
    }

    /// Sandbox `id`'s samples since `since` folded to `step` seconds, with
    /// its limits; None when it is not being sampled.
    pub fn series(&self, id: &str, since: u64, step: u64) -> Option<(UsageLimits, Vec<Point>)> {
        let series = self.shared.series.lock().unwrap_or_else(|p| p.into_inner());
        let s = series.get(id)?;
        Some((s.limits.clone(), s.ring.series(since, step)))
    }

    /// Sandboxes sampled now.
    pub fn tracked(&self) -> usize {
        self.shared
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Heap bytes of every ring together.
    pub fn ring_bytes(&self) -> usize {
        let series = self.shared.series.lock().unwrap_or_else(|p| p.into_inner());
        series.values().map(|s| s.ring.heap_bytes()).sum()
    }

    /// CPU time the sampling thread used so far, and its ticks.
    pub fn cost(&self) -> (Duration, u64) {
        (
            Duration::from_nanos(self.shared.busy_ns.load(Ordering::Relaxed)),
            self.shared.ticks.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Worker {
    sources: Sources,
    shared: Arc<Shared>,
    probes: HashMap<String, Probe>,
    /// Cgroups of other hubs' sandboxes, checked once while they exist.
    foreign: std::collections::HashSet<String>,
    listing_failed: bool,
    /// Probes whose files are kept open, and how many may be.
    kept: usize,
    keep_at_most: usize,
}

impl Worker {
    fn run(mut self, period: Duration, stopped: mpsc::Receiver<()>) {
        let mut next = Instant::now();
        loop {
            let cpu0 = thread_cpu_ns();
            self.tick();
            self.shared
                .busy_ns
                .fetch_add(thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
            self.shared.ticks.fetch_add(1, Ordering::Relaxed);
            next += period;
            let now = Instant::now();
            if next < now {
                // Fell behind (a stalled host): skip, never burst.
                next = now + period;
            }
            match stopped.recv_timeout(next - now) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        }
    }

    fn tick(&mut self) {
        let ids = match self.sources.cgroups.ids() {
            Ok(ids) => {
                self.listing_failed = false;
                ids
            }
            Err(e) => {
                if !self.listing_failed {
                    tracing::warn!(error = %e, "usage sampler: listing the sandboxes' cgroups");
                }
                self.listing_failed = true;
                Vec::new()
            }
        };
        // Forget the gone, open the new.
        let mut gone: Vec<String> = self
            .probes
            .keys()
            .filter(|id| !ids.contains(id))
            .cloned()
            .collect();
        self.foreign.retain(|id| ids.contains(id));
        let mut opened: Vec<(String, UsageLimits)> = Vec::new();
        for id in &ids {
            if self.probes.contains_key(id) || self.foreign.contains(id) {
                continue;
            }
            if let Some(owns) = &self.sources.owns {
                if !owns(id) {
                    self.foreign.insert(id.clone());
                    continue;
                }
            }
            let keep = self.kept < self.keep_at_most;
            let Ok((stats, limits)) = self.sources.cgroups.open(id, keep) else {
                continue;
            };
            self.kept += usize::from(keep);
            let mut qgroup = self.sources.disk.as_ref().and_then(|d| d(id)).map(|fd| {
                if keep {
                    Files::kept(fd)
                } else {
                    Files::opened_each_time(fd)
                }
            });
            let disk_limit = qgroup
                .as_mut()
                .and_then(|q| read_qgroup(q).ok())
                .and_then(|(_, max)| max);
            opened.push((id.clone(), limits_of(&limits, disk_limit)));
            // Spread over the cycle, so the full reads of sandboxes
            // started together do not fall on one tick.
            let phase = (self.probes.len() as u32) % FULL_EVERY;
            self.probes.insert(
                id.clone(),
                Probe {
                    stats,
                    qgroup,
                    kept: keep,
                    prev: None,
                    disk: None,
                    phase,
                    oom_seen: 0,
                    disk_was_full: false,
                },
            );
        }
        // Read everything before taking the lock the REST side reads under.
        let t = unix_now();
        let mut buf = [0u8; READ_BUF];
        let mut points: Vec<(String, Point, Counters)> = Vec::with_capacity(self.probes.len());
        for (id, probe) in self.probes.iter_mut() {
            let now = Instant::now();
            let full = probe.prev.is_none() || probe.phase == 0;
            probe.phase = (probe.phase + 1) % FULL_EVERY;
            let since = match &probe.prev {
                Some((_, last, _)) if !full => Some(last),
                _ => None,
            };
            let counters = match probe.stats.read(&mut buf, since) {
                Ok(c) => c,
                Err(_) => {
                    gone.push(id.clone());
                    continue;
                }
            };
            // A write to its disk goes through the page cache, which is
            // charged to its memory: unmoved memory, unread disk.
            let moved = since.is_none_or(|l| l.memory_bytes != counters.memory_bytes);
            let disk = match probe.qgroup.as_mut() {
                None => None,
                Some(q) if full => read_qgroup(q).ok(),
                Some(q) if moved => read_qgroup_used(q)
                    .ok()
                    .map(|used| (used, probe.disk.and_then(|(_, max)| max))),
                Some(_) => probe.disk,
            };
            probe.disk = disk;
            let net = self.sources.net.as_ref().and_then(|n| n(id));
            let first = probe.prev.is_none();
            if let Some((at, last, prev_net)) = probe.prev {
                let elapsed_us = now.duration_since(at).as_micros().max(1) as u64;
                let span = (elapsed_us + 500_000) / 1_000_000;
                // CPU over exactly `span` seconds, whatever the tick's jitter.
                let cpu_us = (u128::from(counters.cpu_usec.saturating_sub(last.cpu_usec))
                    * u128::from(span.max(1) * 1_000_000)
                    / u128::from(elapsed_us)) as u64;
                let net_delta = net.map(|(rx, tx)| match prev_net {
                    // A counter that went down restarted (a new gateway).
                    Some((prx, ptx)) if rx >= prx && tx >= ptx => (rx - prx, tx - ptx),
                    _ => (rx, tx),
                });
                let point = Point::new(
                    t,
                    span,
                    cpu_us,
                    counters.memory_bytes,
                    counters.pids,
                    disk.map(|(used, _)| used),
                    net_delta,
                );
                points.push((id.clone(), point, counters));
            }
            probe.prev = Some((now, counters, net));
            // Alerts: the event log's hook.
            if counters.oom_kills > probe.oom_seen && !first {
                let _ = self.shared.alerts.send(UsageAlert::OomKilled {
                    sandbox: id.clone(),
                    oom_kills: counters.oom_kills,
                    new_kills: counters.oom_kills - probe.oom_seen,
                });
            }
            probe.oom_seen = counters.oom_kills;
            if let Some((used, Some(limit))) = disk {
                let full = disk_full(used, limit);
                if full && !probe.disk_was_full {
                    let _ = self.shared.alerts.send(UsageAlert::DiskQuotaReached {
                        sandbox: id.clone(),
                        used_bytes: used,
                        limit_bytes: limit,
                    });
                }
                probe.disk_was_full = full;
            }
        }
        for id in &gone {
            if self.probes.remove(id).is_some_and(|p| p.kept) {
                self.kept -= 1;
            }
        }
        let mut series = self.shared.series.lock().unwrap_or_else(|p| p.into_inner());
        for id in &gone {
            series.remove(id);
        }
        for (id, limits) in opened {
            series.insert(
                id,
                Series {
                    ring: Ring::new(),
                    latest: None,
                    limits,
                },
            );
        }
        for (id, point, counters) in points {
            let Some(s) = series.get_mut(&id) else {
                continue;
            };
            s.ring.push(point);
            s.latest = Some(Latest {
                point,
                memory_peak_bytes: counters.memory_peak_bytes.max(counters.memory_bytes),
                oom_kills: counters.oom_kills,
                limits: s.limits.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn fake(dir: &std::path::Path, id: &str, cpu: u64, oom: u64) {
        let d = dir.join(id);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            ("cpu.stat", format!("usage_usec {cpu}\n")),
            ("memory.current", "1048576\n".into()),
            ("memory.events", format!("oom 0\noom_kill {oom}\n")),
            ("pids.current", "4\n".into()),
            ("memory.max", "67108864\n".into()),
            ("pids.max", "100\n".into()),
            ("cpu.max", "max 100000\n".into()),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
    }

    fn wait(mut f: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < until, "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn samples_follows_the_tree_and_raises_the_oom_hook() {
        let tmp = tempfile::tempdir().unwrap();
        fake(tmp.path(), "sb-1", 0, 2);
        fake(tmp.path(), "other-hubs", 0, 0);
        let sampler = Sampler::start(
            Sources {
                cgroups: CgroupTree::v2_at(tmp.path()),
                owns: Some(Arc::new(|id: &str| id != "other-hubs")),
                disk: None,
                net: Some(Arc::new(|id: &str| (id == "sb-1").then_some((100, 50)))),
            },
            Duration::from_millis(20),
        )
        .unwrap();
        let mut alerts = sampler.subscribe();
        wait(|| sampler.latest("sb-1").is_some());
        assert_eq!(sampler.tracked(), 1, "another hub's sandbox is not sampled");
        let u = sampler.latest("sb-1").unwrap();
        assert_eq!(u.limits.memory_mb, Some(64));
        assert_eq!(u.limits.pids, Some(100));
        assert_eq!(u.limits.cpu, None);
        assert_eq!(u.latest.memory_bytes, 1 << 20);
        assert_eq!(u.latest.pids, 4);
        assert_eq!(u.oom_kills, 2);
        assert!(
            alerts.try_recv().is_err(),
            "kills it had when first seen raise nothing"
        );
        // The kernel counts a new kill: one alert. The sampler keeps the file
        // open and re-reads it, as it does kernfs files, so the new value is
        // written in place (same length, one write), not renamed over it.
        let events = tmp.path().join("sb-1/memory.events");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&events)
            .unwrap()
            .write_all_at(b"oom 1\noom_kill 3\n", 0)
            .unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let alert = loop {
            match alerts.try_recv() {
                Ok(a) => break a,
                Err(_) => {
                    assert!(Instant::now() < until, "no alert for the new kill");
                    std::thread::sleep(Duration::from_millis(5))
                }
            }
        };
        assert_eq!(
            alert,
            UsageAlert::OomKilled {
                sandbox: "sb-1".into(),
                oom_kills: 3,
                new_kills: 1
            }
        );
        // Its cgroup removed: forgotten, ring freed.
        std::fs::remove_dir_all(tmp.path().join("sb-1")).unwrap();
        wait(|| sampler.latest("sb-1").is_none());
        assert!(sampler.latest("sb-1").is_none());
        assert_eq!(sampler.ring_bytes(), 0);
        sampler.stop();
        assert!(sampler.cost().1 > 0);
    }
}
