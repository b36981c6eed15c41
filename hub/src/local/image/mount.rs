//! An image's root filesystem: one read-only overlay of its layers,
//! mounted by the hub on the host at `images/mnt/<id hex>` and shared by
//! every sandbox of the image. The runtime then binds its top-level
//! entries into each sandbox like a template's `root_fs` (read-only), so
//! `/proc`, `/dev`, `/tmp`, `/workspace` and sandboxd come from the
//! runtime as for any sandbox.
//!
//! Mounted in the hub's (host) namespace, overlayfs honours the layers'
//! `trusted.overlay.opaque` xattrs and 0/0 whiteouts as unpacked; the
//! files keep their shifted owners, so image root is root inside.
//! Layers are added one by one (`lowerdir+`, Linux 6.8+), so neither their
//! number nor their path length hits the one-page limit of mount options.

use std::{
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use rustix::mount::{
    fsconfig_create, fsconfig_set_string, fsmount, fsopen, move_mount, unmount, FsMountFlags,
    FsOpenFlags, MountAttrFlags, MoveMountFlags, UnmountFlags,
};
use sandhub_api::{
    error::{Code, ErrorBody},
    hub::Image,
};

use super::{format, ImageStore};

impl ImageStore {
    fn mount_point(&self, hex: &str) -> PathBuf {
        self.root.join("mnt").join(hex)
    }

    /// The image a tenant's reference names and its root filesystem,
    /// mounted if it is not yet (after a hub restart, say). `sandbox` is
    /// pinned to the image, in the same locked step, so no removal or
    /// prune can take the image from under it.
    pub fn root_of(
        &self,
        tenant: &str,
        reference: &str,
        sandbox: &str,
    ) -> Result<(Image, PathBuf), ErrorBody> {
        let _g = self.guard();
        let image = self.find(tenant, reference)?.view(tenant);
        let hex =
            format::sha256_hex(&image.id).ok_or_else(|| super::internal("image id", &image.id))?;
        self.pin(sandbox, tenant, &image.id)?;
        let target = self.mount_point(hex);
        if is_mounted(&target) {
            return Ok((image, target));
        }
        std::fs::create_dir_all(&target).map_err(|e| super::internal("image mount point", e))?;
        // Topmost first, as overlayfs stacks them; an empty bottom layer
        // because overlayfs without an upper layer needs two lowers.
        let mut lowers: Vec<PathBuf> = image
            .layers
            .iter()
            .rev()
            .filter_map(|d| format::sha256_hex(d))
            .map(|h| self.layer_dir(h))
            .collect();
        lowers.push(self.root.join("empty"));
        mount_overlay(&lowers, &target).map_err(|e| {
            ErrorBody::new(
                Code::Unavailable,
                format!("mounting image {}: {e}", image.id),
            )
        })?;
        Ok((image, target))
    }

    /// Unmounts every image root: at hub shutdown, so none outlives the
    /// hub. Running sandboxes keep theirs (their mount namespaces hold
    /// their own copies); a restarted hub mounts again on first use.
    pub fn unmount_all(&self) {
        let Ok(dir) = std::fs::read_dir(self.root.join("mnt")) else {
            return;
        };
        for e in dir.flatten() {
            if let Some(hex) = e.file_name().to_str() {
                self.unmount(hex);
            }
        }
    }

    /// Unmounts the root of an image being removed. Lazily: sandboxes
    /// running it keep their view until they end.
    pub(super) fn unmount(&self, hex: &str) {
        let target = self.mount_point(hex);
        if is_mounted(&target) {
            if let Err(e) = unmount(&target, UnmountFlags::DETACH) {
                tracing::warn!(path = %target.display(), error = %e, "unmounting an image root");
            }
        }
        let _ = std::fs::remove_dir(&target);
    }
}

/// Whether `path` is a mount point (its device differs from its parent's).
fn is_mounted(path: &Path) -> bool {
    let (Ok(m), Some(Ok(p))) = (
        std::fs::symlink_metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    m.is_dir() && m.dev() != p.dev()
}

fn mount_overlay(lowers: &[PathBuf], target: &Path) -> io::Result<()> {
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
    for l in lowers {
        fsconfig_set_string(&fs, "lowerdir+", l.as_os_str())
            .map_err(|e| io::Error::other(format!("layer {}: {e}", l.display())))?;
    }
    fsconfig_create(&fs)?;
    let mnt = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        // Set-id bits stay: an image's `su` is root of the sandbox's user
        // namespace only, and the tree is unreachable from the host
        // (under the hub's 0700 state dir).
        MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?;
    move_mount(
        &mnt,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?;
    Ok(())
}
