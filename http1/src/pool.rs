//! Idle upstream connections, by key. The crate keeps no pool of its own:
//! the router keeps one [`IdleMap`] per worker thread by Pod address (no
//! lock, no cross-thread wake-up), the hub one per thread by tenant,
//! sandbox and port. Each returns connections through its
//! [`Keep`](crate::outbound::Keep).

use std::{
    collections::HashMap,
    hash::Hash,
    io,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::BytesMut;
use tokio::net::TcpStream;

/// A kept-alive connection and its read buffer (reused, so a request
/// allocates no fresh 16 KiB).
pub struct Idle {
    pub stream: TcpStream,
    pub buf: BytesMut,
}

/// Idle connections by key: at most `per_key` each, none older than
/// `max_age` handed out.
pub struct IdleMap<K> {
    idle: HashMap<K, Vec<(Idle, Instant)>>,
    per_key: usize,
    max_age: Duration,
}

impl<K: Hash + Eq> IdleMap<K> {
    pub fn new(per_key: usize, max_age: Duration) -> Self {
        Self {
            idle: HashMap::new(),
            per_key,
            max_age,
        }
    }

    /// A connection kept for `key` that is young enough and that the
    /// upstream has not closed meanwhile.
    pub fn take<Q>(&mut self, key: &Q) -> Option<Idle>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let list = self.idle.get_mut(key)?;
        let mut found = None;
        while let Some((i, since)) = list.pop() {
            if since.elapsed() < self.max_age && still_open(&i.stream) {
                found = Some(i);
                break;
            }
        }
        if list.is_empty() {
            self.idle.remove(key);
        }
        found
    }

    /// Keeps `idle` for `key`, unless `key` has `per_key` already. Past
    /// `sweep_at` keys, the keys holding only dead or stale connections
    /// go first, so the map stays as large as what is really idle.
    pub fn put(&mut self, key: K, idle: Idle, sweep_at: usize) {
        if self.idle.len() >= sweep_at {
            let max_age = self.max_age;
            self.idle.retain(|_, list| {
                list.retain(|(i, since)| since.elapsed() < max_age && still_open(&i.stream));
                !list.is_empty()
            });
        }
        let list = self.idle.entry(key).or_default();
        if list.len() < self.per_key {
            list.push((idle, Instant::now()));
        }
    }

    /// Keys holding idle connections.
    pub fn len(&self) -> usize {
        self.idle.len()
    }

    pub fn is_empty(&self) -> bool {
        self.idle.is_empty()
    }
}

/// Whether an idle connection is still usable. An upstream that closes idle
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
