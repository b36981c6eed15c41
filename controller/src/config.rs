//! The optional `agent-sandbox-config` ConfigMap in the controller's namespace.
//!
//! Two uses, as upstream v1.0.9:
//! - tuning flags for installs that cannot edit the Deployment's args (OLM): an allowlist of
//!   keys named like the flags, read once at startup; flags given on the command line or by
//!   environment win; unknown keys are logged and ignored; an invalid value stops the start;
//! - `allowed-label-domains`, the label-domain allowlist for claims' `additionalPodMetadata`
//!   (upstream mounts it as a file; we watch the ConfigMap, so edits apply without restart).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::flags::Cli;

pub const CONFIG_MAP_NAME: &str = "agent-sandbox-config";
pub const ALLOWED_LABEL_DOMAINS_KEY: &str = "allowed-label-domains";
/// Used when the ConfigMap or its key is absent.
pub const DEFAULT_ALLOWED_LABEL_DOMAINS: [&str; 1] = ["sandbox.users.io"];

/// Flags the ConfigMap may set (19, as upstream: API client, workers, warm pool, events,
/// write-behind).
pub const TUNING_KEYS: [&str; 19] = [
    "kube-api-qps",
    "kube-api-burst",
    "api-connections",
    "separate-watch-connection",
    "cache-label-selectors",
    "sandbox-concurrent-workers",
    "sandbox-claim-concurrent-workers",
    "sandbox-warm-pool-concurrent-workers",
    "sandbox-template-concurrent-workers",
    "sandbox-warm-pool-max-batch-size",
    "sandbox-warm-pool-replenish-delay",
    "sandbox-warm-pool-max-refill-rate",
    "sandbox-warm-pool-readiness-grace-period",
    "sandbox-warm-pool-unschedulable-recheck-interval",
    "enable-warm-pool-eviction",
    "disable-claim-events",
    "disable-claim-observability-annotations",
    "sandbox-write-behind-window",
    "cluster-domain",
];

/// Re-parses the command line with the ConfigMap's tuning keys added for every flag the
/// user did not set. Returns the new CLI and the keys that were ignored (unknown).
pub fn apply_tuning_overrides(
    args: &[String],
    matches: &ArgMatches,
    data: &BTreeMap<String, String>,
) -> Result<(Cli, Vec<String>), String> {
    let mut extra = Vec::new();
    let mut ignored = Vec::new();
    for (key, value) in data {
        if key == ALLOWED_LABEL_DOMAINS_KEY {
            continue;
        }
        if !TUNING_KEYS.contains(&key.as_str()) {
            ignored.push(key.clone());
            continue;
        }
        let id = key.replace('-', "_");
        match matches.value_source(&id) {
            Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable) => continue,
            _ => extra.push(format!("--{key}={}", value.trim())),
        }
    }
    let all: Vec<String> = args.iter().cloned().chain(extra).collect();
    let mut cmd = Cli::command();
    let matches = cmd.try_get_matches_from_mut(&all).map_err(|e| {
        format!(
            "ConfigMap {CONFIG_MAP_NAME}: {}",
            e.render().to_string().trim()
        )
    })?;
    let cli =
        Cli::from_arg_matches(&matches).map_err(|e| format!("ConfigMap {CONFIG_MAP_NAME}: {e}"))?;
    Ok((cli, ignored))
}

/// Comma- or newline-separated domains, trimmed and lowercased; empty entries dropped.
pub fn parse_label_domains(raw: &str) -> Vec<String> {
    raw.split([',', '\n'])
        .map(|d| d.trim().trim_end_matches('/').to_ascii_lowercase())
        .filter(|d| !d.is_empty())
        .collect()
}

fn domains_from(cm: Option<&ConfigMap>) -> Vec<String> {
    cm.and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get(ALLOWED_LABEL_DOMAINS_KEY))
        .map(|raw| parse_label_domains(raw))
        .unwrap_or_else(|| {
            DEFAULT_ALLOWED_LABEL_DOMAINS
                .iter()
                .map(|s| s.to_string())
                .collect()
        })
}

/// Settings that may change while the controller runs; readers take a cheap snapshot.
#[derive(Debug)]
pub struct SharedConfig {
    allowed_label_domains: RwLock<Arc<Vec<String>>>,
}

impl Default for SharedConfig {
    fn default() -> Self {
        Self {
            allowed_label_domains: RwLock::new(Arc::new(domains_from(None))),
        }
    }
}

impl SharedConfig {
    pub fn from_config_map(cm: Option<&ConfigMap>) -> Self {
        Self {
            allowed_label_domains: RwLock::new(Arc::new(domains_from(cm))),
        }
    }

    /// Label domains a claim's `additionalPodMetadata.labels` may use (subdomains allowed).
    pub fn allowed_label_domains(&self) -> Arc<Vec<String>> {
        self.allowed_label_domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_allowed_label_domains(&self, domains: Vec<String>) {
        *self
            .allowed_label_domains
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(domains);
    }

    fn update(&self, cm: Option<&ConfigMap>) {
        let domains = domains_from(cm);
        if *self.allowed_label_domains() != domains {
            tracing::info!(?domains, "label-domain allowlist updated");
            self.set_allowed_label_domains(domains);
        }
    }
}

/// Reads the ConfigMap once (None when absent).
pub async fn read_config_map(client: &Client, namespace: &str) -> kube::Result<Option<ConfigMap>> {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(CONFIG_MAP_NAME)
        .await
}

/// Keeps `shared` in step with the ConfigMap until the process ends.
pub async fn watch_config_map(client: Client, namespace: String, shared: Arc<SharedConfig>) {
    let api = Api::<ConfigMap>::namespaced(client, &namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP_NAME}"));
    let mut stream = watcher(api, cfg).boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(cm)) | Ok(watcher::Event::InitApply(cm)) => {
                shared.update(Some(&cm))
            }
            Ok(watcher::Event::Delete(_)) => shared.update(None),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "agent-sandbox-config watch error (retrying)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        std::iter::once("sandhub-controller")
            .chain(list.iter().copied())
            .map(String::from)
            .collect()
    }

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn config_map_sets_unset_flags_but_command_line_wins() {
        let argv = args(&["--sandbox-concurrent-workers=7"]);
        let matches = Cli::command().get_matches_from(&argv);
        let cm = data(&[
            ("sandbox-concurrent-workers", "99"),
            ("sandbox-claim-concurrent-workers", "12"),
            ("sandbox-warm-pool-readiness-grace-period", "30s"),
            ("no-such-flag", "1"),
            (ALLOWED_LABEL_DOMAINS_KEY, "example.com"),
        ]);
        let (cli, ignored) = apply_tuning_overrides(&argv, &matches, &cm).unwrap();
        assert_eq!(cli.flags.sandbox_concurrent_workers, 7);
        assert_eq!(cli.flags.sandbox_claim_concurrent_workers, 12);
        assert_eq!(
            cli.flags.sandbox_warm_pool_readiness_grace_period.as_secs(),
            30
        );
        assert_eq!(ignored, vec!["no-such-flag".to_string()]);
    }

    #[test]
    fn invalid_value_is_an_error_naming_the_config_map() {
        let argv = args(&[]);
        let matches = Cli::command().get_matches_from(&argv);
        let err = apply_tuning_overrides(
            &argv,
            &matches,
            &data(&[("sandbox-concurrent-workers", "lots")]),
        )
        .unwrap_err();
        assert!(err.contains(CONFIG_MAP_NAME), "{err}");
        assert!(err.contains("lots"), "{err}");
    }

    #[test]
    fn label_domains_split_on_commas_and_newlines() {
        assert_eq!(
            parse_label_domains(" a.io, B.io\n\nc.io/ "),
            vec!["a.io", "b.io", "c.io"]
        );
        assert_eq!(
            *SharedConfig::default().allowed_label_domains(),
            vec!["sandbox.users.io".to_string()]
        );
    }
}
