//! sandboxd: the daemon inside every sandbox.

use clap::Parser;
use sandboxd::{server, Config, Daemon};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    init_logging(&config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let daemon = Daemon::new(config)?;
        server::run(daemon).await
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
