//! Named volumes (issue #32 §1): a tenant's disk that outlives sandboxes.
//! The bodies of `/v1/volumes`; the rules are checked in
//! `validate::volume`.
//!
//! On the local backend a volume is a btrfs subvolume with a qgroup limit
//! of `size_mb` on the hub's disk-quota volume (docs/architecture.md,
//! "Named volumes"); on the Kubernetes backend, a PersistentVolumeClaim.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Smallest volume, in MiB (btrfs's own bookkeeping of a subvolume takes
/// a few hundred KiB of it).
pub const MIN_VOLUME_MB: u64 = 1;
/// Largest single volume, in MiB (1 TiB); the tenant's total is bounded
/// by the operator (`--tenant-max-volume-mb`).
pub const MAX_VOLUME_MB: u64 = 1 << 20;

/// `POST /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateVolume {
    /// A DNS-1123 label, unique among the tenant's volumes.
    pub name: String,
    /// Most bytes the volume's files may take, in MiB
    /// ([`MIN_VOLUME_MB`]..=[`MAX_VOLUME_MB`]).
    pub size_mb: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Kubernetes: the claim's access mode (`ReadWriteOnce` by default:
    /// one node's Pods share it). The local backend's volumes are shared
    /// by any number of sandboxes whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
    /// Start as a writable copy of one of the tenant's volume snapshots
    /// (`"data@before"` or `{"volume": "data", "snapshot": "before"}`)
    /// instead of empty. The copy shares nothing with its source after
    /// that: changes on either side stay there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<SnapshotRef>,
}

/// A PersistentVolumeClaim's access mode, in Kubernetes' words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AccessMode {
    #[default]
    ReadWriteOnce,
    ReadOnlyMany,
    ReadWriteMany,
    ReadWriteOncePod,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadOnlyMany => "ReadOnlyMany",
            AccessMode::ReadWriteMany => "ReadWriteMany",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            AccessMode::ReadWriteOnce,
            AccessMode::ReadOnlyMany,
            AccessMode::ReadWriteMany,
            AccessMode::ReadWriteOncePod,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }
}

/// Names one of a tenant's volume snapshots: `"volume@snapshot"`, or the
/// two names apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum SnapshotRef {
    /// `volume@snapshot`.
    Text(String),
    Parts {
        volume: String,
        snapshot: String,
    },
}

impl SnapshotRef {
    /// The volume's and the snapshot's names (unchecked; see
    /// `validate::volume`).
    pub fn parts(&self) -> Option<(&str, &str)> {
        match self {
            SnapshotRef::Text(t) => t.split_once('@'),
            SnapshotRef::Parts { volume, snapshot } => Some((volume, snapshot)),
        }
    }
}

/// Most snapshots one volume may have. A snapshot's blocks are shared
/// with its volume until either side changes, and btrfs has no cheap
/// count of what a snapshot alone holds, so snapshots are bounded by
/// number rather than counted against `--tenant-max-volume-mb`.
pub const MAX_SNAPSHOTS_PER_VOLUME: usize = 64;

/// `POST /v1/volumes/{name}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateVolumeSnapshot {
    /// A DNS-1123 label, unique among the volume's snapshots.
    pub name: String,
}

/// A read-only, point-in-time copy of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeSnapshot {
    /// The volume it was taken of.
    pub volume: String,
    pub name: String,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// `GET /v1/volumes/{name}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeSnapshotList {
    pub snapshots: Vec<VolumeSnapshot>,
}

/// A volume as `GET /v1/volumes/{name}` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Volume {
    pub name: String,
    pub size_mb: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Kubernetes: the claim's access mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

/// Most volumes one template (or one create request) mounts.
pub const MAX_VOLUME_MOUNTS: usize = 16;
/// Longest mount path, in bytes.
pub const MAX_MOUNT_PATH: usize = 256;

/// One volume a sandbox mounts: `{"name": "data", "path":
/// "/workspace/data", "read_only": false}`. The rules are checked in
/// `validate::volume_mounts`, on a template's list, a create request's,
/// and the two together (the request's add to the template's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeMount {
    /// One of the caller's volumes.
    pub name: String,
    /// Where it appears in the sandbox: absolute and normalized.
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}
