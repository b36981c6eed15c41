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
    validate,
    volumes::{CreateVolume, Volume, VolumeList},
};
use sandhub_client::{Error, Result};
use sha2::{Digest, Sha256};

use super::{
    hub::Hub,
    runtime::{quota::MIB, DiskQuotas},
    store::{VolumeRefused, VolumeRow},
};
use crate::backend::{now_ms, rfc3339};

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
        if let Err(e) = made {
            // No volume without its disk: take the row back.
            let _ = self.store.delete_volume(tenant, &row.name);
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
