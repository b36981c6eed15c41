//! Brokered secrets' values on the kubernetes backend: one Kubernetes
//! Secret per tenant in the hub's namespace, which `PUT`/`GET`/`DELETE
//! /v1/secrets` write and only `sandhub egress-proxy` reads values from.
//!
//! Why Secrets (and not the hub's memory or a database): hubs on
//! Kubernetes are stateless replicas, and the proxy replicas must see a
//! value the moment any hub stored it; a labelled Secret is both, and
//! the proxy follows it by a watch. A value is never in a Pod, a claim,
//! an annotation or a log: Pods get placeholders (`kube/egress.rs`).
//!
//! The object: [`object_name`] from the tenant's label digest (a name
//! never carries a tenant's name), labels [`SECRETS_LABEL`]`=tenant` and
//! the tenant label, one data key per secret name (secret names are
//! `[A-Za-z_][A-Za-z0-9_]*`, valid data keys), and the update times in
//! [`UPDATED_ANNOTATION`] (names and times only). Writes replace the
//! object at the resourceVersion read, retried on a conflict, so two hub
//! replicas writing one tenant's secrets never lose either write (the
//! calls are `tenant/secrets.rs`; the object's rules, which the proxy
//! shares, are here).

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Secret, ByteString};
use kube::api::ObjectMeta;
use sandhub_api::{secrets::MAX_TENANT_SECRETS, validate};

use super::model::{tenant_label_value, TENANT_LABEL};

/// The label every tenant-values Secret carries (the proxy's watch
/// selects it): `sandhub.io/secrets=tenant`.
pub const SECRETS_LABEL: &str = "sandhub.io/secrets";
pub const SECRETS_LABEL_VALUE: &str = "tenant";
/// Annotation: `{name: updated_at_ms}` of the values in the Secret.
pub const UPDATED_ANNOTATION: &str = "sandhub.io/secrets-updated";

/// The Secret of the tenant whose label digest is `tenant_label`.
pub fn object_name(tenant_label: &str) -> String {
    format!("sandhub-secrets-{tenant_label}")
}

/// A new, empty values Secret for `tenant`.
pub fn new_object(tenant: &str) -> Secret {
    let label = tenant_label_value(tenant);
    Secret {
        metadata: ObjectMeta {
            name: Some(object_name(&label)),
            labels: Some(BTreeMap::from([
                (SECRETS_LABEL.to_string(), SECRETS_LABEL_VALUE.to_string()),
                (TENANT_LABEL.to_string(), label),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

pub(super) fn updated(s: &Secret) -> BTreeMap<String, i64> {
    s.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(UPDATED_ANNOTATION))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

fn set_updated(s: &mut Secret, times: &BTreeMap<String, i64>) {
    s.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            UPDATED_ANNOTATION.to_string(),
            serde_json::to_string(times).unwrap_or_default(),
        );
}

/// The value `name` holds in `s`, if it is one a request could have put
/// there (the Secret is the hub's, but anyone with write access to the
/// namespace could edit it: a value that would not pass `PUT` is none).
pub fn value_of(s: &Secret, name: &str) -> Option<String> {
    let bytes = s.data.as_ref()?.get(name)?;
    let v = String::from_utf8(bytes.0.clone()).ok()?;
    validate::secret_value(name, &v).ok().map(|()| v)
}

/// Bytes of names and values one tenant's Secret holds at most: the API
/// server refuses a Secret over 1 MiB, and [`MAX_TENANT_SECRETS`] values
/// of the largest size would be 2 MiB, so the cap is said here, as
/// RESOURCE_EXHAUSTED, not found out as an API error.
pub const MAX_VALUES_BYTES: usize = 768 * 1024;

/// `s` with `name` set to `value` at `now`; `false`: the tenant is at
/// [`MAX_TENANT_SECRETS`] and `name` is a new one, or the values would
/// pass [`MAX_VALUES_BYTES`].
pub fn with_value(s: &mut Secret, name: &str, value: &str, now: i64) -> bool {
    let data = s.data.get_or_insert_with(BTreeMap::new);
    if !data.contains_key(name) && data.len() >= MAX_TENANT_SECRETS {
        return false;
    }
    let others: usize = data
        .iter()
        .filter(|(k, _)| k.as_str() != name)
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    if others + name.len() + value.len() > MAX_VALUES_BYTES {
        return false;
    }
    data.insert(name.to_string(), ByteString(value.as_bytes().to_vec()));
    let mut times = updated(s);
    times.insert(name.to_string(), now);
    set_updated(s, &times);
    true
}

/// `s` without `name`; `false` when it had none.
pub fn without(s: &mut Secret, name: &str) -> bool {
    let had = s.data.as_mut().is_some_and(|d| d.remove(name).is_some());
    let mut times = updated(s);
    times.remove(name);
    set_updated(s, &times);
    had
}

/// The JSON merge patch from `old` to `new`: their data (a key `new` has
/// not is `null`: removed), `new`'s annotations, and `old`'s
/// resourceVersion, so the write fails with 409 if anyone wrote between.
pub fn merge_patch(old: &Secret, new: &Secret) -> serde_json::Value {
    let mut data = serde_json::Map::new();
    for k in old.data.iter().flat_map(|d| d.keys()) {
        data.insert(k.clone(), serde_json::Value::Null);
    }
    for (k, v) in new.data.iter().flatten() {
        data.insert(k.clone(), serde_json::to_value(v).unwrap_or_default());
    }
    serde_json::json!({
        "metadata": {
            "resourceVersion": old.metadata.resource_version,
            "annotations": new.metadata.annotations,
        },
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_values_object_is_named_by_digest_bounded_and_never_annotated_with_a_value() {
        let mut s = new_object("alice");
        let name = s.metadata.name.clone().unwrap();
        assert!(!name.contains("alice") && name.len() <= 63, "{name}");
        let labels = s.metadata.labels.clone().unwrap();
        assert_eq!(labels[SECRETS_LABEL], SECRETS_LABEL_VALUE);
        assert_eq!(labels[TENANT_LABEL], tenant_label_value("alice"));
        assert_eq!(name, object_name(&labels[TENANT_LABEL]));
        assert!(with_value(&mut s, "K", "value-long-enough", 7));
        assert_eq!(value_of(&s, "K").as_deref(), Some("value-long-enough"));
        assert_eq!(updated(&s)["K"], 7);
        let meta = serde_json::to_string(&s.metadata).unwrap();
        assert!(!meta.contains("value-long-enough"), "{meta}");
        // The cap counts names: a new one past it is refused, a known one replaced.
        for i in 1..MAX_TENANT_SECRETS {
            assert!(with_value(&mut s, &format!("N{i}"), "value-long-enough", 1));
        }
        assert!(!with_value(&mut s, "ONE_MORE", "value-long-enough", 1));
        assert!(with_value(&mut s, "K", "other-value-long", 8));
        let mut old = s.clone();
        old.metadata.resource_version = Some("42".into());
        assert!(without(&mut s, "K") && !without(&mut s, "K"));
        let p = merge_patch(&old, &s);
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert!(p["data"]["K"].is_null());
        assert_eq!(
            p["data"]["N1"],
            serde_json::json!(ByteString(b"value-long-enough".to_vec()))
        );
        assert!(!updated(&s).contains_key("K"));
        // The bytes are capped below the API server's 1 MiB per Secret.
        let mut big = new_object("bob");
        let v = "v".repeat(sandhub_api::secrets::MAX_SECRET_VALUE);
        let fits = MAX_VALUES_BYTES / (v.len() + 4);
        for i in 0..fits {
            assert!(with_value(&mut big, &format!("K{i:03}"), &v, 1), "{i}");
        }
        assert!(!with_value(&mut big, "K999", &v, 1));
        assert!(with_value(&mut big, "K000", "short-value-ok", 1));
        // A value edited in by hand that `PUT` would refuse is no value.
        s.data.as_mut().unwrap().insert(
            "BAD".into(),
            ByteString(b"line\nbreak-long-enough".to_vec()),
        );
        assert_eq!(value_of(&s, "BAD"), None);
    }
}
