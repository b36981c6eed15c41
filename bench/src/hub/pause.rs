//! Phase `pause` (issue #32 §2 and §3): what pausing, resuming and
//! auto-resuming cost a caller.
//!
//! One sandbox with `auto_resume` and a process holding memory is paused
//! and woken `--pause-rounds` times; each round wakes it twice (after a
//! fresh pause each time), once by `resume` then `exec true` and once by
//! `exec true` alone (the auto-resume), alternating which goes first so
//! drift hits both alike. Baselines from the same run: `exec true` on the
//! running sandbox, and the manual wake. The same again with `suspend`
//! (processes stop, the resume starts the sandbox again) at a fifth of the
//! rounds.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::{args::Args, rest::Series, server::Hub, summary, us};
use crate::report::{Report, Row};

/// How a sandbox is put to sleep.
#[derive(Clone, Copy)]
enum Sleep {
    Pause,
    Suspend,
}

impl Sleep {
    fn verb(self) -> &'static str {
        match self {
            Sleep::Pause => "pause",
            Sleep::Suspend => "suspend",
        }
    }
}

struct Timings {
    sleep: Series,
    resume: Series,
    exec_after_resume: Series,
    manual: Series,
    auto: Series,
}

pub(super) async fn run(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let (id, _) = hub.create_with(json!({"auto_resume": true})).await?;
    // Something holding memory and a timer, as a paused dev server would.
    call(
        hub,
        &id,
        "exec",
        json!({"command": ["sh", "-c", "sleep 100000 >/dev/null 2>&1 &"]}),
    )
    .await?;
    let running = execs(hub, &id, args.pause_rounds).await?;
    let running = summary(report, "exec true on a running sandbox", running)?;

    let paused = rounds(hub, &id, Sleep::Pause, args.pause_rounds, args.deadline()).await?;
    let suspended = rounds(
        hub,
        &id,
        Sleep::Suspend,
        (args.pause_rounds / 5).max(2),
        args.deadline(),
    )
    .await?;
    hub.delete(&id).await?;

    for (kind, t) in [("pause", paused), ("suspend", suspended)] {
        let sleep = summary(report, kind, t.sleep)?;
        let resume = summary(report, &format!("resume after {kind}"), t.resume)?;
        let after = summary(
            report,
            &format!("exec true right after resume ({kind})"),
            t.exec_after_resume,
        )?;
        let manual = summary(report, &format!("resume then exec ({kind})"), t.manual)?;
        let auto = summary(report, &format!("exec with auto-resume ({kind})"), t.auto)?;
        report
            .rows
            .push(Row::absolute(format!("{kind}, p50"), us(sleep.p50), None));
        report.rows.push(Row::absolute(
            format!("resume after {kind}, p50"),
            us(resume.p50),
            None,
        ));
        report.rows.push(Row::compare(
            format!("exec `true` right after resume ({kind}) vs on a running sandbox, p50"),
            us(running.p50),
            us(after.p50),
            None,
        ));
        report.rows.push(Row::compare(
            format!("auto-resume exec vs resume then exec ({kind}), p50"),
            us(manual.p50),
            us(auto.p50),
            None,
        ));
    }
    Ok(())
}

async fn call(hub: &Hub, id: &str, op: &str, body: serde_json::Value) -> anyhow::Result<()> {
    hub.call(
        Method::POST,
        &format!("/v1/sandboxes/{id}/{op}"),
        Some(body),
    )
    .await?;
    Ok(())
}

async fn exec_true(hub: &Hub, id: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    call(hub, id, "exec", json!({"command": ["true"]})).await?;
    Ok(t.elapsed())
}

async fn execs(hub: &Hub, id: &str, n: u32) -> anyhow::Result<Series> {
    let mut s = Series::new(n);
    for _ in 0..n {
        s.samples.push(exec_true(hub, id).await?);
    }
    Ok(s)
}

async fn rounds(
    hub: &Hub,
    id: &str,
    how: Sleep,
    n: u32,
    deadline: Instant,
) -> anyhow::Result<Timings> {
    let mut t = Timings {
        sleep: Series::new(2 * n),
        resume: Series::new(n),
        exec_after_resume: Series::new(n),
        manual: Series::new(n),
        auto: Series::new(n),
    };
    for i in 0..n {
        if t.manual.past(how.verb(), deadline) {
            break;
        }
        for manual_first in [i % 2 == 0, i % 2 != 0] {
            let started = Instant::now();
            call(hub, id, how.verb(), json!({})).await?;
            t.sleep.samples.push(started.elapsed());
            if manual_first {
                let woke = Instant::now();
                call(hub, id, "resume", json!({})).await?;
                t.resume.samples.push(woke.elapsed());
                let ran = exec_true(hub, id).await?;
                t.exec_after_resume.samples.push(ran);
                t.manual.samples.push(woke.elapsed());
            } else {
                t.auto.samples.push(exec_true(hub, id).await?);
            }
        }
    }
    Ok(t)
}
