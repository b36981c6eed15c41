//! `sandhub`: the hub service and its CLI.

use clap::{Parser, Subcommand};
use sandhub::serve::{self, ServeArgs};

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
    Serve(ServeArgs),
}

fn main() -> anyhow::Result<()> {
    // A sandbox's first process is this binary again; it must run before
    // any thread exists (user namespaces need a single-threaded process).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__sandbox-init")
    {
        sandhub::local::init::main(std::env::args_os().skip(2).collect());
    }
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
        }
    })
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
