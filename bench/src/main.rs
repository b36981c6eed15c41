//! sandhub-bench: benchmarks that print Sandhub's numbers next to a baseline
//! measured in the same run, on the same machine, so a ratio means something
//! even on a noisy laptop or CI box.
//!
//! Table of contents (one module per suite, shared helpers below them):
//! - [`sandboxd`]: the daemon inside every sandbox: exec round trip vs a
//!   plain fork+exec, file upload/download vs `cp`, idle RSS.
//! - [`hub`]: `sandhub serve` end to end: warm claim, cold create, reset,
//!   exec via the hub vs straight to sandboxd, MCP, Gym, memory per sandbox,
//!   and (opt-in) images, ports, the egress gateway vs the host.
//! - [`router`]: sandhub-router vs nginx as a reverse proxy under wrk, at
//!   several concurrencies (throughput, p50/p99).
//! - [`controller`]: `sandhub-controller` on the real apiserver: a burst of
//!   claims on a full warm pool and on an empty one, claim→Ready latency.
//! - [`replicas`]: 1, 2 and 4 hubs on the test cluster's real node behind
//!   one loopback address: throughput, p50/p99, and a replica killed mid-run.
//! - [`stats`]: percentiles and medians.
//! - [`report`]: the result table, its JSON form, and progress lines.
//! - [`machine`]: what the numbers were measured on.

mod controller;
mod hub;
mod machine;
mod replicas;
mod report;
mod router;
mod sandboxd;
mod stats;
mod wrk;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "sandhub-bench",
    version,
    about = "Side-by-side benchmarks of Sandhub against baselines measured in the same run"
)]
struct Cli {
    /// Print machine-readable JSON on stdout instead of the table.
    #[arg(long, env = "SANDHUB_BENCH_JSON", global = true)]
    json: bool,

    #[command(subcommand)]
    suite: Suite,
}

#[derive(Debug, Subcommand)]
enum Suite {
    /// sandboxd: exec round trip, file transfer throughput, memory.
    Sandboxd(sandboxd::Args),
    /// hub: claim/create/reset latency, exec via hub vs sandboxd, MCP, Gym, memory;
    /// opt-in phases (images, ports, egress gateway vs host, ...).
    Hub(Box<hub::Args>),
    /// router: sandhub-router vs nginx under wrk (throughput, p50/p99).
    Router(router::Args),
    /// controller: claim→Ready latency of a warm and a cold claim burst.
    Controller(controller::Args),
    /// replicas: 1, 2 and 4 hubs on the test cluster behind one address
    /// (throughput, p50/p99), and one replica killed mid-run.
    Replicas(replicas::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // One thread for the client: its overhead then stays off the cores
    // sandboxd and the kernel need, and the baselines are single-threaded too.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = match cli.suite {
        Suite::Sandboxd(args) => runtime.block_on(sandboxd::run(args))?,
        Suite::Hub(args) => runtime.block_on(hub::run(*args))?,
        Suite::Controller(args) => runtime.block_on(controller::run(args))?,
        Suite::Replicas(args) => runtime.block_on(replicas::run(args))?,
        Suite::Router(args) => router::run_sync(args)?,
    };
    if cli.json {
        report.print_json()?;
    } else {
        report.print_table();
    }
    Ok(())
}
