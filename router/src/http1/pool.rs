//! The connection pool of the direct path: idle sandbox connections kept
//! per Pod address and per worker thread. Thread-local, so taking and
//! returning a connection needs no lock and no cross-thread wake-up; each
//! worker is its own single-threaded event loop (see [`crate::server`]).

use std::{
    cell::RefCell,
    collections::HashMap,
    io,
    net::SocketAddr,
    task::{Context, Poll},
};

use bytes::BytesMut;
use tokio::net::TcpStream;

/// Idle connections kept per Pod address and worker thread.
const MAX_IDLE_PER_ADDR: usize = 256;

thread_local! {
    static IDLE: RefCell<HashMap<SocketAddr, Vec<Idle>>> = RefCell::new(HashMap::new());
}

/// A kept-alive connection and its read buffer (reused, so a request
/// allocates no fresh 16 KiB).
pub(super) struct Idle {
    pub stream: TcpStream,
    pub buf: BytesMut,
}

/// A pooled connection to `addr` that the sandbox has not closed meanwhile.
pub(super) fn take_idle(addr: SocketAddr) -> Option<Idle> {
    IDLE.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.get_mut(&addr)?;
        while let Some(i) = idle.pop() {
            if still_open(&i.stream) {
                return Some(i);
            }
        }
        None
    })
}

/// Whether an idle connection is still usable. A sandbox that closes idle
/// connections (Node's 5 s keep-alive, for one) sends a FIN the reactor has
/// usually seen by now; catching it here matters for requests with a body,
/// which cannot be retried on a fresh connection once sent. Costs no
/// syscall unless the socket turned readable while idle.
fn still_open(s: &TcpStream) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match s.poll_read_ready(&mut cx) {
        Poll::Pending => true,
        Poll::Ready(Err(_)) => false,
        Poll::Ready(Ok(())) => {
            // Readable while idle: EOF, an error, or bytes nobody asked for.
            let mut probe = [0u8; 1];
            matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
        }
    }
}

pub(super) fn put_idle(addr: SocketAddr, s: Idle) {
    IDLE.with(|p| {
        let mut p = p.borrow_mut();
        let v = p.entry(addr).or_default();
        if v.len() < MAX_IDLE_PER_ADDR {
            v.push(s);
        }
    });
}
