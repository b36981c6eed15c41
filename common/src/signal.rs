//! The one way a Sandhub process learns it should stop: SIGTERM (Kubernetes,
//! systemd) or SIGINT (Ctrl-C in a terminal).

use std::fmt;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Which signal asked the process to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminated {
    Sigterm,
    Sigint,
}

impl fmt::Display for Terminated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Terminated::Sigterm => "SIGTERM",
            Terminated::Sigint => "SIGINT",
        })
    }
}

/// SIGTERM and SIGINT handlers, installed when this is made. A server
/// makes one before it binds: a signal that arrives between "listening"
/// and the first poll of a lazily installed handler would otherwise take
/// the default action and kill the process mid-start, uncleanly.
pub struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    /// Fails only when the handlers cannot be installed (no signal driver:
    /// a runtime built without `enable_io`), which a caller should treat
    /// as a start-up error rather than as a request to stop.
    pub fn install() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves at the first SIGTERM or SIGINT since [`StopSignals::install`].
    pub async fn recv(mut self) -> Terminated {
        tokio::select! {
            _ = self.term.recv() => Terminated::Sigterm,
            _ = self.int.recv() => Terminated::Sigint,
        }
    }
}

/// Resolves at the first SIGTERM or SIGINT after it is first polled; for
/// callers with nothing to race (a server uses [`StopSignals`]).
pub async fn terminated() -> std::io::Result<Terminated> {
    Ok(StopSignals::install()?.recv().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `fut` once (which installs its handlers) and checks it is waiting.
    async fn first_poll<F: std::future::Future + Unpin>(fut: &mut F) {
        tokio::select! {
            biased;
            _ = fut => panic!("resolved before any signal"),
            _ = async {} => {}
        }
    }

    // One test raises both signals in turn: the handlers are process-wide,
    // so two tests raising them in parallel could see each other's signal.
    // Each signal is raised once, after the future's handlers exist, and
    // the first phase consumes its signal before the second subscribes.
    #[tokio::test]
    async fn resolves_on_sigterm_and_on_sigint() {
        for (raw, want) in [
            (libc::SIGTERM, Terminated::Sigterm),
            (libc::SIGINT, Terminated::Sigint),
        ] {
            let mut wait = Box::pin(terminated());
            first_poll(&mut wait).await;
            // SAFETY: raise only sends a signal to this thread.
            assert_eq!(unsafe { libc::raise(raw) }, 0);
            assert_eq!(wait.await.unwrap(), want);
        }
        // A signal raised after install and before anyone waits is kept,
        // not fatal: the window a server has between binding and awaiting.
        let signals = StopSignals::install().unwrap();
        // SAFETY: raise only sends a signal to this thread.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert_eq!(signals.recv().await, Terminated::Sigterm);
        assert_eq!(Terminated::Sigterm.to_string(), "SIGTERM");
    }
}
