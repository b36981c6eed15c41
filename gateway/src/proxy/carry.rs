//! Carrying an opened flow: the client's stream, counted as the meter
//! counts a TUN flow's payload (`bytes_out`: what the workload sent,
//! `bytes_in`: what it was given), spliced to the upstream connection or
//! handed to the broker, and ended when nothing moves for `idle`.

use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Dialed;
use crate::{broker::Broker, meter::Meter};

/// The client's side, counting payload both ways into its log entry.
struct Counted<S> {
    inner: S,
    meter: Arc<Meter>,
    seq: u64,
    /// Milliseconds since `start` when a byte last moved.
    active: Arc<AtomicU64>,
    start: Instant,
}

impl<S> Counted<S> {
    fn touch(&self) {
        self.active
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.meter.moved(self.seq, n as u64, 0);
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.meter.moved(self.seq, 0, n as u64);
                self.touch();
            }
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

/// Resolves when nothing has moved for `idle`.
async fn idled(active: &AtomicU64, start: Instant, idle: Duration) {
    let tick = (idle / 4).max(Duration::from_millis(50));
    loop {
        tokio::time::sleep(tick).await;
        let last = Duration::from_millis(active.load(Ordering::Relaxed));
        if start.elapsed().saturating_sub(last) >= idle {
            return;
        }
    }
}

pub(super) async fn run<S>(
    client: S,
    d: Dialed,
    meter: Arc<Meter>,
    idle: Duration,
    broker: Option<(Arc<Broker>, String)>,
    sandbox: &str,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let start = Instant::now();
    let active = Arc::new(AtomicU64::new(0));
    let mut client = Counted {
        inner: client,
        meter,
        seq: d.seq,
        active: active.clone(),
        start,
    };
    let Dialed {
        mut upstream,
        slot,
        secrets,
        ..
    } = d;
    // The slot is held until the flow ends, whichever way.
    let _slot = slot;
    match broker {
        None => {
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = idled(&active, start, idle) => {}
            }
        }
        Some((broker, name)) => {
            let relay = broker.relay(name.clone(), Arc::new(secrets), client, upstream);
            tokio::select! {
                r = relay => if let Err(e) = r {
                    tracing::info!(%sandbox, %name, error = %e, "egress proxy: a brokered connection ended");
                },
                _ = idled(&active, start, idle) => {}
            }
        }
    }
}
