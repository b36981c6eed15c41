//! `watcher.v1.FileWatcherService`: inotify-backed directory watches.
//! (Stub; being written.)

use std::sync::Arc;

use sandhub_api::proto::watcher::v1 as pb;
use tonic::{Request, Response, Status};

use crate::daemon::Daemon;

pub struct WatcherService {
    pub daemon: Arc<Daemon>,
}

#[tonic::async_trait]
impl pb::file_watcher_service_server::FileWatcherService for WatcherService {
    type WatchDirStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::WatchDirResponse, Status>> + Send>>;

    async fn watch_dir(
        &self,
        _request: Request<pb::WatchDirRequest>,
    ) -> Result<Response<Self::WatchDirStream>, Status> {
        Err(Status::unimplemented("WatchDir"))
    }
}
