//! Kept connections to sandbox ports on the fast path, per worker thread:
//! taking and returning one needs no lock. Keyed by tenant, sandbox and
//! port, as the hyper path's `proxy::PortPool` is: a connection is only
//! ever reused for the tenant that made it, and only after the sandbox is
//! checked to still be theirs and Ready (`fast::Ports::exchange`).

use std::cell::RefCell;

use sandhub_http1::{
    outbound::Keep,
    pool::{Idle, IdleMap},
};

use crate::http::proxy::{Slot, IDLE_FOR, MAX_IDLE_PER_PORT, SWEEP_AT};

/// Whose connection it is.
#[derive(Clone, Hash, PartialEq, Eq)]
pub struct PortKey {
    pub tenant: String,
    pub id: String,
    pub port: u16,
}

thread_local! {
    static IDLE: RefCell<IdleMap<PortKey>> = RefCell::new(IdleMap::new(MAX_IDLE_PER_PORT, IDLE_FOR));
}

/// A connection this thread keeps for `key`, still open and young enough.
pub fn take(key: &PortKey) -> Option<Idle> {
    IDLE.with(|p| p.borrow_mut().take(key))
}

/// An answer's connection, back to its key once the body is through; and
/// the request's slot under the caps, held until then.
pub struct Kept {
    pub key: PortKey,
    pub slot: Slot,
}

impl Keep for Kept {
    fn keep(self, idle: Idle) {
        let Kept { key, slot } = self;
        drop(slot);
        IDLE.with(|p| p.borrow_mut().put(key, idle, SWEEP_AT));
    }
}
