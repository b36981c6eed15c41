//! The egress phase (issue #27): what the gateway of a `network: egress`
//! sandbox costs, against the same thing done from the host in the same
//! run, over alternating rounds (the first side of a round alternates).
//!
//! Everything talks to the phase's own [`Internet`] (198.19.0.0/24): the
//! hub is started with `--egress-dns` pointing at its resolver.
//!
//! 1. Download of `--egress-download-mib` MiB over HTTP with `curl -o
//!    /dev/null`, inside an egress sandbox (by name, through the gateway)
//!    vs on the host (same curl, same server; `--resolve` for the name).
//!    curl's own `speed_download`, so exec overhead is not in it.
//! 2. TCP connect: one Python process per side and round times
//!    `--egress-connects` `socket.create_connection`s to a server that
//!    holds each connection until the client closes it. Inside: to the
//!    name's fake IP (resolved once, untimed; the gateway still resolves
//!    it upstream for every flow) and to the real address; host: the real
//!    address. DNS: the same process shape asks a name already answered
//!    (cached) and a new name each time (fresh), inside from the gateway's
//!    responder (`/etc/resolv.conf`), on the host from the bench's resolver
//!    (a baseline for scale; the target is absolute).
//! 3. Cold create from an `egress` template vs a `none` one, alternating
//!    which goes first.
//! 4. (First, on a hub that has done little yet.) Hub RSS, PSS and
//!    anonymous memory per 100 idle sandboxes: `none` ones first, then as
//!    many `egress` ones on top (none deleted in between, so memory the
//!    allocator keeps from one batch cannot hide the other's). The hub's
//!    PSS falls as sandboxes start: their shims map the same `sandhub`
//!    binary, and PSS splits shared pages among the processes mapping them.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context};
use reqwest::Method;
use serde_json::{json, Value as Json};

use super::{
    args::Args,
    internet::{self, Internet},
    procs,
    server::Hub,
};
use crate::{
    report::{Progress, Report, Row, Target, Unit, Value},
    stats::{median, summarize},
};

const EGRESS: &str = "bench-egress";
const NONE: &str = "bench-none";
const DOWNLOAD_NAME: &str = "dl.bench.test";
const CONNECT_NAME: &str = "sink.bench.test";
const PYTHON: &str = "/usr/bin/python3";
/// Longest one command inside the sandbox may take (a slow download).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// Times `n` TCP connects (µs each) after one untimed one; prints JSON.
const CONNECT_PY: &str = r#"
import json, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
socket.create_connection(addr, timeout=10).close()
out = []
for _ in range(n):
    t = time.perf_counter_ns()
    s = socket.create_connection(addr, timeout=10)
    out.append((time.perf_counter_ns() - t) // 1000)
    s.close()
print(json.dumps({"addr": addr[0], "us": out}))
"#;

/// Times `n` DNS A queries (µs each) over UDP: the same name each time
/// (`cached`, asked once untimed first) or a new one (`fresh`).
const DNS_PY: &str = r#"
import json, socket, struct, sys, time
server, mode, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if server == "resolv.conf":
    server = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.connect((server, 53))
def ask(name, qid):
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    m = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack(">HH", 1, 1)
    t = time.perf_counter_ns()
    s.send(m)
    r = s.recv(1500)
    while r[:2] != m[:2]:
        r = s.recv(1500)
    took = (time.perf_counter_ns() - t) // 1000
    if r[3] & 15 or struct.unpack(">H", r[6:8])[0] < 1:
        sys.exit(f"{name}: rcode {r[3] & 15}, no answer")
    return took
ask("cached.bench.test", 1)
out = [ask("cached.bench.test" if mode == "cached" else f"f{i}-{tag}.bench.test", i % 60000 + 2)
       for i in range(n)]
print(json.dumps({"server": server, "us": out}))
"#;

/// The hub flags the phase needs: its resolver, and per-tenant caps that
/// admit both idle batches at once.
pub fn hub_flags(args: &Args) -> Vec<String> {
    let sandboxes = 2 * u64::from(args.egress_idle_sandboxes) + 16;
    vec![
        "--egress-dns".into(),
        internet::SERVER_ADDR.to_string(),
        "--tenant-max-sandboxes".into(),
        sandboxes.to_string(),
        // The hub's default memory limit is at most 1024 MiB a sandbox.
        "--tenant-max-memory-mb".into(),
        (sandboxes * 1024).to_string(),
    ]
}

pub async fn run(
    args: &Args,
    hub: &mut Hub,
    report: &mut Report,
    net: &Internet,
) -> anyhow::Result<()> {
    let deadline = args.deadline();
    report.detail("egress: bench internet", format!("namespace {}", net.ns()));
    for (name, network) in [(EGRESS, "egress"), (NONE, "none")] {
        hub.call(
            Method::PUT,
            &format!("/v1/templates/{name}"),
            Some(json!({ "network": network })),
        )
        .await?;
    }
    // Memory first, while the hub's heap holds little that earlier work
    // freed: new allocations then show in its RSS instead of reusing it.
    let r = async {
        idle_memory(args, hub, report).await?;
        network(args, hub, report, deadline).await?;
        cold_creates(args, hub, report, deadline).await
    }
    .await;
    for name in [EGRESS, NONE] {
        let _ = hub
            .call(Method::DELETE, &format!("/v1/templates/{name}"), None)
            .await;
    }
    r
}

/// Samples of one side over all rounds: MB/s per download, µs otherwise.
#[derive(Default)]
struct Side {
    download_mbps: Vec<f64>,
    /// The hub's CPU seconds (user + system) during each download: through
    /// the gateway, the user-space stack and the TUN's reads and writes.
    hub_cpu_s: Vec<f64>,
    connect_name_us: Vec<u64>,
    connect_addr_us: Vec<u64>,
    dns_cached_us: Vec<u64>,
    dns_fresh_us: Vec<u64>,
}

/// Where a probe runs: the bench's own (the host's) network namespace, or
/// inside the egress sandbox through the hub's exec API.
enum Place<'a> {
    Host,
    Sandbox { hub: &'a Hub, id: &'a str },
}

impl Place<'_> {
    async fn run(&self, argv: &[String]) -> anyhow::Result<String> {
        match self {
            Place::Host => on_host_run(argv),
            Place::Sandbox { hub, id } => in_sandbox(hub, id, argv).await,
        }
    }
}

/// The commands one side runs in a round.
struct Probes {
    download: Vec<String>,
    connect_name: Option<Vec<String>>,
    connect_addr: Vec<String>,
    dns_cached: Vec<String>,
    dns_fresh: Vec<String>,
}

impl Probes {
    /// `round` makes the fresh names of each round new.
    fn new(args: &Args, on_host: bool, round: u32) -> Probes {
        let bytes = u64::from(args.egress_download_mib) << 20;
        let mut download: Vec<String> = ["curl", "-sS", "--noproxy", "*", "-o", "/dev/null"]
            .map(String::from)
            .to_vec();
        if on_host {
            // The same URL (and Host header) as inside, without asking
            // the host's resolver about a name only the bench knows.
            download.push("--resolve".into());
            download.push(format!(
                "{DOWNLOAD_NAME}:{}:{}",
                internet::HTTP_PORT,
                internet::SERVER_ADDR
            ));
        }
        download.extend([
            "--max-time".into(),
            COMMAND_TIMEOUT.as_secs().to_string(),
            "-w".into(),
            "%{size_download} %{speed_download}".into(),
            format!("http://{DOWNLOAD_NAME}/bytes/{bytes}"),
        ]);
        let py = |script: &str, rest: &[&str]| {
            let mut argv = vec![PYTHON.to_string(), "-c".into(), script.into()];
            argv.extend(rest.iter().map(|s| s.to_string()));
            argv
        };
        let (addr, sink) = (
            internet::SERVER_ADDR.to_string(),
            internet::SINK_PORT.to_string(),
        );
        let (n, q, tag) = (
            args.egress_connects.to_string(),
            args.egress_dns_queries.to_string(),
            format!("r{round}"),
        );
        let dns_server = if on_host {
            addr.as_str()
        } else {
            "resolv.conf"
        };
        Probes {
            download,
            // The host has no name for the sink: its baseline is the address.
            connect_name: (!on_host).then(|| py(CONNECT_PY, &[CONNECT_NAME, &sink, &n])),
            connect_addr: py(CONNECT_PY, &[&addr, &sink, &n]),
            dns_cached: py(DNS_PY, &[dns_server, "cached", &q, &tag]),
            dns_fresh: py(DNS_PY, &[dns_server, "fresh", &q, &tag]),
        }
    }

    async fn run(&self, place: &Place<'_>, bytes: u64, side: &mut Side) -> anyhow::Result<()> {
        let hub_cpu = || match place {
            Place::Sandbox { hub, .. } => super::ports::cpu_us(hub.pid()).unwrap_or(0.0) / 1e6,
            Place::Host => 0.0,
        };
        let before = hub_cpu();
        side.download_mbps
            .push(download(&place.run(&self.download).await?, bytes)?);
        side.hub_cpu_s.push(hub_cpu() - before);
        if let Some(argv) = &self.connect_name {
            side.connect_name_us
                .extend(samples(&place.run(argv).await?)?);
        }
        side.connect_addr_us
            .extend(samples(&place.run(&self.connect_addr).await?)?);
        side.dns_cached_us
            .extend(samples(&place.run(&self.dns_cached).await?)?);
        side.dns_fresh_us
            .extend(samples(&place.run(&self.dns_fresh).await?)?);
        Ok(())
    }
}

async fn network(
    args: &Args,
    hub: &mut Hub,
    report: &mut Report,
    deadline: Instant,
) -> anyhow::Result<()> {
    let (id, _) = hub.create_from(EGRESS).await?;
    let bytes = u64::from(args.egress_download_mib) << 20;
    let (mut host, mut gw) = (Side::default(), Side::default());
    let mut rounds = 0;
    let sandbox = Place::Sandbox { hub, id: &id };
    for round in 0..args.egress_rounds {
        if Instant::now() >= deadline {
            eprintln!("egress: phase deadline reached after {round} rounds");
            break;
        }
        eprintln!("egress: round {}/{}", round + 1, args.egress_rounds);
        // Host first in even rounds, gateway first in odd ones.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for on_host in order {
            let probes = Probes::new(args, on_host, round);
            if on_host {
                probes.run(&Place::Host, bytes, &mut host).await?;
            } else {
                probes.run(&sandbox, bytes, &mut gw).await?;
            }
        }
        rounds += 1;
    }
    hub.delete(&id).await?;
    ensure!(rounds > 0, "egress: no round before the deadline");

    let mbps = |x| Value::new(x, Unit::MegabytesPerSecond);
    let (h, g) = (median(&host.download_mbps), median(&gw.download_mbps));
    report.rows.push(Row::compare(
        format!(
            "download {} MiB: gateway vs host, median of {rounds}",
            args.egress_download_mib
        ),
        mbps(h),
        mbps(g),
        Some(Target::RatioAtLeast(0.5)),
    ));
    report.rows.push(Row::compare(
        "  the same, against the issue's aim",
        mbps(h),
        mbps(g),
        Some(Target::RatioAtLeast(0.8)),
    ));
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    report.detail(
        "egress: download rounds (MB/s)",
        format!(
            "host [{}] vs gateway [{}]",
            list(&host.download_mbps),
            list(&gw.download_mbps)
        ),
    );
    report.detail(
        "egress: hub CPU during each gateway download (user + system, s)",
        gw.hub_cpu_s
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    report.detail(
        "egress: download, host",
        Probes::new(args, true, 0).download.join(" "),
    );
    report.detail(
        "egress: download, gateway (exec in the sandbox)",
        Probes::new(args, false, 0).download.join(" "),
    );

    let one_ms = Value::new(1000.0, Unit::Microseconds);
    let p50 = |report: &mut Report, name: &str, v: &[u64]| {
        let mut d: Vec<Duration> = v.iter().map(|&us| Duration::from_micros(us)).collect();
        let s = summarize(&mut d);
        report.detail(
            format!("egress: {name}"),
            format!(
                "n={}: p50 {} µs, mean {} µs, p99 {} µs",
                s.n,
                s.p50.as_micros(),
                s.mean.as_micros(),
                s.p99.as_micros()
            ),
        );
        Value::new(s.p50.as_micros() as f64, Unit::Microseconds)
    };
    let host_connect = p50(report, "connect from the host", &host.connect_addr_us);
    let gw_name = p50(
        report,
        "connect by name through the gateway",
        &gw.connect_name_us,
    );
    let gw_addr = p50(
        report,
        "connect to the address through the gateway",
        &gw.connect_addr_us,
    );
    report.rows.push(Row::compare(
        "TCP connect by name: gateway vs host, p50",
        host_connect,
        gw_name,
        Some(Target::AboveBaselineAtMost(one_ms)),
    ));
    report.rows.push(Row::compare(
        "TCP connect to the address: gateway vs host, p50",
        host_connect,
        gw_addr,
        Some(Target::AboveBaselineAtMost(one_ms)),
    ));
    for (kind, h, g) in [
        ("the same name", &host.dns_cached_us, &gw.dns_cached_us),
        ("a new name each time", &host.dns_fresh_us, &gw.dns_fresh_us),
    ] {
        let h = p50(
            report,
            &format!("DNS, {kind}, bench resolver from the host"),
            h,
        );
        let g = p50(report, &format!("DNS, {kind}, gateway responder"), g);
        report.rows.push(Row::compare(
            format!("DNS answer, {kind}: gateway responder vs a resolver on the host, p50"),
            h,
            g,
            Some(Target::AtMost(one_ms)),
        ));
    }
    Ok(())
}

async fn cold_creates(
    args: &Args,
    hub: &mut Hub,
    report: &mut Report,
    deadline: Instant,
) -> anyhow::Result<()> {
    let (mut egress, mut none) = (Vec::new(), Vec::new());
    let mut progress = Progress::new("egress: cold creates", args.egress_creates.into());
    for i in 0..args.egress_creates {
        if Instant::now() >= deadline {
            eprintln!("egress: phase deadline reached after {i} pairs of creates");
            break;
        }
        let order = if i % 2 == 0 {
            [EGRESS, NONE]
        } else {
            [NONE, EGRESS]
        };
        for template in order {
            let t = Instant::now();
            let (id, _) = hub.create_from(template).await?;
            let took = t.elapsed();
            hub.delete(&id).await?;
            if template == EGRESS {
                &mut egress
            } else {
                &mut none
            }
            .push(took);
        }
        progress.update(u64::from(i) + 1);
    }
    ensure!(!egress.is_empty(), "egress: no create before the deadline");
    let (e, n) = (summarize(&mut egress), summarize(&mut none));
    let us = |d: Duration| Value::new(d.as_micros() as f64, Unit::Microseconds);
    report.rows.push(Row::compare(
        format!("cold create: egress vs none template, p50 of {}", e.n),
        us(n.p50),
        us(e.p50),
        Some(Target::RatioAtMost(1.2)),
    ));
    report.rows.push(Row::compare(
        "cold create: egress vs none template, p99",
        us(n.p99),
        us(e.p99),
        None,
    ));
    Ok(())
}

/// One number of [`procs::Totals`].
type Field = fn(&procs::Totals) -> u64;

async fn idle_memory(args: &Args, hub: &mut Hub, report: &mut Report) -> anyhow::Result<()> {
    let count = args.egress_idle_sandboxes;
    let mut at = vec![settled_hub_memory(hub).await];
    let mut ids = Vec::new();
    for template in [NONE, EGRESS] {
        let mut progress = Progress::new("egress: idle sandboxes", count.into());
        for done in 1..=count {
            ids.push(hub.create_from(template).await?.0);
            progress.update(done.into());
        }
        at.push(settled_hub_memory(hub).await);
    }
    let per_100 = |f: Field, batch: usize| {
        let kib = f(&at[batch + 1]) as f64 - f(&at[batch]) as f64;
        Value::new(kib / 1024.0 * 100.0 / f64::from(count), Unit::Mebibytes)
    };
    let kinds: [(&str, Field); 3] = [
        ("RSS", |t| t.rss_kib),
        ("PSS", |t| t.pss_kib),
        ("anonymous", |t| t.anon_kib),
    ];
    for (kind, f) in kinds {
        report.rows.push(Row::compare(
            format!("hub {kind} per 100 idle sandboxes: egress vs none"),
            per_100(f, 0),
            per_100(f, 1),
            None,
        ));
    }
    let kib = |t: &procs::Totals| {
        format!(
            "RSS {} PSS {} anonymous {}",
            t.rss_kib, t.pss_kib, t.anon_kib
        )
    };
    report.detail(
        "egress: hub memory (KiB)",
        format!(
            "at start {}; after {count} none {}; after {count} egress on top {}",
            kib(&at[0]),
            kib(&at[1]),
            kib(&at[2])
        ),
    );
    let mut progress = Progress::new("egress: deleting idle sandboxes", ids.len() as u64);
    for (done, id) in ids.iter().enumerate() {
        hub.delete(id).await?;
        progress.update(done as u64 + 1);
    }
    Ok(())
}

/// The hub's memory after startup work of new sandboxes has had time to
/// finish (they are idle, not just born).
async fn settled_hub_memory(hub: &Hub) -> procs::Totals {
    tokio::time::sleep(Duration::from_secs(2)).await;
    procs::totals(&[hub.pid()])
}

/// Runs `argv` in the sandbox through the hub's exec API; its stdout.
async fn in_sandbox(hub: &Hub, id: &str, argv: &[String]) -> anyhow::Result<String> {
    let v: Json = hub
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec", hub.url))
        .timeout(COMMAND_TIMEOUT + Duration::from_secs(30))
        .json(&json!({"command": argv, "timeout_seconds": COMMAND_TIMEOUT.as_secs()}))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("exec {}", argv[0]))?
        .json()
        .await?;
    if v["exit_code"] != 0 {
        bail!("in the sandbox, {} failed: {v}", argv[0]);
    }
    Ok(v["stdout"].as_str().unwrap_or_default().to_string())
}

/// Runs `argv` in the bench's own (the host's) network namespace.
fn on_host_run(argv: &[String]) -> anyhow::Result<String> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("running {}", argv[0]))?;
    if !out.status.success() {
        bail!(
            "on the host, {} failed: {}",
            argv[0],
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// MB/s (10⁶ bytes/s) from curl's `-w "%{size_download} %{speed_download}"`.
fn download(out: &str, want: u64) -> anyhow::Result<f64> {
    let mut it = out.split_whitespace();
    let size: f64 = it.next().context("no size")?.parse()?;
    let speed: f64 = it.next().context("no speed")?.parse()?;
    ensure!(size as u64 == want, "downloaded {size} bytes of {want}");
    Ok(speed / 1e6)
}

/// The `us` list of a probe's JSON line.
fn samples(out: &str) -> anyhow::Result<Vec<u64>> {
    let v: Json =
        serde_json::from_str(out.trim()).with_context(|| format!("probe output {out:?}"))?;
    v["us"]
        .as_array()
        .context("no us")?
        .iter()
        .map(|x| x.as_u64().context("not a number"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_curl_and_probe_output() {
        assert_eq!(download("1048576 2000000.5", 1 << 20).unwrap(), 2.0000005);
        assert!(download("100 5", 1 << 20).is_err());
        assert_eq!(
            samples("{\"addr\": \"x\", \"us\": [3, 4]}\n").unwrap(),
            vec![3, 4]
        );
    }
}
