//! Flags every client subcommand shares, and the value parsers they use.

use std::{collections::BTreeMap, time::Duration};

use clap::{Args, ValueEnum};
use sandhub_client::{http::HubClient, Result};

pub const DEFAULT_HUB_URL: &str = "http://127.0.0.1:7070";

/// How the hub is reached and how answers are printed. `global` so that
/// `sandhub pool set --hub URL` and `sandhub pool --hub URL set` both work.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The hub's URL.
    #[arg(long = "hub", value_name = "URL", env = "SANDHUB_URL", default_value = DEFAULT_HUB_URL, global = true)]
    pub hub: String,

    /// Sent as `Authorization: Bearer` (for hubs started with --api-keys-file).
    #[arg(
        long,
        value_name = "KEY",
        env = "SANDHUB_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub api_key: Option<String>,

    /// `text` for people, `json` for scripts.
    #[arg(long, env = "SANDHUB_OUTPUT", value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
}

impl ClientArgs {
    pub fn connect(&self) -> Result<HubClient> {
        HubClient::new(self.hub.clone(), self.api_key.clone())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `KEY=VALUE`; the value may itself contain `=`.
pub fn parse_key_value(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// `--volume NAME:PATH[:ro]`: a named volume and where it is mounted
/// (read-write unless `:ro`). The hub checks the name and the path.
pub fn parse_volume_mount(
    s: &str,
) -> std::result::Result<sandhub_api::volumes::VolumeMount, String> {
    let (name, rest) = s
        .split_once(':')
        .ok_or_else(|| format!("expected NAME:PATH[:ro], got {s:?}"))?;
    let (path, read_only) = match rest.strip_suffix(":ro") {
        Some(p) => (p, true),
        None => (rest.strip_suffix(":rw").unwrap_or(rest), false),
    };
    if name.is_empty() || path.is_empty() {
        return Err(format!("expected NAME:PATH[:ro], got {s:?}"));
    }
    Ok(sandhub_api::volumes::VolumeMount {
        name: name.to_string(),
        path: path.to_string(),
        read_only,
    })
}

/// `30s`, `5m`, `1h30m`, or a bare number of seconds: the parser every
/// Sandhub binary uses for durations.
pub use sandhub_common::parse_duration;

/// Whole seconds for the hub's `*_seconds` fields, rounded up so that a
/// short limit never becomes "none" (0).
pub fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Later pairs win, as with repeated `--env` flags in most tools.
pub fn to_map(pairs: Vec<(String, String)>) -> BTreeMap<String, String> {
    pairs.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values() {
        assert_eq!(
            parse_key_value("a=b=c").unwrap(),
            ("a".to_string(), "b=c".to_string())
        );
        assert_eq!(
            parse_key_value("a=").unwrap(),
            ("a".to_string(), String::new())
        );
        assert!(parse_key_value("=b").is_err());
        assert!(parse_key_value("ab").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(60)), 60);
    }
}
