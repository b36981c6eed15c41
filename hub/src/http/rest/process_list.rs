//! What `GET /v1/sandboxes/{id}/processes` lists: the processes this hub
//! started in a sandbox through `POST .../processes` and the terminal
//! (`.../pty`), running or lately exited, each with the tenant and sandbox
//! it belongs to.
//!
//! sandboxd keeps no list of the processes it starts (only of the *kept*
//! ones, which the local backend never starts), while the hub streams every
//! one of them from `Started` to `Exited`: so the hub's own table is the
//! list, on both backends. The table is bounded: per sandbox, the running
//! ones (sandboxd's `--max-processes` bounds those anyway) and the last
//! [`MAX_EXITED`] exited; and in all, [`MAX_SANDBOXES`] sandboxes, past
//! which sandboxes with nothing running are forgotten first.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use serde::Serialize;

/// Exited processes remembered per sandbox, newest kept.
pub const MAX_EXITED: usize = 16;
/// Running processes listed per sandbox; past it, new ones go unlisted.
pub const MAX_RUNNING: usize = 1024;
/// Sandboxes the table holds entries for.
pub const MAX_SANDBOXES: usize = 4096;

/// One process as the list shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ProcessInfo {
    pub pid: i32,
    pub argv: Vec<String>,
    /// `process` (started by `POST .../processes`), `terminal` (a shell of
    /// `.../pty`) or `e2b` (kept by the E2B door, Kubernetes only).
    pub kind: String,
    /// The starter's own name for it (E2B's `tag`), when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// When this hub saw it start (RFC 3339); absent for `e2b`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    pub running: bool,
    /// How it ended; absent while it runs, and when its stream ended
    /// without an exit (it was killed with its stream).
    pub exit_code: Option<i32>,
}

type Key = (String, String);

#[derive(Default)]
struct Procs {
    running: BTreeMap<i32, ProcessInfo>,
    exited: VecDeque<ProcessInfo>,
}

#[derive(Default)]
pub struct ProcessTable {
    by_sandbox: Mutex<HashMap<Key, Procs>>,
}

impl std::fmt::Debug for ProcessTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessTable")
    }
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Procs>> {
        self.by_sandbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lists `pid` as running in `tenant`'s sandbox `sandbox` until the
    /// returned guard is dropped (or told its exit code first). `None`
    /// when the table is full.
    pub fn started(
        self: &Arc<Self>,
        tenant: &str,
        sandbox: &str,
        pid: i32,
        argv: Vec<String>,
        kind: &str,
    ) -> Option<Tracked> {
        let key = (tenant.to_string(), sandbox.to_string());
        let mut all = self.lock();
        if !all.contains_key(&key) && all.len() >= MAX_SANDBOXES {
            all.retain(|_, p| !p.running.is_empty());
            if all.len() >= MAX_SANDBOXES {
                return None;
            }
        }
        let procs = all.entry(key.clone()).or_default();
        if procs.running.len() >= MAX_RUNNING {
            return None;
        }
        procs.running.insert(
            pid,
            ProcessInfo {
                pid,
                argv,
                kind: kind.to_string(),
                tag: None,
                started_at: Some(crate::backend::rfc3339(crate::backend::now_ms())),
                running: true,
                exit_code: None,
            },
        );
        Some(Tracked {
            table: self.clone(),
            key,
            pid,
            exit_code: None,
        })
    }

    fn ended(&self, key: &Key, pid: i32, exit_code: Option<i32>) {
        let mut all = self.lock();
        let Some(procs) = all.get_mut(key) else {
            return;
        };
        let Some(mut info) = procs.running.remove(&pid) else {
            return;
        };
        info.running = false;
        info.exit_code = exit_code;
        procs.exited.push_front(info);
        procs.exited.truncate(MAX_EXITED);
    }

    /// `tenant`'s processes in `sandbox`: running ones by pid, then the
    /// exited, newest first.
    pub fn list(&self, tenant: &str, sandbox: &str) -> Vec<ProcessInfo> {
        let all = self.lock();
        let Some(procs) = all.get(&(tenant.to_string(), sandbox.to_string())) else {
            return Vec::new();
        };
        procs
            .running
            .values()
            .chain(procs.exited.iter())
            .cloned()
            .collect()
    }
}

/// A listed running process; dropping it moves it to the exited ones.
pub struct Tracked {
    table: Arc<ProcessTable>,
    key: Key,
    pid: i32,
    exit_code: Option<i32>,
}

impl Tracked {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its exit code, recorded when this guard is dropped.
    pub fn exited(&mut self, exit_code: i32) {
        self.exit_code = Some(exit_code);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.table.ended(&self.key, self.pid, self.exit_code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_then_exited_per_tenant_and_sandbox() {
        let t = Arc::new(ProcessTable::default());
        let mut a = t
            .started("alice", "sb-1", 10, vec!["sleep".into()], "process")
            .unwrap();
        let b = t
            .started("alice", "sb-1", 11, vec!["sh".into()], "terminal")
            .unwrap();
        assert_eq!(t.list("alice", "sb-1").len(), 2);
        assert!(t.list("bob", "sb-1").is_empty(), "another tenant's");
        assert!(t.list("alice", "sb-2").is_empty(), "another sandbox's");
        a.exited(3);
        drop(a);
        drop(b);
        let list = t.list("alice", "sb-1");
        assert_eq!(list.len(), 2);
        assert!(list.iter().all(|p| !p.running));
        // Newest first: b (no exit code: its stream ended), then a.
        assert_eq!((list[0].pid, list[0].exit_code), (11, None));
        assert_eq!((list[1].pid, list[1].exit_code), (10, Some(3)));
    }

    #[test]
    fn exited_ones_are_bounded() {
        let t = Arc::new(ProcessTable::default());
        for pid in 0..(MAX_EXITED as i32 + 5) {
            drop(t.started("alice", "sb-1", pid, vec![], "process"));
        }
        let list = t.list("alice", "sb-1");
        assert_eq!(list.len(), MAX_EXITED);
        assert_eq!(list[0].pid, MAX_EXITED as i32 + 4);
    }

    #[test]
    fn sandboxes_with_nothing_running_are_forgotten_first() {
        let t = Arc::new(ProcessTable::default());
        let keep = t.started("alice", "busy", 1, vec![], "process").unwrap();
        for i in 0..MAX_SANDBOXES {
            drop(t.started("alice", &format!("sb-{i}"), 1, vec![], "process"));
        }
        assert_eq!(t.list("alice", "busy").len(), 1);
        assert!(keep.pid() == 1);
    }
}
