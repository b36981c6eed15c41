//! `entrypoint_exited` on Kubernetes. sandboxd in the Pod records its
//! entrypoint's end and only answers when asked, and an event every
//! replica derives must come from a write they all see: so each replica
//! asks the Ready sandboxes' sandboxd every [`EVERY`], and when a run has
//! ended that the claim does not record yet, writes the exit (the GET's
//! words, clamped) to the claim's [`ANNOTATION`]. Every replica's claim
//! watch then derives `entrypoint_exited` from that write, under one id
//! (kube/events.rs). Two replicas that see one exit write the same bytes,
//! and the second write changes nothing. The annotation is the claim's
//! memory: an exit is told once, also across restarts of every replica.
//!
//! Cost: one small GET per Ready sandbox with an entrypoint per [`EVERY`]
//! per replica (16 at once, kube/asking.rs); a sandbox whose sandboxd runs no
//! entrypoint is asked once per time it is Ready.

use std::{sync::Arc, time::Duration};

use sandhub_api::k8s::SandboxClaim;
use serde::{Deserialize, Serialize};

use super::{
    asking::{self, ReadyClaims},
    Shared,
};

/// The claim's record of its entrypoint's last told exit ([`Exit`]).
pub const ANNOTATION: &str = "sandhub.io/entrypoint-exit";
/// How often a Ready sandbox with an entrypoint is asked.
pub const EVERY: Duration = Duration::from_secs(5);
/// An annotation longer than this is not read (the hub writes ~300 bytes).
const MAX_ANNOTATION: usize = 4096;

/// One run's end, as a claim records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exit {
    /// The run (its start, Unix ms, as sandboxd said).
    pub run: i64,
    /// `entrypoint_exited`'s details (`crate::entrypoint::exit_details`).
    pub details: serde_json::Value,
}

/// The exit `claim` records, if any (and sane).
pub fn exit_of(claim: &SandboxClaim) -> Option<Exit> {
    asking::recorded(claim, ANNOTATION, MAX_ANNOTATION)
}

/// Starts the asking (see the module docs).
pub(super) fn spawn(shared: Arc<Shared>) {
    tokio::spawn(async move {
        let mut claims = ReadyClaims::default();
        let mut tick = asking::ticker(EVERY);
        loop {
            tick.tick().await;
            pass(&shared, &mut claims).await;
        }
    });
}

async fn pass(shared: &Shared, claims: &mut ReadyClaims) {
    let ask = claims.this_round(shared);
    let answers = asking::ask_each(shared, ask, |c| async move {
        crate::entrypoint::answer(&c).await
    })
    .await;
    for (claim, answer) in answers {
        let Some(id) = claim.metadata.name.clone() else {
            continue;
        };
        let record = match answer.flatten() {
            None => continue,
            Some(None) => {
                claims.has_nothing(id);
                continue;
            }
            Some(Some(r)) => r,
        };
        if !record.ended() || exit_of(&claim).is_some_and(|e| e.run == record.started_at_unix_ms) {
            continue;
        }
        let exit = Exit {
            run: record.started_at_unix_ms,
            // The Pod's OOM count is the kubelet's, not the hub's (see
            // `crate::entrypoint`): an OOM kill reads as an Error here.
            details: crate::entrypoint::exit_details(&record, 0, crate::backend::now_ms()),
        };
        asking::record(shared, &id, ANNOTATION, &exit).await;
    }
}
