//! Exec round trip: `true` through gRPC `Execute` vs `true` spawned and
//! waited for in this process. The difference is what sandboxd adds on top
//! of the fork+exec+wait that any way of running a command pays.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context};
use sandhub_api::proto::process::v1::{
    process_service_client::ProcessServiceClient, ExecuteRequest, ProcessConfig,
};
use tonic::transport::{Channel, Endpoint};

use crate::{
    report::{Progress, Report, Row, Target, Unit, Value},
    stats::{summarize, Summary},
};

/// One `Execute` of `true` takes about a millisecond; a call this slow
/// means sandboxd is stuck, and the benchmark must not hang on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct ExecResult {
    pub baseline: Summary,
    pub sandboxd: Summary,
    /// `Execute` rejected before any process starts: what the RPC alone
    /// costs, so the rest of the gap can be pinned on spawning and reaping.
    pub rpc_only: Summary,
    /// Set when the phase deadline cut the run short.
    pub stopped_early: bool,
}

/// Warms up, then alternates one remote and one local exec per iteration, so
/// drift (CPU frequency, background load) hits both series alike.
pub async fn run(
    grpc_url: &str,
    iterations: u32,
    warmup: u32,
    deadline: Instant,
) -> anyhow::Result<ExecResult> {
    // One persistent HTTP/2 connection, as a real client keeps.
    let channel = Endpoint::from_shared(grpc_url.to_string())?
        .connect()
        .await
        .with_context(|| format!("connecting to {grpc_url}"))?;
    let mut client = ProcessServiceClient::new(channel);

    eprintln!("exec: warming up ({warmup} each side)");
    for _ in 0..warmup {
        remote(&mut client).await?;
        local()?;
    }

    let n = iterations as usize;
    let mut remote_t = Vec::with_capacity(n);
    let mut local_t = Vec::with_capacity(n);
    let mut rpc_t = Vec::with_capacity(n);
    let mut progress = Progress::new("exec", iterations.into());
    let mut stopped_early = false;
    for done in 1..=n {
        if Instant::now() >= deadline {
            eprintln!("exec: phase deadline reached after {} iterations", done - 1);
            stopped_early = true;
            break;
        }
        remote_t.push(remote(&mut client).await?);
        local_t.push(local()?);
        rpc_t.push(rpc_only(&mut client).await?);
        progress.update(done as u64);
    }
    ensure!(
        !remote_t.is_empty(),
        "exec: no iteration before the deadline"
    );
    Ok(ExecResult {
        baseline: summarize(&mut local_t),
        sandboxd: summarize(&mut remote_t),
        rpc_only: summarize(&mut rpc_t),
        stopped_early,
    })
}

/// One `Execute` of `true`, timed from sending the request to holding the
/// decoded response.
pub(super) async fn remote(client: &mut ProcessServiceClient<Channel>) -> anyhow::Result<Duration> {
    let request = ExecuteRequest {
        config: Some(ProcessConfig {
            command: vec!["true".into()],
            ..Default::default()
        }),
    };
    let started = Instant::now();
    let response = tokio::time::timeout(CALL_TIMEOUT, client.execute(request))
        .await
        .context("Execute timed out")?
        .context("Execute failed")?;
    let elapsed = started.elapsed();
    let code = response.into_inner().exit_code;
    ensure!(code == 0, "`true` exited with {code} through sandboxd");
    Ok(elapsed)
}

/// An `Execute` with an empty command, which sandboxd rejects with
/// INVALID_ARGUMENT before spawning anything.
async fn rpc_only(client: &mut ProcessServiceClient<Channel>) -> anyhow::Result<Duration> {
    let request = ExecuteRequest {
        config: Some(ProcessConfig::default()),
    };
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_TIMEOUT, client.execute(request))
        .await
        .context("Execute timed out")?;
    let elapsed = started.elapsed();
    match result {
        Err(status) if status.code() == tonic::Code::InvalidArgument => Ok(elapsed),
        other => {
            anyhow::bail!("Execute of an empty command: expected INVALID_ARGUMENT, got {other:?}")
        }
    }
}

/// The baseline: spawn `true` (PATH lookup included, as sandboxd does) and
/// wait for it. Blocking is fine here: nothing else runs on this thread
/// while it waits.
fn local() -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = Command::new("true").status().context("spawning `true`")?;
    let elapsed = started.elapsed();
    ensure!(status.success(), "`true` failed locally: {status}");
    Ok(elapsed)
}

fn us(d: Duration) -> Value {
    Value::new(d.as_secs_f64() * 1e6, Unit::Microseconds)
}

impl ExecResult {
    pub fn describe(&self, report: &mut Report, max_ratio: f64) {
        let (b, s) = (&self.baseline, &self.sandboxd);
        let target = Some(Target::RatioAtMost(max_ratio));
        report.rows.push(Row::compare(
            "exec `true`, p50",
            us(b.p50),
            us(s.p50),
            target,
        ));
        report.rows.push(Row::compare(
            "exec `true`, mean",
            us(b.mean),
            us(s.mean),
            target,
        ));
        report
            .rows
            .push(Row::compare("exec `true`, p99", us(b.p99), us(s.p99), None));
        let r = &self.rpc_only;
        report.rows.push(Row::absolute(
            "gRPC Execute, no process (rejected), p50",
            us(r.p50),
            None,
        ));
        report.detail(
            "exec samples",
            format!(
                "{} per side{}; baseline = Command::new(\"true\").status() in the \
                 bench process, sandboxd = gRPC Execute over one kept-alive connection; \
                 max {:.0} µs baseline, {:.0} µs sandboxd; rejected Execute \
                 (INVALID_ARGUMENT, nothing spawned) p50 {:.0} µs, mean {:.0} µs",
                s.n,
                if self.stopped_early {
                    " (stopped early at the phase deadline)"
                } else {
                    ""
                },
                b.max.as_secs_f64() * 1e6,
                s.max.as_secs_f64() * 1e6,
                r.p50.as_secs_f64() * 1e6,
                r.mean.as_secs_f64() * 1e6,
            ),
        );
    }
}
