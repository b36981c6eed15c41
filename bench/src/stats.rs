//! Summaries of latency samples and of repeated throughput runs.

use std::time::Duration;

/// Latency summary of one series of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
    pub max: Duration,
}

/// Summarises `samples` (sorted in place). Panics on an empty slice: a
/// benchmark that measured nothing has a bug, not a result.
pub fn summarize(samples: &mut [Duration]) -> Summary {
    assert!(!samples.is_empty(), "no samples to summarise");
    samples.sort_unstable();
    let total: Duration = samples.iter().sum();
    Summary {
        n: samples.len(),
        p50: percentile(samples, 50.0),
        p99: percentile(samples, 99.0),
        mean: total / samples.len() as u32,
        max: samples[samples.len() - 1],
    }
}

/// Nearest-rank percentile of sorted samples: always a value that was
/// actually observed, never an interpolation between two.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of a few repeated measurements (mean of the middle two when even).
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "no values for a median");
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_micros(x)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = us(&(1..=100).rev().collect::<Vec<_>>());
        let sum = summarize(&mut s);
        assert_eq!(sum.n, 100);
        assert_eq!(sum.p50, Duration::from_micros(50));
        assert_eq!(sum.p99, Duration::from_micros(99));
        assert_eq!(sum.max, Duration::from_micros(100));
        assert_eq!(sum.mean, Duration::from_nanos(50_500));
    }

    #[test]
    fn single_sample_is_every_percentile() {
        let sum = summarize(&mut us(&[7]));
        assert_eq!(
            (sum.p50, sum.p99, sum.max),
            (us(&[7])[0], us(&[7])[0], us(&[7])[0])
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[5.0]), 5.0);
    }
}
