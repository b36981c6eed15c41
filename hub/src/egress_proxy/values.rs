//! Secret values for the proxy: the tenants' Secrets (kube/secrets.rs),
//! kept by a watch of the label they carry, and the operator's
//! `--secrets-file` (the hub's own, mounted here too), a tenant's value
//! winning over the operator's as on the local backend.
//!
//! A claim names its tenant by label digest only, so the operator's file
//! is keyed by that digest here. What the broker gets is built from the
//! claim's record (secret specs and placeholders, which are not secret)
//! and these values at each new connection, so a `PUT /v1/secrets` applies
//! to the next one.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use kube::{
    runtime::{
        reflector::{self, ObjectRef, Store},
        watcher, WatchStreamExt,
    },
    Api, Client,
};
use sandhub_api::validate;
use sandhub_gateway::broker::Secret;

use crate::{
    kube::{
        egress::Recorded,
        secrets::{object_name, value_of, SECRETS_LABEL, SECRETS_LABEL_VALUE},
        tenant_label_value,
    },
    secrets_file::OperatorSecrets,
};

/// Where values come from.
pub struct Values {
    store: Option<Store<KubeSecret>>,
    namespace: String,
    /// Tenant label digest → name → value.
    operator: HashMap<String, BTreeMap<String, String>>,
}

impl Values {
    /// Watches the tenants' Secrets in `namespace`.
    pub fn watch(client: &Client, namespace: &str, operator: &OperatorSecrets) -> Values {
        let api: Api<KubeSecret> = Api::namespaced(client.clone(), namespace);
        let (reader, writer) = reflector::store();
        let selector = format!("{SECRETS_LABEL}={SECRETS_LABEL_VALUE}");
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default().labels(&selector)),
        )
        .default_backoff()
        .for_each(|_| futures::future::ready(()));
        tokio::spawn(stream);
        Values {
            store: Some(reader),
            namespace: namespace.to_string(),
            operator: by_label(operator),
        }
    }

    /// The value of secret `name` for the tenant labelled `tenant`.
    fn value(&self, tenant: &str, name: &str) -> Option<String> {
        let own = self.store.as_ref().and_then(|s| {
            let obj = s.get(&ObjectRef::new(&object_name(tenant)).within(&self.namespace))?;
            value_of(&obj, name)
        });
        own.or_else(|| self.operator.get(tenant)?.get(name).cloned())
    }

    /// The broker's secrets of a sandbox: each one its record lists that
    /// has a placeholder and a value now. One without a value (deleted
    /// since the create) is left out: its placeholder then goes out as
    /// the workload wrote it, never anything else.
    pub fn secrets(&self, sandbox: &str, tenant: &str, r: &Recorded) -> Vec<Secret> {
        let mut out = Vec::new();
        for (i, s) in r.secrets.iter().enumerate() {
            let field = format!("secrets[{i}] {:?}", s.name);
            let Ok(hosts) = validate::secret_ref(&field, s) else {
                continue; // the hub validated it; a record that does not parse brokers nothing
            };
            let Ok(header) = http::HeaderName::from_bytes(s.header.as_bytes()) else {
                continue;
            };
            let (Some(placeholder), Some(value)) =
                (r.placeholders.get(&s.name), self.value(tenant, &s.name))
            else {
                tracing::debug!(sandbox, secret = %s.name, "egress proxy: a secret without a value now");
                continue;
            };
            out.push(Secret {
                name: s.name.clone(),
                placeholder: placeholder.clone(),
                value,
                hosts,
                header,
                format: s.format.clone(),
            });
        }
        out
    }
}

/// The operator's values keyed by the tenant label digest claims carry.
fn by_label(operator: &OperatorSecrets) -> HashMap<String, BTreeMap<String, String>> {
    operator
        .tenants()
        .map(|(tenant, values)| (tenant_label_value(tenant), values.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::{egress::TemplateNetwork, secrets::new_object};

    #[test]
    fn a_sandbox_gets_its_tenants_values_over_the_operators_and_nothing_of_another() {
        let (tenant, other) = (tenant_label_value("alice"), tenant_label_value("bob"));
        let spec = |name: &str| -> sandhub_api::secrets::SecretRef {
            serde_json::from_value(serde_json::json!({
                "name": name, "hosts": ["api.test"], "header": "Authorization",
                "format": "Bearer {value}"}))
            .unwrap()
        };
        let t = TemplateNetwork {
            network: sandhub_api::hub::Network::Egress.into(),
            egress_mb: None,
            secrets: vec![spec("A"), spec("B"), spec("C")],
        };
        let r = Recorded::new(&t, None, &[]).unwrap();
        let (reader, mut writer) = reflector::store();
        let mut obj = new_object("alice");
        obj.metadata.namespace = Some("ns".into());
        crate::kube::secrets::with_value(&mut obj, "A", "tenant-value-A", 1);
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
        let values = Values {
            store: Some(reader),
            namespace: "ns".into(),
            operator: HashMap::from([
                (
                    tenant.clone(),
                    BTreeMap::from([
                        ("A".to_string(), "operator-value-A".to_string()),
                        ("B".to_string(), "operator-value-B".to_string()),
                    ]),
                ),
                (
                    other.clone(),
                    BTreeMap::from([("C".to_string(), "bobs-value-C".to_string())]),
                ),
            ]),
        };
        let got = values.secrets("sb-1", &tenant, &r);
        let pairs: Vec<(&str, &str)> = got
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(pairs, [("A", "tenant-value-A"), ("B", "operator-value-B")]);
        assert_eq!(got[0].placeholder, r.placeholders["A"]);
        assert_eq!(got[0].formatted(), "Bearer tenant-value-A");
        assert!(got[0].applies("api.test", 443) && !got[0].applies("other.test", 443));
        // Bob's values never reach Alice's sandbox, nor hers his.
        assert!(values
            .secrets("sb-2", &other, &r)
            .iter()
            .all(|s| s.value == "bobs-value-C"));
    }
}
