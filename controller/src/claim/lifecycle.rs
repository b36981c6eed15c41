//! Claim expiry: `min(shutdownTime, Finished.lastTransitionTime + ttlSecondsAfterFinished)`.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// When the claim expires, if ever. The TTL timer starts at the mirrored
/// Finished condition's transition, and only once Finished is True.
pub fn expiry(
    shutdown_time: Option<Timestamp>,
    finished_at: Option<Timestamp>,
    ttl_seconds_after_finished: Option<i32>,
) -> Option<Timestamp> {
    let ttl_end = match (finished_at, ttl_seconds_after_finished) {
        (Some(f), Some(ttl)) => Some(
            f.saturating_add(SignedDuration::from_secs(i64::from(ttl.max(0))))
                .ok()?,
        ),
        _ => None,
    };
    match (shutdown_time, ttl_end) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How long until `expiry` (None: never; zero: already expired).
pub fn remaining(expiry: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    let e = expiry?;
    Some(now.duration_until(e).try_into().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn no_shutdown_and_no_finish_never_expires() {
        assert_eq!(expiry(None, None, Some(0)), None);
        assert_eq!(expiry(None, Some(ts(0)), None), None);
        assert_eq!(remaining(None, ts(0)), None);
    }

    #[test]
    fn the_earlier_of_shutdown_and_ttl_wins() {
        assert_eq!(expiry(Some(ts(100)), None, Some(10)), Some(ts(100)));
        assert_eq!(expiry(Some(ts(100)), Some(ts(50)), Some(10)), Some(ts(60)));
        assert_eq!(expiry(Some(ts(55)), Some(ts(50)), Some(10)), Some(ts(55)));
        assert_eq!(expiry(None, Some(ts(50)), Some(0)), Some(ts(50)));
    }

    #[test]
    fn remaining_time_is_clamped_at_zero() {
        assert_eq!(remaining(Some(ts(10)), ts(4)), Some(Duration::from_secs(6)));
        assert_eq!(remaining(Some(ts(10)), ts(40)), Some(Duration::ZERO));
    }
}
