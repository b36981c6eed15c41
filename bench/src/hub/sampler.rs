//! Phase `sampler` (issue #30 §1): what the hub's usage sampler costs.
//! The hub reads every sandbox's cgroup (and disk quota) once a second on
//! one thread, `sandhub-sampler`; this phase starts `--sampler-sandboxes`
//! idle sandboxes (as many as the machine holds before the phase
//! deadline), then reads that thread's CPU time from
//! `/proc/<hub>/task/<tid>/stat` over a window and reports it as a share
//! of one core. Target: at most 1% at 500 sandboxes.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{args::Args, server::Hub};
use crate::report::{Report, Row, Unit, Value};

/// The window the thread's CPU time is measured over.
const WINDOW: Duration = Duration::from_secs(30);
/// At most 1% of one core.
const TARGET_PCT: f64 = 1.0;

/// The hub's `sandhub-sampler` thread's utime + stime, in clock ticks.
fn sampler_ticks(hub_pid: u32) -> anyhow::Result<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{hub_pid}/task"))?;
    for task in tasks {
        let dir = task?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != "sandhub-sampler" {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat"))?;
        // Fields after the parenthesised comm: state is field 3; utime
        // and stime are fields 14 and 15.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .context("a stat line without its comm")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(11).context("no utime")?.parse()?;
        let stime: u64 = fields.get(12).context("no stime")?.parse()?;
        return Ok(utime + stime);
    }
    anyhow::bail!("the hub has no sandhub-sampler thread (no cgroups?)")
}

pub async fn run(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let deadline = args.deadline();
    let want = args.sampler_sandboxes;
    let mut ids = Vec::new();
    let started = Instant::now();
    for _ in 0..want {
        if Instant::now() + WINDOW + Duration::from_secs(5) >= deadline {
            eprintln!("sampler: phase deadline near after {} creates", ids.len());
            break;
        }
        match hub.create().await {
            Ok((id, _)) => ids.push(id),
            Err(e) => {
                eprintln!(
                    "sampler: create {} failed ({e:#}); measuring at {}",
                    ids.len() + 1,
                    ids.len()
                );
                break;
            }
        }
    }
    anyhow::ensure!(!ids.is_empty(), "sampler: no sandbox created");
    eprintln!(
        "sampler: {} sandboxes in {:?}",
        ids.len(),
        started.elapsed()
    );
    // Two ticks so every sandbox is being sampled, not just discovered.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let t0 = sampler_ticks(hub.pid())?;
    let w0 = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let t1 = sampler_ticks(hub.pid())?;
    let wall = w0.elapsed().as_secs_f64();
    let pct = (t1 - t0) as f64 / hz / wall * 100.0;
    report.rows.push(Row::absolute(
        format!(
            "usage sampler CPU at {} sandboxes, % of one core",
            ids.len()
        ),
        Value::new(pct, Unit::Percent),
        Some(Value::new(TARGET_PCT, Unit::Percent)),
    ));
    report.detail(
        format!("usage sampler at {} sandboxes", ids.len()),
        format!(
            "{} clock ticks (1/{hz:.0} s) of the sandhub-sampler thread in {wall:.1} s: \
             {:.3} ms per tick, {pct:.3}% of one core",
            t1 - t0,
            (t1 - t0) as f64 / hz / wall * 1000.0
        ),
    );
    for id in &ids {
        hub.delete(id).await?;
    }
    Ok(())
}
