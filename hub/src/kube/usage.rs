//! A Kubernetes sandbox's usage (issue #30 §1): the hub cannot read a
//! Pod's cgroup, so sandboxd keeps a ring of its own container's and
//! answers it on `GET /v1/_sandhub/usage` ([`sandboxd::usage`]). That
//! answer comes from inside the sandbox: a workload that replaced sandboxd
//! can say anything. So the read is bounded (body size, time), every value
//! is clamped (times near now and increasing, at most [`FINE`] + [`COARSE`]
//! points, CPU within the span and the template's cores, memory and pids
//! within the template's limits), and the limits shown are the template's,
//! never the report's. The numbers are only ever shown to the sandbox's
//! owner: a lie harms no one else.

use std::time::Duration;

use sandboxd::usage::{UsageReport, USAGE_ROUTE};
use sandhub_api::usage::{SandboxUsage, UsageLimits};
use sandhub_client::sandboxd::SandboxdClient;

use crate::usage::{Latest, Point, COARSE, FINE, FOLD};

/// (900 + 360) points of five numbers are ~40 KiB of JSON; room to spare.
const MAX_REPORT_BYTES: usize = 256 << 10;
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// Points this far in the future (clock skew) or the past are dropped.
const FUTURE_SLACK_S: u64 = 60;
const PAST_S: u64 = 2 * 3600;
/// Cores assumed where the template sets no `cpu` (a clamp, not a claim).
const MAX_CORES: u64 = 1024;
/// Most OOM kills believed.
const MAX_OOM_KILLS: u64 = 1 << 32;

/// sandboxd's report, or None when it has none or does not answer sanely
/// in time.
pub async fn ask(client: &SandboxdClient) -> Option<UsageReport> {
    client
        .get_json_bounded::<Option<UsageReport>>(USAGE_ROUTE, MAX_REPORT_BYTES, ASK_TIMEOUT)
        .await
        .flatten()
}

/// sandboxd's counters alone (no points: `since` is past any), or None
/// as [`ask`]. The OOM watch asks this of every Ready sandbox each 5 s
/// (kube/oom.rs), so it must stay small.
pub async fn ask_counters(client: &SandboxdClient) -> Option<UsageReport> {
    const NO_POINTS: u64 = u64::MAX;
    client
        .get_json_bounded::<Option<UsageReport>>(
            &format!("{USAGE_ROUTE}?since={NO_POINTS}"),
            4096,
            ASK_TIMEOUT,
        )
        .await
        .flatten()
}

/// The report's points, clamped, oldest first.
pub fn points(report: &UsageReport, limits: &UsageLimits, now_s: u64) -> Vec<Point> {
    let cores = limits
        .cpu
        .map_or(MAX_CORES, |c| (c.ceil() as u64).clamp(1, MAX_CORES));
    let mem_max = limits
        .memory_mb
        .map_or(u64::MAX, |m| m.saturating_mul(1 << 20));
    let pids_max = limits.pids.unwrap_or(u64::MAX);
    let keep = FINE + COARSE + 1;
    let skip = report.points.len().saturating_sub(keep);
    let mut out: Vec<Point> = Vec::with_capacity(report.points.len().min(keep));
    for &[t, span, cpu_us, mem_kib, pids] in &report.points[skip..] {
        if t > now_s + FUTURE_SLACK_S || t + PAST_S < now_s {
            continue;
        }
        if out.last().is_some_and(|p| u64::from(p.t) >= t) {
            continue;
        }
        let span = span.clamp(1, u64::from(FOLD));
        out.push(Point::new(
            t,
            span,
            cpu_us.min(span * cores * 1_000_000),
            mem_kib.saturating_mul(1024).min(mem_max),
            pids.min(pids_max),
            None,
            None,
        ));
    }
    out
}

/// The latest sample of the report, against the template's `limits`.
pub fn latest(report: &UsageReport, limits: &UsageLimits, now_s: u64) -> Option<SandboxUsage> {
    let point = *points(report, limits, now_s).last()?;
    let mem_max = limits
        .memory_mb
        .map_or(u64::MAX, |m| m.saturating_mul(1 << 20));
    Some(
        Latest {
            point,
            memory_peak_bytes: report
                .memory_peak_bytes
                .min(mem_max)
                .max(point.memory_bytes()),
            oom_kills: report.oom_kills.min(MAX_OOM_KILLS),
            limits: limits.clone(),
        }
        .to_api(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> UsageLimits {
        UsageLimits {
            memory_mb: Some(64),
            cpu: Some(0.5),
            pids: Some(100),
            disk_mb: None,
        }
    }

    #[test]
    fn a_lying_report_is_clamped() {
        let now = 1_800_000_000;
        let report = UsageReport {
            memory_limit_bytes: Some(u64::MAX),
            cpu_limit: Some(1e9),
            pids_limit: None,
            memory_peak_bytes: u64::MAX,
            oom_kills: u64::MAX,
            points: vec![
                [now - 3, 1, 500_000, 1024, 3],
                [now - 3, 1, 0, 0, 0], // not increasing: dropped
                [now - 2, 999, u64::MAX, u64::MAX, u64::MAX],
                [now + 3600, 1, 0, 0, 0], // the future: dropped
                [1, 1, 0, 0, 0],          // long ago: dropped
            ],
        };
        let p = points(&report, &limits(), now);
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].span, 10);
        assert!(p[1].cpu_cores() <= 1.0, "one core at most (ceil of 0.5)");
        assert_eq!(p[1].memory_bytes(), 64 << 20);
        assert_eq!(p[1].pids, 100);
        let u = latest(&report, &limits(), now).unwrap();
        assert_eq!(
            u.limits,
            limits(),
            "the template's limits, not the report's"
        );
        assert_eq!(u.memory_peak_bytes, 64 << 20);
        assert_eq!(u.oom_kills, MAX_OOM_KILLS);
    }

    #[test]
    fn at_most_a_rings_worth_of_points() {
        let now = 1_800_000_000;
        let report = UsageReport {
            points: (0..5000).map(|i| [now - 5000 + i, 1, 0, 1, 1]).collect(),
            ..Default::default()
        };
        let p = points(&report, &UsageLimits::default(), now);
        assert_eq!(p.len(), FINE + COARSE + 1);
        assert_eq!(u64::from(p.last().unwrap().t), now - 1);
    }
}
