//! `tracing` to stderr, as text or JSON, filtered by `RUST_LOG` (default
//! `info`). Shared by every Sandhub binary that links this crate.
//!
//! `RUST_LOG` takes `level` and `target=level` directives, comma-separated
//! (`info,sandboxd=debug`): `Targets`, not `EnvFilter`, whose span and field
//! filters pull a regex engine into every sandbox's resident memory
//! (about 250 KiB of text) for a feature nobody sets on a sandbox.

use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};

pub fn init(format: &str) {
    let info = || Targets::new().with_default(tracing::Level::INFO);
    let filter = match std::env::var("RUST_LOG") {
        Ok(d) if !d.trim().is_empty() => d.parse::<Targets>().unwrap_or_else(|e| {
            eprintln!("RUST_LOG={d:?} is not understood ({e}); logging at info");
            info()
        }),
        _ => info(),
    };
    let registry = tracing_subscriber::registry().with(filter);
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if format == "json" {
        registry.with(stderr.json()).init();
    } else {
        registry.with(stderr).init();
    }
}
