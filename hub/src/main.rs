//! `sandhub`: the hub service and its CLI.

use clap::{Parser, Subcommand};
use sandhub::{
    cli,
    serve::{self, ServeArgs},
};

#[derive(Debug, Parser)]
#[command(
    name = "sandhub",
    version,
    about = "Isolated sandboxes for AI agents and RL trainers"
)]
struct Cli {
    /// Log format: `text` or `json`.
    #[arg(long, global = true, env = "SANDHUB_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the hub (REST API) on the embedded local backend.
    Serve(Box<ServeArgs>),
    /// MCP on stdio: against --hub, or an embedded local hub without one.
    Mcp(Box<sandhub::mcp::McpArgs>),
    /// Create a sandbox and print its id.
    Create(cli::sandbox::CreateArgs),
    /// List sandboxes.
    Ls(cli::sandbox::ListArgs),
    /// Delete sandboxes.
    Rm(cli::sandbox::RemoveArgs),
    /// Running sandboxes by CPU and memory, refreshed in place (`--once`
    /// prints one table).
    Top(cli::top::TopArgs),
    /// Run a command in a sandbox; exits with the command's exit code.
    ///
    /// Output is streamed as it is produced, stdin and SIGINT/SIGTERM are
    /// forwarded, and --timeout exits 124. CMD is argv, never a shell line:
    /// use `sh -c '...'` for pipes, globs or `&&`.
    Exec(cli::exec::ExecArgs),
    /// An interactive terminal in a sandbox.
    Shell(cli::shell::ShellArgs),
    /// Run code in a stateful kernel of a sandbox: a small REPL, or one
    /// cell with -c (exits 1 if it raised).
    Code(cli::code::CodeArgs),
    /// Copy files between here and a sandbox (`ID:path` on one side).
    Cp(cli::cp::CpArgs),
    /// Forward a local TCP port to a port inside a sandbox (LOCAL:REMOTE).
    PortForward(cli::port_forward::PortForwardArgs),
    /// Warm pools: set, ls, get, rm.
    Pool(cli::pool::PoolArgs),
    /// Named volumes: create, ls, get, rm.
    Volume(cli::volume::VolumeArgs),
    /// Templates: set, ls, get, rm.
    Template(cli::template::TemplateArgs),
    /// Images in the hub's store (local backend): import, ls, rm, prune.
    Image(cli::image::ImageArgs),
    /// Stop a sandbox's processes, keeping its files.
    Suspend(cli::sandbox::IdArgs),
    /// Freeze a sandbox's processes in place (memory, files and sockets
    /// kept, no CPU used) until `resume`.
    Pause(cli::sandbox::IdArgs),
    /// Start a suspended sandbox again on the same files, or thaw a paused one.
    Resume(cli::sandbox::IdArgs),
    /// Drop every change to a sandbox's workspace and kill its processes.
    Reset(cli::sandbox::IdArgs),
    /// Keep a copy of a sandbox's workspace (prints the snapshot id);
    /// `snapshot ls ID`, `snapshot rm ID SNAPSHOT...`.
    Snapshot(cli::snapshot::SnapshotArgs),
    /// A new sandbox from a snapshot of this one; prints its id.
    Fork(cli::sandbox::ForkArgs),
    /// Show a sandbox's network, or narrow it while it runs (`--allow-out`,
    /// `--deny-out`, `--none`): new connections follow at once.
    Network(cli::network::NetworkArgs),
    /// Lifecycle events: what the hub keeps, or `-f` to follow new ones.
    Events(cli::events::EventsArgs),
    /// Kubernetes: the egress gateway in proxy form (HTTP CONNECT, SOCKS5)
    /// for `network: egress` Pods; the `sandhub-egress` Deployment runs it.
    EgressProxy(Box<sandhub::egress_proxy::EgressProxyArgs>),
}

fn main() -> anyhow::Result<()> {
    // A sandbox's first process is this binary again; it must run before
    // any thread exists (user namespaces need a single-threaded process).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__sandbox-init")
    {
        sandhub::local::runtime::init::main(std::env::args_os().skip(2).collect());
    }
    let cli = Cli::parse();
    let otlp = match &cli.command {
        Command::Serve(args) => args.otlp_endpoint.as_deref(),
        Command::Mcp(args) => args.otlp_endpoint.as_deref(),
        _ => None,
    };
    // Kept to the end of main: dropping it flushes the spans still queued.
    let _traces = sandhub_telemetry::init(
        sandhub_common::Logging::new(&cli.log_format),
        otlp,
        "sandhub",
    );
    if sandhub_telemetry::enabled() {
        sandhub_client::propagate::set_injector(sandhub_telemetry::inject_current);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Mcp(args) => sandhub::mcp::run(*args).await,
            Command::Create(args) => cli::exit(cli::sandbox::create(args).await),
            Command::Ls(args) => cli::exit(cli::sandbox::list(args).await),
            Command::Rm(args) => cli::exit(cli::sandbox::remove(args).await),
            Command::Top(args) => cli::exit(cli::top::top(args).await),
            Command::Exec(args) => cli::exit(cli::exec::run(args).await),
            Command::Code(args) => cli::exit(cli::code::run(args).await),
            Command::Shell(args) => cli::exit(cli::shell::run(args).await),
            Command::Cp(args) => cli::exit(cli::cp::run(args).await),
            Command::PortForward(args) => cli::exit(cli::port_forward::run(args).await),
            Command::Pool(args) => cli::exit(cli::pool::run(args).await),
            Command::Volume(args) => cli::exit(cli::volume::run(args).await),
            Command::Template(args) => cli::exit(cli::template::run(args).await),
            Command::Image(args) => cli::exit(cli::image::run(args).await),
            Command::Suspend(args) => cli::exit(cli::sandbox::suspend(args).await),
            Command::Pause(args) => cli::exit(cli::sandbox::pause(args).await),
            Command::Resume(args) => cli::exit(cli::sandbox::resume(args).await),
            Command::Reset(args) => cli::exit(cli::sandbox::reset(args).await),
            Command::Snapshot(args) => cli::exit(cli::snapshot::run(args).await),
            Command::Fork(args) => cli::exit(cli::sandbox::fork(args).await),
            Command::Network(args) => cli::exit(cli::network::run(args).await),
            Command::Events(args) => cli::exit(cli::events::run(args).await),
            Command::EgressProxy(args) => sandhub::egress_proxy::run(*args).await,
        }
    })
}
