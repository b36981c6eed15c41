//! Phase `code` (issue #33): what the code interpreter costs, each against
//! `python3 -c 'print(1+1)'` run by exec in the same sandbox (a fresh
//! interpreter: what an agent without kernels pays per snippet).
//!
//! - **Warm**: `1+1` in the default context (its kernel already up)
//!   through REST (`POST /v1/sandboxes/{id}/code`, the NDJSON stream read
//!   to its `end`) vs exec through REST; through MCP (`run_code` vs
//!   `execute_command`); and through E2B's code-interpreter SDK
//!   (`run_code` vs `commands.run`) when `--e2b-python` has it.
//! - **First context**: `POST .../code/contexts` until the new kernel
//!   answers vs the same exec, alternating; each context is deleted
//!   (untimed) before the next.
//!
//! The image is the layout `dev/code-interpreter/build-image.py` builds
//! (`--code-image`), imported with `sandhub image import` and set as the
//! `code-interpreter-v1` template, as its `--install` does.

use std::{path::Path, time::Instant};

use anyhow::{bail, ensure, Context};
use reqwest::Method;
use serde_json::{json, Value};

use super::{args::Args, mcp::Session, rest::Series, server::Hub, summary, us};
use crate::report::{Progress, Report, Row, Target, Unit, Value as Measured};

const TEMPLATE: &str = "code-interpreter-v1";
const REF: &str = "sandhub/code-interpreter:1";
const PYTHON_ONE_PLUS_ONE: &str = "python3 -c 'print(1+1)'";
/// Issue #33's target for `1+1` in a warm context through REST, in µs.
const REST_P50_MAX_US: f64 = 5_000.0;

pub(super) async fn run(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let layout = args.code_image.as_deref().context(
        "the code phase needs --code-image (dev/code-interpreter/build-image.py prints it)",
    )?;
    let t = Instant::now();
    import(hub, &args.sandhub_bin(), layout).await?;
    report.detail(
        "import of the code-interpreter image",
        format!("{} ms", t.elapsed().as_millis()),
    );
    let (id, _) = hub.create_from(TEMPLATE).await?;
    let result = phases(args, hub, report, &id).await;
    hub.delete(&id).await?;
    result
}

async fn phases(args: &Args, hub: &mut Hub, report: &mut Report, id: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    ensure!(run_code(hub, id, None).await? == "2", "1+1 is not 2");
    report.detail(
        "first run_code in a new sandbox (its default context's kernel starts)",
        format!("{} ms", t.elapsed().as_millis()),
    );
    rest(args, hub, report, id).await?;
    mcp(args, hub, report).await?;
    first_context(args, hub, report, id).await?;
    if args.code_e2b {
        e2b(args, hub, report)?;
    }
    Ok(())
}

async fn import(hub: &Hub, bin: &Path, layout: &Path) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(bin)
        .arg("image")
        .arg("import")
        .arg(layout)
        .args(["--hub", &hub.url, "--tag", REF])
        .output()
        .await
        .context("running sandhub image import")?;
    if !out.status.success() {
        bail!(
            "sandhub image import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    hub.call(
        Method::PUT,
        &format!("/v1/templates/{TEMPLATE}"),
        Some(json!({"image": REF, "entrypoint": [], "workdir": "/workspace"})),
    )
    .await?;
    Ok(())
}

/// `1+1` through REST, the stream read to its end; the main result's text.
async fn run_code(hub: &Hub, id: &str, context: Option<&str>) -> anyhow::Result<String> {
    let body = json!({"code": "1+1", "context": context});
    let resp = hub
        .http
        .post(format!("{}/v1/sandboxes/{id}/code", hub.url))
        .json(&body)
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await?;
    ensure!(status.is_success(), "run_code: {status}: {text}");
    let mut main = None;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let event: Value = serde_json::from_str(line)?;
        match event["type"].as_str() {
            Some("result") if event["is_main_result"] == true => {
                main = event["text/plain"].as_str().map(str::to_string);
            }
            Some("error") => bail!("run_code: {event}"),
            Some("end") => return main.context("run_code: no main result"),
            _ => {}
        }
    }
    bail!("run_code: the stream ended before its end event: {text}")
}

async fn exec_python(hub: &Hub, id: &str) -> anyhow::Result<()> {
    let out = hub
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": PYTHON_ONE_PLUS_ONE})),
        )
        .await?;
    ensure!(out["stdout"] == "2\n", "exec python3: {out}");
    Ok(())
}

/// Alternating rounds of `a` then `b` (which goes first flips each round).
macro_rules! alternate {
    ($name:expr, $n:expr, $deadline:expr, $a:expr, $b:expr) => {{
        let (mut a, mut b) = (Series::new($n), Series::new($n));
        let mut progress = Progress::new($name, $n.into());
        for i in 0..$n {
            if a.past($name, $deadline) {
                break;
            }
            for first in [i % 2 == 0, i % 2 != 0] {
                let t = Instant::now();
                if first {
                    $a;
                    a.samples.push(t.elapsed());
                } else {
                    $b;
                    b.samples.push(t.elapsed());
                }
            }
            progress.update((i + 1).into());
        }
        (a, b)
    }};
}

async fn rest(args: &Args, hub: &mut Hub, report: &mut Report, id: &str) -> anyhow::Result<()> {
    for _ in 0..args.exec_warmup.min(50) {
        run_code(hub, id, None).await?;
        exec_python(hub, id).await?;
    }
    let (code, exec) = alternate!(
        "run_code vs exec python3, REST",
        args.code_calls,
        args.deadline(),
        run_code(hub, id, None).await?,
        exec_python(hub, id).await?
    );
    let code = summary(report, "run_code 1+1 in a warm context, REST", code)?;
    let exec = summary(report, "exec python3 -c 'print(1+1)', REST", exec)?;
    report.rows.push(Row::absolute(
        "run_code 1+1 in a warm context through REST, p50",
        us(code.p50),
        Some(Measured::new(REST_P50_MAX_US, Unit::Microseconds)),
    ));
    report.rows.push(Row::compare(
        "run_code 1+1 (warm context) vs exec python3 -c, REST, p50",
        us(exec.p50),
        us(code.p50),
        Some(Target::RatioAtMost(1.0)),
    ));
    Ok(())
}

async fn mcp(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let http = hub.http.clone();
    let mut s = Session::open(&http, &hub.url).await?;
    // An MCP session reaches only the sandboxes it made.
    let created = s
        .call_tool("create_sandbox", json!({"warmpool": TEMPLATE}))
        .await?;
    let id = created["sandbox_claim_name"]
        .as_str()
        .with_context(|| format!("create_sandbox: {created}"))?
        .to_string();
    hub.track_sandbox(id.clone());
    let code = json!({"sandbox_claim_name": id, "code": "1+1"});
    let exec = json!({"sandbox_claim_name": id, "command": PYTHON_ONE_PLUS_ONE});
    let check_code = |r: &Value| -> anyhow::Result<()> {
        ensure!(r["results"] == json!(["2"]), "mcp run_code: {r}");
        Ok(())
    };
    let check_exec = |r: &Value| -> anyhow::Result<()> {
        ensure!(r["stdout"] == "2\n", "mcp execute_command: {r}");
        Ok(())
    };
    for _ in 0..args.exec_warmup.min(50) {
        check_code(&s.call_tool("run_code", code.clone()).await?)?;
        check_exec(&s.call_tool("execute_command", exec.clone()).await?)?;
    }
    let (c, e) = alternate!(
        "run_code vs execute_command python3, MCP",
        args.code_calls,
        args.deadline(),
        check_code(&s.call_tool("run_code", code.clone()).await?)?,
        check_exec(&s.call_tool("execute_command", exec.clone()).await?)?
    );
    let c = summary(report, "run_code 1+1 in a warm context, MCP", c)?;
    let e = summary(report, "execute_command python3 -c 'print(1+1)', MCP", e)?;
    report.rows.push(Row::compare(
        "run_code 1+1 (warm context) vs execute_command python3 -c, MCP, p50",
        us(e.p50),
        us(c.p50),
        None,
    ));
    hub.delete(&id).await
}

async fn first_context(
    args: &Args,
    hub: &mut Hub,
    report: &mut Report,
    id: &str,
) -> anyhow::Result<()> {
    let path = format!("/v1/sandboxes/{id}/code/contexts");
    let mut made = Vec::new();
    let n = args.code_contexts;
    let (ctx, exec) = alternate!(
        "first context vs exec python3",
        n,
        args.deadline(),
        made.push(hub.call(Method::POST, &path, Some(json!({}))).await?),
        exec_python(hub, id).await?
    );
    for c in made {
        let cid = c["id"].as_str().context("a context without an id")?;
        ensure!(c["state"] == "idle", "a new context is not idle: {c}");
        hub.call(Method::DELETE, &format!("{path}/{cid}"), None)
            .await?;
    }
    let ctx = summary(report, "first context (a kernel starts and answers)", ctx)?;
    let exec = summary(report, "exec python3 -c 'print(1+1)' beside it", exec)?;
    report.rows.push(Row::compare(
        "first context (kernel start) vs exec python3 -c, p50",
        us(exec.p50),
        us(ctx.p50),
        None,
    ));
    Ok(())
}

/// Prints two lines of durations in seconds (run_code, then commands.run
/// of the same python3), space separated (argv: hub url, n, warmup).
const E2B_SCRIPT: &str = r#"
import sys, time
from e2b_code_interpreter import Sandbox
url, n, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = Sandbox.create(api_key="bench", api_url=url, sandbox_url=url, timeout=600)
try:
    for _ in range(warmup):
        s.run_code("1+1")
        s.commands.run("python3 -c 'print(1+1)'")
    tc, te = [], []
    for i in range(n):
        for first in (i % 2 == 0, i % 2 != 0):
            t = time.perf_counter()
            if first:
                r = s.run_code("1+1"); tc.append(time.perf_counter() - t)
                assert r.text == "2", r
            else:
                r = s.commands.run("python3 -c 'print(1+1)'"); te.append(time.perf_counter() - t)
                assert r.stdout == "2\n", r
    print(" ".join(repr(x) for x in tc))
    print(" ".join(repr(x) for x in te))
finally:
    s.kill()
"#;

fn e2b(args: &Args, hub: &Hub, report: &mut Report) -> anyhow::Result<()> {
    let (code, exec) = super::e2b::two_series(
        &args.e2b_python,
        E2B_SCRIPT,
        &hub.url,
        args.code_calls,
        args.exec_warmup.min(50),
    )?;
    let code = summary(report, "run_code 1+1 via e2b_code_interpreter", code)?;
    let exec = summary(
        report,
        "commands.run python3 -c via e2b_code_interpreter",
        exec,
    )?;
    report.rows.push(Row::compare(
        "run_code 1+1 (warm context) vs commands.run python3 -c, E2B SDK, p50",
        us(exec.p50),
        us(code.p50),
        None,
    ));
    Ok(())
}
