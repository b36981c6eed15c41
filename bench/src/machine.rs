//! What the numbers were measured on, printed with every report: a ratio
//! is only comparable to another one taken on a similar machine.

use std::path::Path;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub kernel: String,
    pub cpu_model: String,
    /// Filesystem of the benchmark's work dir: `cp` on ext4 copies in the
    /// kernel (copy_file_range), on btrfs/xfs it may just share extents.
    pub work_dir_fs: String,
    /// 1/5/15-minute load averages when the run started: other work on
    /// the machine widens the spread of every number, baselines included.
    pub load_average: String,
}

impl Machine {
    pub fn probe(work_dir: &Path) -> Self {
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu_model: cpu_model(),
            work_dir_fs: filesystem(work_dir),
            load_average: load_average(),
        }
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map_or_else(|_| "unknown".into(), |s| s.trim().to_string())
}

fn load_average() -> String {
    let text = read_trimmed("/proc/loadavg");
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn cpu_model() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "model name").then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The filesystem type of `path`, by statfs magic number.
fn filesystem(path: &Path) -> String {
    let Ok(st) = rustix::fs::statfs(path) else {
        return "unknown".into();
    };
    let name = match st.f_type as u64 {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x2FC1_2FC1 => "zfs",
        other => return format!("fs type {other:#x}"),
    };
    name.into()
}
