//! One batching window's events, with repeats folded away.
//!
//! Pure data: no I/O, so the coalescing rules are unit-tested here.

use std::{
    collections::HashMap,
    time::{SystemTime, UNIX_EPOCH},
};

use sandhub_api::proto::watcher::v1::{EventType, FileEvent};

/// A window closes early at this many events, so one flood never becomes a
/// message near the 4 MiB a default gRPC client accepts.
pub(crate) const MAX_EVENTS: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct Batch {
    events: Vec<FileEvent>,
    /// Per path, the coalescible kinds already sent since the path last
    /// appeared or went away.
    seen: HashMap<String, Seen>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    create: bool,
    write: bool,
    chmod: bool,
}

impl Batch {
    /// Adds `ev` unless it repeats what this window already says about the
    /// same path: a program writing in 4 KiB chunks makes one WRITE per
    /// window, not one per `write(2)`; the same holds for CHMOD (`touch`
    /// makes several) and for the CREATE a late-watched directory's scan can
    /// repeat. A REMOVE or RENAME ends the path's story, so what follows it
    /// is news again.
    pub(crate) fn push(&mut self, ev: FileEvent) {
        let kind = EventType::try_from(ev.r#type).unwrap_or(EventType::Unspecified);
        match kind {
            EventType::Create | EventType::Write | EventType::Chmod => {
                let seen = self.seen.entry(ev.path.clone()).or_default();
                let flag = match kind {
                    EventType::Create => &mut seen.create,
                    EventType::Write => &mut seen.write,
                    _ => &mut seen.chmod,
                };
                if *flag {
                    return;
                }
                *flag = true;
                if kind == EventType::Create {
                    // A new file at the path: its first write is news.
                    seen.write = false;
                    seen.chmod = false;
                }
            }
            EventType::Remove | EventType::Rename => {
                self.seen.remove(&ev.path);
            }
            EventType::Error | EventType::Unspecified => {}
        }
        self.events.push(ev);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.events.len() >= MAX_EVENTS
    }

    /// Empties the window, returning its events in the order they happened.
    pub(crate) fn take(&mut self) -> Vec<FileEvent> {
        self.seen.clear();
        std::mem::take(&mut self.events)
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn event(kind: EventType, path: String, is_dir: bool) -> FileEvent {
    FileEvent {
        r#type: kind as i32,
        old_path: if kind == EventType::Rename {
            path.clone()
        } else {
            String::new()
        },
        path,
        is_dir,
        message: String::new(),
        timestamp_ms: now_ms(),
    }
}

pub(crate) fn error_event(path: String, message: String) -> FileEvent {
    FileEvent {
        message,
        ..event(EventType::Error, path, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[FileEvent]) -> Vec<(EventType, &str)> {
        events
            .iter()
            .map(|e| (EventType::try_from(e.r#type).unwrap(), e.path.as_str()))
            .collect()
    }

    #[test]
    fn repeated_writes_to_one_path_fold_into_one() {
        let mut b = Batch::default();
        for _ in 0..100 {
            b.push(event(EventType::Write, "/a".into(), false));
            b.push(event(EventType::Write, "/b".into(), false));
        }
        assert_eq!(
            kinds(&b.take()),
            [(EventType::Write, "/a"), (EventType::Write, "/b")]
        );
    }

    #[test]
    fn a_remove_makes_the_next_create_and_write_news_again() {
        let mut b = Batch::default();
        b.push(event(EventType::Create, "/a".into(), false));
        b.push(event(EventType::Write, "/a".into(), false));
        b.push(event(EventType::Create, "/a".into(), false));
        b.push(event(EventType::Remove, "/a".into(), false));
        b.push(event(EventType::Create, "/a".into(), false));
        b.push(event(EventType::Write, "/a".into(), false));
        assert_eq!(
            kinds(&b.take()),
            [
                (EventType::Create, "/a"),
                (EventType::Write, "/a"),
                (EventType::Remove, "/a"),
                (EventType::Create, "/a"),
                (EventType::Write, "/a"),
            ]
        );
    }

    #[test]
    fn renames_and_errors_are_never_folded() {
        let mut b = Batch::default();
        b.push(event(EventType::Rename, "/a".into(), false));
        b.push(event(EventType::Rename, "/a".into(), false));
        b.push(error_event("/".into(), "x".into()));
        b.push(error_event("/".into(), "x".into()));
        let got = b.take();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].old_path, "/a");
    }

    #[test]
    fn take_starts_a_fresh_window() {
        let mut b = Batch::default();
        b.push(event(EventType::Write, "/a".into(), false));
        assert_eq!(b.take().len(), 1);
        assert!(b.is_empty());
        b.push(event(EventType::Write, "/a".into(), false));
        assert_eq!(b.take().len(), 1);
    }
}
