//! sandboxd: the daemon inside every sandbox.

use clap::Parser;
use sandboxd::{server, Config, Daemon};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    sandhub_common::Logging::new(&config.log_format).init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let daemon = Daemon::new(config)?;
        daemon.start_entrypoint();
        server::run(daemon).await
    })
}
