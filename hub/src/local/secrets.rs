//! Brokered secrets on the local backend (issue #27 part 3): where values
//! come from (the operator's `--secrets-file`, the tenant's
//! `PUT /v1/secrets/{name}` in the store), the placeholders sandboxes get
//! instead, and what the gateway is handed. The tenant-facing calls
//! (`/v1/secrets`, the create-time check) are in `tenant_secrets.rs`.
//!
//! Values never leave the hub's process toward a sandbox: not in its
//! environment, its files, the runtime JSON of its row (which records
//! names and placeholders only), nor a log line (`Debug` of a gateway
//! secret leaves the value out).

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::PermissionsExt,
    path::Path,
};

use anyhow::Context;
use sandhub_api::{
    error::Code,
    secrets::{SecretRef, PLACEHOLDER_PREFIX},
    validate,
};
use sandhub_client::{Error, Result};
use sandhub_gateway::broker::Secret;

use super::runtime;

/// The operator's values, per tenant (`--secrets-file`).
#[derive(Default)]
pub struct OperatorSecrets(HashMap<String, BTreeMap<String, String>>);

impl std::fmt::Debug for OperatorSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSecrets")
            .field("tenants", &self.0.len())
            .finish()
    }
}

impl OperatorSecrets {
    /// Reads a `--secrets-file`: a JSON object of tenants, each an object
    /// of names to values (`{"default": {"OPENAI_API_KEY": "sk-..."}}`;
    /// `default` is the tenant of a hub without API keys). It must be
    /// readable by its owner only (0600 or stricter). Errors name the
    /// tenant and the secret, never a value.
    pub fn load(path: &Path) -> anyhow::Result<OperatorSecrets> {
        let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "{}: mode {:o}; a secrets file must be readable by its owner only (chmod 600)",
                path.display(),
                mode & 0o777
            );
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let all: HashMap<String, BTreeMap<String, String>> = serde_json::from_str(&text)
            .map_err(|e| {
                // serde's message may quote the input: only its position.
                anyhow::anyhow!(
                    "{}: not a JSON object of tenants to {{name: value}} objects (line {}, column {})",
                    path.display(),
                    e.line(),
                    e.column()
                )
            })?;
        for (tenant, secrets) in &all {
            for (name, value) in secrets {
                validate::secret_name(name)
                    .and_then(|()| validate::secret_value(name, value))
                    .map_err(|e| {
                        anyhow::anyhow!("{} tenant {tenant:?}: {}", path.display(), e.message)
                    })?;
            }
        }
        Ok(OperatorSecrets(all))
    }

    pub(super) fn get(&self, tenant: &str, name: &str) -> Option<&String> {
        self.0.get(tenant)?.get(name)
    }

    pub(super) fn names(&self, tenant: &str) -> impl Iterator<Item = &String> {
        self.0.get(tenant).into_iter().flat_map(|m| m.keys())
    }
}

/// A fresh placeholder: the prefix and 128 random bits, so one sandbox's
/// placeholder is never guessed by another.
pub fn placeholder() -> String {
    format!("{PLACEHOLDER_PREFIX}{:032x}", rand::random::<u128>())
}

/// The environment a sandbox with secrets gets beyond its placeholders:
/// the bundle with the hub's CA wherever common tools look for one.
pub fn ca_env() -> impl Iterator<Item = (String, String)> {
    let bundle = format!("/etc/{}", runtime::CA_BUNDLE);
    let ca = format!("/etc/{}", runtime::CA_FILE);
    [
        ("SSL_CERT_FILE", bundle.clone()),
        ("REQUESTS_CA_BUNDLE", bundle.clone()),
        ("CURL_CA_BUNDLE", bundle.clone()),
        ("GIT_SSL_CAINFO", bundle),
        // Node adds this file to its own bundled roots.
        ("NODE_EXTRA_CA_CERTS", ca),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
}

/// The gateway's secrets of one sandbox: its list, the placeholders it
/// was given and the values.
pub fn for_gateway(
    list: &[SecretRef],
    placeholders: &BTreeMap<String, String>,
    values: &BTreeMap<String, String>,
) -> Result<Vec<Secret>> {
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let field = format!("secrets[{i}] {:?}", s.name);
            let hosts = validate::secret_ref(&field, s)?;
            let header = http::HeaderName::from_bytes(s.header.as_bytes())
                .map_err(|e| Error::new(Code::InvalidArgument, format!("{field}.header: {e}")))?;
            Ok(Secret {
                name: s.name.clone(),
                placeholder: placeholders
                    .get(&s.name)
                    .cloned()
                    .ok_or_else(|| Error::internal(format!("{field}: no placeholder recorded")))?,
                value: values
                    .get(&s.name)
                    .cloned()
                    .ok_or_else(|| missing(&s.name))?,
                hosts,
                header,
                format: s.format.clone(),
            })
        })
        .collect()
}

pub(super) fn missing(name: &str) -> Error {
    Error::new(
        Code::FailedPrecondition,
        format!(
            "secret {name:?} has no value: set it with `PUT /v1/secrets/{name}` (or ask the \
             operator to add it to --secrets-file)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::hub::{Network, Template};

    #[test]
    fn the_secrets_file_is_private_checked_and_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secrets.json");
        std::fs::write(
            &p,
            r#"{"default": {"OPENAI_API_KEY": "sk-1-long-enough"}, "bob": {"K": "v-long-enough"}}"#,
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(OperatorSecrets::load(&p)
            .unwrap_err()
            .to_string()
            .contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = OperatorSecrets::load(&p).unwrap();
        assert_eq!(
            s.get("default", "OPENAI_API_KEY").unwrap(),
            "sk-1-long-enough"
        );
        assert!(s.get("bob", "OPENAI_API_KEY").is_none());
        assert!(!format!("{s:?}").contains("sk-1"));
        std::fs::write(&p, r#"{"default": {"K": "line\nbreak-sk-2-long"}}"#).unwrap();
        let e = OperatorSecrets::load(&p).unwrap_err().to_string();
        assert!(e.contains("\"K\"") && !e.contains("sk-2"), "{e}");
        std::fs::write(&p, r#"{"default": ["sk-3"]}"#).unwrap();
        let e = OperatorSecrets::load(&p).unwrap_err().to_string();
        assert!(!e.contains("sk-3"), "{e}");
    }

    #[test]
    fn placeholders_are_random_and_marked() {
        let (a, b) = (placeholder(), placeholder());
        assert_ne!(a, b);
        assert!(a.starts_with(PLACEHOLDER_PREFIX) && a.len() == PLACEHOLDER_PREFIX.len() + 32);
    }

    #[test]
    fn placeholders_are_made_once_and_kept_across_launches() {
        let secret = |name: &str| -> SecretRef {
            serde_json::from_value(serde_json::json!({
                "name": name, "hosts": ["api.test"], "header": "Authorization"}))
            .unwrap()
        };
        let net: sandhub_api::hub::NetworkSpec = Network::Egress.into();
        let t = Template {
            network: net.clone(),
            secrets: vec![secret("A")],
            ..Default::default()
        };
        let mut row = super::super::store::SandboxRow {
            id: "sb-1".into(),
            tenant: "t".into(),
            template: "web".into(),
            state: sandhub_api::hub::SandboxState::Pending,
            labels: Default::default(),
            env: Default::default(),
            launch: sandhub_api::hub::Launch::Cold,
            created_at: 0,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: 0,
            pool: None,
            claimed: true,
            forked_from: None,
            // The create request added B.
            runtime: Some(super::super::egress::Recorded::pre_launch(
                &net,
                None,
                vec![secret("B")],
            )),
        };
        let first = super::super::egress::Recorded::for_launch(&row, &t).unwrap();
        let names: Vec<&str> = first.secrets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["A", "B"]);
        assert_eq!(first.mode(), Network::Egress);
        let env = first.secret_env();
        assert!(env
            .iter()
            .any(|(k, v)| k == "A" && v.starts_with("sandhub-secret-")));
        assert!(env.iter().any(|(k, _)| k == "SSL_CERT_FILE"));
        // No value is ever in the record.
        row.runtime = Some(serde_json::json!({ super::super::egress::RECORD_KEY: first.clone() }));
        let again = super::super::egress::Recorded::for_launch(&row, &t).unwrap();
        assert_eq!(again.placeholders, first.placeholders);
        assert_eq!(again.request_secrets.len(), 1);
        // A request naming the template's secret again is refused.
        row.runtime = Some(super::super::egress::Recorded::pre_launch(
            &net,
            None,
            vec![secret("A")],
        ));
        assert!(super::super::egress::Recorded::for_launch(&row, &t).is_err());
    }
}
