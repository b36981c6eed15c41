//! sandboxd: the daemon inside every sandbox.

use clap::Parser;
use sandboxd::{server, Config, Daemon};

fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    // Kept to the end of main: dropping it flushes the spans still queued.
    let _traces = sandhub_telemetry::init(
        sandhub_common::Logging::new(&config.log_format),
        config.otlp_endpoint.as_deref(),
        "sandboxd",
    );
    if let (Some(ca), Some(out)) = (&config.extra_ca_file, &config.ca_bundle_out) {
        // Never fatal: without it only brokered hosts fail their TLS.
        if let Err(e) = sandboxd::trust::write_bundle(ca, out, sandboxd::trust::SYSTEM_BUNDLES) {
            tracing::warn!(out = %out.display(), error = %e, "writing the CA bundle");
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let daemon = Daemon::new(config)?;
        daemon.start_entrypoint();
        server::run(daemon).await
    })
}
