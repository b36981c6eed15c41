//! sandboxd: the daemon inside every sandbox.

use clap::Parser;
use sandboxd::{server, Config, Daemon};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    sandboxd::logging::init(&config.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let daemon = Daemon::new(config)?;
        server::run(daemon).await
    })
}
