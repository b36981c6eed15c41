//! Upgrades (WebSocket and others): after the sandbox's 101, both upgraded
//! connections spliced together, with no proxy timeout, and every byte
//! counted as it passes. Only hyper's path carries them (the fast path hands
//! any `Upgrade` to hyper).

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use http::Response;
use hyper::{body::Incoming, upgrade::OnUpgrade};
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{metrics::Metrics, response::ProxyBody};

/// The sandbox side of a tunnel: reads are rx, writes are tx.
struct Counted<S> {
    inner: S,
    rx: Counter,
    tx: Counter,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.rx.inc_by(n as u64);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &polled {
            self.tx.inc_by(*n as u64);
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Waits for both sides to finish upgrading, then copies until either closes.
pub async fn splice(client: OnUpgrade, sandbox: OnUpgrade, rx: Counter, tx: Counter) {
    let (client, sandbox) = match tokio::try_join!(client, sandbox) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade did not complete");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut sandbox = Counted {
        inner: TokioIo::new(sandbox),
        rx,
        tx,
    };
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut sandbox).await {
        tracing::debug!(error = %e, "upgraded connection ended with an error");
    }
}

/// The sandbox switched protocols: the tunnel starts in its own task (it
/// outlives this request) and the client gets the 101 as the sandbox sent it.
pub(super) fn switch(
    client: OnUpgrade,
    mut resp: Response<Incoming>,
    metrics: &Metrics,
) -> Response<ProxyBody> {
    let sandbox = hyper::upgrade::on(&mut resp);
    tokio::spawn(splice(
        client,
        sandbox,
        metrics.rx_bytes.clone(),
        metrics.tx_bytes.clone(),
    ));
    let (parts, _) = resp.into_parts();
    Response::from_parts(parts, ProxyBody::empty())
}
