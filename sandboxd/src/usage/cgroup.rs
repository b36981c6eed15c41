//! Reading cgroup counters through directory fds: `openat` of a plain name
//! with `O_NOFOLLOW`, into a caller's buffer. sandboxd reads its own
//! container's cgroup with it (Kubernetes): one v2 directory, or, on a node
//! still on cgroup v1, the container's `memory`, `cpuacct` and `pids`
//! directories. The hub's local sampler reads every sandbox's
//! (`sandhub::local::runtime::cgstat`).

use std::{
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
};

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

/// One cgroup directory, and how its counter files are read: `openat` +
/// `read` + `close` each time, or (kept) each file opened at its first read
/// and re-read from offset 0 after that (cgroupfs regenerates a file's text
/// on every read from its start), one `pread` a file a tick. Kept files
/// cost one fd each, so the caller decides which directories keep theirs.
#[derive(Debug)]
pub struct Files {
    dir: OwnedFd,
    kept: Option<Vec<(&'static str, OwnedFd)>>,
}

impl Files {
    /// Reads through `dir` with an `openat` each time.
    pub fn opened_each_time(dir: OwnedFd) -> Self {
        Files { dir, kept: None }
    }

    /// Keeps each file open after its first read.
    pub fn kept(dir: OwnedFd) -> Self {
        Files {
            dir,
            kept: Some(Vec::new()),
        }
    }

    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Files held open now.
    pub fn held(&self) -> usize {
        self.kept.as_ref().map_or(0, Vec::len)
    }

    /// `name`'s text, into `buf`.
    pub fn read<'b>(&mut self, name: &'static str, buf: &'b mut [u8]) -> io::Result<&'b [u8]> {
        let Some(kept) = &mut self.kept else {
            return read_at(self.dir.as_fd(), name, buf);
        };
        let i = match kept.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                let fd = rfs::openat(
                    self.dir.as_fd(),
                    name,
                    OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                    Mode::empty(),
                )?;
                kept.push((name, fd));
                kept.len() - 1
            }
        };
        let fd = &kept[i].1;
        let mut len = 0;
        while len < buf.len() {
            let n = rustix::io::pread(fd, &mut buf[len..], len as u64)?;
            if n == 0 {
                break;
            }
            len += n;
        }
        Ok(&buf[..len])
    }
}

/// Every counter of a v2 cgroup: five small files, or three when `since`
/// (the last reading) is given and `memory.current` has not moved since:
/// the high-water mark and the OOM kill count then cannot have either
/// (short of a spike that ended at the very same byte count), so `since`'s
/// are kept. The caller passes `None` now and then to bound that case. An
/// error (most often `ENOENT`, or `ENODEV` through a kept file: the cgroup
/// was removed) means it is gone.
pub fn read_v2(
    d: &mut Files,
    buf: &mut [u8; READ_BUF],
    since: Option<&Counters>,
) -> io::Result<Counters> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let cpu_usec = keyed(d.read("cpu.stat", buf)?, "usage_usec")
        .ok_or_else(|| bad("cpu.stat has no usage_usec"))?;
    let memory_bytes =
        number(d.read("memory.current", buf)?).ok_or_else(|| bad("memory.current"))?;
    let (memory_peak_bytes, oom_kills) = match since.filter(|p| p.memory_bytes == memory_bytes) {
        Some(p) => (p.memory_peak_bytes, p.oom_kills),
        None => (
            // memory.peak is Linux 5.19+.
            d.read("memory.peak", buf)
                .ok()
                .and_then(number)
                .unwrap_or(0),
            keyed(d.read("memory.events", buf)?, "oom_kill").unwrap_or(0),
        ),
    };
    let pids = number(d.read("pids.current", buf)?).ok_or_else(|| bad("pids.current"))?;
    Ok(Counters {
        cpu_usec,
        memory_bytes,
        memory_peak_bytes,
        oom_kills,
        pids,
    })
}

/// The v1 directories of one cgroup: one per controller.
#[derive(Debug)]
pub struct V1Files {
    pub memory: Files,
    pub pids: Option<Files>,
    /// `cpu` (the CFS quota), or `cpu,cpuacct` where the two are mounted
    /// together.
    pub cpu: Files,
    /// Where `cpuacct.usage` is, when not in `cpu`: `cpuacct`'s own
    /// hierarchy.
    pub cpuacct: Option<Files>,
}

impl V1Files {
    pub fn held(&self) -> usize {
        self.memory.held()
            + self.cpu.held()
            + self.pids.as_ref().map_or(0, Files::held)
            + self.cpuacct.as_ref().map_or(0, Files::held)
    }

    /// The limits written on the cgroup.
    pub fn limits(&self) -> CgroupLimits {
        let mut buf = [0u8; READ_BUF];
        let memory_bytes = read_at(self.memory.dir(), "memory.limit_in_bytes", &mut buf)
            .ok()
            .and_then(limit);
        let pids = self
            .pids
            .as_ref()
            .and_then(|p| read_at(p.dir(), "pids.max", &mut buf).ok().and_then(limit));
        // -1 (no quota) does not parse as a number: no limit.
        let quota = read_at(self.cpu.dir(), "cpu.cfs_quota_us", &mut buf)
            .ok()
            .and_then(limit);
        let period = read_at(self.cpu.dir(), "cpu.cfs_period_us", &mut buf)
            .ok()
            .and_then(number)
            .filter(|&p| p > 0);
        CgroupLimits {
            memory_bytes,
            cpu: quota.zip(period).map(|(q, p)| q as f64 / p as f64),
            pids,
        }
    }

    /// Every counter. CPU reads 0 where no `cpuacct.usage` is readable.
    /// `since` skips the high-water mark and the OOM count while memory
    /// has not moved, as [`read_v2`] does.
    pub fn read(
        &mut self,
        buf: &mut [u8; READ_BUF],
        since: Option<&Counters>,
    ) -> io::Result<Counters> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let m = &mut self.memory;
        let memory_bytes = number(m.read("memory.usage_in_bytes", buf)?)
            .ok_or_else(|| bad("memory.usage_in_bytes"))?;
        let (memory_peak_bytes, oom_kills) = match since.filter(|p| p.memory_bytes == memory_bytes)
        {
            Some(p) => (p.memory_peak_bytes, p.oom_kills),
            None => (
                m.read("memory.max_usage_in_bytes", buf)
                    .ok()
                    .and_then(number)
                    .unwrap_or(0),
                // `oom_kill` in memory.oom_control is Linux 4.13+.
                m.read("memory.oom_control", buf)
                    .ok()
                    .and_then(|raw| keyed(raw, "oom_kill"))
                    .unwrap_or(0),
            ),
        };
        let pids = match &mut self.pids {
            Some(p) => number(p.read("pids.current", buf)?).ok_or_else(|| bad("pids.current"))?,
            None => 0,
        };
        let acct = self.cpuacct.as_mut().unwrap_or(&mut self.cpu);
        let cpu_usec = acct
            .read("cpuacct.usage", buf)
            .ok()
            .and_then(number)
            .map_or(0, |ns| ns / 1000);
        Ok(Counters {
            cpu_usec,
            memory_bytes,
            memory_peak_bytes,
            oom_kills,
            pids,
        })
    }
}
