//! Where one webhook's deliveries stand on Kubernetes, as pure data: its
//! cursor (the highest event id settled: delivered, given up, or not of a
//! type it takes), the retry of the event at its head, and its last
//! attempts. The holder of the Lease keeps this in the webhook's state
//! ConfigMap, so the next holder resumes from the cursor.
//!
//! Deliveries go in id order, one at a time per webhook: the event at the
//! head is retried (with the shared backoff) until it is delivered or
//! given up, and the ones behind it wait. That keeps the state one number
//! and one retry, whatever the backlog.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{
    events::Event,
    webhooks::{Attempt, Verdict, KEPT_ATTEMPTS},
};

/// The retry of the event at the head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub event_id: u64,
    /// Attempts made so far.
    pub attempts: u32,
    /// Unix ms.
    pub next_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The registration this is for (`record::Registration::uid`).
    pub uid: String,
    pub cursor: u64,
    #[serde(default)]
    pub retry: Option<Retry>,
    /// Newest first, at most [`KEPT_ATTEMPTS`].
    #[serde(default)]
    pub attempts: VecDeque<Attempt>,
    /// Changed since it was last written.
    #[serde(skip)]
    pub dirty: bool,
}

/// What to do next.
#[derive(Debug, PartialEq)]
pub enum Next<'a> {
    /// Send this event; this is attempt number `.1`.
    Deliver(&'a Event, u32),
    /// The head event waits for its retry, at this Unix ms.
    WaitUntil(i64),
    /// Nothing to send among the events given.
    Idle,
}

impl Progress {
    /// Where a webhook with no delivery yet starts: after `after`.
    pub fn fresh(uid: &str, after: u64) -> Progress {
        Progress {
            uid: uid.to_string(),
            cursor: after,
            retry: None,
            attempts: VecDeque::new(),
            dirty: true,
        }
    }

    /// The stored progress if it is registration `uid`'s, else a fresh one.
    pub fn resume(stored: Option<Progress>, uid: &str, after: u64) -> Progress {
        match stored {
            Some(mut p) if p.uid == uid => {
                p.attempts.truncate(KEPT_ATTEMPTS as usize);
                p.dirty = false;
                p
            }
            _ => Progress::fresh(uid, after),
        }
    }

    /// The next step over `events` (the tenant's events above the cursor,
    /// in id order): the ones `takes` refuses are passed (the cursor moves
    /// over them); the first it takes is sent, or waits for its retry.
    pub fn next<'a>(
        &mut self,
        events: &'a [Event],
        takes: impl Fn(&Event) -> bool,
        now: i64,
    ) -> Next<'a> {
        let from = self.cursor;
        for e in events.iter().filter(|e| e.id > from) {
            if !takes(e) {
                self.cursor = e.id;
                self.dirty = true;
                continue;
            }
            return match &self.retry {
                Some(r) if r.event_id == e.id && r.next_at > now => Next::WaitUntil(r.next_at),
                Some(r) if r.event_id == e.id => Next::Deliver(e, r.attempts.saturating_add(1)),
                // A retry of an event no longer at the head (gone from the
                // ring): this one starts afresh.
                _ => Next::Deliver(e, 1),
            };
        }
        Next::Idle
    }

    /// Records `attempt` of event `event_id` and its verdict: a settled
    /// event moves the cursor past it, a failed one is retried.
    pub fn settle(&mut self, event_id: u64, attempt: Attempt, verdict: Verdict) {
        let n = attempt.attempt;
        self.attempts.push_front(attempt);
        self.attempts.truncate(KEPT_ATTEMPTS as usize);
        self.dirty = true;
        match verdict {
            Verdict::RetryAt(at) => {
                self.retry = Some(Retry {
                    event_id,
                    attempts: n,
                    next_at: at,
                })
            }
            Verdict::Delivered | Verdict::GaveUp => {
                self.retry = None;
                self.cursor = self.cursor.max(event_id);
            }
        }
    }

    /// How many of `events` (above the cursor) `takes` would send.
    pub fn pending(&self, events: &[Event], takes: impl Fn(&Event) -> bool) -> u64 {
        events
            .iter()
            .filter(|e| e.id > self.cursor && takes(e))
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventType, NewEvent};

    fn ev(id: u64, kind: EventType) -> Event {
        Event::stored(id, NewEvent::pool("k", kind, None))
    }

    fn attempt(id: u64, n: u32, status: u16) -> Attempt {
        Attempt {
            event_id: id,
            attempt: n,
            time: String::new(),
            status: Some(status),
            error: None,
            duration_ms: 1,
        }
    }

    #[test]
    fn the_cursor_passes_other_types_and_moves_only_past_settled_events() {
        let events = [
            ev(10, EventType::Created),
            ev(20, EventType::Deleted),
            ev(30, EventType::Deleted),
        ];
        let deletes = |e: &Event| e.kind == EventType::Deleted;
        let mut p = Progress::fresh("u", 5);
        let Next::Deliver(e, 1) = p.next(&events, deletes, 0) else {
            panic!("the first deleted is due")
        };
        assert_eq!((e.id, p.cursor), (20, 10), "`created` is passed");
        // A failure: retried, the cursor stays, the next waits behind it.
        p.settle(20, attempt(20, 1, 500), Verdict::RetryAt(1000));
        assert_eq!(p.cursor, 10);
        assert_eq!(p.next(&events, deletes, 999), Next::WaitUntil(1000));
        let Next::Deliver(e, 2) = p.next(&events, deletes, 1000) else {
            panic!("the retry is due")
        };
        assert_eq!(e.id, 20);
        p.settle(20, attempt(20, 2, 200), Verdict::Delivered);
        assert_eq!((p.cursor, p.retry.clone()), (20, None));
        let Next::Deliver(e, 1) = p.next(&events, deletes, 1000) else {
            panic!("then the next")
        };
        assert_eq!(e.id, 30);
        // Given up: settled too.
        p.settle(30, attempt(30, 1, 500), Verdict::GaveUp);
        assert_eq!(p.cursor, 30);
        assert_eq!(p.next(&events, deletes, 1000), Next::Idle);
        assert_eq!(
            p.attempts.iter().map(|a| a.event_id).collect::<Vec<_>>(),
            [30, 20, 20],
            "newest first"
        );
        // Nothing at or below the cursor is ever sent again.
        assert_eq!(p.pending(&events, |_| true), 0);
    }

    #[test]
    fn resuming_keeps_a_registrations_own_progress_only_and_attempts_are_bounded() {
        let mut p = Progress::fresh("u1", 7);
        for i in 0..(KEPT_ATTEMPTS as u64 + 20) {
            p.settle(100 + i, attempt(100 + i, 1, 200), Verdict::Delivered);
        }
        assert_eq!(p.attempts.len(), KEPT_ATTEMPTS as usize);
        assert_eq!(p.attempts[0].event_id, 100 + KEPT_ATTEMPTS as u64 + 19);
        let stored: Progress = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        let back = Progress::resume(Some(stored.clone()), "u1", 7);
        assert_eq!((back.cursor, back.dirty), (p.cursor, false));
        // The same name made again is another webhook: it starts at its own `after`.
        let other = Progress::resume(Some(stored), "u2", 900);
        assert_eq!((other.cursor, other.attempts.len()), (900, 0));
        assert_eq!(Progress::resume(None, "u3", 4).cursor, 4);
    }

    #[test]
    fn a_retry_whose_event_left_the_ring_does_not_stick() {
        let mut p = Progress::fresh("u", 0);
        p.settle(40, attempt(40, 3, 500), Verdict::RetryAt(i64::MAX));
        let events = [ev(50, EventType::Ready)];
        assert!(matches!(p.next(&events, |_| true, 0), Next::Deliver(e, 1) if e.id == 50));
    }
}
