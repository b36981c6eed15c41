//! Directory watches over sandboxd's `watcher.v1` gRPC service.

use futures::StreamExt;
use sandhub_api::proto::watcher::v1::{self as pb, EventType};

use super::SandboxdClient;
use crate::{Result, WatchEvent, WatchEvents, WatchKind};

impl SandboxdClient {
    /// Streams batches of events under `path` (about 250 ms each) until the
    /// stream is dropped or the directory goes away. Once this returns, the
    /// watch is in place: changes made after it are reported.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<WatchEvents> {
        let request = pb::WatchDirRequest {
            path: path.to_string(),
            recursive,
        };
        let stream = self.watcher().watch_dir(request).await?.into_inner();
        Ok(Box::pin(stream.filter_map(|item| {
            futures::future::ready(match item {
                Ok(batch) if batch.events.is_empty() => None,
                Ok(batch) => Some(Ok(batch.events.into_iter().map(event_of).collect())),
                Err(status) => Some(Err(status.into())),
            })
        })))
    }
}

fn event_of(e: pb::FileEvent) -> WatchEvent {
    let (kind, message) = match EventType::try_from(e.r#type) {
        Ok(EventType::Create) => (WatchKind::Create, e.message),
        Ok(EventType::Write) => (WatchKind::Write, e.message),
        Ok(EventType::Remove) => (WatchKind::Remove, e.message),
        Ok(EventType::Rename) => (WatchKind::Rename, e.message),
        Ok(EventType::Chmod) => (WatchKind::Chmod, e.message),
        Ok(EventType::Error) => (WatchKind::Error, e.message),
        // A newer sandboxd's event kind: reported, not silently dropped.
        Ok(EventType::Unspecified) | Err(_) => (
            WatchKind::Error,
            format!("unknown watch event type {}", e.r#type),
        ),
    };
    WatchEvent {
        kind,
        path: e.path,
        old_path: e.old_path,
        is_dir: e.is_dir,
        message,
        timestamp_ms: e.timestamp_ms,
    }
}
