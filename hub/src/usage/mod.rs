//! Per-sandbox resource usage (issue #30 §1), the part both backends
//! share: the bounded ring of compact samples each sandbox keeps (it is
//! sandboxd's [`sandboxd::usage::Ring`]: sandboxd keeps one of its own on
//! Kubernetes), the alerts a sampler raises when a sandbox's OOM kills rise
//! or its disk reaches its quota, and the checks of
//! `GET /v1/sandboxes/{id}/metrics`. The local backend's sampler is
//! `crate::local::sampler`; the kubernetes backend reads sandboxd's ring
//! (`crate::kube::usage`).

pub use sandboxd::usage::{fold, Point, Ring, COARSE, FINE, FOLD};
use sandhub_api::usage::{SandboxUsage, UsageLimits};

/// What a sampler knows of one sandbox besides its ring.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latest {
    pub point: Point,
    pub memory_peak_bytes: u64,
    pub oom_kills: u64,
    pub limits: UsageLimits,
}

impl Latest {
    pub fn to_api(&self) -> SandboxUsage {
        SandboxUsage {
            latest: self.point.to_api(),
            memory_peak_bytes: self.memory_peak_bytes,
            oom_kills: self.oom_kills,
            limits: self.limits.clone(),
        }
    }
}

/// What a sampler saw change, for the event log (issue #30 §2:
/// `oom_killed`, `disk_quota_exceeded`). Raised once per rise: an OOM
/// alert each time the kill count goes up, a disk alert when use reaches
/// the quota (again only after it fell below it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageAlert {
    OomKilled {
        sandbox: String,
        /// Kills since the sandbox started (the kernel's count).
        oom_kills: u64,
        /// How many of them are new since the last sample.
        new_kills: u64,
    },
    DiskQuotaReached {
        sandbox: String,
        used_bytes: u64,
        limit_bytes: u64,
    },
}

/// Disk use within this much of the quota counts as reached: btrfs
/// refuses a write that would pass the limit, so use stops just short of
/// it (by less than one extent).
pub const DISK_FULL_SLACK: u64 = 1 << 20;

/// Whether `used` has reached `limit` (see [`DISK_FULL_SLACK`]).
pub fn disk_full(used: u64, limit: u64) -> bool {
    used.saturating_add(DISK_FULL_SLACK.min(limit / 16)) >= limit
}

/// `GET .../metrics?since=&step=` as given (strings), checked: `since` is
/// Unix seconds or RFC 3339, `step` seconds in 1..=3600. The error names
/// the field.
pub fn parse_query(
    since: Option<&str>,
    step: Option<&str>,
) -> Result<sandhub_api::usage::MetricsQuery, String> {
    let since = match since.map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(s) if s.bytes().all(|b| b.is_ascii_digit()) => Some(
            s.parse::<u64>()
                .map_err(|_| format!("since: {s:?} is out of range"))?,
        ),
        Some(s) => Some(
            humantime::parse_rfc3339_weak(s)
                .map_err(|_| format!("since: {s:?} is neither Unix seconds nor an RFC 3339 time"))?
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        ),
    };
    let step = match step.map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(check_step(Some(s.parse::<u64>().map_err(|_| {
            format!("step: {s:?} is not a whole number of seconds")
        })?))?),
    };
    Ok(sandhub_api::usage::MetricsQuery { since, step })
}

/// Validates `GET .../metrics` parameters: the step in seconds.
pub fn check_step(step: Option<u64>) -> Result<u64, String> {
    match step {
        None => Ok(1),
        Some(s) if (1..=sandhub_api::usage::MAX_STEP_SECONDS).contains(&s) => Ok(s),
        Some(s) => Err(format!(
            "step: {s} is out of range; seconds per point, 1 to {}",
            sandhub_api::usage::MAX_STEP_SECONDS
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_name_the_bad_field() {
        let q = parse_query(Some("1700000000"), Some("10")).unwrap();
        assert_eq!((q.since, q.step), (Some(1_700_000_000), Some(10)));
        let q = parse_query(Some("2026-01-01T00:00:00Z"), None).unwrap();
        assert_eq!(q.since, Some(1_767_225_600));
        assert!(parse_query(Some("yesterday"), None)
            .unwrap_err()
            .starts_with("since:"));
        assert!(parse_query(None, Some("1.5"))
            .unwrap_err()
            .starts_with("step:"));
        assert!(parse_query(None, Some("0"))
            .unwrap_err()
            .starts_with("step:"));
        assert_eq!(parse_query(None, None).unwrap().since, None);
    }

    #[test]
    fn steps_are_checked() {
        assert_eq!(check_step(None), Ok(1));
        assert!(check_step(Some(0)).unwrap_err().starts_with("step"));
        assert!(check_step(Some(3601)).is_err());
    }

    #[test]
    fn disk_is_full_just_short_of_the_quota() {
        assert!(disk_full(100 << 20, 100 << 20));
        assert!(disk_full((100 << 20) - 4096, 100 << 20));
        assert!(!disk_full(50 << 20, 100 << 20));
    }
}
