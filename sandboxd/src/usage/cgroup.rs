//! Reading cgroup counters through directory fds: `openat` of a plain name
//! with `O_NOFOLLOW`, into a caller's buffer. sandboxd reads its own
//! container's cgroup with it (Kubernetes): one v2 directory, or, on a node
//! still on cgroup v1, the container's `memory`, `cpuacct` and `pids`
//! directories. The hub's local sampler reads every sandbox's
//! (`sandhub::local::runtime::cgstat`).

use std::{io, os::fd::BorrowedFd};

use rustix::fs::{self as rfs, Mode, OFlags};

/// What a cgroup's counters say now. CPU is cumulative; the rest are
/// levels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// CPU time used since the cgroup was made, in microseconds.
    pub cpu_usec: u64,
    pub memory_bytes: u64,
    /// The kernel's high-water mark (`memory.peak`); 0 where it has none.
    pub memory_peak_bytes: u64,
    pub oom_kills: u64,
    pub pids: u64,
}

/// The limits written on a cgroup, as the kernel holds them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    pub cpu: Option<f64>,
    pub pids: Option<u64>,
}

/// Longest cgroup file the sampler reads (`memory.events`, `cpu.stat`
/// are a few hundred bytes).
pub const READ_BUF: usize = 1024;

/// Reads `name` under `dir` into `buf`; the bytes read.
pub fn read_at<'b>(dir: BorrowedFd<'_>, name: &str, buf: &'b mut [u8]) -> io::Result<&'b [u8]> {
    let fd = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    let mut len = 0;
    while len < buf.len() {
        let n = rustix::io::read(&fd, &mut buf[len..])?;
        if n == 0 {
            break;
        }
        len += n;
    }
    Ok(&buf[..len])
}

pub fn number(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.trim().parse().ok()
}

/// The value of `key` in a flat-keyed file (`key value` lines).
pub fn keyed(raw: &[u8], key: &str) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `max`, or a number; "-1" and absurd values (v1's unlimited is a page
/// rounded `i64::MAX`) are no limit.
pub fn limit(raw: &[u8]) -> Option<u64> {
    number(raw).filter(|&v| v < (1 << 60))
}

/// The limits written on a v2 cgroup.
pub fn limits_v2(d: BorrowedFd<'_>) -> CgroupLimits {
    let mut buf = [0u8; READ_BUF];
    let memory_bytes = read_at(d, "memory.max", &mut buf).ok().and_then(limit);
    let pids = read_at(d, "pids.max", &mut buf).ok().and_then(limit);
    let cpu = read_at(d, "cpu.max", &mut buf).ok().and_then(|raw| {
        let text = std::str::from_utf8(raw).ok()?;
        let mut it = text.split_whitespace();
        let quota: f64 = it.next()?.parse().ok()?;
        let period: f64 = it.next()?.parse().ok()?;
        (period > 0.0).then(|| quota / period)
    });
    CgroupLimits {
        memory_bytes,
        cpu,
        pids,
    }
}

/// Every counter of a v2 cgroup: five small files. An error (most often
/// `ENOENT`: the cgroup was removed under the open fd) means it is gone.
pub fn read_v2(d: BorrowedFd<'_>, buf: &mut [u8; READ_BUF]) -> io::Result<Counters> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let cpu_usec = keyed(read_at(d, "cpu.stat", buf)?, "usage_usec")
        .ok_or_else(|| bad("cpu.stat has no usage_usec"))?;
    let memory_bytes =
        number(read_at(d, "memory.current", buf)?).ok_or_else(|| bad("memory.current"))?;
    // memory.peak is Linux 5.19+.
    let memory_peak_bytes = read_at(d, "memory.peak", buf)
        .ok()
        .and_then(number)
        .unwrap_or(0);
    let oom_kills = keyed(read_at(d, "memory.events", buf)?, "oom_kill").unwrap_or(0);
    let pids = number(read_at(d, "pids.current", buf)?).ok_or_else(|| bad("pids.current"))?;
    Ok(Counters {
        cpu_usec,
        memory_bytes,
        memory_peak_bytes,
        oom_kills,
        pids,
    })
}

/// The v1 directories of one cgroup: one per controller.
#[derive(Clone, Copy)]
pub struct V1Dirs<'a> {
    pub memory: BorrowedFd<'a>,
    /// `cpuacct` (also holds `cpu.*` where the two are mounted together).
    pub cpuacct: BorrowedFd<'a>,
    /// None where the pids controller is not mounted.
    pub pids: Option<BorrowedFd<'a>>,
}

/// The limits written on a v1 cgroup.
pub fn limits_v1(d: V1Dirs<'_>) -> CgroupLimits {
    let mut buf = [0u8; READ_BUF];
    let memory_bytes = read_at(d.memory, "memory.limit_in_bytes", &mut buf)
        .ok()
        .and_then(limit);
    let pids = d
        .pids
        .and_then(|p| read_at(p, "pids.max", &mut buf).ok().and_then(limit));
    // -1 (no quota) does not parse as a number: no limit.
    let quota = read_at(d.cpuacct, "cpu.cfs_quota_us", &mut buf)
        .ok()
        .and_then(number);
    let period = read_at(d.cpuacct, "cpu.cfs_period_us", &mut buf)
        .ok()
        .and_then(number);
    let cpu = match (quota, period) {
        (Some(q), Some(p)) if p > 0 => Some(q as f64 / p as f64),
        _ => None,
    };
    CgroupLimits {
        memory_bytes,
        cpu,
        pids,
    }
}

/// Every counter of a v1 cgroup, from its controllers' directories.
pub fn read_v1(d: V1Dirs<'_>, buf: &mut [u8; READ_BUF]) -> io::Result<Counters> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let cpu_ns =
        number(read_at(d.cpuacct, "cpuacct.usage", buf)?).ok_or_else(|| bad("cpuacct.usage"))?;
    let memory_bytes = number(read_at(d.memory, "memory.usage_in_bytes", buf)?)
        .ok_or_else(|| bad("memory.usage_in_bytes"))?;
    let memory_peak_bytes = read_at(d.memory, "memory.max_usage_in_bytes", buf)
        .ok()
        .and_then(number)
        .unwrap_or(0);
    // `oom_kill` in memory.oom_control is Linux 4.13+.
    let oom_kills = read_at(d.memory, "memory.oom_control", buf)
        .ok()
        .and_then(|raw| keyed(raw, "oom_kill"))
        .unwrap_or(0);
    let pids = match d.pids {
        Some(p) => number(read_at(p, "pids.current", buf)?).ok_or_else(|| bad("pids.current"))?,
        None => 0,
    };
    Ok(Counters {
        cpu_usec: cpu_ns / 1000,
        memory_bytes,
        memory_peak_bytes,
        oom_kills,
        pids,
    })
}
