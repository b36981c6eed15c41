//! API keys and tenancy. `--api-keys-file` holds `key tenant` per line;
//! each request's bearer key picks its tenant. Keys are kept only as
//! SHA-256 digests and compared in constant time.

use std::{path::Path, sync::Arc};

use axum::{extract::Request, http::header, response::IntoResponse};
use sandhub_api::error::Code;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{
    console::{
        tickets::{pty_sandbox, ticket_in},
        PtyTickets,
    },
    error::ApiError,
    plain::{Entry, Plain},
};

/// The tenant every request belongs to when no keys file is configured.
pub const OPEN_TENANT: &str = "default";

pub struct ApiKeys {
    keys: Vec<([u8; 32], String)>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.keys.len())
    }
}

/// The tenant a request was authenticated as.
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

impl ApiKeys {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading API keys file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(key), Some(tenant), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {}: expected `<key> <tenant>`", n + 1));
            };
            if key.len() < 16 {
                return Err(format!(
                    "line {}: keys must be at least 16 characters",
                    n + 1
                ));
            }
            keys.push((Sha256::digest(key.as_bytes()).into(), tenant.to_string()));
        }
        if keys.is_empty() {
            return Err("no keys".into());
        }
        Ok(ApiKeys { keys })
    }

    /// Every tenant the file names, once each.
    pub fn tenants(&self) -> Vec<String> {
        let mut t: Vec<String> = self.keys.iter().map(|(_, t)| t.clone()).collect();
        t.sort();
        t.dedup();
        t
    }

    /// The tenant of `key`. Every stored digest is compared, so the time
    /// taken says nothing about which key (or how much of one) matched.
    pub fn tenant_of(&self, key: &[u8]) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(key).into();
        let mut found = None;
        for (d, tenant) in &self.keys {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(tenant.clone());
            }
        }
        found
    }
}

/// Paths anyone may call: probes, metrics, the API description, and the
/// console's own files (which hold no data: what they show, they ask the
/// API for, with the key).
fn is_open(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/openapi.json")
        || super::console::is_console_path(path)
}

/// What [`authenticate`] checks a request against.
#[derive(Clone)]
pub struct Auth {
    /// `None`: the hub has no keys file, every request is [`OPEN_TENANT`]'s.
    pub keys: Option<Arc<ApiKeys>>,
    /// The terminal's WebSocket tickets (the console's, see `console::tickets`).
    pub tickets: Arc<PtyTickets>,
}

/// The tenant of a terminal upgrade that carries a ticket instead of a
/// key: a browser cannot put a header on a WebSocket.
fn ticket_tenant(request: &Request, tickets: &PtyTickets) -> Option<String> {
    let sandbox = pty_sandbox(request.uri().path())?;
    let ticket = ticket_in(request.uri().query())?;
    tickets.redeem(&ticket, sandbox)
}

/// The API key a request carries: `Authorization: Bearer <key>`, or
/// `X-API-Key` as E2B's SDKs send it.
pub fn presented_key(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .or_else(|| headers.get("x-api-key").map(|v| v.as_bytes()))
}

impl Plain for Auth {
    type Carry = ();

    /// Sets the request's [`Tenant`], or answers UNAUTHENTICATED.
    fn enter(&self, request: &mut Request) -> Entry<()> {
        let tenant = match &self.keys {
            None => OPEN_TENANT.to_string(),
            Some(_) if is_open(request.uri().path()) => OPEN_TENANT.to_string(),
            Some(keys) => match presented_key(request.headers())
                .and_then(|k| keys.tenant_of(k))
                .or_else(|| ticket_tenant(request, &self.tickets))
            {
                Some(t) => t,
                None => return Entry::Answer(unauthenticated().into_response()),
            },
        };
        request.extensions_mut().insert(Tenant(tenant));
        Entry::Pass(())
    }
}

/// The answer to a request without a valid key.
pub fn unauthenticated() -> ApiError {
    ApiError::new(
        Code::Unauthenticated,
        "send a valid API key as `Authorization: Bearer <key>`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_tenants() {
        let k =
            ApiKeys::parse("# comment\naaaaaaaaaaaaaaaa alice\nbbbbbbbbbbbbbbbb bob\n").unwrap();
        assert_eq!(k.tenant_of(b"aaaaaaaaaaaaaaaa").as_deref(), Some("alice"));
        assert_eq!(k.tenant_of(b"bbbbbbbbbbbbbbbb").as_deref(), Some("bob"));
        assert_eq!(k.tenant_of(b"cccccccccccccccc"), None);
        assert!(ApiKeys::parse("short alice").is_err());
        assert!(ApiKeys::parse("aaaaaaaaaaaaaaaa").is_err());
        assert!(ApiKeys::parse("").is_err());
    }
}
