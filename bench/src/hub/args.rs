//! The hub suite's flags, and which phases it runs.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use clap::ValueEnum;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The hub binary to start [default: $CARGO_TARGET_DIR/release/sandhub,
    /// or target/release/sandhub when CARGO_TARGET_DIR is unset].
    #[arg(long, env = "SANDHUB_BENCH_SANDHUB_BIN")]
    pub(super) sandhub_bin: Option<PathBuf>,

    /// An older hub binary to compare with: the selected phases then run
    /// `--rounds` times against each binary, alternating which goes first,
    /// and each row is the median of `--sandhub-bin` over the median of
    /// this one (see `baseline.rs`).
    #[arg(long, env = "SANDHUB_BENCH_BASELINE_BIN")]
    pub(super) baseline_bin: Option<PathBuf>,

    /// Rounds per binary with `--baseline-bin`.
    #[arg(long, env = "SANDHUB_BENCH_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=50))]
    pub(super) rounds: u32,

    /// Parent of the temp dir holding the hub's state dir and log.
    #[arg(long, env = "SANDHUB_BENCH_WORK_DIR", default_value_os_t = std::env::temp_dir())]
    pub(super) work_dir: PathBuf,

    /// Phases to run, comma-separated.
    #[arg(
        long,
        env = "SANDHUB_BENCH_HUB_PHASES",
        value_enum,
        value_delimiter = ',',
        default_value = "warm,cold,reset,exec,mcp,gym,memory"
    )]
    pub(super) phases: Vec<Phase>,

    /// Warm pool size for the warm-claim phase.
    #[arg(long, env = "SANDHUB_BENCH_POOL_REPLICAS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(super) pool_replicas: u32,

    /// Timed warm claims.
    #[arg(long, env = "SANDHUB_BENCH_WARM_CLAIMS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) warm_claims: u32,

    /// Timed cold creates.
    #[arg(long, env = "SANDHUB_BENCH_COLD_CREATES", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) cold_creates: u32,

    /// Suspended sandboxes the cold phase keeps in the store while it
    /// times its creates: a busy hub's rows, which hold no process (the
    /// hub's tenant caps are raised to admit them).
    #[arg(long, env = "SANDHUB_BENCH_COLD_SUSPENDED", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub(super) cold_suspended: u32,

    /// Timed resets of one sandbox.
    #[arg(long, env = "SANDHUB_BENCH_RESETS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) resets: u32,

    /// Timed exec round trips (each side: hub and direct).
    #[arg(long, env = "SANDHUB_BENCH_HUB_EXEC_ITERATIONS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(super) exec_iterations: u32,

    /// Untimed round trips before each exec series (hub/direct and MCP).
    #[arg(long, env = "SANDHUB_BENCH_HUB_EXEC_WARMUP", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub(super) exec_warmup: u32,

    /// Timed MCP `execute_command` calls.
    #[arg(long, env = "SANDHUB_BENCH_MCP_CALLS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(super) mcp_calls: u32,

    /// Pause (and suspend) rounds of the pause phase, each waking the
    /// sandbox twice: by `resume` and by an auto-resuming exec.
    #[arg(long, env = "SANDHUB_BENCH_PAUSE_ROUNDS", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) pause_rounds: u32,

    /// Rounds of the volumes phase (each one clone and one `cp`, one
    /// upload and download on each side).
    #[arg(long, env = "SANDHUB_BENCH_VOLUME_ROUNDS", default_value_t = 6,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(super) volume_rounds: u32,

    /// Timed calls of each kind in the code phase's warm series (REST,
    /// MCP, and the E2B SDK with --code-e2b).
    #[arg(long, env = "SANDHUB_BENCH_CODE_CALLS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) code_calls: u32,

    /// Contexts started (each one kernel) in the code phase, each beside
    /// an exec of python3.
    #[arg(long, env = "SANDHUB_BENCH_CODE_CONTEXTS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(super) code_contexts: u32,

    /// The code-interpreter image's OCI layout, for the code phase
    /// (dev/code-interpreter/build-image.py builds it and prints its path).
    #[arg(long, env = "SANDHUB_CODE_INTERPRETER_IMAGE")]
    pub(super) code_image: Option<PathBuf>,

    /// The code phase also times E2B's code-interpreter SDK (needs
    /// `e2b_code_interpreter` in --e2b-python; the hub then runs with --e2b).
    #[arg(long, env = "SANDHUB_BENCH_CODE_E2B")]
    pub(super) code_e2b: bool,

    /// Timed Gym resets of one env.
    #[arg(long, env = "SANDHUB_BENCH_GYM_RESETS", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) gym_resets: u32,

    /// Timed cold creates of each kind in the image phase.
    #[arg(long, env = "SANDHUB_BENCH_IMAGE_CREATES", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) image_creates: u32,

    /// Timed rounds of the pull phase (each: one curl + tar, one hub pull).
    #[arg(long, env = "SANDHUB_BENCH_PULL_ROUNDS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub(super) pull_rounds: u32,

    /// Envs stepped together in each Gym batch.
    #[arg(long, env = "SANDHUB_BENCH_GYM_ENVS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(super) gym_envs: u32,

    /// Timed Gym batch steps.
    #[arg(long, env = "SANDHUB_BENCH_GYM_BATCHES", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) gym_batches: u32,

    /// Idle sandboxes whose memory is summed.
    #[arg(long, env = "SANDHUB_BENCH_IDLE_SANDBOXES", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) idle_sandboxes: u32,

    /// Wall-time cap of each phase in seconds: a phase that reaches it stops
    /// and reports what it measured so far.
    #[arg(long, env = "SANDHUB_BENCH_PHASE_TIMEOUT_SECS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) phase_timeout_secs: u64,

    /// The Python with the `sandhub` SDK installed, for the sdk phase.
    #[arg(long, env = "SANDHUB_BENCH_PYTHON", default_value = "python3")]
    pub(super) python: PathBuf,

    /// The Python with both `e2b` and `sandhub` installed, for the e2b
    /// phase (scripts/test-deps.sh makes one: $SANDHUB_CACHE/venv-e2b).
    #[arg(long, env = "SANDHUB_BENCH_E2B_PYTHON", default_value = "python3")]
    pub(super) e2b_python: PathBuf,

    /// Rounds of the ports phase (each: one direct wrk run, one through the hub).
    #[arg(long, env = "SANDHUB_BENCH_PORTS_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(super) ports_rounds: u32,

    /// Seconds of each wrk run of the ports phase.
    #[arg(long, env = "SANDHUB_BENCH_PORTS_SECS", default_value_t = 4,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(super) ports_secs: u64,

    /// wrk connections of the ports phase.
    #[arg(long, env = "SANDHUB_BENCH_PORTS_CONNECTIONS", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) ports_connections: u32,

    /// sandhub-router for the ports phase's third side (the router in the
    /// sandbox's network namespace, on the same servers); none: two sides.
    #[arg(long, env = "SANDHUB_BENCH_PORTS_ROUTER_BIN")]
    pub(super) ports_router_bin: Option<PathBuf>,

    /// Rounds of the egress phase (each: download, connects and DNS on the
    /// host and through the gateway, which side first alternating).
    #[arg(long, env = "SANDHUB_BENCH_EGRESS_ROUNDS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(super) egress_rounds: u32,

    /// MiB of each download of the egress phase.
    #[arg(long, env = "SANDHUB_BENCH_EGRESS_DOWNLOAD_MIB", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=16_384))]
    pub(super) egress_download_mib: u32,

    /// Timed TCP connects per side and round of the egress phase.
    #[arg(long, env = "SANDHUB_BENCH_EGRESS_CONNECTS", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) egress_connects: u32,

    /// Timed DNS queries per side, round and kind (same name, new name).
    #[arg(long, env = "SANDHUB_BENCH_EGRESS_DNS_QUERIES", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=30_000))]
    pub(super) egress_dns_queries: u32,

    /// Timed cold creates of each template (egress, none) in the egress phase.
    #[arg(long, env = "SANDHUB_BENCH_EGRESS_CREATES", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) egress_creates: u32,

    /// Idle sandboxes of each template whose hub memory is measured (both
    /// batches run at once; the hub gets tenant caps that admit them).
    #[arg(long, env = "SANDHUB_BENCH_EGRESS_IDLE_SANDBOXES", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub(super) egress_idle_sandboxes: u32,

    /// Idle sandboxes the usage sampler reads each second in phase
    /// `sampler` (fewer if the machine holds fewer before the deadline).
    #[arg(long, env = "SANDHUB_BENCH_SAMPLER_SANDBOXES", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) sampler_sandboxes: u32,

    /// Idle `GET /v1/events` consumers whose hub memory phase `events`
    /// measures.
    #[arg(long, env = "SANDHUB_BENCH_EVENT_CONSUMERS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=15_000))]
    pub(super) event_consumers: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Phase {
    Warm,
    Cold,
    Reset,
    Exec,
    Mcp,
    Gym,
    Memory,
    /// The Python SDK vs the Rust HubClient (not in the default set: it
    /// needs `sandhub` installed for --python).
    Sdk,
    /// Cold create from a cached image vs from the host root (not in the
    /// default set: it builds the test registry's image from Debian
    /// packages first).
    Image,
    /// Pull + unpack of a ~200 MB image from the loopback test registry vs
    /// curl + tar -x (not in the default set: it needs the registry built,
    /// `dev/registry/registry.sh build`, and generates the image first).
    Pull,
    /// Disk use of ten images sharing a base layer vs one image (not in
    /// the default set: it generates the images first).
    Disk,
    /// HTTP through the port proxy vs from the sandbox's own network
    /// namespace (not in the default set: it needs wrk, nsenter and nginx).
    Ports,
    /// E2B `commands.run("true")` vs the sandhub SDK's (not in the default
    /// set: it needs --e2b-python; the hub then runs with --e2b).
    E2b,
    /// The egress gateway vs the host: download, TCP connect and DNS, cold
    /// create of `egress` vs `none`, hub memory per 100 idle sandboxes (not
    /// in the default set: it needs root, `ip` and /dev/net/tun, and builds
    /// its own network namespace, 198.19.0.0/24).
    Egress,
    /// The usage sampler's CPU at `--sampler-sandboxes` idle sandboxes
    /// (not in the default set: it starts hundreds of sandboxes).
    Sampler,
    /// The event stream's cost: hub memory at `--event-consumers` idle
    /// consumers, and warm create p50 at 100/s with live consumers vs none
    /// (not in the default set: it holds ten thousand connections).
    Events,
    /// Exec with trace export on (a second hub, `--otlp-endpoint` to a
    /// loopback sink) vs off (not in the default set).
    Traces,
    /// Named volumes: a clone of 1 GiB in 1,000 files vs `cp -a
    /// --reflink`, and 256 MiB through the volume files API vs the
    /// sandbox files API (not in the default set: it writes a few GiB).
    Volumes,
    /// Pause, resume and auto-resume (after pause and after suspend) vs
    /// exec on a running sandbox and a plain resume (not in the default
    /// set).
    Pause,
    /// The code interpreter: `1+1` in a warm context through REST, MCP
    /// and (with --code-e2b) the E2B SDK, and the first context, each vs
    /// exec of `python3 -c` (not in the default set: it needs
    /// --code-image).
    Code,
}

impl Args {
    pub(super) fn sandhub_bin(&self) -> PathBuf {
        self.sandhub_bin.clone().unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
            PathBuf::from(target).join("release").join("sandhub")
        })
    }

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.phase_timeout_secs)
    }
}
