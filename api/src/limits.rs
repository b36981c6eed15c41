//! Bounds on what a client may ask for, checked the same way by every front
//! door (REST, Gym, MCP) and every backend.
//!
//! Durations come off the wire as `f64` seconds or `u64` seconds; added to
//! a clock they can overflow it (`1e19` seconds is past any `Instant`), so
//! each one is range-checked here before anything turns it into a
//! deadline, and refused with the range it must lie in.

use std::time::Duration;

use crate::error::{Code, ErrorBody};

/// Shortest command timeout (`timeout_seconds`, `step_timeout_seconds`, a
/// verify command's `timeout_seconds`): a millisecond, below which no
/// process can even start.
pub const MIN_TIMEOUT_SECONDS: f64 = 0.001;
/// Longest command timeout: a day. Longer work belongs in a started
/// process, which has no timeout at all.
pub const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

/// Shortest sandbox lifetime (`shutdown_after_seconds`, `idle_timeout_seconds`).
pub const MIN_LIFETIME_SECONDS: u64 = 1;
/// Longest sandbox lifetime: a year.
pub const MAX_LIFETIME_SECONDS: u64 = 365 * 24 * 3600;

/// The hub's default cap on one file upload (`sandhub serve --max-upload-bytes`): 1 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1 << 30;

fn invalid(message: String) -> ErrorBody {
    ErrorBody::new(Code::InvalidArgument, message)
}

/// `seconds` as a [`Duration`] if it lies in `min..=max`; else
/// `INVALID_ARGUMENT` naming `name` and the range. NaN and infinities are
/// never in range.
pub fn seconds_in(name: &str, seconds: f64, min: f64, max: f64) -> Result<Duration, ErrorBody> {
    // `contains` is false for NaN, so NaN needs no case of its own.
    if !(min..=max).contains(&seconds) {
        return Err(invalid(format!(
            "{name} must be between {min} and {max} seconds, not {seconds}"
        )));
    }
    // Cannot fail in range; a second guard costs nothing.
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid(format!("{name} must be between {min} and {max} seconds")))
}

/// A command timeout: [`MIN_TIMEOUT_SECONDS`] to [`MAX_TIMEOUT_SECONDS`].
pub fn timeout(name: &str, seconds: f64) -> Result<Duration, ErrorBody> {
    seconds_in(name, seconds, MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS)
}

/// A sandbox lifetime: [`MIN_LIFETIME_SECONDS`] to [`MAX_LIFETIME_SECONDS`].
pub fn lifetime(name: &str, seconds: u64) -> Result<Duration, ErrorBody> {
    if !(MIN_LIFETIME_SECONDS..=MAX_LIFETIME_SECONDS).contains(&seconds) {
        return Err(invalid(format!(
            "{name} must be between {MIN_LIFETIME_SECONDS} and {MAX_LIFETIME_SECONDS} seconds, \
             not {seconds}"
        )));
    }
    Ok(Duration::from_secs(seconds))
}

/// An optional timeout: checked when present.
pub fn optional_timeout(name: &str, seconds: Option<f64>) -> Result<(), ErrorBody> {
    seconds.map_or(Ok(()), |s| timeout(name, s).map(drop))
}

/// An optional lifetime: checked when present.
pub fn optional_lifetime(name: &str, seconds: Option<u64>) -> Result<(), ErrorBody> {
    seconds.map_or(Ok(()), |s| lifetime(name, s).map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_in_range_pass_and_the_rest_name_the_range() {
        assert_eq!(timeout("t", 0.5).unwrap(), Duration::from_millis(500));
        assert_eq!(timeout("t", 86_400.0).unwrap(), Duration::from_secs(86_400));
        assert!(timeout("t", 0.001).is_ok());
        for bad in [
            0.0,
            -1.0,
            0.0009,
            86_400.1,
            1e19,
            u64::MAX as f64,
            f64::MAX,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let e = timeout("timeout_seconds", bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad}");
            assert!(
                e.message
                    .starts_with("timeout_seconds must be between 0.001 and 86400 seconds"),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn lifetimes_in_range_pass() {
        assert_eq!(lifetime("l", 1).unwrap(), Duration::from_secs(1));
        assert!(lifetime("l", MAX_LIFETIME_SECONDS).is_ok());
        for bad in [0, MAX_LIFETIME_SECONDS + 1, u64::MAX] {
            let e = lifetime("shutdown_after_seconds", bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument);
            assert!(
                e.message.contains("between 1 and 31536000"),
                "{}",
                e.message
            );
        }
        assert!(optional_lifetime("l", None).is_ok());
        assert!(optional_timeout("t", Some(f64::NAN)).is_err());
    }
}
