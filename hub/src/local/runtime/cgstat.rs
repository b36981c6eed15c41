//! Reading a sandbox's cgroup counters cheaply, for the usage sampler
//! (`crate::local::sampler`): each sandbox's cgroup directory is opened
//! once and every file is opened relative to that fd with `O_NOFOLLOW`
//! (cgroupfs has no links and the sandbox cannot write it, but the hub
//! never resolves a path by name where it does not have to). With `keep`,
//! each file stays open after its first read and is re-read from offset 0
//! (one `pread` a file a tick instead of `openat` + `read` + `close`), at
//! one fd a file; the sampler keeps them while its fd budget lasts. A read
//! is a handful of syscalls whatever the sandbox does: the kernel keeps
//! these counters, so a thousand processes or a full disk cost nothing
//! more.
//!
//! ```text
//! CgroupTree::ids()              the sandboxes with a cgroup now (one getdents pass)
//! CgroupTree::open(id, keep)     -> CgroupStats (dir fds) and the limits set on it
//! CgroupStats::read(&mut buf, since) -> Counters (since: skip what unmoved memory keeps)
//! CgroupStats::held()            files it holds open
//! CgroupTree::v2_at(dir)     any directory laid out like cgroup v2 (bench, tests)
//! ```

use std::{
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
};

use rustix::fs::{self as rfs, Mode, OFlags};
use sandboxd::usage::cgroup::{limits_v2, read_v2, Files, V1Files};
pub use sandboxd::usage::cgroup::{CgroupLimits, Counters, READ_BUF};

use super::cgroup::{Backend, SandboxCgroup};

/// The cgroup parent of every sandbox, for listing and opening them.
#[derive(Debug, Clone)]
pub struct CgroupTree(Backend);

/// One sandbox's open cgroup directories.
#[derive(Debug)]
pub enum CgroupStats {
    V2(Files),
    V1(V1Files),
}

/// The most files one sandbox's [`CgroupStats`] holds open when kept
/// (v1: three of memory, pids, `cpuacct.usage`).
pub const MAX_HELD: usize = 5;

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
            // Dot names are not sandboxes: ".", ".." and spares'
            // (`spare.rs`; sandbox ids never start with a dot).
            if !name.starts_with('.') {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// Opens sandbox `id`'s cgroup and reads the limits written on it;
    /// with `keep`, its files stay open after their first read (at most
    /// [`MAX_HELD`]).
    pub fn open(&self, id: &str, keep: bool) -> io::Result<(CgroupStats, CgroupLimits)> {
        let dir = |p: &Path| -> io::Result<Files> {
            let fd: OwnedFd = rfs::open(
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )?;
            Ok(if keep {
                Files::kept(fd)
            } else {
                Files::opened_each_time(fd)
            })
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
                ..
            } => CgroupStats::V1(V1Files {
                memory: dir(&memory)?,
                pids: Some(dir(&pids)?),
                cpu: dir(&cpu)?,
                cpuacct: cpuacct.as_deref().map(dir).transpose()?,
            }),
        };
        let limits = stats.limits();
        Ok((stats, limits))
    }
}

impl CgroupStats {
    fn limits(&self) -> CgroupLimits {
        match self {
            CgroupStats::V2(d) => limits_v2(d.dir()),
            CgroupStats::V1(v1) => v1.limits(),
        }
    }

    /// Reads every counter: five small files, three when memory has not
    /// moved since `since` (whose high-water mark and OOM count are then
    /// kept). An error (most often `ENOENT`, or `ENODEV` through a kept
    /// file: the cgroup was removed) means the sandbox is gone.
    pub fn read(
        &mut self,
        buf: &mut [u8; READ_BUF],
        since: Option<&Counters>,
    ) -> io::Result<Counters> {
        match self {
            CgroupStats::V2(d) => read_v2(d, buf, since),
            CgroupStats::V1(v1) => v1.read(buf, since),
        }
    }

    /// Files held open now.
    pub fn held(&self) -> usize {
        match self {
            CgroupStats::V2(d) => d.held(),
            CgroupStats::V1(v1) => v1.held(),
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
        let (mut stats, limits) = tree.open("sb-1", false).unwrap();
        assert_eq!(limits.memory_bytes, Some(64 << 20));
        assert_eq!(limits.pids, None, "max is no limit");
        assert_eq!(limits.cpu, Some(0.5));
        let mut buf = [0u8; READ_BUF];
        let c = stats.read(&mut buf, None).unwrap();
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
        assert!(stats.read(&mut buf, None).is_err());
        assert!(tree.open("../x", false).is_err());
    }

    #[test]
    fn a_link_in_place_of_a_file_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        fake(tmp.path(), "sb-1", 1, 1);
        let d = tmp.path().join("sb-1");
        std::fs::remove_file(d.join("memory.current")).unwrap();
        std::os::unix::fs::symlink("/proc/self/status", d.join("memory.current")).unwrap();
        for keep in [false, true] {
            let (mut stats, _) = CgroupTree::v2_at(tmp.path()).open("sb-1", keep).unwrap();
            assert!(stats.read(&mut [0u8; READ_BUF], None).is_err());
        }
    }

    /// Kept files are opened once and re-read from their start each time,
    /// so a counter that changed reads its new value; at most `MAX_HELD`.
    #[test]
    fn kept_files_read_the_current_value_each_time() {
        let tmp = tempfile::tempdir().unwrap();
        fake(tmp.path(), "sb-1", 1500, 4096);
        let (mut stats, _) = CgroupTree::v2_at(tmp.path()).open("sb-1", true).unwrap();
        let mut buf = [0u8; READ_BUF];
        assert_eq!(stats.held(), 0);
        assert_eq!(stats.read(&mut buf, None).unwrap().memory_bytes, 4096);
        assert!(
            stats.held() > 0 && stats.held() <= MAX_HELD,
            "{}",
            stats.held()
        );
        let held = stats.held();
        // A shorter value than before: the read must not keep old bytes.
        std::fs::write(tmp.path().join("sb-1/memory.current"), "77\n").unwrap();
        std::fs::write(tmp.path().join("sb-1/cpu.stat"), "usage_usec 9\n").unwrap();
        let c = stats.read(&mut buf, None).unwrap();
        assert_eq!((c.memory_bytes, c.cpu_usec), (77, 9));
        assert_eq!(stats.held(), held, "no file opened twice");
    }

    /// With the last reading given, the high-water mark and the OOM count
    /// are read only when memory moved; without it, always.
    #[test]
    fn unmoved_memory_keeps_the_last_peak_and_oom_count() {
        let tmp = tempfile::tempdir().unwrap();
        fake(tmp.path(), "sb-1", 10, 4096);
        let d = tmp.path().join("sb-1");
        for keep in [false, true] {
            let (mut stats, _) = CgroupTree::v2_at(tmp.path()).open("sb-1", keep).unwrap();
            let mut buf = [0u8; READ_BUF];
            std::fs::write(d.join("memory.current"), "4096\n").unwrap();
            std::fs::write(d.join("memory.peak"), "8192\n").unwrap();
            std::fs::write(d.join("memory.events"), "oom_kill 1\n").unwrap();
            let first = stats.read(&mut buf, None).unwrap();
            assert_eq!((first.memory_peak_bytes, first.oom_kills), (8192, 1));
            std::fs::write(d.join("memory.peak"), "9000\n").unwrap();
            std::fs::write(d.join("memory.events"), "oom_kill 2\n").unwrap();
            std::fs::write(d.join("cpu.stat"), "usage_usec 11\n").unwrap();
            let light = stats.read(&mut buf, Some(&first)).unwrap();
            assert_eq!(light.cpu_usec, 11, "CPU is read every time");
            assert_eq!((light.memory_peak_bytes, light.oom_kills), (8192, 1));
            // A full read sees them.
            let full = stats.read(&mut buf, None).unwrap();
            assert_eq!((full.memory_peak_bytes, full.oom_kills), (9000, 2));
            // So does one after memory moved.
            std::fs::write(d.join("memory.events"), "oom_kill 3\n").unwrap();
            std::fs::write(d.join("memory.current"), "2048\n").unwrap();
            let moved = stats.read(&mut buf, Some(&full)).unwrap();
            assert_eq!((moved.memory_bytes, moved.oom_kills), (2048, 3));
        }
    }
}
