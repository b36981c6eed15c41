//! What one tenant may hold open through the port proxy. Each proxied
//! request holds two file descriptors (the client's connection and the
//! one into the sandbox) for as long as it lasts, so a tenant whose port
//! never answers could otherwise take the hub to its `RLIMIT_NOFILE` and
//! starve every other tenant's `exec` and the probes. Bounded here:
//!
//! - requests in flight per sandbox, per tenant and in all (the last sized
//!   from the descriptor limit, keeping a reserve for the API): past a cap
//!   the answer is 429 `RESOURCE_EXHAUSTED`;
//! - how long the server may take to send its answer's head
//!   (504 `DEADLINE_EXCEEDED`), and how long an answer's body, or an
//!   upgraded connection, may go without a byte (then it is cut).
//!
//! A slot is held until the answer's body ends or the upgraded connection
//! closes, not only until the head is through.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use sandhub_api::error::Code;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::{ApiError, ApiResult};

/// The operator's bounds on proxied traffic (`sandhub serve --port-*`).
#[derive(Debug, Clone)]
pub struct ProxyLimits {
    pub per_sandbox: usize,
    pub per_tenant: usize,
    /// Over every tenant: what the descriptor limit leaves after the
    /// reserve for the API (see [`ProxyLimits::total_for`]).
    pub total: usize,
    /// From sending the request to the answer's head.
    pub response_timeout: Duration,
    /// Between two pieces of an ordinary answer's body.
    pub idle_timeout: Duration,
    /// Between two bytes of an upgraded connection or an event stream
    /// (SSE), which are quiet by nature.
    pub stream_idle_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            per_sandbox: 256,
            per_tenant: 512,
            total: Self::total_for(1024),
            response_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(3600),
        }
    }
}

impl ProxyLimits {
    /// Proxied requests the hub may hold under a descriptor limit of
    /// `nofile`: half of it is kept for everything else (API clients,
    /// sandboxd sockets, the store, the database), and each request
    /// takes two.
    pub fn total_for(nofile: u64) -> usize {
        usize::try_from(nofile / 2 / 2).unwrap_or(usize::MAX).max(1)
    }
}

/// In flight per tenant, and per sandbox of that tenant. Entries that
/// fall to zero are kept (the next request to the same sandbox, the usual
/// case, then costs no allocation) and swept once there are many.
#[derive(Default)]
struct Counts {
    total: usize,
    tenants: HashMap<Arc<str>, TenantCount>,
}

#[derive(Default)]
struct TenantCount {
    n: usize,
    sandboxes: HashMap<Arc<str>, usize>,
}

/// Past this many kept entries (tenants, or one tenant's sandboxes), the
/// zero ones are dropped.
const SWEEP_AT: usize = 1024;

/// The key of `name` in `map`, inserted (with the zero entries swept
/// first, when there are many) if missing: one allocation per new name.
fn key_of<V: Default>(
    map: &mut HashMap<Arc<str>, V>,
    name: &str,
    zero: fn(&V) -> bool,
) -> Arc<str> {
    if let Some((key, _)) = map.get_key_value(name) {
        return key.clone();
    }
    if map.len() >= SWEEP_AT {
        map.retain(|_, v| !zero(v));
    }
    let key: Arc<str> = Arc::from(name);
    map.insert(key.clone(), V::default());
    key
}

/// Counts what is in flight, and hands out [`Slot`]s within the caps.
#[derive(Default)]
pub struct Gate {
    counts: Arc<Mutex<Counts>>,
}

impl Gate {
    /// A slot for one more request of `tenant` to sandbox `id`, or 429.
    pub fn admit(&self, limits: &ProxyLimits, tenant: &str, id: &str) -> ApiResult<Slot> {
        let mut guard = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let c = &mut *guard;
        let tenant = key_of(&mut c.tenants, tenant, |t| t.n == 0);
        let t = c.tenants.get_mut(&tenant).expect("made above");
        let id = key_of(&mut t.sandboxes, id, |n| *n == 0);
        let of_tenant = t.n;
        let of_sandbox = t.sandboxes.get_mut(&id).expect("made above");
        let refused = if *of_sandbox >= limits.per_sandbox {
            Some(format!(
                "{} requests to this sandbox's ports are in flight, at most {} \
                 (--port-max-requests-per-sandbox)",
                *of_sandbox, limits.per_sandbox
            ))
        } else if of_tenant >= limits.per_tenant {
            Some(format!(
                "{of_tenant} of this tenant's requests to sandbox ports are in flight, at most \
                 {} (--port-max-requests-per-tenant)",
                limits.per_tenant
            ))
        } else if c.total >= limits.total {
            Some(format!(
                "the hub carries {} requests to sandbox ports, all it keeps file descriptors \
                 for; try again shortly",
                c.total
            ))
        } else {
            None
        };
        if let Some(message) = refused {
            return Err(ApiError::new(Code::ResourceExhausted, message));
        }
        *of_sandbox += 1;
        t.n += 1;
        c.total += 1;
        Ok(Slot {
            counts: self.counts.clone(),
            tenant,
            id,
        })
    }

    /// Requests in flight over every tenant (for tests and metrics).
    pub fn in_flight(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

/// One request's place under the caps, given back when dropped.
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    tenant: Arc<str>,
    id: Arc<str>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(t) = c.tenants.get_mut(&self.tenant) {
            t.n = t.n.saturating_sub(1);
            if let Some(n) = t.sandboxes.get_mut(&self.id) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An answer's body that holds its [`Slot`] until it ends, and ends with
/// an error when no piece of it arrives for `idle`.
///
/// The timer is armed only when the body first has to wait, and not
/// re-armed per piece: a piece only records when it came, and a timer that
/// fires early re-arms itself for the rest. Most answers arrive whole and
/// never touch the timer wheel (it cost ~8% of the proxy's throughput when
/// every piece reset it).
pub struct Watched<B> {
    inner: B,
    idle: Duration,
    last: tokio::time::Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    _slot: Slot,
}

impl<B> Watched<B> {
    pub fn new(inner: B, idle: Duration, slot: Slot) -> Self {
        Watched {
            inner,
            idle,
            last: tokio::time::Instant::now(),
            timer: None,
            _slot: slot,
        }
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(frame)) => {
                self.last = tokio::time::Instant::now();
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => loop {
                let deadline = self.last + self.idle;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) if tokio::time::Instant::now() >= deadline => {
                        return Poll::Ready(Some(Err(format!(
                            "the sandbox's server sent nothing for {:?}",
                            self.idle
                        )
                        .into())));
                    }
                    Poll::Ready(()) => continue,
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A watched answer body as axum's.
pub fn watched_body<B>(inner: B, idle: Duration, slot: Slot) -> axum::body::Body
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    axum::body::Body::new(Watched::new(inner, idle, slot))
}

/// The last time either side of a spliced connection moved a byte.
#[derive(Clone)]
pub struct Activity {
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    pub fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: Arc::default(),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    /// Resolves once nothing has moved for `idle`.
    pub async fn until_idle(&self, idle: Duration) {
        loop {
            let quiet = self.quiet_for();
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

/// A stream that records its traffic in an [`Activity`].
pub struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Activity) -> Self {
        Tracked { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Splices `a` and `b` both ways until either closes or neither moves a
/// byte for `idle`.
pub async fn splice<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity::new();
    let mut a = Tracked::new(a, activity.clone());
    let mut b = Tracked::new(b, activity.clone());
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
        () = activity.until_idle(idle) => {
            tracing::debug!(?idle, "a spliced port connection went idle: closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn limits(per_sandbox: usize, per_tenant: usize, total: usize) -> ProxyLimits {
        ProxyLimits {
            per_sandbox,
            per_tenant,
            total,
            ..ProxyLimits::default()
        }
    }

    #[test]
    fn each_cap_refuses_with_429_and_slots_come_back() {
        let gate = Gate::default();
        let l = limits(2, 3, 4);
        let a1 = gate.admit(&l, "a", "s1").unwrap();
        let _a2 = gate.admit(&l, "a", "s1").unwrap();
        let e = gate.admit(&l, "a", "s1").err().unwrap();
        assert_eq!(e.error.code, Code::ResourceExhausted);
        assert!(
            e.error.message.contains("per-sandbox"),
            "{}",
            e.error.message
        );
        let _a3 = gate.admit(&l, "a", "s2").unwrap();
        let e = gate.admit(&l, "a", "s3").err().unwrap();
        assert!(
            e.error.message.contains("per-tenant"),
            "{}",
            e.error.message
        );
        let _b1 = gate.admit(&l, "b", "t1").unwrap();
        let e = gate.admit(&l, "b", "t1").err().unwrap();
        assert!(
            e.error.message.contains("file descriptors"),
            "{}",
            e.error.message
        );
        drop(a1);
        assert_eq!(gate.in_flight(), 3);
        gate.admit(&l, "b", "t1").unwrap();
        assert_eq!(gate.in_flight(), 3, "the new slot was dropped at once");
        let c = gate.counts.lock().unwrap();
        assert_eq!(c.tenants["a"].n, 2);
        assert_eq!(c.tenants["a"].sandboxes["s1"], 1);
        assert_eq!(c.tenants["b"].n, 1);
    }

    #[test]
    fn counts_of_gone_sandboxes_and_tenants_do_not_pile_up() {
        let gate = Gate::default();
        let l = limits(1, 1, 1);
        for i in 0..3 * SWEEP_AT {
            let tenant = format!("t{}", i % (2 * SWEEP_AT));
            drop(gate.admit(&l, &tenant, &format!("s{i}")).unwrap());
            drop(gate.admit(&l, "one", &format!("s{i}")).unwrap());
        }
        let held = gate.admit(&l, "one", "held").unwrap();
        let c = gate.counts.lock().unwrap();
        assert!(c.tenants.len() <= SWEEP_AT + 1, "{}", c.tenants.len());
        assert!(c.tenants["one"].sandboxes.len() <= SWEEP_AT + 1);
        assert_eq!(c.total, 1);
        drop(c);
        drop(held);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn the_total_keeps_half_the_descriptors() {
        assert_eq!(ProxyLimits::total_for(1024), 256);
        assert_eq!(ProxyLimits::total_for(1), 1);
    }

    #[tokio::test]
    async fn a_silent_body_ends_with_an_error_and_frees_its_slot() {
        let gate = Gate::default();
        let slot = gate.admit(&limits(1, 1, 1), "a", "s").unwrap();
        let body = http_body_util::StreamBody::new(futures::stream::pending::<
            Result<Frame<Bytes>, BoxError>,
        >());
        let mut w = Watched::new(body, Duration::from_millis(50), slot);
        let frame = w.frame().await.expect("an error frame");
        assert!(frame.is_err());
        drop(w);
        assert_eq!(gate.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_quiet_splice_is_closed() {
        let (a, _a_peer) = tokio::io::duplex(64);
        let (b, _b_peer) = tokio::io::duplex(64);
        let started = Instant::now();
        splice(a, b, Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
