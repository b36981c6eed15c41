//! Terminals that outlive their WebSocket, so that a page reload finds its
//! shell again. A terminal opened with `keep=true` is told its shell's id
//! first; when its socket drops, the shell is not killed but *detached*:
//! a task keeps reading its output into a bounded tail for [`GRACE`]. A new
//! socket (with a fresh single-use ticket, and `shell=<id>`) of the same
//! tenant, for the same sandbox, claims it: it gets the tail replayed, then
//! the live output. A shell nobody claims in time is killed; so is one past
//! the bounds ([`MAX_DETACHED_PER_SANDBOX`], [`MAX_DETACHED`]).
//!
//! The shell's output stream lives in this hub process (sandboxd kills a
//! started process when its stream ends), so only the replica that started
//! it can hand it back: behind a load balancer without affinity a reload
//! may start a new shell instead.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine as _;
use futures::StreamExt;
use sandhub_client::{ProcessEvent, ProcessEvents, Signal};
use tokio::sync::oneshot;

use super::process_list::Tracked;
use crate::backend::TenantView;

/// How long a detached shell waits to be claimed.
pub const GRACE: Duration = Duration::from_secs(60);
/// Output kept for a re-attach's replay, the newest bytes.
pub const TAIL_BYTES: usize = 64 << 10;
/// Detached shells one sandbox may have at once.
pub const MAX_DETACHED_PER_SANDBOX: usize = 4;
/// Detached shells the hub holds at once.
pub const MAX_DETACHED: usize = 256;

/// The newest [`TAIL_BYTES`] of a shell's output.
#[derive(Default)]
pub struct Tail(VecDeque<u8>);

impl Tail {
    pub fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(TAIL_BYTES)..];
        let over = (self.0.len() + data.len()).saturating_sub(TAIL_BYTES);
        self.0.drain(..over);
        self.0.extend(data);
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.0.iter().copied().collect()
    }
}

/// A running shell and what a socket needs to serve it.
pub struct Shell {
    pub id: String,
    pub pid: i32,
    pub events: ProcessEvents,
    pub tail: Tail,
    /// Its row in the process list, ended when this is dropped.
    pub tracked: Option<Tracked>,
}

impl Shell {
    pub fn new(pid: i32, events: ProcessEvents, tracked: Option<Tracked>) -> Self {
        Shell {
            id: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>()),
            pid,
            events,
            tail: Tail::default(),
            tracked,
        }
    }
}

struct Detached {
    tenant: String,
    sandbox: String,
    /// Hands the shell to whoever sends a sender here.
    claim: oneshot::Sender<oneshot::Sender<Shell>>,
}

#[derive(Default)]
pub struct Shells {
    detached: Mutex<HashMap<String, Detached>>,
}

impl std::fmt::Debug for Shells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shells")
    }
}

impl Shells {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Detached>> {
        self.detached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `shell` of `api`'s sandbox `sandbox` for [`GRACE`], or kills
    /// it at once when the bounds are reached.
    pub fn detach(self: &Arc<Self>, api: Arc<dyn TenantView>, sandbox: String, shell: Shell) {
        let tenant = api.tenant().to_string();
        let (claim, claimed) = oneshot::channel();
        {
            let mut all = self.lock();
            let here = all
                .values()
                .filter(|d| d.tenant == tenant && d.sandbox == sandbox)
                .count();
            if here >= MAX_DETACHED_PER_SANDBOX || all.len() >= MAX_DETACHED {
                drop(all);
                tokio::spawn(kill(api, sandbox, shell));
                return;
            }
            all.insert(
                shell.id.clone(),
                Detached {
                    tenant,
                    sandbox: sandbox.clone(),
                    claim,
                },
            );
        }
        let shells = self.clone();
        tokio::spawn(async move {
            let id = shell.id.clone();
            let outcome = keep(shell, claimed, GRACE).await;
            // Claimed: the claimer removed the entry already.
            shells.lock().remove(&id);
            if let Some(shell) = outcome {
                kill(api, sandbox, shell).await;
            }
        });
    }

    /// The detached shell `id`, if it belongs to `tenant`'s `sandbox` and
    /// still runs. Another tenant's or sandbox's id finds nothing (and
    /// leaves that shell alone).
    pub async fn claim(&self, tenant: &str, sandbox: &str, id: &str) -> Option<Shell> {
        let entry = {
            let mut all = self.lock();
            let ours = matches!(all.get(id), Some(d) if d.tenant == tenant && d.sandbox == sandbox);
            if !ours {
                return None;
            }
            all.remove(id)?
        };
        let (tx, rx) = oneshot::channel();
        entry.claim.send(tx).ok()?;
        rx.await.ok()
    }
}

/// Reads a detached shell's output into its tail until it is claimed
/// (handed over: `None`), exits or its stream ends (`None`), or `grace`
/// ends (`Some`: to be killed).
async fn keep(
    mut shell: Shell,
    mut claimed: oneshot::Receiver<oneshot::Sender<Shell>>,
    grace: Duration,
) -> Option<Shell> {
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    let mut claimable = true;
    loop {
        tokio::select! {
            to = &mut claimed, if claimable => match to {
                Ok(to) => {
                    // A claimer that went away meanwhile drops it: killed
                    // with its stream.
                    let _ = to.send(shell);
                    return None;
                }
                // The entry went without a claim: wait out the grace.
                Err(_) => claimable = false,
            },
            ev = shell.events.next() => match ev {
                Some(Ok(ProcessEvent::Stdout { data } | ProcessEvent::Stderr { data })) => {
                    shell.tail.push(&data);
                }
                Some(Ok(ProcessEvent::Started { .. })) => {}
                Some(Ok(ProcessEvent::Exited { exit_code })) => {
                    if let Some(mut t) = shell.tracked.take() {
                        t.exited(exit_code);
                    }
                    return None;
                }
                Some(Err(_)) | None => return None,
            },
            _ = &mut deadline => return Some(shell),
        }
    }
}

async fn kill(api: Arc<dyn TenantView>, sandbox: String, shell: Shell) {
    let _ = api.signal(&sandbox, shell.pid, Signal::Sigkill).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(200);

    /// A shell whose output is `lines`, then (with `exit`) its exit, else
    /// nothing more, ever.
    fn shell(lines: &[&str], exit: Option<i32>) -> Shell {
        let mut events: Vec<sandhub_client::Result<ProcessEvent>> = lines
            .iter()
            .map(|l| {
                Ok(ProcessEvent::Stdout {
                    data: l.as_bytes().to_vec(),
                })
            })
            .collect();
        events.extend(exit.map(|exit_code| Ok(ProcessEvent::Exited { exit_code })));
        let stream = futures::stream::iter(events);
        let events: ProcessEvents = if exit.is_some() {
            Box::pin(stream)
        } else {
            Box::pin(stream.chain(futures::stream::pending()))
        };
        Shell::new(7, events, None)
    }

    #[tokio::test]
    async fn an_unclaimed_shell_is_given_up_when_the_grace_ends() {
        let (_claim, claimed) = oneshot::channel();
        let started = tokio::time::Instant::now();
        let kept = keep(shell(&["a", "b"], None), claimed, SHORT)
            .await
            .expect("to be killed");
        assert!(started.elapsed() >= SHORT);
        // What it printed while detached is in the tail for the replay.
        assert_eq!(kept.tail.to_vec(), b"ab");
    }

    #[tokio::test]
    async fn a_claimed_shell_is_handed_over_with_its_tail() {
        let (claim, claimed) = oneshot::channel();
        let keeper = tokio::spawn(keep(shell(&["prompt$ "], None), claimed, GRACE));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (tx, rx) = oneshot::channel();
        claim.send(tx).ok().unwrap();
        let got = rx.await.expect("handed over");
        assert_eq!((got.pid, got.tail.to_vec()), (7, b"prompt$ ".to_vec()));
        assert!(keeper.await.unwrap().is_none(), "not to be killed");
    }

    #[tokio::test]
    async fn a_shell_that_exits_while_detached_is_not_kept() {
        let (_claim, claimed) = oneshot::channel();
        let started = tokio::time::Instant::now();
        assert!(keep(shell(&["bye"], Some(0)), claimed, GRACE)
            .await
            .is_none());
        assert!(started.elapsed() < GRACE);
    }

    #[test]
    fn the_tail_keeps_the_newest_bytes() {
        let mut t = Tail::default();
        t.push(b"abc");
        t.push(&vec![b'x'; TAIL_BYTES - 1]);
        let v = t.to_vec();
        assert_eq!(v.len(), TAIL_BYTES);
        assert_eq!(&v[..1], b"c");
        t.push(&vec![b'y'; TAIL_BYTES + 10]);
        assert_eq!(t.to_vec(), vec![b'y'; TAIL_BYTES]);
    }
}
