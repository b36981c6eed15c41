//! What imports and pulls in progress hold, outside the store's lock:
//! the bytes they count against the quotas ([`Ledger`], [`Charge`]) and
//! the names they rely on ([`InFlight`], [`Claim`]).
//!
//! Imports unpack without the store's lock, so two of them (or an import
//! and a prune) can run at once. Each one charges its bytes to the
//! ledger as it writes them, so together they never pass a tenant's
//! quota or the store's cap; and each claims the layers and blobs it
//! will use, so a prune running meanwhile leaves them alone.
//!
//! The ledger's committed figures (`held`, `stored`) are refreshed from
//! the records under the store's lock whenever they change (import,
//! remove, prune); a finished import's bytes are briefly counted twice
//! (committed and still charged) until its charge drops, never zero
//! times.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use sandhub_api::error::{Code, ErrorBody};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes the tenants' images and the store take, committed and in flight.
#[derive(Default)]
pub struct Ledger {
    state: Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    /// Per tenant: the quota size of the images it holds.
    held: HashMap<String, u64>,
    /// Bytes of the store on disk: unpacked layers (once each), blobs,
    /// partial downloads.
    stored: u64,
    /// Per tenant: bytes charged by its imports and pulls in progress.
    live: HashMap<String, u64>,
    /// Bytes on disk of every import and pull in progress.
    live_store: u64,
    /// Limits (0: none).
    max_tenant: u64,
    max_store: u64,
}

/// Which limit refused a charge.
#[derive(Debug)]
pub enum Over {
    Tenant { limit: u64, held: u64 },
    Store { limit: u64, used: u64 },
}

impl Over {
    /// `RESOURCE_EXHAUSTED`, saying which limit and how to get room.
    pub fn error(&self, what: &str) -> ErrorBody {
        let mib = |b: u64| b.div_ceil(1 << 20);
        let message = match self {
            Over::Tenant { limit, held } => format!(
                "{what} would take the tenant's images past {} MiB (held or in progress: \
                 {} MiB; compressed layers and unpacked layers both count); remove some \
                 (`sandhub image rm`, `prune`)",
                limit >> 20,
                mib(*held),
            ),
            Over::Store { limit, used } => format!(
                "{what} would take the hub's image store past {} MiB (--max-image-store-mb; \
                 in use: {} MiB)",
                limit >> 20,
                mib(*used),
            ),
        };
        ErrorBody::new(Code::ResourceExhausted, message)
    }
}

impl Ledger {
    pub fn set_limits(&self, max_tenant: u64, max_store: u64) {
        let mut s = lock(&self.state);
        s.max_tenant = max_tenant;
        s.max_store = max_store;
    }

    pub fn max_tenant(&self) -> u64 {
        lock(&self.state).max_tenant
    }

    pub fn max_store(&self) -> u64 {
        lock(&self.state).max_store
    }

    /// The committed figures, as just read from the store (under its lock).
    pub fn refresh(&self, held: HashMap<String, u64>, stored: u64) {
        let mut s = lock(&self.state);
        s.held = held;
        s.stored = stored;
    }

    /// A charge of `tenant`'s, empty; what it takes is given back when it
    /// drops.
    pub fn charge(self: &Arc<Self>, tenant: &str) -> Charge {
        Charge {
            ledger: self.clone(),
            tenant: tenant.to_string(),
            tenant_bytes: 0,
            store_bytes: 0,
        }
    }
}

/// Bytes one import or pull counts while it runs: `tenant_bytes` against
/// its tenant's quota, `store_bytes` against the store's cap.
pub struct Charge {
    ledger: Arc<Ledger>,
    tenant: String,
    tenant_bytes: u64,
    store_bytes: u64,
}

impl Charge {
    /// Takes `tenant` more bytes of the tenant's quota and `store` more of
    /// the store's cap, or nothing when either would pass its limit.
    pub fn add(&mut self, tenant: u64, store: u64) -> Result<(), Over> {
        let mut s = lock(&self.ledger.state);
        let live = s.live.get(&self.tenant).copied().unwrap_or(0);
        let held = s
            .held
            .get(&self.tenant)
            .copied()
            .unwrap_or(0)
            .saturating_add(live);
        if s.max_tenant > 0 && held.saturating_add(tenant) > s.max_tenant {
            return Err(Over::Tenant {
                limit: s.max_tenant,
                held,
            });
        }
        let used = s.stored.saturating_add(s.live_store);
        if s.max_store > 0 && used.saturating_add(store) > s.max_store {
            return Err(Over::Store {
                limit: s.max_store,
                used,
            });
        }
        *s.live.entry(self.tenant.clone()).or_default() += tenant;
        s.live_store += store;
        self.tenant_bytes += tenant;
        self.store_bytes += store;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut s = lock(&self.ledger.state);
        if let Some(live) = s.live.get_mut(&self.tenant) {
            *live = live.saturating_sub(self.tenant_bytes);
            if *live == 0 {
                s.live.remove(&self.tenant);
            }
        }
        s.live_store = s.live_store.saturating_sub(self.store_bytes);
    }
}

/// Names (blob and layer hexes) imports and pulls in progress rely on;
/// `collect` and the pruning of `partial/` skip them.
#[derive(Default)]
pub struct InFlight {
    names: Mutex<HashMap<String, usize>>,
}

impl InFlight {
    /// Claims `names` until the returned claim drops.
    pub fn claim(self: &Arc<Self>, names: impl IntoIterator<Item = String>) -> Claim {
        let names: Vec<String> = names.into_iter().collect();
        let mut held = lock(&self.names);
        for n in &names {
            *held.entry(n.clone()).or_default() += 1;
        }
        Claim {
            inflight: self.clone(),
            names,
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        lock(&self.names).contains_key(name)
    }

    /// How many claims hold `name`.
    pub fn count(&self, name: &str) -> usize {
        lock(&self.names).get(name).copied().unwrap_or(0)
    }
}

pub struct Claim {
    inflight: Arc<InFlight>,
    names: Vec<String>,
}

impl Claim {
    /// Claims `more` names too, for as long as this claim lives.
    pub fn extend(&mut self, more: impl IntoIterator<Item = String>) {
        let mut held = lock(&self.inflight.names);
        for n in more {
            *held.entry(n.clone()).or_default() += 1;
            self.names.push(n);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = lock(&self.inflight.names);
        for n in &self.names {
            if let Some(c) = held.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    held.remove(n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_share_the_limits_and_give_back_on_drop() {
        let l = Arc::new(Ledger::default());
        l.set_limits(100, 150);
        l.refresh(HashMap::from([("a".to_string(), 40)]), 40);
        let mut one = l.charge("a");
        one.add(50, 50).unwrap();
        let mut two = l.charge("a");
        assert!(matches!(two.add(20, 0), Err(Over::Tenant { .. })));
        let mut b = l.charge("b");
        assert!(matches!(b.add(70, 70), Err(Over::Store { .. })));
        drop(one);
        two.add(20, 0).unwrap();
        b.add(60, 60).unwrap();
    }

    #[test]
    fn claims_count() {
        let f = Arc::new(InFlight::default());
        let a = f.claim(["x".to_string()]);
        let mut b = f.claim(["x".to_string()]);
        b.extend(["y".to_string()]);
        assert_eq!(f.count("x"), 2);
        drop(a);
        assert!(f.contains("x") && f.contains("y"));
        drop(b);
        assert!(!f.contains("x") && !f.contains("y"));
    }
}
