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
    volumes::{CreateVolume, Volume, VolumeList, VolumeMount},
};
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    hub::{counts_against_quota, Hub},
    runtime::{quota::MIB, DiskQuotas, IdMap, VolumeBind, VOLUMES_DIR},
    store::{SandboxRow, VolumeRefused, VolumeRow},
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
        match self.store.insert_volume(&row, cap)? {
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
        let made = quotas.create_volume(
            &tenant_dir(tenant),
            &row.name,
            row.size_mb.saturating_mul(MIB),
            true,
        );
        let made = made.and_then(|_| {
            let root = quotas.open_volume(&tenant_dir(tenant), &row.name)?;
            give_to_sandboxes(&root, &self.backend.idmap())
        });
        if let Err(e) = made {
            // No volume without its disk: take the row back.
            let _ = self.store.delete_volume(tenant, &row.name);
            if let Some(q) = self.backend.quotas() {
                let _ = q.release_volume(&tenant_dir(tenant), &row.name);
            }
            return Err(disk_error("making the volume's subvolume", e));
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

    /// Puts the disk in line with the rows (see the module docs). Without
    /// a disk-quota volume there is nothing on disk to reconcile; rows stay
    /// and answer as before. A volume that cannot be put right is logged
    /// and left as it is: one bad directory must not keep the hub (and
    /// every sandbox) from starting.
    pub(super) fn reconcile_volumes(&self) -> Result<()> {
        let Some(quotas) = self.backend.quotas() else {
            return Ok(());
        };
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
