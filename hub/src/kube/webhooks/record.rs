//! The objects webhooks keep in the hub's namespace, as pure data: what
//! each holds, its name and labels, and its bounds. No I/O here.
//!
//! - **Registrations**: one Secret per tenant, [`secret_name`] (from the
//!   tenant's label digest, never its name), data key [`REGISTRATIONS_KEY`]:
//!   [`Registrations`], the tenant's name and each webhook's URL, types,
//!   secret, `uid` and `after`. Written by whichever replica serves the
//!   `PUT`/`DELETE`, merge-patched at the resourceVersion read.
//! - **Delivery state**: one ConfigMap per webhook, [`state_name`],
//!   labelled [`STATE_LABEL`] (the holder of the Lease lists them to find
//!   the tenants with webhooks: the hub may not list Secrets). Key
//!   [`IDENTITY_KEY`] ([`Identity`]) is written with the registration; key
//!   [`PROGRESS_KEY`] ([`super::progress::Progress`]) only by the holder.
//!   Each key is a merge patch of its own, so the two writers never undo
//!   each other; a progress whose `uid` is not the registration's (the
//!   webhook was deleted and made again) is read as none.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    ByteString,
};
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::kube::model::TENANT_LABEL;

/// Every tenant's webhooks Secret carries `sandhub.io/webhooks=tenant`.
pub const SECRET_LABEL: &str = "sandhub.io/webhooks";
/// Every webhook's state ConfigMap carries `sandhub.io/webhook-state=true`.
pub const STATE_LABEL: &str = "sandhub.io/webhook-state";
pub const REGISTRATIONS_KEY: &str = "webhooks.json";
pub const IDENTITY_KEY: &str = "webhook.json";
pub const PROGRESS_KEY: &str = "delivery.json";
/// The Lease whose holder delivers every tenant's webhooks.
pub const LEASE_NAME: &str = "sandhub-hub-webhooks";

/// Bytes one tenant's registrations may take: far below the API server's
/// 1 MiB per object, whatever `--webhook-max-per-tenant` says (16 of the
/// largest are ~40 KiB).
pub const MAX_REGISTRATIONS_BYTES: usize = 256 * 1024;

/// The Secret of the tenant whose label digest is `key`.
pub fn secret_name(key: &str) -> String {
    format!("sandhub-webhooks-{key}")
}

/// The state ConfigMap of webhook `name` (a DNS label) of tenant `key`.
pub fn state_name(key: &str, name: &str) -> String {
    format!("sandhub-webhook-{key}-{name}")
}

/// One webhook as registered. `secret` is write-only: it goes to the
/// receiver's HMAC and nowhere else.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Made at the first `PUT` of this name, kept by a replacing `PUT`: a
    /// webhook deleted and made again is another one (no old cursor).
    pub uid: String,
    pub url: String,
    /// Empty: every type.
    pub events: Vec<String>,
    pub secret: String,
    pub updated_at: i64,
    /// Events with ids at most this were before the webhook: the cluster's
    /// revision when it was first put, × 16 + 15 (kube/events.rs's ids).
    pub after: u64,
}

impl std::fmt::Debug for Registration {
    // Never the secret, even in a debug line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("uid", &self.uid)
            .field("url", &self.url)
            .field("events", &self.events)
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

/// What a tenant's Secret holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registrations {
    /// The tenant's name, for the `tenant` of the events sent (the watches
    /// know only its digest) and to check a read is the caller's.
    pub tenant: String,
    pub hooks: BTreeMap<String, Registration>,
}

impl Registrations {
    /// The registrations `s` holds; `None` when they do not parse (an
    /// object edited by hand is reported, never half-read).
    pub fn of(s: &Secret) -> Option<Registrations> {
        let bytes = s.data.as_ref()?.get(REGISTRATIONS_KEY)?;
        serde_json::from_slice(&bytes.0).ok()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Puts `name` (keeping its `uid` and `after` if it exists); `false`:
    /// a new name past `max` webhooks, or the bytes past
    /// [`MAX_REGISTRATIONS_BYTES`].
    pub fn put(&mut self, name: &str, mut r: Registration, max: usize) -> bool {
        if let Some(old) = self.hooks.get(name) {
            r.uid = old.uid.clone();
            r.after = old.after;
        } else if self.hooks.len() >= max {
            return false;
        }
        let old = self.hooks.insert(name.to_string(), r);
        if self.to_bytes().len() > MAX_REGISTRATIONS_BYTES {
            match old {
                Some(o) => self.hooks.insert(name.to_string(), o),
                None => self.hooks.remove(name),
            };
            return false;
        }
        true
    }
}

/// A new, empty registrations Secret for the tenant `tenant`, digest `key`.
pub fn new_secret(tenant: &str, key: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(key)),
            labels: Some(BTreeMap::from([
                (SECRET_LABEL.to_string(), "tenant".to_string()),
                (TENANT_LABEL.to_string(), key.to_string()),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            REGISTRATIONS_KEY.to_string(),
            ByteString(
                Registrations {
                    tenant: tenant.to_string(),
                    hooks: BTreeMap::new(),
                }
                .to_bytes(),
            ),
        )])),
        ..Default::default()
    }
}

/// The merge patch that writes `regs` over the Secret read at `rv` (a
/// write between the read and this fails with 409).
pub fn registrations_patch(rv: Option<&str>, regs: &Registrations) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": rv},
        "data": {REGISTRATIONS_KEY: ByteString(regs.to_bytes())},
    })
}

/// Which webhook a state ConfigMap is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The tenant's label digest.
    pub tenant_key: String,
    pub name: String,
    pub uid: String,
}

/// A new state ConfigMap for `id`.
pub fn new_state(id: &Identity) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(state_name(&id.tenant_key, &id.name)),
            labels: Some(BTreeMap::from([
                (STATE_LABEL.to_string(), "true".to_string()),
                (TENANT_LABEL.to_string(), id.tenant_key.clone()),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "sandhub-hub".to_string(),
                ),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            IDENTITY_KEY.to_string(),
            serde_json::to_string(id).unwrap_or_default(),
        )])),
        ..Default::default()
    }
}

/// The merge patch that points an existing state ConfigMap at `id`; a new
/// `uid` drops the old progress with it.
pub fn identity_patch(id: &Identity, same_uid: bool) -> serde_json::Value {
    let mut data = serde_json::json!({IDENTITY_KEY: serde_json::to_string(id).unwrap_or_default()});
    if !same_uid {
        data[PROGRESS_KEY] = serde_json::Value::Null;
    }
    serde_json::json!({"data": data})
}

/// The identity a state ConfigMap names, if it parses.
pub fn identity_of(cm: &ConfigMap) -> Option<Identity> {
    serde_json::from_str(cm.data.as_ref()?.get(IDENTITY_KEY)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(url: &str) -> Registration {
        Registration {
            uid: "u1".into(),
            url: url.into(),
            events: vec![],
            secret: "0123456789abcdef-secret".into(),
            updated_at: 1,
            after: 160,
        }
    }

    #[test]
    fn registrations_are_bounded_keep_their_identity_and_never_show_the_secret() {
        let mut regs = Registrations {
            tenant: "alice".into(),
            ..Default::default()
        };
        assert!(regs.put("a", reg("http://x/1"), 2));
        let mut again = reg("http://x/2");
        again.uid = "u2".into();
        again.after = 999;
        assert!(regs.put("a", again, 2), "a replace is not a new one");
        assert_eq!(
            (regs.hooks["a"].uid.as_str(), regs.hooks["a"].after),
            ("u1", 160)
        );
        assert_eq!(regs.hooks["a"].url, "http://x/2");
        assert!(regs.put("b", reg("http://x/3"), 2));
        assert!(!regs.put("c", reg("http://x/4"), 2), "past the count");
        assert!(!regs.put("c", reg(&"x".repeat(MAX_REGISTRATIONS_BYTES)), 100));
        assert!(!regs.hooks.contains_key("c"));
        let long = format!("http://x/{}", "y".repeat(MAX_REGISTRATIONS_BYTES));
        assert!(!regs.put("a", reg(&long), 100), "past the bytes");
        assert_eq!(regs.hooks["a"].url, "http://x/2", "the old one is kept");
        assert!(!format!("{:?}", regs).contains("secret-"));

        let key = crate::kube::model::tenant_label_value("alice");
        let mut s = new_secret("alice", &key);
        let name = s.metadata.name.clone().unwrap();
        assert!(!name.contains("alice") && name.len() <= 253, "{name}");
        assert_eq!(Registrations::of(&s).unwrap().tenant, "alice");
        s.data
            .as_mut()
            .unwrap()
            .insert(REGISTRATIONS_KEY.into(), ByteString(regs.to_bytes()));
        assert_eq!(Registrations::of(&s).unwrap(), regs);
        let p = registrations_patch(Some("7"), &regs);
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        s.data
            .as_mut()
            .unwrap()
            .insert(REGISTRATIONS_KEY.into(), ByteString(b"{not json".to_vec()));
        assert_eq!(Registrations::of(&s), None);
    }

    #[test]
    fn a_state_object_names_its_webhook_and_a_new_uid_drops_the_old_progress() {
        let id = Identity {
            tenant_key: "k".repeat(40),
            name: "ops".into(),
            uid: "u".into(),
        };
        let cm = new_state(&id);
        assert_eq!(identity_of(&cm), Some(id.clone()));
        assert!(cm.metadata.name.as_ref().unwrap().len() <= 253);
        assert_eq!(
            cm.metadata.labels.as_ref().unwrap()[TENANT_LABEL],
            id.tenant_key
        );
        assert!(identity_patch(&id, true)["data"]
            .get(PROGRESS_KEY)
            .is_none());
        assert!(identity_patch(&id, false)["data"][PROGRESS_KEY].is_null());
    }
}
