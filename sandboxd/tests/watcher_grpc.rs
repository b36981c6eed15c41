//! `watcher.v1.FileWatcherService/WatchDir`: events, recursion, batching,
//! the end of a watched directory, confinement and the concurrency cap.
//!
//! Most tests call the service in-process; the `grpc_` tests go through the
//! real binary and a tonic client. Every wait is bounded: a missing event
//! fails the test with what did arrive instead of hanging.

mod common;

use std::{
    fs,
    os::unix::fs::{symlink, PermissionsExt},
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser;
use futures::{Stream, StreamExt};
use sandboxd::{watcher::WatcherService, Config, Daemon};
use sandhub_api::proto::watcher::v1::{
    file_watcher_service_client::FileWatcherServiceClient,
    file_watcher_service_server::FileWatcherService, EventType, FileEvent, WatchDirRequest,
    WatchDirResponse,
};
use tonic::{Code, Request, Status};

/// Long enough for a loaded 2-core CI box; only failures ever wait this long.
const PATIENCE: Duration = Duration::from_secs(10);

type Events = Pin<Box<dyn Stream<Item = Result<WatchDirResponse, Status>> + Send>>;

struct Fixture {
    tmp: tempfile::TempDir,
    daemon: Arc<Daemon>,
    svc: WatcherService,
}

impl Fixture {
    fn new() -> Self {
        Self::with_flags(&[])
    }

    fn with_flags(extra: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let mut args = vec!["sandboxd", "--root-dir", tmp.path().to_str().unwrap()];
        args.extend_from_slice(extra);
        let daemon = Daemon::new(Config::parse_from(args)).unwrap();
        let svc = WatcherService {
            daemon: daemon.clone(),
        };
        Fixture { tmp, daemon, svc }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn mkdir(&self, rel: &str) {
        fs::create_dir_all(self.path(rel)).unwrap();
    }

    async fn watch(&self, path: &str, recursive: bool) -> Result<Events, Status> {
        let req = Request::new(WatchDirRequest {
            path: path.into(),
            recursive,
        });
        Ok(self.svc.watch_dir(req).await?.into_inner())
    }
}

fn kind(ev: &FileEvent) -> EventType {
    EventType::try_from(ev.r#type).unwrap()
}

fn has(events: &[FileEvent], ty: EventType, path: &str) -> bool {
    events.iter().any(|e| kind(e) == ty && e.path == path)
}

fn position(events: &[FileEvent], ty: EventType, path: &str) -> usize {
    events
        .iter()
        .position(|e| kind(e) == ty && e.path == path)
        .unwrap_or_else(|| panic!("no {ty:?} {path} in {}", show(events)))
}

fn show(events: &[FileEvent]) -> String {
    let lines: Vec<String> = events
        .iter()
        .map(|e| format!("  {:?} {} {}", kind(e), e.path, e.message))
        .collect();
    format!("[\n{}\n]", lines.join("\n"))
}

/// Reads batches until `done` holds for everything received so far.
/// Returns the batches; panics (showing what came) after PATIENCE.
async fn batches_until<S>(
    stream: &mut S,
    done: impl Fn(&[FileEvent]) -> bool,
) -> Vec<Vec<FileEvent>>
where
    S: Stream<Item = Result<WatchDirResponse, Status>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut batches: Vec<Vec<FileEvent>> = Vec::new();
    loop {
        let all: Vec<FileEvent> = batches.iter().flatten().cloned().collect();
        if done(&all) {
            return batches;
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(resp))) => {
                assert!(!resp.events.is_empty(), "an empty batch was sent");
                batches.push(resp.events);
            }
            Ok(Some(Err(status))) => panic!("stream failed: {status:?}; got {}", show(&all)),
            Ok(None) => panic!("stream ended early; got {}", show(&all)),
            Err(_) => panic!("timed out; got {}", show(&all)),
        }
    }
}

async fn events_until<S>(stream: &mut S, done: impl Fn(&[FileEvent]) -> bool) -> Vec<FileEvent>
where
    S: Stream<Item = Result<WatchDirResponse, Status>> + Unpin,
{
    batches_until(stream, done).await.concat()
}

/// Reads until the stream ends; the events it sent on the way.
async fn events_until_end<S>(stream: &mut S) -> Vec<FileEvent>
where
    S: Stream<Item = Result<WatchDirResponse, Status>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut all = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(resp))) => all.extend(resp.events),
            Ok(Some(Err(status))) => panic!("stream failed: {status:?}; got {}", show(&all)),
            Ok(None) => return all,
            Err(_) => panic!("stream did not end; got {}", show(&all)),
        }
    }
}

/// A change in the watched directory itself; once its event arrives, every
/// event queued before it has arrived too (one inotify queue, in order).
async fn sentinel<S>(fx_dir: &Path, shown: &str, stream: &mut S) -> Vec<FileEvent>
where
    S: Stream<Item = Result<WatchDirResponse, Status>> + Unpin,
{
    fs::write(fx_dir.join("sentinel"), b"").unwrap();
    let path = format!("{shown}/sentinel");
    events_until(stream, |evs| has(evs, EventType::Create, &path)).await
}

fn error_message<T>(r: Result<T, Status>) -> Status {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(s) => s,
    }
}

// ---- event kinds ----

#[tokio::test]
async fn create_reports_a_root_relative_path_and_timestamp() {
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("w", false).await.unwrap();
    fs::write(fx.path("w/file.txt"), b"hi").unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Create, "/w/file.txt")).await;
    let ev = &evs[position(&evs, EventType::Create, "/w/file.txt")];
    assert!(!ev.is_dir);
    assert!(ev.timestamp_ms > 1_600_000_000_000, "{ev:?}");
}

#[tokio::test]
async fn mkdir_reports_create_with_is_dir() {
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("/w/", false).await.unwrap();
    fs::create_dir(fx.path("w/sub")).unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Create, "/w/sub")).await;
    assert!(evs[position(&evs, EventType::Create, "/w/sub")].is_dir);
}

#[tokio::test]
async fn write_to_an_existing_file_reports_write() {
    let fx = Fixture::new();
    fx.mkdir("w");
    fs::write(fx.path("w/f"), b"old").unwrap();
    let mut s = fx.watch("w", false).await.unwrap();
    fs::write(fx.path("w/f"), b"new").unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Write, "/w/f")).await;
    assert!(!has(&evs, EventType::Create, "/w/f"), "{}", show(&evs));
}

#[tokio::test]
async fn remove_reports_remove() {
    let fx = Fixture::new();
    fx.mkdir("w/d");
    fs::write(fx.path("w/f"), b"x").unwrap();
    let mut s = fx.watch("w", false).await.unwrap();
    fs::remove_file(fx.path("w/f")).unwrap();
    fs::remove_dir(fx.path("w/d")).unwrap();
    let evs = events_until(&mut s, |e| {
        has(e, EventType::Remove, "/w/f") && has(e, EventType::Remove, "/w/d")
    })
    .await;
    assert!(!evs[position(&evs, EventType::Remove, "/w/f")].is_dir);
    assert!(evs[position(&evs, EventType::Remove, "/w/d")].is_dir);
}

#[tokio::test]
async fn rename_reports_the_old_path_then_a_create_of_the_new() {
    let fx = Fixture::new();
    fx.mkdir("w");
    fs::write(fx.path("w/a"), b"x").unwrap();
    let mut s = fx.watch("w", false).await.unwrap();
    fs::rename(fx.path("w/a"), fx.path("w/b")).unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Create, "/w/b")).await;
    let rename = position(&evs, EventType::Rename, "/w/a");
    assert_eq!(evs[rename].old_path, "/w/a");
    assert!(rename < position(&evs, EventType::Create, "/w/b"));
}

#[tokio::test]
async fn rename_out_of_the_tree_reports_only_the_rename() {
    let fx = Fixture::new();
    fx.mkdir("w");
    fs::write(fx.path("w/a"), b"x").unwrap();
    let mut s = fx.watch("w", false).await.unwrap();
    fs::rename(fx.path("w/a"), fx.path("elsewhere")).unwrap();
    let evs = sentinel(&fx.path("w"), "/w", &mut s).await;
    assert!(has(&evs, EventType::Rename, "/w/a"));
    assert!(
        !evs.iter().any(|e| e.path.contains("elsewhere")),
        "{}",
        show(&evs)
    );
}

#[tokio::test]
async fn chmod_reports_chmod() {
    let fx = Fixture::new();
    fx.mkdir("w");
    fs::write(fx.path("w/f"), b"x").unwrap();
    let mut s = fx.watch("w", false).await.unwrap();
    fs::set_permissions(fx.path("w/f"), fs::Permissions::from_mode(0o600)).unwrap();
    events_until(&mut s, |e| has(e, EventType::Chmod, "/w/f")).await;
}

#[tokio::test]
async fn chmod_of_the_watched_directory_itself_reports_chmod() {
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("w", false).await.unwrap();
    fs::set_permissions(fx.path("w"), fs::Permissions::from_mode(0o700)).unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Chmod, "/w")).await;
    assert!(evs[position(&evs, EventType::Chmod, "/w")].is_dir);
}

#[tokio::test]
async fn watching_the_root_reports_paths_with_one_leading_slash() {
    let fx = Fixture::new();
    let mut s = fx.watch("/", false).await.unwrap();
    fs::write(fx.path("top.txt"), b"x").unwrap();
    events_until(&mut s, |e| has(e, EventType::Create, "/top.txt")).await;
}

// ---- recursion ----

#[tokio::test]
async fn non_recursive_ignores_changes_inside_subdirectories() {
    let fx = Fixture::new();
    fx.mkdir("w/sub/deeper");
    let mut s = fx.watch("w", false).await.unwrap();
    fs::write(fx.path("w/sub/f"), b"x").unwrap();
    fs::write(fx.path("w/sub/deeper/g"), b"x").unwrap();
    let evs = sentinel(&fx.path("w"), "/w", &mut s).await;
    assert!(
        !evs.iter().any(|e| e.path.starts_with("/w/sub/")),
        "{}",
        show(&evs)
    );
}

#[tokio::test]
async fn recursive_sees_changes_inside_existing_subdirectories() {
    let fx = Fixture::new();
    fx.mkdir("w/sub/deeper");
    let mut s = fx.watch("w", true).await.unwrap();
    fs::write(fx.path("w/sub/f"), b"x").unwrap();
    fs::write(fx.path("w/sub/deeper/g"), b"x").unwrap();
    fs::remove_file(fx.path("w/sub/f")).unwrap();
    events_until(&mut s, |e| {
        has(e, EventType::Create, "/w/sub/f")
            && has(e, EventType::Create, "/w/sub/deeper/g")
            && has(e, EventType::Write, "/w/sub/deeper/g")
            && has(e, EventType::Remove, "/w/sub/f")
    })
    .await;
}

#[tokio::test]
async fn recursive_watches_directories_created_after_the_watch_started() {
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("w", true).await.unwrap();
    // Created faster than the watcher can add watches: whatever lands before
    // a directory's watch exists must still be reported.
    fs::create_dir_all(fx.path("w/new/a/b")).unwrap();
    fs::write(fx.path("w/new/a/b/early.txt"), b"x").unwrap();
    let evs = events_until(&mut s, |e| {
        has(e, EventType::Create, "/w/new/a/b/early.txt")
    })
    .await;
    for dir in ["/w/new", "/w/new/a", "/w/new/a/b"] {
        assert!(evs[position(&evs, EventType::Create, dir)].is_dir, "{dir}");
    }
    // And once reported, the new directories are watched.
    fs::write(fx.path("w/new/a/b/late.txt"), b"x").unwrap();
    fs::write(fx.path("w/new/late.txt"), b"x").unwrap();
    events_until(&mut s, |e| {
        has(e, EventType::Create, "/w/new/a/b/late.txt")
            && has(e, EventType::Create, "/w/new/late.txt")
    })
    .await;
}

#[tokio::test]
async fn recursive_reports_the_contents_of_a_directory_moved_in() {
    let fx = Fixture::new();
    fx.mkdir("w");
    fx.mkdir("outside/x");
    fs::write(fx.path("outside/x/y.txt"), b"x").unwrap();
    let mut s = fx.watch("w", true).await.unwrap();
    fs::rename(fx.path("outside"), fx.path("w/in")).unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Create, "/w/in/x/y.txt")).await;
    assert!(evs[position(&evs, EventType::Create, "/w/in")].is_dir);
    assert!(evs[position(&evs, EventType::Create, "/w/in/x")].is_dir);
    fs::write(fx.path("w/in/x/z.txt"), b"x").unwrap();
    events_until(&mut s, |e| has(e, EventType::Create, "/w/in/x/z.txt")).await;
}

#[tokio::test]
async fn recursive_follows_a_directory_renamed_inside_the_tree() {
    let fx = Fixture::new();
    fx.mkdir("w/a/inner");
    let mut s = fx.watch("w", true).await.unwrap();
    fs::rename(fx.path("w/a"), fx.path("w/b")).unwrap();
    fs::write(fx.path("w/b/inner/f"), b"x").unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Create, "/w/b/inner/f")).await;
    assert!(has(&evs, EventType::Rename, "/w/a"));
    assert!(has(&evs, EventType::Create, "/w/b"));
    assert!(
        !evs.iter().any(|e| e.path.starts_with("/w/a/")),
        "{}",
        show(&evs)
    );
}

#[tokio::test]
async fn recursive_stops_reporting_a_directory_moved_out() {
    let fx = Fixture::new();
    fx.mkdir("w/a/inner");
    let mut s = fx.watch("w", true).await.unwrap();
    fs::rename(fx.path("w/a"), fx.path("gone")).unwrap();
    fs::write(fx.path("gone/f"), b"x").unwrap();
    fs::write(fx.path("gone/inner/f"), b"x").unwrap();
    let evs = sentinel(&fx.path("w"), "/w", &mut s).await;
    assert!(has(&evs, EventType::Rename, "/w/a"));
    assert!(
        !evs.iter().any(|e| e.path.starts_with("/w/a/")),
        "{}",
        show(&evs)
    );
}

#[tokio::test]
async fn recursive_does_not_follow_symlinks() {
    let fx = Fixture::new();
    fx.mkdir("w");
    fx.mkdir("other");
    symlink("../other", fx.path("w/link")).unwrap();
    let mut s = fx.watch("w", true).await.unwrap();
    fs::write(fx.path("other/f"), b"x").unwrap();
    let evs = sentinel(&fx.path("w"), "/w", &mut s).await;
    assert!(
        !evs.iter().any(|e| e.path.starts_with("/w/link/")),
        "{}",
        show(&evs)
    );
}

// ---- batching ----

#[tokio::test]
async fn many_writes_arrive_in_few_batches_with_repeats_folded() {
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("w", false).await.unwrap();
    let started = Instant::now();
    for i in 0..200 {
        fs::write(fx.path(&format!("w/f{}", i % 20)), format!("{i}")).unwrap();
    }
    let took = started.elapsed();
    let batches = batches_until(&mut s, |e| {
        (0..20).all(|i| has(e, EventType::Write, &format!("/w/f{i}")))
    })
    .await;
    // One window per 250 ms the writes took, plus the one they may straddle.
    let allowed = 2 + (took.as_millis() / 250) as usize;
    assert!(
        batches.len() <= allowed,
        "{} batches for writes that took {took:?}",
        batches.len()
    );
    for batch in &batches {
        for i in 0..20 {
            let path = format!("/w/f{i}");
            let writes = batch
                .iter()
                .filter(|e| kind(e) == EventType::Write && e.path == path)
                .count();
            assert!(writes <= 1, "{writes} WRITEs of {path} in one batch");
        }
    }
}

#[tokio::test]
async fn a_queue_overflow_is_reported_and_the_watch_goes_on_complete() {
    let queue: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if queue > 100_000 {
        eprintln!("skipped: max_queued_events is {queue}, too many files to overflow it");
        return;
    }
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("w", true).await.unwrap();
    // Not reading: the responses back up, the watcher stops reading, and the
    // kernel queue overflows. Empty files make one event each.
    let files = queue + 16_384;
    let w = fx.path("w");
    tokio::task::spawn_blocking(move || {
        for i in 0..files {
            fs::File::create(w.join(i.to_string())).unwrap();
        }
        // Its IN_CREATE is lost to the overflow, yet it must get watched.
        fs::create_dir(w.join("late_dir")).unwrap();
    })
    .await
    .unwrap();
    let evs = events_until(&mut s, |e| {
        e.iter()
            .any(|e| kind(e) == EventType::Error && e.message.contains("overflow"))
    })
    .await;
    assert!(evs.len() < files, "nothing was lost?");
    fs::write(fx.path("w/late_dir/f"), b"x").unwrap();
    events_until(&mut s, |e| has(e, EventType::Create, "/w/late_dir/f")).await;
}

// ---- the watched directory going away ----

#[tokio::test]
async fn removing_the_watched_directory_ends_the_stream_with_an_error() {
    let fx = Fixture::new();
    fx.mkdir("w/sub");
    fs::write(fx.path("w/f"), b"x").unwrap();
    let mut s = fx.watch("w", true).await.unwrap();
    fs::remove_dir_all(fx.path("w")).unwrap();
    let evs = events_until_end(&mut s).await;
    assert!(has(&evs, EventType::Remove, "/w/f"), "{}", show(&evs));
    let last = evs.last().unwrap();
    assert_eq!(kind(last), EventType::Error, "{}", show(&evs));
    assert_eq!(last.path, "/w");
    assert!(last.message.contains("removed"), "{}", last.message);
}

#[tokio::test]
async fn renaming_the_watched_directory_ends_the_stream_with_an_error() {
    let fx = Fixture::new();
    fx.mkdir("w");
    let mut s = fx.watch("w", false).await.unwrap();
    fs::rename(fx.path("w"), fx.path("w2")).unwrap();
    let evs = events_until_end(&mut s).await;
    let last = evs.last().unwrap();
    assert_eq!(kind(last), EventType::Error, "{}", show(&evs));
    assert!(last.message.contains("renamed"), "{}", last.message);
}

// ---- requests that are refused ----

#[tokio::test]
async fn a_path_climbing_out_of_the_root_is_permission_denied() {
    let fx = Fixture::new();
    for path in ["../x", "a/../../x", "/../etc"] {
        let st = error_message(fx.watch(path, false).await);
        assert_eq!(st.code(), Code::PermissionDenied, "{path}: {st:?}");
    }
}

#[tokio::test]
async fn a_symlink_leading_out_of_the_root_is_permission_denied() {
    let fx = Fixture::new();
    symlink("/etc", fx.path("etc")).unwrap();
    symlink("../../..", fx.path("up")).unwrap();
    for path in ["etc", "up", "up/etc"] {
        let st = error_message(fx.watch(path, true).await);
        assert_eq!(st.code(), Code::PermissionDenied, "{path}: {st:?}");
    }
}

#[tokio::test]
async fn a_missing_directory_is_not_found() {
    let fx = Fixture::new();
    let st = error_message(fx.watch("nope", false).await);
    assert_eq!(st.code(), Code::NotFound, "{st:?}");
    let st = error_message(fx.watch("nope/deeper", true).await);
    assert_eq!(st.code(), Code::NotFound, "{st:?}");
}

#[tokio::test]
async fn a_file_is_invalid_argument() {
    let fx = Fixture::new();
    fs::write(fx.path("f"), b"x").unwrap();
    let st = error_message(fx.watch("f", false).await);
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    assert!(st.message().contains("not a directory"), "{st:?}");
}

#[tokio::test]
async fn a_refused_request_holds_no_slot() {
    let fx = Fixture::with_flags(&["--max-watches", "1"]);
    for _ in 0..3 {
        assert!(fx.watch("nope", false).await.is_err());
    }
    let _watch = fx.watch("", false).await.unwrap();
}

// ---- the concurrency cap ----

#[tokio::test]
async fn a_third_watch_over_a_cap_of_two_is_resource_exhausted_until_one_is_dropped() {
    let fx = Fixture::with_flags(&["--max-watches", "2"]);
    fx.mkdir("w");
    let first = fx.watch("w", false).await.unwrap();
    let _second = fx.watch("w", true).await.unwrap();
    assert_eq!(fx.daemon.metrics.active_watches.get(), 2);
    let st = error_message(fx.watch("w", false).await);
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    drop(first);
    assert_eq!(fx.daemon.metrics.active_watches.get(), 1);
    let mut third = fx.watch("w", false).await.unwrap();
    fs::write(fx.path("w/f"), b"x").unwrap();
    events_until(&mut third, |e| has(e, EventType::Create, "/w/f")).await;
}

// ---- over the wire ----

async fn grpc_client(d: &common::Daemon) -> FileWatcherServiceClient<tonic::transport::Channel> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match FileWatcherServiceClient::connect(d.grpc_url()).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("connecting: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot connect to {}: {e}", d.grpc_url()),
        }
    }
}

fn req(path: &str, recursive: bool) -> WatchDirRequest {
    WatchDirRequest {
        path: path.into(),
        recursive,
    }
}

#[tokio::test]
async fn grpc_streams_batches_of_events() {
    let d = common::Daemon::start(&[]);
    fs::create_dir_all(d.root_path().join("w/sub")).unwrap();
    let mut client = grpc_client(&d).await;
    let mut s = client.watch_dir(req("w", true)).await.unwrap().into_inner();
    fs::write(d.root_path().join("w/sub/f.txt"), b"x").unwrap();
    fs::rename(
        d.root_path().join("w/sub/f.txt"),
        d.root_path().join("w/g.txt"),
    )
    .unwrap();
    let evs = events_until(&mut s, |e| has(e, EventType::Create, "/w/g.txt")).await;
    assert!(has(&evs, EventType::Create, "/w/sub/f.txt"));
    assert_eq!(
        evs[position(&evs, EventType::Rename, "/w/sub/f.txt")].old_path,
        "/w/sub/f.txt"
    );
}

#[tokio::test]
async fn grpc_refusals_carry_their_codes() {
    let d = common::Daemon::start(&[]);
    symlink("/etc", d.root_path().join("etc")).unwrap();
    fs::write(d.root_path().join("file"), b"x").unwrap();
    let mut client = grpc_client(&d).await;
    for (path, code) in [
        ("../x", Code::PermissionDenied),
        ("etc", Code::PermissionDenied),
        ("missing", Code::NotFound),
        ("file", Code::InvalidArgument),
    ] {
        let st = error_message(client.watch_dir(req(path, false)).await);
        assert_eq!(st.code(), code, "{path}: {st:?}");
    }
}

#[tokio::test]
async fn grpc_removed_directory_ends_the_stream_with_an_error() {
    let d = common::Daemon::start(&[]);
    fs::create_dir_all(d.root_path().join("w")).unwrap();
    let mut client = grpc_client(&d).await;
    let mut s = client
        .watch_dir(req("w", false))
        .await
        .unwrap()
        .into_inner();
    fs::remove_dir(d.root_path().join("w")).unwrap();
    let evs = events_until_end(&mut s).await;
    let last = evs.last().unwrap();
    assert_eq!(kind(last), EventType::Error, "{}", show(&evs));
    assert!(last.message.contains("removed"), "{}", last.message);
}

#[tokio::test]
async fn grpc_a_third_watch_over_a_cap_of_two_waits_for_a_slot() {
    let d = common::Daemon::start(&["--max-watches", "2"]);
    fs::create_dir_all(d.root_path().join("w")).unwrap();
    let mut client = grpc_client(&d).await;
    let first = client
        .watch_dir(req("w", false))
        .await
        .unwrap()
        .into_inner();
    let _second = client.watch_dir(req("", true)).await.unwrap().into_inner();
    let st = error_message(client.watch_dir(req("w", false)).await);
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    // Cancelling reaches the server as a stream reset, so the slot frees
    // shortly after, not at once.
    drop(first);
    let deadline = Instant::now() + PATIENCE;
    let mut third = loop {
        match client.watch_dir(req("w", false)).await {
            Ok(r) => break r.into_inner(),
            Err(st) if st.code() == Code::ResourceExhausted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(st) => panic!("slot never freed: {st:?}"),
        }
    };
    fs::write(d.root_path().join("w/f"), b"x").unwrap();
    events_until(&mut third, |e| has(e, EventType::Create, "/w/f")).await;
}
