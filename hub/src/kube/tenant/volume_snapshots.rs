//! Volume snapshots and clones on the kubernetes backend (issue #32 §1):
//! a snapshot is a `snapshot.storage.k8s.io/v1` VolumeSnapshot of the
//! volume's claim, and a clone (`POST /v1/volumes {from_snapshot}`) is a
//! claim whose `dataSource` is that VolumeSnapshot: the cluster's CSI
//! driver and snapshot controller do the copying.
//!
//! A cluster without the CRDs answers 404 for the resource itself; that is
//! `UNIMPLEMENTED` here, naming what is missing. The objects are the
//! tenant's like its claims: named `<volume>.<snapshot>-<tenant suffix>`
//! (volume and snapshot names are DNS labels, so the dot keeps pairs
//! apart), labelled with the tenant, the volume and the snapshot, and read
//! back only through those labels and names.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::TypedLocalObjectReference;
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams},
    Api,
};
use sandhub_api::{
    error::Code,
    k8s::names,
    validate,
    volumes::{CreateVolumeSnapshot, VolumeSnapshot, VolumeSnapshotList, MAX_SNAPSHOTS_PER_VOLUME},
};
use sandhub_client::{Error, Result};
use serde_json::json;

use super::{
    kube_error, owner,
    volumes::{self, VOLUME_LABEL},
    KubeTenant,
};
use crate::kube::model::{tenant_label_value, CREATED_BY_HUB, TENANT_LABEL};

pub const GROUP: &str = "snapshot.storage.k8s.io";
pub const KIND: &str = "VolumeSnapshot";
/// The snapshot's hub name.
const SNAPSHOT_LABEL: &str = "sandhub.io/volume-snapshot";
/// The source volume's size in MiB when the snapshot was taken: a clone
/// must be at least as large, and the source may be gone by then.
const SIZE_ANNOTATION: &str = "sandhub.io/size-mb";

fn resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: KIND.into(),
        plural: "volumesnapshots".into(),
    }
}

/// What a 404 on the resource (not on one object) means.
fn no_crds() -> Error {
    Error::new(
        Code::Unimplemented,
        "volume snapshots need the cluster's VolumeSnapshot CRDs (snapshot.storage.k8s.io/v1) \
         and a CSI driver that snapshots; this cluster has no such resource",
    )
}

fn object_name(tenant: &str, volume: &str, snapshot: &str) -> String {
    owner::object_name(tenant, &format!("{volume}.{snapshot}"))
}

/// A snapshot the clone will start from: its object's name and its
/// source's size.
pub(super) struct Source {
    pub object: String,
    pub size_mb: u64,
}

impl Source {
    /// The claim `dataSource` that starts a clone from it.
    pub fn data_source(&self) -> TypedLocalObjectReference {
        TypedLocalObjectReference {
            api_group: Some(GROUP.into()),
            kind: KIND.into(),
            name: self.object.clone(),
        }
    }
}

impl KubeTenant {
    fn snapshots_api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.shared.client.clone(),
            &self.shared.namespace,
            &resource(),
        )
    }

    fn own_snapshots(&self, volume: &str) -> ListParams {
        ListParams::default().labels(&format!(
            "{TENANT_LABEL}={},{}={CREATED_BY_HUB},{VOLUME_LABEL}={volume}",
            tenant_label_value(&self.tenant),
            names::CREATED_BY
        ))
    }

    async fn snapshot_objects(&self, volume: &str) -> Result<Vec<DynamicObject>> {
        match self.snapshots_api().list(&self.own_snapshots(volume)).await {
            Ok(list) => Ok(list
                .items
                .into_iter()
                .filter(|o| o.metadata.deletion_timestamp.is_none())
                .collect()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(no_crds()),
            Err(e) => Err(kube_error("listing volume snapshots", e)),
        }
    }

    /// The caller's snapshot object, if it exists (and is the caller's).
    async fn snapshot_object(&self, volume: &str, snapshot: &str) -> Result<Option<DynamicObject>> {
        let name = object_name(&self.tenant, volume, snapshot);
        match self.snapshots_api().get_opt(&name).await {
            Ok(got) => Ok(got.filter(|o| {
                owner::owner(&o.metadata, &self.tenant) == owner::Owner::Caller
                    && o.metadata.deletion_timestamp.is_none()
            })),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(no_crds()),
            Err(e) => Err(kube_error("reading a volume snapshot", e)),
        }
    }

    pub(super) async fn snapshot_volume(
        &self,
        volume: &str,
        req: CreateVolumeSnapshot,
    ) -> Result<VolumeSnapshot> {
        validate::name("volume", volume)?;
        validate::name("snapshot", &req.name)?;
        let Some(claim) = self.volume_claim(volume).await? else {
            return Err(Error::not_found(format!("volume {volume:?}")));
        };
        if self.snapshot_objects(volume).await?.len() >= MAX_SNAPSHOTS_PER_VOLUME {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "volume {volume:?} has {MAX_SNAPSHOTS_PER_VOLUME} snapshots, the most it may; \
                     delete one first"
                ),
            ));
        }
        let labels = BTreeMap::from([
            (TENANT_LABEL.to_string(), tenant_label_value(&self.tenant)),
            (names::CREATED_BY.to_string(), CREATED_BY_HUB.to_string()),
            (VOLUME_LABEL.to_string(), volume.to_string()),
            (SNAPSHOT_LABEL.to_string(), req.name.clone()),
        ]);
        let size = volumes::size_mb(&claim);
        let mut spec = json!({"source": {"persistentVolumeClaimName": claim.metadata.name}});
        if let Some(class) = &self.shared.volume_snapshot_class {
            spec["volumeSnapshotClassName"] = json!(class);
        }
        let mut object =
            DynamicObject::new(&object_name(&self.tenant, volume, &req.name), &resource())
                .within(&self.shared.namespace)
                .data(json!({ "spec": spec }));
        object.metadata.labels = Some(labels);
        object.metadata.annotations = Some(BTreeMap::from([(
            SIZE_ANNOTATION.to_string(),
            size.to_string(),
        )]));
        match self
            .snapshots_api()
            .create(&PostParams::default(), &object)
            .await
        {
            Ok(o) => Ok(snapshot_of(&o)),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::new(
                Code::Conflict,
                format!("volume {volume:?} has a snapshot {:?} already", req.name),
            )),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(no_crds()),
            Err(e) => Err(kube_error("creating a volume snapshot", e)),
        }
    }

    pub(super) async fn volume_snapshot_list(&self, volume: &str) -> Result<VolumeSnapshotList> {
        validate::name("volume", volume)?;
        if self.volume_claim(volume).await?.is_none() {
            return Err(Error::not_found(format!("volume {volume:?}")));
        }
        let mut snapshots: Vec<VolumeSnapshot> = self
            .snapshot_objects(volume)
            .await?
            .iter()
            .map(snapshot_of)
            .collect();
        snapshots.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(VolumeSnapshotList { snapshots })
    }

    pub(super) async fn remove_volume_snapshot(&self, volume: &str, snapshot: &str) -> Result<()> {
        validate::name("volume", volume)?;
        validate::name("snapshot", snapshot)?;
        let gone = || Error::not_found(format!("snapshot {volume}@{snapshot}"));
        if self.snapshot_object(volume, snapshot).await?.is_none() {
            return Err(gone());
        }
        let name = object_name(&self.tenant, volume, snapshot);
        match self
            .snapshots_api()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(gone()),
            Err(e) => Err(kube_error("deleting a volume snapshot", e)),
        }
    }

    /// The caller's snapshot `volume@snapshot`, for a clone.
    pub(super) async fn snapshot_source(&self, volume: &str, snapshot: &str) -> Result<Source> {
        let object = self
            .snapshot_object(volume, snapshot)
            .await?
            .ok_or_else(|| Error::not_found(format!("snapshot {volume}@{snapshot}")))?;
        let size_mb = object
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIZE_ANNOTATION))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok(Source {
            object: object.metadata.name.unwrap_or_default(),
            size_mb,
        })
    }
}

fn snapshot_of(o: &DynamicObject) -> VolumeSnapshot {
    let label = |k: &str| {
        o.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .cloned()
            .unwrap_or_default()
    };
    VolumeSnapshot {
        volume: label(VOLUME_LABEL),
        name: label(SNAPSHOT_LABEL),
        created_at: volumes::created_at(&o.metadata),
    }
}
