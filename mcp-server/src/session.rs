//! One MCP session's identity and what it owns.
//!
//! A sandbox created in a session is reachable from that session only (as
//! upstream's MCP server does it): `create_sandbox` labels it with the
//! session's random id, and every other tool refuses, as "not found", a
//! sandbox that does not carry its label. The sandboxes it created are also
//! kept here in memory, so that a call on one needs no round trip to the
//! hub to prove ownership: only this session can label sandboxes with its
//! (unguessable) id, so the set never claims more than the label does. The
//! label is what `list_sandboxes`, the resource and the REST API filter by.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Mutex, MutexGuard},
};

use rand::RngCore;

use crate::process::ProcessTable;

/// The label that ties a sandbox to the MCP session that created it.
pub const SESSION_LABEL: &str = "sandhub.io/mcp-session";

pub struct Session {
    id: String,
    owned: Mutex<HashSet<String>>,
    processes: Mutex<ProcessTable>,
}

impl Session {
    pub fn new(processes: ProcessTable) -> Self {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        Session {
            // 32 hex digits: a valid label value (≤ 63 of [A-Za-z0-9-_.]).
            id: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            owned: Mutex::new(HashSet::new()),
            processes: Mutex::new(processes),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The label selector of this session's sandboxes.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(SESSION_LABEL.to_string(), self.id.clone())])
    }

    pub fn adopt(&self, sandbox: &str) {
        lock(&self.owned).insert(sandbox.to_string());
    }

    pub fn forget(&self, sandbox: &str) {
        lock(&self.owned).remove(sandbox);
        lock(&self.processes).remove_sandbox(sandbox);
    }

    /// True when this session created `sandbox` (and has not deleted it).
    pub fn owns(&self, sandbox: &str) -> bool {
        lock(&self.owned).contains(sandbox)
    }

    pub fn processes(&self) -> MutexGuard<'_, ProcessTable> {
        lock(&self.processes)
    }
}

/// Sets and tables stay consistent whatever panicked while they were held
/// (every update is a single insert or remove), so poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_have_distinct_valid_ids() {
        let a = Session::new(ProcessTable::new(1, 16));
        let b = Session::new(ProcessTable::new(1, 16));
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id().len(), 32);
        assert!(a.id().chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a.selector()[SESSION_LABEL], a.id());
    }

    #[test]
    fn owned_until_forgotten() {
        let s = Session::new(ProcessTable::new(1, 16));
        assert!(!s.owns("sb-1"));
        s.adopt("sb-1");
        assert!(s.owns("sb-1"));
        assert!(!s.owns("sb-2"));
        s.forget("sb-1");
        assert!(!s.owns("sb-1"));
    }
}
