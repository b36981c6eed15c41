//! A tenant's secrets on the local hub: `/v1/secrets` (write-only values
//! in the store) and the create-time check that every secret a sandbox
//! names has a value. Apart from `secrets.rs` so that module stays a leaf
//! the gateway glue (egress, runtime_adapter) can use without reaching
//! back into the hub.

use std::collections::BTreeMap;

use sandhub_api::{
    error::Code,
    hub::{CreateSandbox, Network, Template},
    secrets::{SecretInfo, SecretList, SecretSource, MAX_TENANT_SECRETS},
    validate,
};
use sandhub_client::{Error, Result};

use super::{hub::Hub, secrets::missing};
use crate::backend::{now_ms, rfc3339};

impl Hub {
    /// A create request's secrets (added to its template's, with egress,
    /// the host's root) and that every secret it will use has a value.
    pub(super) fn check_secrets(
        &self,
        tenant: &str,
        template: &Template,
        req: &CreateSandbox,
    ) -> Result<()> {
        let all = validate::merge_secrets(&template.secrets, &req.secrets)?;
        if !req.secrets.is_empty() {
            let mode = match &req.network {
                Some(n) if n.mode == Network::None => n.mode,
                _ => template.network.mode,
            };
            if mode != Network::Egress {
                return Err(Error::new(
                    Code::InvalidArgument,
                    "secrets need `network: egress`: only the egress gateway can broker them",
                ));
            }
            super::hub::secrets_need_host_root(template)?;
        }
        self.secret_values(tenant, all.iter().map(|s| s.name.as_str()))
            .map(|_| ())
    }

    /// The values of `names` for `tenant` (the tenant's own over the
    /// operator's); FAILED_PRECONDITION naming the first that has none.
    pub(super) fn secret_values<'a>(
        &self,
        tenant: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for name in names {
            let v = match self.store.secret_value(tenant, name)? {
                Some(v) => v,
                None => self
                    .backend
                    .egress
                    .operator_secrets()
                    .get(tenant, name)
                    .cloned()
                    .ok_or_else(|| missing(name))?,
            };
            out.insert(name.to_string(), v);
        }
        Ok(out)
    }

    pub(super) fn put_secret(&self, tenant: &str, name: &str, value: &str) -> Result<SecretInfo> {
        validate::secret_name(name)?;
        validate::secret_value(name, value)?;
        let now = now_ms();
        if !self
            .store
            .put_secret(tenant, name, value, now, MAX_TENANT_SECRETS)?
        {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!("a tenant stores at most {MAX_TENANT_SECRETS} secrets; delete one first"),
            ));
        }
        Ok(SecretInfo {
            name: name.to_string(),
            source: SecretSource::Tenant,
            updated_at: Some(rfc3339(now)),
        })
    }

    pub(super) fn list_secrets(&self, tenant: &str) -> Result<SecretList> {
        let mut secrets: Vec<SecretInfo> = self
            .store
            .list_secrets(tenant)?
            .into_iter()
            .map(|(name, at)| SecretInfo {
                name,
                source: SecretSource::Tenant,
                updated_at: Some(rfc3339(at)),
            })
            .collect();
        let egress = &self.backend.egress;
        for name in egress.operator_secrets().names(tenant) {
            if !secrets.iter().any(|s| &s.name == name) {
                secrets.push(SecretInfo {
                    name: name.clone(),
                    source: SecretSource::Operator,
                    updated_at: None,
                });
            }
        }
        secrets.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(SecretList { secrets })
    }

    pub(super) fn delete_secret(&self, tenant: &str, name: &str) -> Result<()> {
        validate::secret_name(name)?;
        if self.store.delete_secret(tenant, name)? {
            return Ok(());
        }
        if self
            .backend
            .egress
            .operator_secrets()
            .get(tenant, name)
            .is_some()
        {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("secret {name:?} is the operator's (--secrets-file); only the operator can remove it"),
            ));
        }
        Err(Error::not_found(format!("secret {name:?}")))
    }
}
