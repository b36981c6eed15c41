//! `tracing` to stderr, as text or JSON, filtered by `level` and
//! `target=level` directives, comma-separated (`info,sandboxd=debug`), read
//! from `RUST_LOG` unless the caller says otherwise.
//!
//! The filter is `Targets`, not `EnvFilter`: `EnvFilter`'s span and field
//! filters pull a regex engine into the resident memory of every process
//! that builds one (about 250 KiB of text per sandbox's sandboxd) for a
//! feature none of our binaries needs.

use tracing::Level;
use tracing_subscriber::{
    filter::Targets, layer::SubscriberExt, util::SubscriberInitExt, Layer, Registry,
};

/// Another layer beside the log layer, with a filter of its own (the trace
/// exporter of `sandhub-telemetry`: this crate stays free of it).
pub type ExtraLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// How one binary logs. `Logging::new(format).init()` is the usual call.
#[derive(Clone, Copy, Debug)]
pub struct Logging<'a> {
    json: bool,
    ansi: Option<bool>,
    default_level: Level,
    source: Source<'a>,
}

#[derive(Clone, Copy, Debug)]
enum Source<'a> {
    Env(&'a str),
    Directives(&'a str),
}

impl<'a> Logging<'a> {
    /// `format` is the value of a binary's `--log-format`: `json` logs JSON
    /// lines, anything else text. Defaults: `RUST_LOG`, level `info`.
    pub fn new(format: &str) -> Self {
        Self {
            json: format == "json",
            ansi: None,
            default_level: Level::INFO,
            source: Source::Env("RUST_LOG"),
        }
    }

    /// The level when no directive is given (or the directives are not understood).
    pub fn default_level(mut self, level: Level) -> Self {
        self.default_level = level;
        self
    }

    /// Read the directives from this environment variable instead of `RUST_LOG`.
    pub fn env_var(mut self, name: &'a str) -> Self {
        self.source = Source::Env(name);
        self
    }

    /// Use these directives instead of any environment variable (a process
    /// whose environment belongs to someone else, such as a sandbox's init).
    pub fn directives(mut self, directives: &'a str) -> Self {
        self.source = Source::Directives(directives);
        self
    }

    /// The filter these options describe; bad directives are reported on
    /// stderr and replaced by the default level, so a typo never stops a start.
    pub fn filter(&self) -> Targets {
        let owned;
        let directives = match self.source {
            Source::Env(name) => {
                owned = std::env::var(name).ok();
                owned.as_deref().map(|d| (name, d))
            }
            Source::Directives(d) => Some(("log filter", d)),
        };
        match directives {
            Some((from, d)) => filter(Some(d), self.default_level).unwrap_or_else(|e| {
                eprintln!(
                    "{from}={d:?} is not understood ({e}); logging at {}",
                    self.default_level
                );
                Targets::new().with_default(self.default_level)
            }),
            None => Targets::new().with_default(self.default_level),
        }
    }

    /// Colour text logs or not (default: `tracing-subscriber`'s, which
    /// colours unless `NO_COLOR` is set).
    pub fn ansi(mut self, ansi: bool) -> Self {
        self.ansi = Some(ansi);
        self
    }

    /// Installs the global subscriber. Panics if one is installed already.
    pub fn init(self) {
        if let Err(e) = self.try_init() {
            panic!("logging is set up already: {e}");
        }
    }

    /// Installs the global subscriber; fails if one is installed already.
    pub fn try_init(self) -> Result<(), tracing_subscriber::util::TryInitError> {
        self.try_init_with(None)
    }

    /// As [`Logging::try_init`], with `extra` beside the log layer. `extra`
    /// brings its own filter: the log filter (`RUST_LOG`) then applies to the
    /// log layer alone, so `RUST_LOG=warn` quiets the logs without turning
    /// off what `extra` records (the trace exporter's spans are at `info`).
    pub fn try_init_with(
        self,
        extra: Option<ExtraLayer>,
    ) -> Result<(), tracing_subscriber::util::TryInitError> {
        // The log layer's type names the stack below it, so each stack
        // builds its own.
        macro_rules! stderr {
            () => {{
                let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
                match self.ansi {
                    Some(ansi) => stderr.with_ansi(ansi),
                    None => stderr,
                }
            }};
        }
        let Some(extra) = extra else {
            // One global filter: spans and events nobody logs are never made.
            let registry = tracing_subscriber::registry().with(self.filter());
            return if self.json {
                registry.with(stderr!().json()).try_init()
            } else {
                registry.with(stderr!()).try_init()
            };
        };
        let registry = tracing_subscriber::registry().with(extra);
        if self.json {
            registry
                .with(stderr!().json().with_filter(self.filter()))
                .try_init()
        } else {
            registry
                .with(stderr!().with_filter(self.filter()))
                .try_init()
        }
    }
}

/// Parses comma-separated `level` and `target=level` directives; `None` or
/// blank means `default` for every target. As with `EnvFilter`, directives
/// without a bare level leave every other target off (`sandboxd=debug` logs
/// sandboxd only).
pub fn filter(
    directives: Option<&str>,
    default: Level,
) -> Result<Targets, tracing_subscriber::filter::ParseError> {
    match directives.map(str::trim) {
        None | Some("") => Ok(Targets::new().with_default(default)),
        Some(d) => d.parse(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_directives_means_the_default_level_everywhere() {
        for none in [None, Some(""), Some("  ")] {
            let f = filter(none, Level::WARN).unwrap();
            assert!(f.would_enable("anything", &Level::WARN));
            assert!(!f.would_enable("anything", &Level::INFO));
        }
    }

    #[test]
    fn level_and_target_directives() {
        let f = filter(Some("info,sandboxd=debug"), Level::WARN).unwrap();
        assert!(f.would_enable("sandboxd::rest", &Level::DEBUG));
        assert!(!f.would_enable("sandboxd::rest", &Level::TRACE));
        assert!(f.would_enable("hyper", &Level::INFO));
        assert!(!f.would_enable("hyper", &Level::DEBUG));
    }

    #[test]
    fn target_only_directives_leave_other_targets_off() {
        let f = filter(Some("sandhub_router=debug"), Level::INFO).unwrap();
        assert!(f.would_enable("sandhub_router::proxy", &Level::DEBUG));
        assert!(!f.would_enable("kube_runtime", &Level::ERROR));
    }

    #[test]
    fn span_and_regex_filters_are_refused_not_half_applied() {
        // EnvFilter syntax that Targets does not take: the caller falls back
        // to its default level instead.
        assert!(filter(Some("sandboxd[exec{id=1}]=debug"), Level::INFO).is_err());
        assert!(filter(Some("sandboxd=loud"), Level::INFO).is_err());
    }

    #[test]
    fn options_read_given_directives_and_fall_back_on_bad_ones() {
        let f = Logging::new("text")
            .default_level(Level::WARN)
            .directives("sandboxd=trace")
            .filter();
        assert!(f.would_enable("sandboxd", &Level::TRACE));
        let bad = Logging::new("json")
            .default_level(Level::WARN)
            .directives("sandboxd=loud")
            .filter();
        assert!(bad.would_enable("sandboxd", &Level::WARN));
        assert!(!bad.would_enable("sandboxd", &Level::INFO));
    }

    #[test]
    fn options_read_the_named_variable() {
        // A variable no other test or binary sets: the process environment is shared.
        std::env::set_var("SANDHUB_COMMON_TEST_LOG", "error,x=debug");
        let f = Logging::new("text")
            .env_var("SANDHUB_COMMON_TEST_LOG")
            .filter();
        assert!(f.would_enable("x", &Level::DEBUG));
        assert!(!f.would_enable("y", &Level::WARN));
        let unset = Logging::new("text")
            .env_var("SANDHUB_COMMON_TEST_LOG_UNSET")
            .filter();
        assert!(unset.would_enable("y", &Level::INFO));
        assert!(!unset.would_enable("y", &Level::DEBUG));
    }
}
