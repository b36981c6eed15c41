//! The Python SDK (`sandhub`, PyO3 over `sandhub-client`) next to the Rust
//! `HubClient` it binds: `run("true")` on the same hub and sandbox, one
//! series each, so the ratio is what the Python layer costs.

use std::{
    path::Path,
    process::Command as Process,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context};
use sandhub_api::hub::{Command, ExecRequest};
use sandhub_client::{http::HubClient, Sandboxes};

use super::{rest::Series, server::Hub};

/// Times `commands.run("true")` in a fresh interpreter and prints one
/// duration in seconds per line (argv: url, sandbox id, n, warmup).
const PYTHON_SERIES: &str = r#"
import sys, time, sandhub
url, sid, n, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sb = sandhub.Hub(url).get(sid)
for _ in range(warmup):
    sb.commands.run(["true"])
out = []
for _ in range(n):
    t = time.perf_counter()
    r = sb.commands.run(["true"])
    out.append(time.perf_counter() - t)
    assert r.exit_code == 0, r
print("\n".join(repr(x) for x in out))
"#;

/// `(rust, python)` series of `n` timed `run("true")` each.
pub async fn exec(
    hub: &mut Hub,
    python: &Path,
    n: u32,
    warmup: u32,
) -> anyhow::Result<(Series, Series)> {
    let (id, _) = hub.create().await?;
    let client = HubClient::new(hub.url.clone(), None)?;
    let request = ExecRequest {
        command: Command::Argv(vec!["true".into()]),
        env: Default::default(),
        cwd: String::new(),
        timeout_seconds: None,
        stdin: String::new(),
        container: None,
    };
    for _ in 0..warmup {
        client.exec(&id, request.clone()).await?;
    }
    let mut rust = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        let r = client.exec(&id, request.clone()).await?;
        rust.push(t.elapsed());
        ensure!(r.exit_code == 0, "Rust exec of true exited {}", r.exit_code);
    }
    eprintln!("sdk: Python series ({} with {warmup} warmup)", n);
    let out = Process::new(python)
        .args([
            "-c",
            PYTHON_SERIES,
            &hub.url,
            &id,
            &n.to_string(),
            &warmup.to_string(),
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "the Python series failed (is `sandhub` installed for {}?): {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let py = String::from_utf8(out.stdout)?
        .lines()
        .map(|l| l.trim().parse::<f64>().map(Duration::from_secs_f64))
        .collect::<Result<Vec<_>, _>>()
        .context("the Python series printed something other than durations")?;
    hub.delete(&id).await?;
    let series = |samples| Series {
        samples,
        stopped_early: false,
    };
    Ok((series(rust), series(py)))
}

/// 64 asyncio tasks on one `AsyncHub`, each running `true` `calls` times
/// (argv: url, sandbox id, sessions, calls); prints calls per second.
const PYTHON_CONCURRENT: &str = r#"
import asyncio, sys, time, sandhub
url, sid, sessions, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
async def main():
    sb = await sandhub.AsyncHub(url).get(sid)
    async def session():
        for _ in range(calls):
            r = await sb.commands.run(["true"])
            assert r.exit_code == 0, r
    await session()
    t = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(sessions)))
    return sessions * calls / (time.perf_counter() - t)
print(asyncio.run(main()))
"#;

/// `(rust, python)` calls per second of `sessions` concurrent sessions of
/// `calls` sequential `run("true")` each, on one sandbox.
pub async fn concurrent(
    hub: &mut Hub,
    python: &Path,
    sessions: u32,
    calls: u32,
) -> anyhow::Result<(f64, f64)> {
    let (id, _) = hub.create().await?;
    let client = HubClient::new(hub.url.clone(), None)?;
    let request = ExecRequest {
        command: Command::Argv(vec!["true".into()]),
        env: Default::default(),
        cwd: String::new(),
        timeout_seconds: None,
        stdin: String::new(),
        container: None,
    };
    let session = || async {
        for _ in 0..calls {
            let r = client.exec(&id, request.clone()).await?;
            ensure!(r.exit_code == 0, "Rust exec of true exited {}", r.exit_code);
        }
        anyhow::Ok(())
    };
    session().await?;
    let t = Instant::now();
    futures::future::try_join_all((0..sessions).map(|_| session())).await?;
    let rust = f64::from(sessions * calls) / t.elapsed().as_secs_f64();
    let out = Process::new(python)
        .args([
            "-c",
            PYTHON_CONCURRENT,
            &hub.url,
            &id,
            &sessions.to_string(),
            &calls.to_string(),
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        out.status.success(),
        "the Python sessions failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: f64 = String::from_utf8(out.stdout)?
        .trim()
        .parse()
        .context("the Python sessions printed something other than a rate")?;
    hub.delete(&id).await?;
    Ok((rust, py))
}
