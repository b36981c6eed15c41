//! `sandhub`: the hub service and its CLI.

fn main() -> anyhow::Result<()> {
    Ok(())
}
