//! Kept processes over sandboxd's `keep.v1` (a Sandhub extension): started
//! processes that outlive their stream, whose output any later caller can
//! replay from a bounded tail and follow. `process.v1`'s pid calls
//! ([`SandboxdClient::write_stdin`], [`SandboxdClient::signal`], ...) reach
//! them as any started process.

use std::{collections::BTreeMap, pin::Pin};

use futures::{Stream, StreamExt};
use sandhub_api::proto::{
    keep::v1::{self as kpb, attach_response::Event},
    process::v1 as pb,
};
use tonic::Streaming;

use super::{process::config, SandboxdClient};
use crate::{ProcessEvent, Result, StartProcess};

/// One event of a kept process's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptEvent {
    Process(ProcessEvent),
    /// This many output bytes were gone from the tail (the oldest go first
    /// past its 1 MiB) before this reader reached them.
    Dropped {
        bytes: u64,
    },
}

/// Starts with `Started`, replays the tail, follows, ends after `Exited`.
pub type KeptEvents = Pin<Box<dyn Stream<Item = Result<KeptEvent>> + Send>>;

/// A kept process as `List` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptProcess {
    pub pid: i32,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub pty: bool,
    /// None while it runs.
    pub exit_code: Option<i32>,
    /// The starter's own name for it (E2B's `tag`); empty when none.
    pub tag: String,
}

impl SandboxdClient {
    /// Starts a process that survives this stream (dropping it kills
    /// nothing), findable later only under `label`; `List` shows `tag`
    /// (each at most 256 bytes).
    pub async fn start_kept(
        &self,
        request: StartProcess,
        label: &str,
        tag: &str,
    ) -> Result<KeptEvents> {
        let StartProcess {
            command,
            env,
            cwd,
            pty,
            stdin_closed,
        } = request;
        let start = kpb::StartRequest {
            start: Some(pb::StartRequest {
                config: Some(config(command, env, cwd)),
                pty: pty.map(|p| pb::Pty {
                    cols: p.cols.into(),
                    rows: p.rows.into(),
                }),
            }),
            label: label.into(),
            tag: tag.into(),
            stdin_closed,
        };
        Ok(events(self.kept().start(start).await?.into_inner()))
    }

    /// The kept processes started under `label`, running or recently exited.
    pub async fn list_kept(&self, label: &str) -> Result<Vec<KeptProcess>> {
        let list = self
            .kept()
            .list(kpb::ListRequest {
                label: label.into(),
            })
            .await?
            .into_inner();
        Ok(list
            .processes
            .into_iter()
            .map(|p| {
                let config = p.config.unwrap_or_default();
                KeptProcess {
                    pid: p.process_id,
                    command: config.command,
                    env: config.env_vars.into_iter().collect(),
                    cwd: config.cwd.unwrap_or_default(),
                    pty: p.pty,
                    exit_code: p.exit_code,
                    tag: p.tag,
                }
            })
            .collect())
    }

    /// Replays kept process `pid`'s tail and follows it to the exit;
    /// NOT_FOUND unless it was started under `label`.
    pub async fn attach_kept(&self, pid: i32, label: &str) -> Result<KeptEvents> {
        let request = kpb::AttachRequest {
            process_id: pid,
            label: label.into(),
        };
        Ok(events(self.kept().attach(request).await?.into_inner()))
    }
}

/// A kept process's events as an ordinary process's: `Dropped` notes are
/// left out (what a reader missed of the tail is gone either way).
pub fn process_events(events: KeptEvents) -> crate::ProcessEvents {
    Box::pin(events.filter_map(|item| {
        futures::future::ready(match item {
            Ok(KeptEvent::Process(event)) => Some(Ok(event)),
            Ok(KeptEvent::Dropped { .. }) => None,
            Err(e) => Some(Err(e)),
        })
    }))
}

fn events(stream: Streaming<kpb::AttachResponse>) -> KeptEvents {
    Box::pin(stream.filter_map(|item| {
        futures::future::ready(match item {
            Ok(response) => response.event.map(|e| Ok(event_of(e))),
            Err(status) => Some(Err(status.into())),
        })
    }))
}

fn event_of(event: Event) -> KeptEvent {
    KeptEvent::Process(match event {
        Event::Init(init) => ProcessEvent::Started {
            pid: init.process_id,
        },
        Event::Stdout(data) => ProcessEvent::Stdout { data: data.into() },
        Event::Stderr(data) => ProcessEvent::Stderr { data: data.into() },
        Event::Exit(exit) => ProcessEvent::Exited {
            exit_code: exit.exit_code,
        },
        Event::Dropped(d) => return KeptEvent::Dropped { bytes: d.bytes },
    })
}
