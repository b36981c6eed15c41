use clap::Parser;
fn main() -> anyhow::Result<()> {
    let config = sandboxd::Config::parse();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async { sandboxd::server::run(sandboxd::Daemon::new(config)?).await })
}
