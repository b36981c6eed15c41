//! One MCP session's identity and what it owns.
//!
//! A sandbox created in a session is reachable from that session only (as
//! upstream's MCP server does it): `create_sandbox` labels it with the
//! session's id, and every other tool refuses, as "not found", a
//! sandbox that does not carry its label.
//!
//! Over streamable HTTP the id is a digest of the session's
//! `Mcp-Session-Id` (rmcp's random id, which only the client and the hub
//! know), taken on the session's first call, so every replica of the hub
//! that serves the session derives the same label and finds the same
//! sandboxes ([`crate::shared`]). On stdio it is random. The sandboxes it created are also
//! kept here in memory, so that a call on one needs no round trip to the
//! hub to prove ownership: only this session can label sandboxes with its
//! (unguessable) id, so the set never claims more than the label does. The
//! label is what `list_sandboxes`, the resource and the REST API filter by.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Mutex, MutexGuard, OnceLock},
};

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::process::ProcessTable;

/// The label that ties a sandbox to the MCP session that created it.
pub const SESSION_LABEL: &str = "sandhub.io/mcp-session";

/// What the label is a digest of, besides the session id.
const LABEL_DOMAIN: &[u8] = b"sandhub-mcp-session-label/v1\0";

pub struct Session {
    id: OnceLock<String>,
    owned: Mutex<HashSet<String>>,
    processes: Mutex<ProcessTable>,
}

impl Session {
    pub fn new(processes: ProcessTable) -> Self {
        Session {
            id: OnceLock::new(),
            owned: Mutex::new(HashSet::new()),
            processes: Mutex::new(processes),
        }
    }

    /// Takes the id from the session's `Mcp-Session-Id`, unless it has
    /// one already (a session's id never changes once used).
    pub fn bind_http(&self, mcp_session_id: &str) {
        let digest = Sha256::new()
            .chain_update(LABEL_DOMAIN)
            .chain_update(mcp_session_id.as_bytes())
            .finalize();
        let _ = self.id.set(hex(&digest[..16]));
    }

    /// 32 hex digits: a valid label value (≤ 63 of [A-Za-z0-9-_.]).
    pub fn id(&self) -> &str {
        self.id.get_or_init(|| {
            let mut bytes = [0u8; 16];
            rand::rng().fill_bytes(&mut bytes);
            hex(&bytes)
        })
    }

    /// The label selector of this session's sandboxes.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(SESSION_LABEL.to_string(), self.id().to_string())])
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    fn an_http_session_has_the_same_id_on_every_replica_and_keeps_it() {
        let (a, b) = (
            Session::new(ProcessTable::new(1, 16)),
            Session::new(ProcessTable::new(1, 16)),
        );
        a.bind_http("rmcp-session-1");
        b.bind_http("rmcp-session-1");
        assert_eq!(a.id(), b.id());
        assert_eq!(a.id().len(), 32);
        assert!(
            !a.id().contains("rmcp"),
            "a digest, not the session id itself"
        );
        a.bind_http("rmcp-session-2");
        assert_eq!(a.id(), b.id(), "the first binding holds");
        let c = Session::new(ProcessTable::new(1, 16));
        c.bind_http("rmcp-session-2");
        assert_ne!(a.id(), c.id());
        // Used before any binding (stdio): random, and then fixed.
        let d = Session::new(ProcessTable::new(1, 16));
        let random = d.id().to_string();
        d.bind_http("rmcp-session-1");
        assert_eq!(d.id(), random);
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
