//! The sandboxd suite. Starts the release `sandboxd` on loopback with a
//! temporary root and measures, each next to its baseline in the same run:
//!
//! 1. memory: VmRSS right after startup and one health call (and after
//!    each load phase, for context);
//! 2. exec: the round trip of `true` through gRPC `Execute` vs a plain
//!    fork+exec+wait of `true` in this process;
//! 3. files: REST upload and download of one large file vs `cp` of it on
//!    the same filesystem;
//! 4. against (with `--against-bin`): downloads and exec next to another
//!    sandboxd, upstream's Go daemon or an older build of ours.

mod against;
mod daemon;
mod exec;
mod files;
mod memory;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::ValueEnum;

use self::daemon::Daemon;
use crate::{
    machine::Machine,
    report::{Report, Row, Unit, Value},
};

/// Targets from the design: what "good enough" means for each number.
const EXEC_MAX_RATIO: f64 = 1.5;
const TRANSFER_MIN_RATIO: f64 = 0.5;
const IDLE_RSS_MAX_MIB: f64 = 5.0;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandboxd binary to start [default: $CARGO_TARGET_DIR/release/sandboxd,
    /// or target/release/sandboxd when CARGO_TARGET_DIR is unset].
    #[arg(long, env = "SANDHUB_BENCH_SANDBOXD_BIN")]
    sandboxd_bin: Option<PathBuf>,

    /// Where the temporary sandbox root and the baseline's files go. Both
    /// live under one temp dir here, so `cp` and sandboxd write to the same
    /// filesystem.
    #[arg(long, env = "SANDHUB_BENCH_WORK_DIR", default_value_os_t = std::env::temp_dir())]
    work_dir: PathBuf,

    /// Phases to run, comma-separated (idle memory is always measured).
    #[arg(
        long,
        env = "SANDHUB_BENCH_PHASES",
        value_enum,
        value_delimiter = ',',
        default_value = "exec,files"
    )]
    phases: Vec<Phase>,

    /// Timed exec round trips (each side).
    #[arg(long, env = "SANDHUB_BENCH_EXEC_ITERATIONS", default_value_t = 2000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    exec_iterations: u32,

    /// Untimed exec round trips first (each side): connection setup, page
    /// faults and allocator growth are not what we measure.
    #[arg(long, env = "SANDHUB_BENCH_EXEC_WARMUP", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    exec_warmup: u32,

    /// Size of the transferred file, in MiB.
    #[arg(long, env = "SANDHUB_BENCH_FILE_SIZE_MIB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    file_size_mib: u64,

    /// Transfers per direction and side; the median is reported.
    #[arg(long, env = "SANDHUB_BENCH_FILE_REPEATS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    file_repeats: u32,

    /// Another sandboxd for the `against` phase: upstream's Go daemon
    /// (`go build ./packages/sandboxd/cmd/sandboxd` in kubernetes-sigs/agent-sandbox)
    /// or an older build of ours; which one is told from its `--help`.
    #[arg(long, env = "SANDHUB_BENCH_AGAINST_BIN")]
    against_bin: Option<PathBuf>,

    /// Wall-time cap of each phase in seconds: a phase that reaches it stops
    /// and reports what it measured so far.
    #[arg(long, env = "SANDHUB_BENCH_PHASE_TIMEOUT_SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    phase_timeout_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Phase {
    Exec,
    Files,
    /// Next to `--against-bin` (not in the default set).
    Against,
}

impl Args {
    fn sandboxd_bin(&self) -> PathBuf {
        self.sandboxd_bin.clone().unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
            PathBuf::from(target).join("release").join("sandboxd")
        })
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.phase_timeout_secs)
    }
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let work = tempfile::Builder::new()
        .prefix("sandhub-bench-")
        .tempdir_in(&args.work_dir)
        .with_context(|| format!("creating a temp dir in {}", args.work_dir.display()))?;
    let root = work.path().join("root");
    let outside = work.path().join("outside");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir_all(&outside)?;

    let mut report = Report {
        suite: "sandboxd",
        machine: Machine::probe(work.path()),
        rows: Vec::new(),
        details: Vec::new(),
    };
    let http = reqwest::Client::new();
    let daemon = Daemon::start(&args.sandboxd_bin(), &root).await?;
    report.detail("sandboxd binary", daemon.bin.display());

    daemon.health(&http).await?;
    let idle = memory::sample(daemon.pid())?;
    report.rows.push(Row::absolute(
        "sandboxd RSS, idle (after 1 health call)",
        mib(idle.rss_kib),
        Some(Value::new(IDLE_RSS_MAX_MIB, Unit::Mebibytes)),
    ));
    idle.describe(&mut report, "idle");

    if args.phases.contains(&Phase::Exec) {
        let result = exec::run(
            &daemon.grpc_url,
            args.exec_iterations,
            args.exec_warmup,
            args.deadline(),
        )
        .await?;
        result.describe(&mut report, EXEC_MAX_RATIO);
        let loaded = memory::sample(daemon.pid())?;
        report.rows.push(Row::absolute(
            "sandboxd RSS, after exec load",
            mib(loaded.rss_kib),
            None,
        ));
        loaded.describe(&mut report, "after exec load");
    }

    if args.phases.contains(&Phase::Files) {
        let plan = files::Plan {
            rest_url: &daemon.rest_url,
            root: &root,
            outside: &outside,
            size: args.file_size_mib << 20,
            repeats: args.file_repeats,
            deadline: args.deadline(),
        };
        let result = files::run(&http, &plan).await?;
        result.describe(&mut report, TRANSFER_MIN_RATIO);
        let loaded = memory::sample(daemon.pid())?;
        report.rows.push(Row::absolute(
            "sandboxd RSS, after file load",
            mib(loaded.rss_kib),
            None,
        ));
        loaded.describe(&mut report, "after file load");
    }

    if args.phases.contains(&Phase::Against) {
        let Some(bin) = &args.against_bin else {
            anyhow::bail!("the against phase needs --against-bin");
        };
        let theirs_root = work.path().join("theirs");
        std::fs::create_dir_all(&theirs_root)?;
        let theirs = Daemon::start(bin, &theirs_root).await?;
        let theirs_name = if theirs.upstream {
            "upstream"
        } else {
            "baseline"
        };
        report.detail(format!("{theirs_name} binary"), theirs.bin.display());
        let plan = against::Plan {
            ours: &daemon,
            ours_root: &root,
            theirs: &theirs,
            theirs_root: &theirs_root,
            theirs_name,
            large: args.file_size_mib << 20,
            rounds: args.file_repeats,
            deadline: args.deadline(),
        };
        let result = against::run(&plan, &mut report).await;
        theirs.stop().await;
        result?;
    }

    daemon.stop().await;
    Ok(report)
}

fn mib(kib: u64) -> Value {
    Value::new(kib as f64 / 1024.0, Unit::Mebibytes)
}
