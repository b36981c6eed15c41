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

use std::collections::BTreeMap;

use sandhub_api::{
    error::Code,
    secrets::{SecretRef, PLACEHOLDER_PREFIX},
    validate,
};
use sandhub_client::{Error, Result};
use sandhub_gateway::broker::Secret;

use super::runtime;

pub use crate::secrets_file::OperatorSecrets;

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
            idle_action: sandhub_api::hub::IdleAction::Delete,
            auto_resume: false,
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
