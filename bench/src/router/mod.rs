//! The router suite: sandhub-router next to nginx as a reverse proxy, both in
//! front of the same upstream (an nginx answering a fixed 15-byte JSON body),
//! both under the same wrk load on loopback at each concurrency. Runs
//! alternate (nginx, router, nginx, router, ...) so drift on a shared
//! machine hits both; the median of the rounds is reported.
//!
//! Targets (issue "sandhub-router"): throughput at least nginx's, p99 no worse.

pub(crate) mod procs;

use std::{path::PathBuf, time::Duration};

use anyhow::Context;

use crate::wrk::{Load, WrkResult};
use crate::{
    machine::Machine,
    report::{Report, Row, Target, Unit, Value},
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandhub-router binary [default: $CARGO_TARGET_DIR/release/sandhub-router,
    /// or target/release/sandhub-router].
    #[arg(long, env = "SANDHUB_BENCH_ROUTER_BIN")]
    router_bin: Option<PathBuf>,
    /// nginx [default: on PATH, else /usr/sbin/nginx].
    #[arg(long, env = "SANDHUB_BENCH_NGINX")]
    nginx: Option<PathBuf>,
    /// wrk [default: on PATH].
    #[arg(long, env = "SANDHUB_BENCH_WRK")]
    wrk: Option<PathBuf>,
    /// Concurrent connections, comma-separated; one wrk run per value, proxy and round.
    #[arg(
        long,
        env = "SANDHUB_BENCH_CONNECTIONS",
        value_delimiter = ',',
        default_value = "10,50,200"
    )]
    connections: Vec<u32>,
    /// Seconds per wrk run.
    #[arg(long, env = "SANDHUB_BENCH_DURATION_SECS", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=120))]
    duration_secs: u64,
    /// Rounds per concurrency (each runs nginx, then the router); medians are reported.
    #[arg(long, env = "SANDHUB_BENCH_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// wrk threads.
    #[arg(long, env = "SANDHUB_BENCH_WRK_THREADS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    wrk_threads: u32,
    /// Run the router with its access log on (nginx's stays off either way).
    #[arg(long, env = "SANDHUB_BENCH_ROUTER_ACCESS_LOG")]
    router_access_log: bool,
}

impl Args {
    fn router_bin(&self) -> PathBuf {
        self.router_bin.clone().unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
            PathBuf::from(target).join("release").join("sandhub-router")
        })
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

struct Medians {
    rps: f64,
    p50: f64,
    p99: f64,
}

fn medians(runs: &[WrkResult]) -> Medians {
    Medians {
        rps: median(runs.iter().map(|r| r.requests_per_sec).collect()),
        p50: median(runs.iter().map(|r| r.p50_us).collect()),
        p99: median(runs.iter().map(|r| r.p99_us).collect()),
    }
}

/// wrk and the servers are separate processes: nothing here needs the runtime.
pub fn run_sync(args: Args) -> anyhow::Result<Report> {
    run_blocking(&args)
}

fn run_blocking(args: &Args) -> anyhow::Result<Report> {
    let nginx_bin = procs::find("nginx", args.nginx.as_deref())?;
    let wrk_bin = procs::find("wrk", args.wrk.as_deref())?;
    let router_bin = args.router_bin();
    anyhow::ensure!(
        router_bin.is_file(),
        "{} not found (cargo build --release -p sandhub-router)",
        router_bin.display()
    );
    let work = tempfile::Builder::new()
        .prefix("sandhub-bench-router-")
        .tempdir()?;
    let mut report = Report {
        suite: "router",
        machine: Machine::probe(work.path()),
        rows: Vec::new(),
        details: Vec::new(),
    };

    let (up_port, nginx_port, router_port) = (
        procs::free_port()?,
        procs::free_port()?,
        procs::free_port()?,
    );
    let _upstream = procs::upstream(&nginx_bin, &work.path().join("upstream"), up_port)?;
    let _nginx = procs::nginx_proxy(&nginx_bin, &work.path().join("proxy"), nginx_port, up_port)?;
    let _router = procs::router(
        &router_bin,
        &work.path().join("router"),
        router_port,
        args.router_access_log,
    )?;

    // The router's routing headers; nginx ignores them (same bytes on the wire).
    let headers = [
        "X-Sandbox-ID: bench".to_string(),
        "X-Sandbox-Pod-IP: 127.0.0.1".to_string(),
        format!("X-Sandbox-Port: {up_port}"),
    ];
    let nginx_url = format!("http://127.0.0.1:{nginx_port}/v1/health");
    let router_url = format!("http://127.0.0.1:{router_port}/v1/health");
    for &c in &args.connections {
        let load = Load {
            wrk: &wrk_bin,
            threads: args.wrk_threads.min(c),
            connections: c,
            duration: Duration::from_secs(args.duration_secs),
            headers: &headers,
        };
        // Untimed warm-up: connection pools, page faults, CPU frequency.
        let warm = Load {
            duration: Duration::from_secs(1),
            ..load
        };
        warm.run(&nginx_url)?;
        warm.run(&router_url)?;
        let (mut nginx_runs, mut router_runs) = (Vec::new(), Vec::new());
        for round in 0..args.rounds {
            let n = load.run(&nginx_url).context("wrk against nginx")?;
            let r = load.run(&router_url).context("wrk against the router")?;
            eprintln!(
                "router c={c} round {}: nginx {:.0} req/s p99 {:.0} µs | router {:.0} req/s p99 {:.0} µs",
                round + 1,
                n.requests_per_sec,
                n.p99_us,
                r.requests_per_sec,
                r.p99_us
            );
            anyhow::ensure!(
                n.errors == 0 && r.errors == 0,
                "errors under load: nginx {} router {}",
                n.errors,
                r.errors
            );
            nginx_runs.push(n);
            router_runs.push(r);
        }
        let (n, r) = (medians(&nginx_runs), medians(&router_runs));
        let per_s = |x| Value::new(x, Unit::PerSecond);
        let us = |x| Value::new(x, Unit::Microseconds);
        report.rows.push(Row::compare(
            format!("throughput, c={c}"),
            per_s(n.rps),
            per_s(r.rps),
            Some(Target::RatioAtLeast(1.0)),
        ));
        report.rows.push(Row::compare(
            format!("p50 latency, c={c}"),
            us(n.p50),
            us(r.p50),
            None,
        ));
        report.rows.push(Row::compare(
            format!("p99 latency, c={c}"),
            us(n.p99),
            us(r.p99),
            Some(Target::RatioAtMost(1.0)),
        ));
        if c == args.connections[0] {
            report.detail(
                "load (each run)",
                load.command_line("http://127.0.0.1:<port>/v1/health"),
            );
        }
    }
    report.detail(
        "baseline",
        format!(
            "{} as a reverse proxy (keepalive 512 to the upstream, access_log off)",
            nginx_version(&nginx_bin)
        ),
    );
    report.detail(
        "router",
        format!(
            "{} --allow-loopback-pod-ip --access-log={}",
            router_bin.display(),
            args.router_access_log
        ),
    );
    report.detail(
        "upstream",
        "nginx `return 200 '{\"status\":\"ok\"}'` on loopback, shared by both",
    );
    report.detail(
        "rounds",
        format!(
            "{} × {} s per proxy and concurrency, medians; 1 s warm-up each",
            args.rounds, args.duration_secs
        ),
    );
    Ok(report)
}

fn nginx_version(bin: &std::path::Path) -> String {
    std::process::Command::new(bin)
        .arg("-v")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .replace("nginx version: ", "")
        })
        .unwrap_or_else(|_| "nginx".into())
}
