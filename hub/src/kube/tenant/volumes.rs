//! `/v1/volumes` on the kubernetes backend (issue #32 §1): each named
//! volume is a PersistentVolumeClaim in the hub's namespace, named like
//! the tenant's other objects ([`owner::object_name`]) and labelled with
//! the tenant, of `--volume-storage-class` (the cluster's default class
//! when unset), `size_mb` MiB and the request's access mode.
//!
//! Templates mount them (`template::tenant_template` adds a Pod volume
//! for each); the claim name is built from the caller's own tenant, so a
//! template can never name another tenant's claim. A volume a template
//! names cannot be deleted (409); a Pod still using a deleted claim keeps
//! it until it ends (the API server's `pvc-protection` finalizer).
//!
//! A clone (`from_snapshot`) is a claim whose `dataSource` is the
//! snapshot's VolumeSnapshot (`volume_snapshots.rs`); the files API
//! without a sandbox goes through a helper Pod (`volume_pod.rs`). A
//! template may also mount, read-only, a volume the operator shares
//! (`--shared-volume [TENANT/]NAME`: that tenant's claim).
//!
//! Volumes a create request adds go on its SandboxClaim as an annotation
//! the hub signs for that claim (`sandhub_api::k8s::volumes`): the
//! controller then makes a Pod for it (no warm member has them) with each
//! claim mounted. A volume such a claim names cannot be deleted either.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
    Api,
};
use sandhub_api::{
    error::Code,
    k8s::{names, volumes as claim_volumes},
    validate,
    volumes::{AccessMode, CreateVolume, Volume, VolumeList, VolumeMount},
};
use sandhub_client::{Error, Result};

use super::{kube_error, owner, KubeTenant};
use crate::kube::model::{tenant_label_value, CREATED_BY_HUB, TENANT_LABEL};

/// The hub name of the volume a claim is (its cluster name carries the
/// tenant's suffix).
pub const VOLUME_LABEL: &str = "sandhub.io/volume";
/// The volume's `labels`, as JSON (a tenant's keys never become the
/// claim's own labels, which selectors and quotas read).
const LABELS_ANNOTATION: &str = "sandhub.io/volume-labels";
/// The size asked for, in MiB: a class may round the claim's capacity up.
const SIZE_ANNOTATION: &str = "sandhub.io/size-mb";

/// Whose claim a mount of the caller's names.
pub(super) enum Mounted {
    /// The caller's own volume (`owner::object_name`).
    Own(String),
    /// One the operator shares, mounted read-only.
    Shared(String),
}

impl KubeTenant {
    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.shared.client.clone(), &self.shared.namespace)
    }

    fn own_volumes(&self) -> ListParams {
        ListParams::default().labels(&format!(
            "{TENANT_LABEL}={},{}={CREATED_BY_HUB}",
            tenant_label_value(&self.tenant),
            names::CREATED_BY
        ))
    }

    async fn volume_claims(&self) -> Result<Vec<PersistentVolumeClaim>> {
        let mut claims = self
            .pvcs()
            .list(&self.own_volumes())
            .await
            .map_err(|e| kube_error("listing volumes", e))?
            .items;
        claims.retain(|c| !being_deleted(c));
        Ok(claims)
    }

    /// The claim of the caller's volume `name`, if there is one.
    pub(super) async fn volume_claim(&self, name: &str) -> Result<Option<PersistentVolumeClaim>> {
        self.claim_of(&self.tenant, name).await
    }

    /// The claim of `tenant`'s volume `name`, if there is one.
    async fn claim_of(&self, tenant: &str, name: &str) -> Result<Option<PersistentVolumeClaim>> {
        let object = owner::object_name(tenant, name);
        let got = self
            .pvcs()
            .get_opt(&object)
            .await
            .map_err(|e| kube_error(&format!("reading volume {name}"), e))?;
        // The name is the tenant's by construction; check the label too.
        // A claim being deleted (held by a Pod that still uses it) is gone
        // to the API.
        Ok(got.filter(|c| {
            owner::owner(&c.metadata, tenant) == owner::Owner::Caller && !being_deleted(c)
        }))
    }

    /// The claim of the volume `name` the operator shares with every
    /// tenant (`--shared-volume [TENANT/]NAME`), if it exists.
    pub(super) async fn shared_volume_claim(&self, name: &str) -> Result<Option<String>> {
        let Some(shared) = self
            .shared
            .policy
            .shared_volumes
            .iter()
            .find(|s| s.name == name)
        else {
            return Ok(None);
        };
        let claim = self.claim_of(&shared.owner, name).await?;
        Ok(claim.and_then(|c| c.metadata.name))
    }

    /// The claim mount `m` of the caller's names: its own volume, or one
    /// the operator shares, which only `read_only` may mount; any other
    /// name is NOT_FOUND (`what` says where it was named).
    pub(super) async fn mounted_claim(&self, m: &VolumeMount, what: &str) -> Result<Mounted> {
        if let Some(c) = self.volume_claim(&m.name).await? {
            return Ok(Mounted::Own(c.metadata.name.unwrap_or_default()));
        }
        match self.shared_volume_claim(&m.name).await? {
            Some(_) if !m.read_only => Err(Error::new(
                Code::PermissionDenied,
                format!(
                    "volume {:?} is shared by the operator read-only: mount it with \
                     `read_only: true`",
                    m.name
                ),
            )),
            Some(claim) => Ok(Mounted::Shared(claim)),
            None => Err(Error::not_found(format!("volume {:?} ({what})", m.name))),
        }
    }

    /// The annotations that give claim `id` of template `template` the
    /// volumes its create request adds: the list of claims, and the hub's
    /// signature of it for that claim, which the controller checks before
    /// it mounts anything. None when the request adds none.
    pub(super) async fn request_volumes(
        &self,
        id: &str,
        template: &str,
        mounts: &[VolumeMount],
    ) -> Result<Vec<(String, String)>> {
        if mounts.is_empty() {
            return Ok(Vec::new());
        }
        let Some(keys) = &self.shared.proxy_tokens else {
            return Err(Error::new(
                Code::FailedPrecondition,
                "volumes on a create request need the hub's and the controller's \
                 --sandboxd-token-key-file: the controller mounts only what the hub signed",
            ));
        };
        // With the template's own: none may be at, above or below another.
        let own = self.read_template(template).await?.template.volumes;
        let all: Vec<VolumeMount> = own.iter().chain(mounts).cloned().collect();
        validate::volume_mounts(&all)?;
        let mut list = Vec::with_capacity(mounts.len());
        for m in mounts {
            let (Mounted::Own(claim) | Mounted::Shared(claim)) = self
                .mounted_claim(m, &format!("mounted at {} by the request", m.path))
                .await?;
            list.push(claim_volumes::ClaimVolume {
                claim,
                path: m.path.clone(),
                read_only: m.read_only,
            });
        }
        let value = serde_json::to_string(&list)
            .map_err(|e| Error::internal(format!("volume mounts: {e}")))?;
        let signature = keys.volumes_signature(&self.shared.namespace, id, &value);
        Ok(vec![
            (claim_volumes::MOUNTS_ANNOTATION.to_string(), value),
            (claim_volumes::SIGNATURE_ANNOTATION.to_string(), signature),
        ])
    }

    /// A sandbox whose create request mounted claim `object`, if any (of
    /// any tenant: an operator's shared volume is mounted by others).
    async fn request_mounting(&self, object: &str) -> Result<Option<String>> {
        let claims = self
            .claims()
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error("listing sandboxes", e))?;
        Ok(claims.items.into_iter().find_map(|c| {
            let value = c
                .metadata
                .annotations
                .as_ref()?
                .get(claim_volumes::MOUNTS_ANNOTATION)?;
            let mounts = claim_volumes::parse(value).ok()?;
            mounts
                .iter()
                .any(|m| m.claim == object)
                .then(|| c.metadata.name.clone().unwrap_or_default())
        }))
    }

    pub(super) async fn create_volume_claim(&self, req: CreateVolume) -> Result<Volume> {
        validate::volume(&req)?;
        let source = match req.from_snapshot.as_ref().and_then(|f| f.parts()) {
            Some((volume, snapshot)) => {
                let source = self.snapshot_source(volume, snapshot).await?;
                if req.size_mb < source.size_mb {
                    return Err(Error::invalid(format!(
                        "size_mb {} is smaller than the snapshot's volume ({} MiB)",
                        req.size_mb, source.size_mb
                    )));
                }
                Some(source)
            }
            None => None,
        };
        let cap = self.shared.policy.tenant_max_volume_mb;
        // Each replica checks against what the API server lists: two
        // creates racing on two replicas may both pass (the storage
        // class's own quota, if any, still holds).
        let have: u64 = self.volume_claims().await?.iter().map(size_mb).sum();
        if have.saturating_add(req.size_mb) > cap {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "volume of {} MiB refused: this tenant's volumes take {have} of the {cap} \
                     MiB allowed (--tenant-max-volume-mb); delete one first",
                    req.size_mb
                ),
            ));
        }
        let mut claim = self.claim_object(&req);
        if let (Some(source), Some(spec)) = (&source, claim.spec.as_mut()) {
            spec.data_source = Some(source.data_source());
        }
        match self.pvcs().create(&PostParams::default(), &claim).await {
            Ok(c) => Ok(volume_of(&c)),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::new(
                Code::Conflict,
                format!(
                    "volume {:?} exists already (or is still being deleted: a Pod uses it)",
                    req.name
                ),
            )),
            Err(e) => Err(kube_error(&format!("creating volume {}", req.name), e)),
        }
    }

    fn claim_object(&self, req: &CreateVolume) -> PersistentVolumeClaim {
        let labels = BTreeMap::from([
            (TENANT_LABEL.to_string(), tenant_label_value(&self.tenant)),
            (names::CREATED_BY.to_string(), CREATED_BY_HUB.to_string()),
            (VOLUME_LABEL.to_string(), req.name.clone()),
        ]);
        let mut annotations =
            BTreeMap::from([(SIZE_ANNOTATION.to_string(), req.size_mb.to_string())]);
        if !req.labels.is_empty() {
            annotations.insert(
                LABELS_ANNOTATION.into(),
                serde_json::to_string(&req.labels).unwrap_or_default(),
            );
        }
        let mode = req.access_mode.unwrap_or_default();
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(owner::object_name(&self.tenant, &req.name)),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec![mode.as_str().to_string()]),
                storage_class_name: self.shared.volume_storage_class.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(format!("{}Mi", req.size_mb)),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(super) async fn volume_list(&self) -> Result<VolumeList> {
        let mut volumes: Vec<Volume> = self.volume_claims().await?.iter().map(volume_of).collect();
        volumes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(VolumeList { volumes })
    }

    pub(super) async fn read_volume(&self, name: &str) -> Result<Volume> {
        validate::name("volume", name)?;
        self.volume_claim(name)
            .await?
            .map(|c| volume_of(&c))
            .ok_or_else(|| Error::not_found(format!("volume {name:?}")))
    }

    /// 409 while one of the tenant's templates mounts it (its Pods would
    /// fail to start without it), or a sandbox's create request did.
    pub(super) async fn remove_volume(&self, name: &str) -> Result<()> {
        validate::name("volume", name)?;
        if self.volume_claim(name).await?.is_none() {
            return Err(Error::not_found(format!("volume {name:?}")));
        }
        for t in self.template_list().await? {
            if t.template.volumes.iter().any(|m| m.name == name) {
                return Err(Error::new(
                    Code::Conflict,
                    format!(
                        "volume {name:?} is mounted by template {}; take it out of the template \
                         first",
                        t.name
                    ),
                ));
            }
        }
        let object = owner::object_name(&self.tenant, name);
        if let Some(sandbox) = self.request_mounting(&object).await? {
            // Another tenant's sandbox mounting a shared volume is not
            // named to its owner.
            let who = if self.claim(&sandbox).await.is_ok() {
                format!("sandbox {sandbox}")
            } else {
                "another tenant's sandbox".to_string()
            };
            return Err(Error::new(
                Code::Conflict,
                format!("volume {name:?} is mounted by {who}; delete that first"),
            ));
        }
        self.stop_volume_pod(name).await;
        match self.pvcs().delete(&object, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Err(Error::not_found(format!("volume {name:?}")))
            }
            Err(e) => Err(kube_error(&format!("deleting volume {name}"), e)),
        }
    }
}

fn being_deleted(c: &PersistentVolumeClaim) -> bool {
    c.metadata.deletion_timestamp.is_some()
}

/// The MiB a claim was asked for (its annotation; else its request).
pub(super) fn size_mb(c: &PersistentVolumeClaim) -> u64 {
    let annotated = c
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIZE_ANNOTATION))
        .and_then(|s| s.parse().ok());
    annotated
        .or_else(|| {
            let q = c
                .spec
                .as_ref()?
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")?;
            q.0.strip_suffix("Mi")?.parse().ok()
        })
        .unwrap_or(0)
}

fn volume_of(c: &PersistentVolumeClaim) -> Volume {
    let annotations = c.metadata.annotations.as_ref();
    Volume {
        name: c
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(VOLUME_LABEL))
            .cloned()
            .unwrap_or_default(),
        size_mb: size_mb(c),
        labels: annotations
            .and_then(|a| a.get(LABELS_ANNOTATION))
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default(),
        created_at: created_at(&c.metadata),
        access_mode: c
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.as_ref())
            .and_then(|m| m.first())
            .and_then(|m| AccessMode::parse(m)),
    }
}

/// An object's creation time as RFC 3339, UTC (empty if it has none).
pub(super) fn created_at(meta: &ObjectMeta) -> String {
    meta.creation_timestamp
        .as_ref()
        .map(|t| humantime::format_rfc3339_seconds(std::time::SystemTime::from(t.0)).to_string())
        .unwrap_or_default()
}
