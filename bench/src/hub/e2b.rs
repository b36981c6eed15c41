//! E2B's `commands.run("true")` through Sandhub's E2B-compatible API (the
//! real `e2b` SDK, pointed at the hub) next to the same call through the
//! `sandhub` Python SDK, on one sandbox each of the same hub, interleaved
//! in one interpreter: what E2B's protocol costs over Sandhub's own.
//!
//! E2B's SDK never runs the command alone: it asks for
//! `/bin/bash -l -c "true"`, a login shell, whose `/etc/profile` forks
//! `id -u` on Debian. So the `sandhub` SDK also runs that very argv: the
//! protocol's own cost is the ratio to that, and the ratio to `run("true")`
//! is what a user moving from one SDK to the other sees.

use std::{path::Path, process::Command as Process, time::Duration};

use anyhow::{ensure, Context};

use super::rest::Series;

/// Prints three lines of durations in seconds (e2b, sandhub `true`, sandhub
/// running E2B's login-shell argv), space separated (argv: hub url, n,
/// warmup).
const SCRIPT: &str = r#"
import sys, time, e2b, sandhub
url, n, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = dict(api_key="bench", api_url=url, sandbox_url=url)
e = e2b.Sandbox.create(template="base", timeout=600, **conn)
hub = sandhub.Hub(url)
s = hub.create()
login = ["/bin/bash", "-l", "-c", "true"]
try:
    for _ in range(warmup):
        e.commands.run("true")
        s.commands.run(["true"])
        s.commands.run(login)
    te, ts, tl = [], [], []
    for _ in range(n):
        t = time.perf_counter(); r = e.commands.run("true"); te.append(time.perf_counter() - t)
        assert r.exit_code == 0, r
        t = time.perf_counter(); r = s.commands.run(["true"]); ts.append(time.perf_counter() - t)
        assert r.exit_code == 0, r
        t = time.perf_counter(); r = s.commands.run(login); tl.append(time.perf_counter() - t)
        assert r.exit_code == 0, r
    for series in (te, ts, tl):
        print(" ".join(repr(x) for x in series))
finally:
    e.kill()
    s.delete()
"#;

/// `(e2b, sandhub SDK, sandhub SDK running E2B's argv)` series of `n`
/// timed runs each.
pub fn commands_run(
    python: &Path,
    url: &str,
    n: u32,
    warmup: u32,
) -> anyhow::Result<(Series, Series, Series)> {
    let mut s = series(python, SCRIPT, url, n, warmup, 3)?.into_iter();
    let mut next = || s.next().context("three series");
    Ok((next()?, next()?, next()?))
}

/// Runs a Python `script` (argv: hub url, n, warmup) that prints two lines
/// of durations in seconds, space separated: two series.
pub fn two_series(
    python: &Path,
    script: &str,
    url: &str,
    n: u32,
    warmup: u32,
) -> anyhow::Result<(Series, Series)> {
    let mut s = series(python, script, url, n, warmup, 2)?.into_iter();
    let mut next = || s.next().context("two series");
    Ok((next()?, next()?))
}

/// Runs a Python `script` (argv: hub url, n, warmup) that prints `count`
/// lines of durations in seconds, space separated: `count` series.
fn series(
    python: &Path,
    script: &str,
    url: &str,
    n: u32,
    warmup: u32,
    count: usize,
) -> anyhow::Result<Vec<Series>> {
    let out = Process::new(python)
        .args(["-c", script, url, &n.to_string(), &warmup.to_string()])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "the e2b series failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let mut series = || -> anyhow::Result<Series> {
        let line = lines
            .next()
            .context("the e2b script printed too few lines")?;
        let samples = line
            .split_whitespace()
            .map(|s| s.parse::<f64>().map(Duration::from_secs_f64))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Series {
            samples,
            stopped_early: false,
        })
    };
    (0..count).map(|_| series()).collect()
}
