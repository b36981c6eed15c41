//! `/v1/secrets` and the create-time check on the kubernetes backend:
//! the tenant's values Secret (`kube/secrets.rs` says why and how) and
//! the operator's `--secrets-file`.

use k8s_openapi::api::core::v1::Secret;
use kube::{
    api::{Patch, PatchParams, PostParams},
    Api,
};
use sandhub_api::{
    error::Code,
    secrets::{SecretInfo, SecretList, SecretSource, MAX_TENANT_SECRETS},
    validate,
};
use sandhub_client::{Error, Result};

use super::{kube_error, KubeTenant};
use crate::{
    backend::{now_ms, rfc3339},
    kube::{
        model::tenant_label_value,
        secrets::{merge_patch, new_object, object_name, updated, value_of, with_value, without},
    },
};

/// Conflicting writes retried before giving up with UNAVAILABLE.
const WRITE_ATTEMPTS: usize = 5;

impl KubeTenant {
    fn secret_api(&self) -> Api<Secret> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    fn values_name(&self) -> String {
        object_name(&tenant_label_value(&self.tenant))
    }

    /// The tenant's values Secret, if it has one.
    async fn values_object(&self) -> Result<Option<Secret>> {
        self.secret_api()
            .get_opt(&self.values_name())
            .await
            .map_err(|e| kube_error("reading the tenant's secrets", e))
    }

    /// Reads, changes with `edit`, writes; again on a conflict. `edit`
    /// answers what the call answers, or an error that stops it.
    async fn edit_values<T>(
        &self,
        create: bool,
        mut edit: impl FnMut(&mut Secret) -> Result<T>,
    ) -> Result<Option<T>> {
        let api = self.secret_api();
        for _ in 0..WRITE_ATTEMPTS {
            let (mut s, old) = match self.values_object().await? {
                Some(s) => (s.clone(), Some(s)),
                None if create => (new_object(&self.tenant), None),
                None => return Ok(None),
            };
            let out = edit(&mut s)?;
            let written = match &old {
                // A merge patch at the version read (`patch`, never
                // `update`: the role grants no replacing of objects).
                Some(old) => {
                    api.patch(
                        &self.values_name(),
                        &PatchParams::default(),
                        &Patch::Merge(merge_patch(old, &s)),
                    )
                    .await
                }
                None => api.create(&PostParams::default(), &s).await,
            };
            match written {
                Ok(_) => return Ok(Some(out)),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(kube_error("writing the tenant's secrets", e)),
            }
        }
        Err(Error::new(
            Code::Unavailable,
            "the tenant's secrets changed under every attempt; try again",
        ))
    }

    pub(super) async fn put_secret_value(&self, name: &str, value: &str) -> Result<SecretInfo> {
        validate::secret_name(name)?;
        validate::secret_value(name, value)?;
        let now = now_ms();
        let stored = self
            .edit_values(true, |s| Ok(with_value(s, name, value, now)))
            .await?;
        if stored != Some(true) {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "a tenant stores at most {MAX_TENANT_SECRETS} secrets and {} KiB of names and \
                     values on this backend; delete one first",
                    crate::kube::secrets::MAX_VALUES_BYTES / 1024
                ),
            ));
        }
        Ok(SecretInfo {
            name: name.to_string(),
            source: SecretSource::Tenant,
            updated_at: Some(rfc3339(now)),
        })
    }

    pub(super) async fn secret_list(&self) -> Result<SecretList> {
        let mut secrets: Vec<SecretInfo> = match self.values_object().await? {
            Some(s) => {
                let times = updated(&s);
                s.data
                    .iter()
                    .flat_map(|d| d.keys())
                    .map(|name| SecretInfo {
                        name: name.clone(),
                        source: SecretSource::Tenant,
                        updated_at: times.get(name).map(|t| rfc3339(*t)),
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        for name in self.shared.operator_secrets.names(&self.tenant) {
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

    pub(super) async fn remove_secret(&self, name: &str) -> Result<()> {
        validate::secret_name(name)?;
        if self.edit_values(false, |s| Ok(without(s, name))).await? == Some(true) {
            return Ok(());
        }
        if self
            .shared
            .operator_secrets
            .get(&self.tenant, name)
            .is_some()
        {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("secret {name:?} is the operator's (--secrets-file); only the operator can remove it"),
            ));
        }
        Err(Error::not_found(format!("secret {name:?}")))
    }

    /// That each of `names` has a value (the tenant's, or the operator's);
    /// FAILED_PRECONDITION naming the first that has none. The values
    /// themselves stay in the Secret: only the proxy reads them.
    pub(super) async fn secret_values<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        let names: Vec<&str> = names.into_iter().collect();
        if names.is_empty() {
            return Ok(());
        }
        let object = self.values_object().await?;
        for name in names {
            let own = object.as_ref().and_then(|s| value_of(s, name)).is_some();
            if !own
                && self
                    .shared
                    .operator_secrets
                    .get(&self.tenant, name)
                    .is_none()
            {
                return Err(Error::new(
                    Code::FailedPrecondition,
                    format!(
                        "secret {name:?} has no value: set it with `PUT /v1/secrets/{name}` (or \
                         ask the operator to add it to --secrets-file)"
                    ),
                ));
            }
        }
        Ok(())
    }
}
