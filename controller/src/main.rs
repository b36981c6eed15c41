//! sandhub-controller: `crd` prints the CRDs; otherwise run the controllers
//! (see `app::run` for the start-up order).

use clap::{CommandFactory, FromArgMatches};
use sandhub_controller::flags::{Cli, Command};
use sandhub_controller::{app, crdgen};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let matches = Cli::command().get_matches_from(&args);
    let cli = Cli::from_arg_matches(&matches)?;
    match cli.command {
        Some(Command::Crd) => {
            print!("{}", crdgen::crds_yaml());
            Ok(())
        }
        Some(Command::Run) | None => {
            // kube-runtime makes a `reconciling object` span per reconcile;
            // with an endpoint they are exported. Dropping the guard (after
            // the runtime) flushes what is queued.
            let _traces = sandhub_telemetry::init(
                sandhub_common::Logging::new(&cli.flags.log_format),
                cli.flags.otlp_endpoint.as_deref(),
                "sandhub-controller",
            );
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(app::run(args, matches, cli.flags))
        }
    }
}
