//! The processes of this run's sandboxes, found in /proc: each sandbox's
//! shim (`<argv0> __sandbox-init`, re-executed from the hub binary) that
//! is a child of our hub or whose mounts or open files mention our state
//! dir, plus all its descendants (the sandbox's PID 1 and sandboxd, and
//! whatever they run).

use std::{collections::BTreeMap, path::Path};

/// Memory summed over a set of processes, in KiB.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub processes: u64,
    pub rss_kib: u64,
    pub pss_kib: u64,
    /// Private (clean + dirty) pages: what exists only for this process.
    pub private_kib: u64,
    /// Anonymous pages (heap, stacks): unlike PSS, not moved by other
    /// processes mapping the same files.
    pub anon_kib: u64,
}

/// The shims of sandboxes living under `state_dir`, and their descendants.
pub fn sandbox_processes(state_dir: &Path, hub: Option<u32>) -> Vec<u32> {
    let needle = state_dir.to_string_lossy().into_owned();
    let mut parent = BTreeMap::new();
    let mut shims = Vec::new();
    for pid in all_pids() {
        if let Some(ppid) = ppid(pid) {
            parent.insert(pid, ppid);
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let is_shim = cmdline.split(|&b| b == 0).nth(1) == Some(b"__sandbox-init");
        if is_shim && (hub.is_some() && ppid(pid) == hub || mentions(pid, &needle)) {
            shims.push(pid);
        }
    }
    let mut out = Vec::new();
    for (&pid, _) in parent.iter() {
        let mut p = pid;
        // Walk up; pid namespaces do not hide host ppids from the host.
        for _ in 0..64 {
            if shims.contains(&p) {
                out.push(pid);
                break;
            }
            match parent.get(&p) {
                Some(&pp) if pp > 1 => p = pp,
                _ => break,
            }
        }
    }
    out
}

pub fn totals(pids: &[u32]) -> Totals {
    let mut t = Totals::default();
    for &pid in pids {
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        t.processes += 1;
        t.rss_kib += field(&rollup, "Rss");
        t.pss_kib += field(&rollup, "Pss");
        t.private_kib += field(&rollup, "Private_Clean") + field(&rollup, "Private_Dirty");
        t.anon_kib += field(&rollup, "Anonymous");
    }
    t
}

/// VmRSS of one process, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| field(&s, "VmRSS"))
        .unwrap_or(0)
}

/// SIGKILLs whatever of this run's sandboxes outlived the API deletes and
/// the hub; returns how many processes it killed.
pub fn kill_leftovers(state_dir: &Path) -> usize {
    let pids = sandbox_processes(state_dir, None);
    for &pid in &pids {
        if let Some(p) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    pids.len()
}

/// Whether the process's mounts or open files name a path under `needle`.
fn mentions(pid: u32, needle: &str) -> bool {
    if std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).is_ok_and(|m| m.contains(needle)) {
        return true;
    }
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|l| l.to_string_lossy().contains(needle))
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Field 4 of /proc/<pid>/stat, after the parenthesised command name.
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The number after `name:` on its own line (`Pss:   1234 kB`), 0 if absent.
fn field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_parent_and_memory() {
        let me = std::process::id();
        assert!(ppid(me).is_some());
        let t = totals(&[me]);
        assert_eq!(t.processes, 1);
        assert!(t.rss_kib > 0 && t.pss_kib > 0);
    }

    #[test]
    fn no_sandboxes_under_a_fresh_dir() {
        let dir = tempfile::tempdir().unwrap();
        assert!(sandbox_processes(dir.path(), None).is_empty());
    }
}
