//! Reading a sandbox's cgroup counters cheaply, for the usage sampler
//! (`crate::local::sampler`): each sandbox's cgroup directory is opened
//! once and every read is an `openat` of a plain name relative to that fd
//! with `O_NOFOLLOW` (cgroupfs has no links and the sandbox cannot write
//! it, but the hub never resolves a path by name where it does not have
//! to). A read is a handful of syscalls whatever the sandbox does: the
//! kernel keeps these counters, so a thousand processes or a full disk
//! cost nothing more.
//!
//! ```text
//! CgroupTree::ids()          the sandboxes with a cgroup now (one getdents pass)
//! CgroupTree::open(id)       -> CgroupStats (dir fds) and the limits set on it
//! CgroupStats::read(&mut buf) -> Counters
//! CgroupTree::v2_at(dir)     any directory laid out like cgroup v2 (bench, tests)
//! ```

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use rustix::fs::{self as rfs, Mode, OFlags};
use sandboxd::usage::cgroup::{keyed, limit, limits_v2, number, read_at, read_v2};
pub use sandboxd::usage::cgroup::{CgroupLimits, Counters, READ_BUF};

use super::cgroup::{Backend, SandboxCgroup};

/// The cgroup parent of every sandbox, for listing and opening them.
#[derive(Debug, Clone)]
pub struct CgroupTree(Backend);

/// One sandbox's open cgroup directories.
#[derive(Debug)]
pub enum CgroupStats {
    V2(OwnedFd),
    V1 {
        memory: OwnedFd,
        pids: OwnedFd,
        cpu: OwnedFd,
        /// Where `cpuacct.usage` is: `cpuacct`'s own hierarchy, else `cpu`'s.
        cpuacct: Option<OwnedFd>,
    },
}

impl CgroupTree {
    pub(super) fn new(backend: Backend) -> Self {
        CgroupTree(backend)
    }

    /// A directory laid out like a cgroup v2 parent (one subdirectory per
    /// sandbox holding `cpu.stat`, `memory.current`, ...): the sampler's
    /// bench and tests run on such synthetic trees.
    pub fn v2_at(dir: impl Into<PathBuf>) -> Self {
        CgroupTree(Backend::V2 { base: dir.into() })
    }

    fn listing_dir(&self) -> &Path {
        match &self.0 {
            Backend::V2 { base } => base,
            Backend::V1 { memory, .. } => memory,
        }
    }

    /// The ids of the sandboxes that have a cgroup now.
    pub fn ids(&self) -> io::Result<Vec<String>> {
        let dir = rfs::open(
            self.listing_dir(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        let mut out = Vec::new();
        for entry in rfs::Dir::read_from(&dir)? {
            let entry = entry?;
            if entry.file_type() != rfs::FileType::Directory {
                continue;
            }
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name != "." && name != ".." {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// Opens sandbox `id`'s cgroup and reads the limits written on it.
    pub fn open(&self, id: &str) -> io::Result<(CgroupStats, CgroupLimits)> {
        let dir = |p: &Path| {
            rfs::open(
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .map_err(io::Error::from)
        };
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad sandbox id",
            ));
        }
        let stats = match self.0.sandbox(id) {
            SandboxCgroup::V2(d) => CgroupStats::V2(dir(&d)?),
            SandboxCgroup::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => CgroupStats::V1 {
                memory: dir(&memory)?,
                pids: dir(&pids)?,
                cpu: dir(&cpu)?,
                cpuacct: cpuacct.as_deref().map(dir).transpose()?,
            },
        };
        let limits = stats.limits();
        Ok((stats, limits))
    }
}

impl CgroupStats {
    fn limits(&self) -> CgroupLimits {
        let mut buf = [0u8; READ_BUF];
        match self {
            CgroupStats::V2(d) => limits_v2(d.as_fd()),
            CgroupStats::V1 {
                memory, pids, cpu, ..
            } => {
                let memory_bytes = read_at(memory.as_fd(), "memory.limit_in_bytes", &mut buf)
                    .ok()
                    .and_then(limit);
                let pids = read_at(pids.as_fd(), "pids.max", &mut buf)
                    .ok()
                    .and_then(limit);
                let quota = read_at(cpu.as_fd(), "cpu.cfs_quota_us", &mut buf)
                    .ok()
                    .and_then(limit);
                let period = read_at(cpu.as_fd(), "cpu.cfs_period_us", &mut buf)
                    .ok()
                    .and_then(number)
                    .filter(|&p| p > 0);
                CgroupLimits {
                    memory_bytes,
                    cpu: quota.zip(period).map(|(q, p)| q as f64 / p as f64),
                    pids,
                }
            }
        }
    }

    /// Reads every counter: five small files. An error (most often
    /// `ENOENT`: the cgroup was removed under the open fd) means the
    /// sandbox is gone.
    pub fn read(&self, buf: &mut [u8; READ_BUF]) -> io::Result<Counters> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        match self {
            CgroupStats::V2(d) => read_v2(d.as_fd(), buf),
            CgroupStats::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                let m = memory.as_fd();
                let memory_bytes = number(read_at(m, "memory.usage_in_bytes", buf)?)
                    .ok_or_else(|| bad("memory.usage_in_bytes"))?;
                let memory_peak_bytes = read_at(m, "memory.max_usage_in_bytes", buf)
                    .ok()
                    .and_then(number)
                    .unwrap_or(0);
                let oom_kills = read_at(m, "memory.oom_control", buf)
                    .ok()
                    .and_then(|raw| keyed(raw, "oom_kill"))
                    .unwrap_or(0);
                let pids = number(read_at(pids.as_fd(), "pids.current", buf)?)
                    .ok_or_else(|| bad("pids.current"))?;
                // cpuacct co-mounted with cpu, or its own hierarchy (the
                // runtime then makes the sandbox a cgroup there too).
                let acct = cpuacct.as_ref().unwrap_or(cpu);
                let cpu_usec = read_at(acct.as_fd(), "cpuacct.usage", buf)
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(dir: &Path, id: &str, cpu: u64, mem: u64) {
        let d = dir.join(id);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            (
                "cpu.stat",
                format!("usage_usec {cpu}\nuser_usec 1\nsystem_usec 2\n"),
            ),
            ("memory.current", format!("{mem}\n")),
            ("memory.peak", format!("{}\n", mem * 2)),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n".into(),
            ),
            ("pids.current", "7\n".into()),
            ("memory.max", "67108864\n".into()),
            ("pids.max", "max\n".into()),
            ("cpu.max", "50000 100000\n".into()),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
    }

    #[test]
    fn reads_a_v2_layout_through_dir_fds() {
        let tmp = tempfile::tempdir().unwrap();
        fake(tmp.path(), "sb-1", 1500, 4096);
        std::fs::write(tmp.path().join("not-a-dir"), "").unwrap();
        let tree = CgroupTree::v2_at(tmp.path());
        assert_eq!(tree.ids().unwrap(), vec!["sb-1".to_string()]);
        let (stats, limits) = tree.open("sb-1").unwrap();
        assert_eq!(limits.memory_bytes, Some(64 << 20));
        assert_eq!(limits.pids, None, "max is no limit");
        assert_eq!(limits.cpu, Some(0.5));
        let mut buf = [0u8; READ_BUF];
        let c = stats.read(&mut buf).unwrap();
        assert_eq!(
            c,
            Counters {
                cpu_usec: 1500,
                memory_bytes: 4096,
                memory_peak_bytes: 8192,
                oom_kills: 1,
                pids: 7
            }
        );
        // Removed under the open fd: the read fails, the sandbox is gone.
        std::fs::remove_dir_all(tmp.path().join("sb-1")).unwrap();
        assert!(stats.read(&mut buf).is_err());
        assert!(tree.open("../x").is_err());
    }

    #[test]
    fn a_link_in_place_of_a_file_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        fake(tmp.path(), "sb-1", 1, 1);
        let d = tmp.path().join("sb-1");
        std::fs::remove_file(d.join("memory.current")).unwrap();
        std::os::unix::fs::symlink("/proc/self/status", d.join("memory.current")).unwrap();
        let (stats, _) = CgroupTree::v2_at(tmp.path()).open("sb-1").unwrap();
        assert!(stats.read(&mut [0u8; READ_BUF]).is_err());
    }
}
