//! Tickets for the terminal's WebSocket. A browser cannot put the API key
//! on a WebSocket (nor should the key ever be in a URL, where logs and
//! history keep it), so the console first asks for a ticket with the key,
//! then opens `GET /v1/sandboxes/{id}/pty?ticket=...`.
//!
//! A ticket is 256 random bits, good once, for one sandbox of one tenant,
//! for [`TTL`]. Only its SHA-256 is kept, and looked up by that: the time
//! a lookup takes depends on the digest, never on how much of a guess was
//! right. The store is bounded per tenant and in all, so no tenant can
//! grow it.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use base64::Engine as _;
use sandhub_api::error::Code;
use sha2::{Digest, Sha256};

use crate::http::ApiError;

/// How long an unused ticket stays good: enough to open a WebSocket.
pub const TTL: Duration = Duration::from_secs(30);
/// Unused tickets one tenant may hold at once.
pub const MAX_PER_TENANT: usize = 32;
/// Unused tickets the hub holds at once, every tenant's together.
pub const MAX_TOTAL: usize = 4096;

struct Ticket {
    tenant: String,
    sandbox: String,
    expires: Instant,
}

#[derive(Default)]
pub struct PtyTickets {
    live: Mutex<HashMap<[u8; 32], Ticket>>,
}

impl std::fmt::Debug for PtyTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PtyTickets")
    }
}

fn digest(ticket: &str) -> [u8; 32] {
    Sha256::digest(ticket.as_bytes()).into()
}

impl PtyTickets {
    /// A new ticket for `tenant`'s sandbox `sandbox`.
    pub fn mint(&self, tenant: &str, sandbox: &str) -> Result<String, ApiError> {
        self.mint_at(tenant, sandbox, Instant::now())
    }

    fn mint_at(&self, tenant: &str, sandbox: &str, now: Instant) -> Result<String, ApiError> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, t| t.expires > now);
        let held = live.values().filter(|t| t.tenant == tenant).count();
        if held >= MAX_PER_TENANT || live.len() >= MAX_TOTAL {
            return Err(ApiError::new(
                Code::ResourceExhausted,
                "too many unused terminal tickets: use or let some expire",
            ));
        }
        let ticket =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        live.insert(
            digest(&ticket),
            Ticket {
                tenant: tenant.to_string(),
                sandbox: sandbox.to_string(),
                expires: now + TTL,
            },
        );
        Ok(ticket)
    }

    /// The tenant `ticket` was minted for, if it is good for `sandbox`
    /// now. A ticket is spent by any attempt, right or wrong.
    pub fn redeem(&self, ticket: &str, sandbox: &str) -> Option<String> {
        self.redeem_at(ticket, sandbox, Instant::now())
    }

    fn redeem_at(&self, ticket: &str, sandbox: &str, now: Instant) -> Option<String> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let t = live.remove(&digest(ticket))?;
        (t.expires > now && t.sandbox == sandbox).then_some(t.tenant)
    }
}

/// The sandbox id of a terminal path, `/v1/sandboxes/{id}/pty`.
pub fn pty_sandbox(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/sandboxes/")?.strip_suffix("/pty")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The `ticket` a query carries.
pub fn ticket_in(query: Option<&str>) -> Option<String> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(query?)
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == "ticket").then_some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_opens_one_sandbox_once_and_expires() {
        let t = PtyTickets::default();
        let now = Instant::now();
        let a = t.mint_at("alice", "sb-1", now).unwrap();
        assert_eq!(t.redeem_at(&a, "sb-1", now).as_deref(), Some("alice"));
        assert_eq!(t.redeem_at(&a, "sb-1", now), None, "single use");

        let b = t.mint_at("alice", "sb-1", now).unwrap();
        assert_eq!(t.redeem_at(&b, "sb-2", now), None, "another sandbox");
        assert_eq!(t.redeem_at(&b, "sb-1", now), None, "spent by the wrong try");

        let c = t.mint_at("alice", "sb-1", now).unwrap();
        assert_eq!(t.redeem_at(&c, "sb-1", now + TTL), None, "expired");
        assert_eq!(t.redeem_at("not-a-ticket", "sb-1", now), None);
    }

    #[test]
    fn unused_tickets_are_bounded_per_tenant() {
        let t = PtyTickets::default();
        let now = Instant::now();
        for _ in 0..MAX_PER_TENANT {
            t.mint_at("alice", "sb-1", now).unwrap();
        }
        let e = t.mint_at("alice", "sb-1", now).unwrap_err();
        assert_eq!(e.error.code, Code::ResourceExhausted);
        // Another tenant is not starved, and expired ones make room.
        t.mint_at("bob", "sb-9", now).unwrap();
        t.mint_at("alice", "sb-1", now + TTL).unwrap();
    }

    #[test]
    fn paths_and_queries() {
        assert_eq!(pty_sandbox("/v1/sandboxes/sb-1/pty"), Some("sb-1"));
        assert_eq!(pty_sandbox("/v1/sandboxes/sb-1/ports/80/pty"), None);
        assert_eq!(pty_sandbox("/v1/sandboxes//pty"), None);
        assert_eq!(
            ticket_in(Some("cols=80&ticket=a%2Bb")).as_deref(),
            Some("a+b")
        );
        assert_eq!(ticket_in(Some("cols=80")), None);
        assert_eq!(ticket_in(None), None);
    }
}
