//! A WatchDir stream gives back everything it holds when the client goes
//! away or the watched directory does. Alone in its own test binary, because
//! it counts the process's inotify fds, which other tests would disturb.

use std::{
    fs,
    time::{Duration, Instant},
};

use clap::Parser;
use futures::StreamExt;
use sandboxd::{watcher::WatcherService, Config, Daemon};
use sandhub_api::proto::watcher::v1::{
    file_watcher_service_server::FileWatcherService, WatchDirRequest,
};
use tonic::Request;

fn inotify_fds() -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("inotify"))
        .count()
}

async fn wait_for_inotify_fds(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while inotify_fds() != n {
        assert!(
            Instant::now() < deadline,
            "{} inotify fds open, want {n}",
            inotify_fds()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn watches_release_their_fd_and_slot_when_dropped_or_ended() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_str().unwrap();
    let daemon = Daemon::new(Config::parse_from([
        "sandboxd",
        "--root-dir",
        root,
        "--max-watches",
        "2",
    ]))
    .unwrap();
    let svc = WatcherService {
        daemon: daemon.clone(),
    };
    fs::create_dir_all(tmp.path().join("w/a/b")).unwrap();
    let watch = |path: &str| {
        svc.watch_dir(Request::new(WatchDirRequest {
            path: path.into(),
            recursive: true,
        }))
    };
    let baseline = inotify_fds();

    // Client goes away.
    let s1 = watch("w").await.unwrap().into_inner();
    let s2 = watch("w/a").await.unwrap().into_inner();
    wait_for_inotify_fds(baseline + 2).await;
    assert_eq!(daemon.watches.available_permits(), 0);
    drop(s1);
    drop(s2);
    assert_eq!(daemon.watches.available_permits(), 2);
    assert_eq!(daemon.metrics.active_watches.get(), 0);
    wait_for_inotify_fds(baseline).await;

    // The watched directory goes away.
    let mut s = watch("w/a").await.unwrap().into_inner();
    fs::remove_dir_all(tmp.path().join("w/a")).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(item) = s.next().await {
            item.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "stream did not end");
    wait_for_inotify_fds(baseline).await;
    drop(s);
    assert_eq!(daemon.watches.available_permits(), 2);
    assert_eq!(daemon.metrics.active_watches.get(), 0);
}
