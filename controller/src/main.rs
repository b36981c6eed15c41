//! sandhub-controller: `crd` prints the CRDs; otherwise run the controllers.

use clap::Parser;
use sandhub_controller::flags::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crd) => {
            print!("{}", sandhub_controller::crdgen::crds_yaml());
            Ok(())
        }
        Some(Command::Run) | None => anyhow::bail!("not yet"),
    }
}
