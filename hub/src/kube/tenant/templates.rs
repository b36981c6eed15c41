//! A tenant's SandboxTemplates: its own (named by [`owner::object_name`]),
//! applied server-side, and the operator's, read only.

use super::volumes::Mounted;
use super::*;

/// The field manager of tenants' SandboxTemplates (server-side apply).
const TEMPLATE_FIELD_MANAGER: &str = "sandhub-hub";

impl KubeTenant {
    /// What tenants' templates start from: the operator's `--base-template`
    /// if there is one, else the built-in sandboxd template.
    pub(super) async fn base_template(&self) -> Result<sandhub_api::k8s::SandboxTemplateSpec> {
        let name = &self.shared.base_template;
        match self.templates().get_opt(name).await {
            Ok(Some(t)) if owner::owner(&t.metadata, &self.tenant) == Owner::Operator => Ok(t.spec),
            Ok(_) => Ok(template::builtin_base(&self.shared.prepull_images.sandboxd)),
            Err(e) => Err(kube_error(&format!("reading the base template {name}"), e)),
        }
    }

    fn template_view(&self, name: &str, t: &SandboxTemplate) -> NamedTemplate {
        NamedTemplate {
            name: name.to_string(),
            template: template::template_of(&t.spec, &self.shared.prepull_images.sandboxd),
        }
    }

    pub(super) async fn apply_template(&self, name: &str, t: Template) -> Result<NamedTemplate> {
        // The shared rules first, so a template out of range gets the same
        // answer on both backends.
        validate::name("template", name)?;
        t.validate()?;
        template::refuse_local_only(&t)?;
        if name.len() > owner::MAX_TENANT_NAME {
            return Err(Error::invalid(format!(
                "template name `{name}` must be a DNS-1123 label of at most {} characters",
                owner::MAX_TENANT_NAME
            )));
        }
        let templates = self.templates();
        let read = |e| kube_error(&format!("reading template {name}"), e);
        if templates
            .get_opt(name)
            .await
            .map_err(read)?
            .is_some_and(|t| owner::owner(&t.metadata, &self.tenant) == Owner::Operator)
        {
            return Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "template {name} is the operator's: pools can use it, but it is changed \
                     only with kubectl or Helm"
                ),
            ));
        }
        // The tenant's own volumes, or one the operator shares read-only
        // (`--shared-volume`); any other name is 404.
        let mut shared = Vec::new();
        for (i, m) in t.volumes.iter().enumerate() {
            if let Mounted::Shared(claim) = self
                .mounted_claim(m, &format!("mounted at {} by template {name}", m.path))
                .await?
            {
                shared.push((i, claim));
            }
        }
        let mut want = template::tenant_template(
            &self.tenant,
            name,
            self.base_template().await?,
            &t,
            &self.shared.prepull_images.sandboxd,
            self.shared.image_pull_policy,
        )?;
        for (i, claim) in shared {
            template::use_shared_claim(&mut want, i, claim);
        }
        let object = owner::object_name(&self.tenant, name);
        // Read back from the API server for a while, not the watch.
        self.shared.caches.wrote::<SandboxTemplate>(&object);
        // The controller may write the object (its status) between our read
        // and our write; a few fresh read-check-writes get past that, and a
        // writer that keeps changing it meanwhile gets 409.
        let mut attempt = 0;
        let written = loop {
            attempt += 1;
            match templates.get_opt(&object).await.map_err(read)? {
                // The name is ours by construction; anything else there is
                // left alone.
                Some(have) if owner::owner(&have.metadata, &self.tenant) != Owner::Caller => {
                    return Err(Error::new(
                        Code::Conflict,
                        format!("template {name}: the cluster name {object} is taken"),
                    ))
                }
                // At the version read: no write lands on what was not checked.
                Some(have) => want.metadata.resource_version = have.metadata.resource_version,
                None => want.metadata.resource_version = None,
            }
            // Server-side apply, always by one field manager: what a new
            // version of the template no longer sets is removed.
            let wrote = templates
                .patch(
                    &object,
                    &PatchParams::apply(TEMPLATE_FIELD_MANAGER).force(),
                    &Patch::Apply(&want),
                )
                .await;
            if let Some(written) = settle_write(wrote, attempt, "template", name)? {
                break written;
            }
        };
        Ok(self.template_view(name, &written))
    }

    pub(super) async fn read_template(&self, name: &str) -> Result<NamedTemplate> {
        let (t, _) = self.find(&self.templates(), "template", name).await?;
        Ok(self.template_view(name, &t))
    }

    /// The caller's templates and the operator's; the caller's own wins a
    /// name both have.
    pub(super) async fn template_list(&self) -> Result<Vec<NamedTemplate>> {
        let mut listed = self
            .templates()
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing templates", e))?
            .items;
        listed.retain(|t| owner::owner(&t.metadata, &self.tenant) != Owner::Other);
        listed.sort_by_key(|t| owner::owner(&t.metadata, &self.tenant) == Owner::Caller);
        let mut by_name = BTreeMap::new();
        for t in &listed {
            if let Some(name) = owner::hub_name(&t.metadata, &self.tenant) {
                let v = self.template_view(&name, t);
                by_name.insert(name, v);
            }
        }
        Ok(by_name.into_values().collect())
    }

    pub(super) async fn remove_template(&self, name: &str) -> Result<()> {
        let (t, who) = self.find_fresh(&self.templates(), "template", name).await?;
        if who == Owner::Operator {
            return Err(Error::new(
                Code::PermissionDenied,
                format!("template {name} is the operator's: delete it with kubectl or Helm"),
            ));
        }
        let object = t.metadata.name.clone().unwrap_or_default();
        self.shared.caches.wrote::<SandboxTemplate>(&object);
        let users: Vec<String> = self
            .pools()
            .list(&ListParams::default().labels(&owner::tenant_selector(&self.tenant)))
            .await
            .map_err(|e| kube_error("listing pools", e))?
            .iter()
            .filter(|p| p.spec.sandbox_template_ref.name == object)
            .map(|p| self.pool_view(p).name)
            .collect();
        if !users.is_empty() {
            return Err(Error::new(
                Code::Conflict,
                format!("template {name} is used by pool {}", users.join(", ")),
            ));
        }
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: t.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.templates()
            .delete(&object, &params)
            .await
            .map(|_| ())
            .map_err(|e| kube_error(&format!("deleting template {name}"), e))
    }
}
