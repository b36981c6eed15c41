//! Running wrk and reading its report.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{bail, Context};

#[derive(Debug, Clone, Copy)]
pub struct WrkResult {
    pub requests_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub errors: u64,
}

pub struct Load<'a> {
    pub wrk: &'a Path,
    pub threads: u32,
    pub connections: u32,
    pub duration: Duration,
    pub headers: &'a [String],
}

impl Load<'_> {
    pub fn command_line(&self, url: &str) -> String {
        let mut s = format!(
            "wrk -t{} -c{} -d{}s --latency",
            self.threads,
            self.connections,
            self.duration.as_secs()
        );
        for h in self.headers {
            s += &format!(" -H '{h}'");
        }
        s + " " + url
    }

    pub fn run(&self, url: &str) -> anyhow::Result<WrkResult> {
        self.run_as(Command::new(self.wrk), url)
    }

    /// The same load from the network namespace of process `pid`
    /// (`nsenter --net`, as `ip netns exec` would; host cgroup and mounts).
    pub fn run_in_netns(&self, pid: u32, url: &str) -> anyhow::Result<WrkResult> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/proc/{pid}/ns/net")).arg(self.wrk);
        self.run_as(cmd, url)
    }

    /// Runs `cmd` (wrk, or what starts it) with this load's arguments.
    fn run_as(&self, mut cmd: Command, url: &str) -> anyhow::Result<WrkResult> {
        cmd.arg(format!("-t{}", self.threads))
            .arg(format!("-c{}", self.connections))
            .arg(format!("-d{}s", self.duration.as_secs()))
            .arg("--latency");
        for h in self.headers {
            cmd.arg("-H").arg(h);
        }
        let out = cmd.arg(url).output().context("running wrk")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "wrk failed: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        parse(&text).with_context(|| format!("unexpected wrk output:\n{text}"))
    }
}

/// "1.23ms", "850.00us", "2.01s" → microseconds.
fn duration_us(s: &str) -> Option<f64> {
    let (num, mult) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    Some(num.parse::<f64>().ok()? * mult)
}

pub fn parse(text: &str) -> Option<WrkResult> {
    let mut rps = None;
    let (mut p50, mut p99) = (None, None);
    let mut errors = 0;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => rps = v.parse().ok(),
            ["50%", v] => p50 = duration_us(v),
            ["99%", v] => p99 = duration_us(v),
            ["Non-2xx", "or", "3xx", "responses:", n] => errors += n.parse::<u64>().unwrap_or(0),
            ["Socket", "errors:", rest @ ..] => {
                errors += rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    Some(WrkResult {
        requests_per_sec: rps?,
        p50_us: p50?,
        p99_us: p99?,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk_latency_report() {
        let text = "Running 5s test @ http://127.0.0.1:1/\n  2 threads and 50 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency     1.10ms  300.00us   9.00ms   90.00%\n  Latency Distribution\n     50%  850.00us\n     75%    1.20ms\n     90%    1.50ms\n     99%    2.01ms\n  100000 requests in 5.00s, 10.00MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\nRequests/sec:  20000.50\nTransfer/sec:      2.00MB\n";
        let r = parse(text).unwrap();
        assert_eq!(r.requests_per_sec, 20000.5);
        assert_eq!(r.p50_us, 850.0);
        // 2.01 ms in microseconds is not exact in binary floating point.
        assert!((r.p99_us - 2010.0).abs() < 1e-6, "{}", r.p99_us);
        assert_eq!(r.errors, 3);
    }
}
