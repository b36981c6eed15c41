//! A tenant's named volumes on the local hub (`/v1/volumes`, issue #32
//! §1): rows in the store, each a subvolume with a qgroup limit of its
//! `size_mb` at `volumes/<tenant dir>/<name>` on the disk-quota volume
//! (`runtime::quota`), where `<tenant dir>` is a digest of the tenant's
//! name (any text an API keys file gives, never a path).
//!
//! The row is the truth: a create writes the row, then makes the
//! subvolume; a delete removes the row, then the subvolume. A hub killed
//! between the two finds the difference at start-up
//! ([`Hub::reconcile_volumes`]): a row without a subvolume gets an empty
//! one, a subvolume without a row goes.

use std::collections::BTreeSet;

use sandhub_api::{
    error::Code,
    hub::Template,
    validate,
    volumes::{
        CreateVolume, CreateVolumeSnapshot, Volume, VolumeList, VolumeMount, VolumeSnapshot,
        VolumeSnapshotList, MAX_SNAPSHOTS_PER_VOLUME,
    },
};
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    hub::{counts_against_quota, Hub},
    runtime::{quota::MIB, DiskQuotas, IdMap, VolumeBind, VOLUMES_DIR},
    store::{
        PendingClone, SandboxRow, SnapshotRefused, VolumeRefused, VolumeRow, VolumeSnapshotRow,
    },
};
use crate::backend::{now_ms, rfc3339};

/// Key of a row's runtime JSON holding the volumes its create request
/// added to its template's (kept across launches).
pub const REQUEST_KEY: &str = "request_volumes";
/// Key of a row's runtime JSON holding what its last launch mounted.
pub const MOUNTED_KEY: &str = "volumes";

/// A volume a sandbox mounts, resolved to its owner (the sandbox's own
/// tenant, or the operator's for a `--shared-volume`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mounted {
    pub owner: String,
    pub name: String,
    pub path: String,
    pub read_only: bool,
}

/// The volumes `row`'s create request added (none for most rows).
pub fn requested(row: &SandboxRow) -> Vec<VolumeMount> {
    recorded(row, REQUEST_KEY)
}

/// What `row`'s last launch mounted.
fn mounted(row: &SandboxRow) -> Vec<Mounted> {
    recorded(row, MOUNTED_KEY)
}

fn recorded<T: serde::de::DeserializeOwned>(row: &SandboxRow, key: &str) -> Vec<T> {
    row.runtime
        .as_ref()
        .and_then(|r| r.get(key))
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// The directory a tenant's volumes live in: 32 hex digits of the SHA-256
/// of its name.
pub fn tenant_dir(tenant: &str) -> String {
    hex::encode(&Sha256::digest(tenant.as_bytes())[..16])
}

fn to_api(row: VolumeRow) -> Volume {
    Volume {
        name: row.name,
        size_mb: row.size_mb,
        labels: row.labels,
        created_at: rfc3339(row.created_at),
        access_mode: None,
    }
}

/// A volume snapshot's name on disk: `<volume>@<snapshot>`, both
/// DNS-1123 labels, so it is one component and says both names.
fn snapshot_key(volume: &str, snapshot: &str) -> String {
    format!("{volume}@{snapshot}")
}

fn snapshot_to_api(row: VolumeSnapshotRow) -> VolumeSnapshot {
    VolumeSnapshot {
        volume: row.volume,
        name: row.name,
        created_at: rfc3339(row.created_at),
    }
}

fn snapshot_not_found(volume: &str, snapshot: &str) -> Error {
    Error::not_found(format!("volume snapshot {volume:?}@{snapshot:?}"))
}

fn not_found(name: &str) -> Error {
    Error::not_found(format!("volume {name:?}"))
}

fn disk_error(what: &str, e: std::io::Error) -> Error {
    tracing::error!(error = %e, "{what}");
    Error::new(Code::Unavailable, format!("{what}: {e}"))
}

impl Hub {
    fn volume_quotas(&self) -> Result<&DiskQuotas> {
        self.backend.quotas().map(|q| &**q).ok_or_else(|| {
            Error::new(
                Code::FailedPrecondition,
                "named volumes need the hub's disk-quota volume (btrfs with qgroups), \
                 which this hub runs without (see `sandhub serve --help`, --disk-*)",
            )
        })
    }

    pub(super) fn create_volume(&self, tenant: &str, req: CreateVolume) -> Result<Volume> {
        validate::volume(&req)?;
        let quotas = self.volume_quotas()?;
        let row = VolumeRow {
            tenant: tenant.to_string(),
            name: req.name,
            size_mb: req.size_mb,
            labels: req.labels,
            created_at: now_ms(),
        };
        let cap = self.policy.tenant_max_volume_mb;
        let _held = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        let from = req.from_snapshot.as_ref().and_then(|f| f.parts());
        let pending = match from {
            Some((volume, snapshot)) => {
                if self
                    .store
                    .get_volume_snapshot(tenant, volume, snapshot)?
                    .is_none()
                {
                    return Err(snapshot_not_found(volume, snapshot));
                }
                Some(PendingClone {
                    tenant: tenant.to_string(),
                    name: row.name.clone(),
                    snapshot_volume: volume.to_string(),
                    snapshot: snapshot.to_string(),
                })
            }
            None => None,
        };
        match self.store.insert_volume_from(&row, cap, pending.as_ref())? {
            Ok(()) => {}
            Err(VolumeRefused::Exists) => {
                return Err(Error::new(
                    Code::Conflict,
                    format!("volume {:?} exists already", row.name),
                ))
            }
            Err(VolumeRefused::OverCap { have_mb }) => {
                return Err(Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "volume of {} MiB refused: this tenant's volumes take {have_mb} of the \
                         {cap} MiB allowed (--tenant-max-volume-mb); delete one first",
                        row.size_mb
                    ),
                ))
            }
        }
        let bytes = row.size_mb.saturating_mul(MIB);
        let made = match &pending {
            Some(p) => quotas.clone_volume(
                &tenant_dir(tenant),
                &snapshot_key(&p.snapshot_volume, &p.snapshot),
                &row.name,
                bytes,
            ),
            None => quotas.create_volume(&tenant_dir(tenant), &row.name, bytes, true),
        };
        // Its root belongs to the sandboxes' root (the id range they all
        // share), so a sandbox can write its first file there.
        let made = made.and_then(|_| {
            let root = quotas.open_volume(&tenant_dir(tenant), &row.name)?;
            give_to_sandboxes(&root, &self.backend.idmap())
        });
        if let Err(e) = made {
            // No volume without its disk: take the row back.
            let _ = self.store.delete_volume(tenant, &row.name);
            let _ = self.store.clone_done(tenant, &row.name);
            let _ = quotas.release_volume(&tenant_dir(tenant), &row.name);
            return Err(disk_error("making the volume's subvolume", e));
        }
        if pending.is_some() {
            self.store.clone_done(tenant, &row.name)?;
        }
        tracing::info!(tenant, volume = %row.name, size_mb = row.size_mb, "volume created");
        Ok(to_api(row))
    }

    pub(super) fn list_volumes(&self, tenant: &str) -> Result<VolumeList> {
        Ok(VolumeList {
            volumes: self
                .store
                .list_volumes(tenant)?
                .into_iter()
                .map(to_api)
                .collect(),
        })
    }

    pub(super) fn get_volume(&self, tenant: &str, name: &str) -> Result<Volume> {
        validate::name("volume", name)?;
        self.store
            .get_volume(tenant, name)?
            .map(to_api)
            .ok_or_else(|| not_found(name))
    }

    pub(super) fn delete_volume(&self, tenant: &str, name: &str) -> Result<()> {
        validate::name("volume", name)?;
        let _held = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(user) = self.volume_user(tenant, name)? {
            return Err(Error::new(
                Code::Conflict,
                format!(
                    "volume {name:?} is mounted by sandbox {user} (running, paused, suspended \
                     or starting); delete that sandbox first"
                ),
            ));
        }
        if !self.store.delete_volume(tenant, name)? {
            return Err(not_found(name));
        }
        if let Some(q) = self.backend.quotas() {
            // Gone from the API already; a failure here leaves a
            // subvolume the next start removes.
            if let Err(e) = q.release_volume(&tenant_dir(tenant), name) {
                tracing::warn!(error = %e, tenant, volume = name, "deleting a volume's subvolume; the next start retries");
            }
        }
        tracing::info!(tenant, volume = name, "volume deleted");
        Ok(())
    }

    /// A sandbox that mounts `owner`'s volume `name`, or would on its next
    /// start: one not finished whose last launch mounted it, whose create
    /// request asked for it, or whose template (as it is now) names it.
    /// Any tenant's sandbox counts: a shared volume is mounted by others.
    fn volume_user(&self, owner: &str, name: &str) -> Result<Option<String>> {
        let shared = self.shared_volume_owner(name).is_some_and(|o| o == owner);
        for r in self.store.all_sandboxes()? {
            if !counts_against_quota(r.state) || (r.tenant != owner && !shared) {
                continue;
            }
            let by_launch = mounted(&r)
                .iter()
                .any(|m| m.owner == owner && m.name == name);
            let by_name = |m: &VolumeMount| {
                m.name == name && (r.tenant == owner || !self.owns_volume(&r.tenant, name))
            };
            let by_template = || {
                self.template(&r.tenant, &r.template)
                    .is_ok_and(|t| t.volumes.iter().any(by_name))
            };
            if by_launch || requested(&r).iter().any(by_name) || by_template() {
                return Ok(Some(r.id));
            }
        }
        Ok(None)
    }

    fn owns_volume(&self, tenant: &str, name: &str) -> bool {
        matches!(self.store.get_volume(tenant, name), Ok(Some(_)))
    }

    /// The tenant that owns the shared volume `name`, if the operator
    /// published one by that name.
    fn shared_volume_owner(&self, name: &str) -> Option<&str> {
        self.policy
            .shared_volumes
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.owner.as_str())
    }

    /// Keeps with a launch's handle what the next launch and the in-use
    /// check need: the volumes the create request added, and what this
    /// launch mounted.
    pub(super) fn record_volumes(
        row: &SandboxRow,
        mounted: &[Mounted],
        handle: &mut serde_json::Value,
    ) {
        let Some(obj) = handle.as_object_mut() else {
            return;
        };
        let request_volumes = requested(row);
        if !request_volumes.is_empty() {
            obj.insert(
                REQUEST_KEY.into(),
                serde_json::to_value(&request_volumes).unwrap_or_default(),
            );
        }
        if !mounted.is_empty() {
            obj.insert(
                MOUNTED_KEY.into(),
                serde_json::to_value(mounted).unwrap_or_default(),
            );
        }
    }

    /// What a launch of `row` with `template` mounts: the template's
    /// volumes and its create request's, each the tenant's own or, failing
    /// that, one the operator shares (read-only only). A volume that does
    /// not exist is `NOT_FOUND`, naming who asked for it.
    pub(super) fn volume_binds(
        &self,
        row: &SandboxRow,
        template: &Template,
    ) -> Result<(Vec<VolumeBind>, Vec<Mounted>)> {
        let extra = requested(row);
        if template.volumes.is_empty() && extra.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let all: Vec<VolumeMount> = template.volumes.iter().chain(&extra).cloned().collect();
        validate::volume_mounts(&all)?;
        let quotas = self.volume_quotas()?;
        let (mut binds, mut mounted) = (Vec::new(), Vec::new());
        for m in all {
            let owner = if self.owns_volume(&row.tenant, &m.name) {
                row.tenant.clone()
            } else {
                match self.shared_volume_owner(&m.name) {
                    Some(o) if self.owns_volume(o, &m.name) => {
                        if !m.read_only {
                            return Err(Error::new(
                                Code::PermissionDenied,
                                format!(
                                    "volume {:?} is shared by the operator read-only: mount it \
                                     with `read_only: true`",
                                    m.name
                                ),
                            ));
                        }
                        o.to_string()
                    }
                    _ => {
                        return Err(Error::not_found(format!(
                            "volume {:?} (mounted at {} by template {:?} or the create request)",
                            m.name, m.path, row.template
                        )))
                    }
                }
            };
            let dir = tenant_dir(&owner);
            // Checked here too, so a broken volume fails the create with
            // its name rather than deep inside the sandbox's start.
            quotas
                .open_volume(&dir, &m.name)
                .map_err(|e| disk_error(&format!("opening volume {:?}", m.name), e))?;
            binds.push(VolumeBind {
                root: quotas.root().to_path_buf(),
                rel: format!("{VOLUMES_DIR}/{dir}/{}", m.name),
                path: m.path.clone(),
                read_only: m.read_only,
            });
            mounted.push(Mounted {
                owner,
                name: m.name,
                path: m.path,
                read_only: m.read_only,
            });
        }
        Ok((binds, mounted))
    }

    /// The root of a tenant's volume, for the volume files API: the row
    /// first (another tenant's name is NOT_FOUND, as an unused one), then
    /// the subvolume, reached without following links or crossing mounts.
    pub(super) fn volume_dir(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<crate::volume_files::VolumeDir> {
        validate::name("volume", name)?;
        let quotas = self.volume_quotas()?;
        if self.store.get_volume(tenant, name)?.is_none() {
            return Err(not_found(name));
        }
        let fd = quotas
            .open_volume(&tenant_dir(tenant), name)
            .map_err(|e| disk_error("opening the volume", e))?;
        Ok(crate::volume_files::VolumeDir::new(
            fd,
            super::runtime::IdMap::for_current_user().host_root(),
        ))
    }

    /// CONFLICT while `volume` has snapshots: they are named after it, and
    /// a clone of one must keep meaning the volume it was taken of.
    pub(super) fn check_no_volume_snapshots(&self, tenant: &str, volume: &str) -> Result<()> {
        validate::name("volume", volume)?;
        let snaps = self.store.list_volume_snapshots(tenant, volume)?;
        if snaps.is_empty() {
            return Ok(());
        }
        Err(Error::new(
            Code::Conflict,
            format!(
                "volume {volume:?} has {} snapshot(s) ({}); delete them first",
                snaps.len(),
                snaps
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }

    /// A read-only snapshot of a volume. The row goes first (it claims the
    /// name and the count), then the subvolume; a failure takes the row
    /// back. A hub killed in between finds a row without a subvolume at
    /// start and drops it (the create never answered).
    pub(super) fn create_volume_snapshot(
        &self,
        tenant: &str,
        volume: &str,
        req: CreateVolumeSnapshot,
    ) -> Result<VolumeSnapshot> {
        validate::name("volume", volume)?;
        validate::name("snapshot", &req.name)?;
        let quotas = self.volume_quotas()?;
        let _held = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        if self.store.get_volume(tenant, volume)?.is_none() {
            return Err(not_found(volume));
        }
        let row = VolumeSnapshotRow {
            tenant: tenant.to_string(),
            volume: volume.to_string(),
            name: req.name,
            created_at: now_ms(),
        };
        match self
            .store
            .insert_volume_snapshot(&row, MAX_SNAPSHOTS_PER_VOLUME)?
        {
            Ok(()) => {}
            Err(SnapshotRefused::Exists) => {
                return Err(Error::new(
                    Code::Conflict,
                    format!("volume {volume:?} has a snapshot {:?} already", row.name),
                ))
            }
            Err(SnapshotRefused::TooMany(n)) => {
                return Err(Error::new(
                    Code::ResourceExhausted,
                    format!(
                        "volume {volume:?} has {n} snapshots, the most one volume may have \
                         ({MAX_SNAPSHOTS_PER_VOLUME}); delete one first"
                    ),
                ))
            }
        }
        let dir = tenant_dir(tenant);
        let key = snapshot_key(volume, &row.name);
        // A subvolume at the key without a row is a crashed create's
        // leftover: never a snapshot anyone was answered.
        let made = quotas
            .release_volume_snapshot(&dir, &key)
            .and_then(|()| quotas.snapshot_volume(&dir, volume, &key));
        if let Err(e) = made {
            let _ = self.store.delete_volume_snapshot(tenant, volume, &row.name);
            return Err(disk_error("snapshotting the volume", e));
        }
        tracing::info!(tenant, volume, snapshot = %row.name, "volume snapshot taken");
        Ok(snapshot_to_api(row))
    }

    pub(super) fn list_volume_snapshots(
        &self,
        tenant: &str,
        volume: &str,
    ) -> Result<VolumeSnapshotList> {
        validate::name("volume", volume)?;
        let rows = self.store.list_volume_snapshots(tenant, volume)?;
        if rows.is_empty() && self.store.get_volume(tenant, volume)?.is_none() {
            return Err(not_found(volume));
        }
        Ok(VolumeSnapshotList {
            snapshots: rows.into_iter().map(snapshot_to_api).collect(),
        })
    }

    /// Removes the row, then the subvolume (a failure there leaves one
    /// the next start removes).
    pub(super) fn delete_volume_snapshot(
        &self,
        tenant: &str,
        volume: &str,
        name: &str,
    ) -> Result<()> {
        validate::name("volume", volume)?;
        validate::name("snapshot", name)?;
        let _held = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        if !self.store.delete_volume_snapshot(tenant, volume, name)? {
            return Err(snapshot_not_found(volume, name));
        }
        if let Some(q) = self.backend.quotas() {
            if let Err(e) =
                q.release_volume_snapshot(&tenant_dir(tenant), &snapshot_key(volume, name))
            {
                tracing::warn!(error = %e, tenant, volume, snapshot = name, "deleting a volume snapshot's subvolume; the next start retries");
            }
        }
        tracing::info!(tenant, volume, snapshot = name, "volume snapshot deleted");
        Ok(())
    }

    /// Snapshots' disk in line with their rows: a subvolume without a row
    /// goes; a row without its subvolume (a create killed halfway, or a
    /// disk changed behind the hub's back) cannot be made again, so it is
    /// dropped and logged.
    fn reconcile_volume_snapshots(&self, quotas: &DiskQuotas) -> Result<()> {
        let rows = self.store.all_volume_snapshots()?;
        let wanted: BTreeSet<(String, String)> = rows
            .iter()
            .map(|r| (tenant_dir(&r.tenant), snapshot_key(&r.volume, &r.name)))
            .collect();
        match quotas.list_volume_snapshots() {
            Ok(on_disk) => {
                for (dir, key) in on_disk {
                    if wanted.contains(&(dir.clone(), key.clone())) {
                        continue;
                    }
                    tracing::info!(tenant_dir = %dir, snapshot = %key, "removing a volume snapshot without a row");
                    if let Err(e) = quotas.release_volume_snapshot(&dir, &key) {
                        tracing::error!(error = %e, tenant_dir = %dir, snapshot = %key, "removing a volume snapshot without a row");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "listing the volume snapshots on disk"),
        }
        for r in rows {
            let key = snapshot_key(&r.volume, &r.name);
            match quotas.has_volume_snapshot(&tenant_dir(&r.tenant), &key) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(tenant = %r.tenant, volume = %r.volume, snapshot = %r.name, "a volume snapshot's subvolume is missing; dropping its row");
                    self.store
                        .delete_volume_snapshot(&r.tenant, &r.volume, &r.name)?;
                }
                Err(e) => {
                    tracing::error!(error = %e, tenant = %r.tenant, snapshot = %key, "checking a volume snapshot")
                }
            }
        }
        Ok(())
    }

    /// Clones a hub was killed in the middle of: made again from their
    /// snapshot (whatever stands at the volume's name may be a leftover
    /// from before the clone, so it is replaced), so the volume has the
    /// snapshot's files, not none. Without the snapshot any more, the
    /// volume is left to the usual reconciliation (kept, or made empty).
    fn finish_pending_clones(&self, quotas: &DiskQuotas) -> Result<()> {
        for p in self.store.pending_clones()? {
            let Some(row) = self.store.get_volume(&p.tenant, &p.name)? else {
                self.store.clone_done(&p.tenant, &p.name)?;
                continue;
            };
            let dir = tenant_dir(&p.tenant);
            let key = snapshot_key(&p.snapshot_volume, &p.snapshot);
            if quotas.has_volume_snapshot(&dir, &key).unwrap_or(false) {
                match quotas.clone_volume(&dir, &key, &p.name, row.size_mb.saturating_mul(MIB)) {
                    Ok(_) => {
                        tracing::info!(tenant = %p.tenant, volume = %p.name, snapshot = %key, "finished a clone a stopped hub left")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, tenant = %p.tenant, volume = %p.name, "finishing a clone");
                        continue;
                    }
                }
            } else {
                tracing::warn!(tenant = %p.tenant, volume = %p.name, snapshot = %key, "a clone's snapshot is gone; the volume stays as it is");
            }
            self.store.clone_done(&p.tenant, &p.name)?;
        }
        Ok(())
    }

    /// Puts the disk in line with the rows (see the module docs). Without
    /// a disk-quota volume there is nothing on disk to reconcile; rows stay
    /// and answer as before. A volume that cannot be put right is logged
    /// and left as it is: one bad directory must not keep the hub (and
    /// every sandbox) from starting.
    pub(super) fn reconcile_volumes(&self) -> Result<()> {
        let Some(quotas) = self.backend.quotas() else {
            return Ok(());
        };
        self.reconcile_volume_snapshots(quotas)?;
        self.finish_pending_clones(quotas)?;
        let rows = self.store.all_volumes()?;
        let wanted: BTreeSet<(String, String)> = rows
            .iter()
            .map(|r| (tenant_dir(&r.tenant), r.name.clone()))
            .collect();
        match quotas.list_volumes() {
            Ok(on_disk) => {
                for (dir, name) in on_disk {
                    if wanted.contains(&(dir.clone(), name.clone())) {
                        continue;
                    }
                    tracing::info!(tenant_dir = %dir, volume = %name, "removing a volume without a row");
                    if let Err(e) = quotas.release_volume(&dir, &name) {
                        tracing::error!(error = %e, tenant_dir = %dir, volume = %name, "removing a volume without a row");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "listing the volumes on disk"),
        }
        for r in &rows {
            let limited = quotas.create_volume(
                &tenant_dir(&r.tenant),
                &r.name,
                r.size_mb.saturating_mul(MIB),
                false,
            );
            if let Err(e) = limited {
                tracing::error!(error = %e, tenant = %r.tenant, volume = %r.name, "putting a volume's subvolume in place");
            }
        }
        if !rows.is_empty() {
            tracing::info!(volumes = rows.len(), "named volumes in place");
        }
        Ok(())
    }
}

/// Makes a new volume's root the sandboxes' root's (the id range all
/// sandboxes share), so a sandbox can write its first file there.
fn give_to_sandboxes(root: &std::os::fd::OwnedFd, idmap: &IdMap) -> std::io::Result<()> {
    let (uid, gid) = idmap.host_root();
    rustix::fs::chownat(
        root,
        "",
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        rustix::fs::AtFlags::EMPTY_PATH,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tenant_dirs_are_fixed_hex_and_distinct() {
        let a = super::tenant_dir("alice");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, super::tenant_dir("alice"));
        assert_ne!(a, super::tenant_dir("bob"));
        assert_ne!(super::tenant_dir("../x"), "../x");
    }
}
