//! Counting body bytes, and how much of a refused request body is still
//! read. A leaf.

use prometheus_client::metrics::counter::Counter;

/// Adds its bytes to a counter when dropped: summed per body and added to
/// the shared counter once, so the hot loop touches no shared cache line.
pub struct ByteCount {
    n: u64,
    counter: Option<Counter>,
}

impl ByteCount {
    /// Counts into `counter`; `None` counts nothing.
    pub fn new(counter: Option<&Counter>) -> Self {
        Self {
            n: 0,
            counter: counter.cloned(),
        }
    }
    pub fn add(&mut self, n: usize) {
        self.n += n as u64;
    }
}

impl Drop for ByteCount {
    fn drop(&mut self) {
        if let (Some(counter), n @ 1..) = (&self.counter, self.n) {
            counter.inc_by(n);
        }
    }
}

/// The bound on reading a refused request body: at most this much of a
/// too-large body, or of one the upstream never got, is still read (and
/// dropped) before the answer, for at most [`DRAIN_TIMEOUT`]. A client
/// still sending when the server answers and closes would get a reset
/// instead of the answer; reading the rest first lets it read it. Bounded,
/// so a huge or endless body still ends the connection.
pub const DRAIN_CAP: u64 = 1 << 20;
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
