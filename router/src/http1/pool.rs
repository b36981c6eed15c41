//! The connection pool of the direct path: idle sandbox connections kept
//! per Pod address and per worker thread. Thread-local, so taking and
//! returning a connection needs no lock and no cross-thread wake-up; each
//! worker is its own single-threaded event loop (see [`crate::server`]).

use std::{cell::RefCell, net::SocketAddr, time::Duration};

use sandhub_http1::{
    outbound::Keep,
    pool::{Idle, IdleMap},
};

/// Idle connections kept per Pod address and worker thread.
const MAX_IDLE_PER_ADDR: usize = 256;
/// A Pod's connections are kept until it closes them (checked on reuse).
const MAX_AGE: Duration = Duration::MAX;
/// Past this many addresses, those left with only closed connections go.
const SWEEP_AT: usize = 4096;

thread_local! {
    static IDLE: RefCell<IdleMap<SocketAddr>> =
        RefCell::new(IdleMap::new(MAX_IDLE_PER_ADDR, MAX_AGE));
}

/// A pooled connection to `addr` that the sandbox has not closed meanwhile.
pub(super) fn take_idle(addr: SocketAddr) -> Option<Idle> {
    IDLE.with(|p| p.borrow_mut().take(&addr))
}

/// An answer's connection goes back to this thread's pool, under its address.
pub struct ByAddr(pub SocketAddr);

impl Keep for ByAddr {
    fn keep(self, idle: Idle) {
        IDLE.with(|p| p.borrow_mut().put(self.0, idle, SWEEP_AT));
    }
}
