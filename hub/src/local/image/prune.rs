//! Taking images off the disk: `remove` (one tenant's tag, or its hold on
//! an image), `prune` (every hold a tenant does not use, and abandoned
//! partial downloads), and what both end with: a record no tenant holds
//! and no sandbox runs is deleted, then every layer and blob no record
//! needs and no import or pull has claimed is collected.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use sandhub_api::{
    error::{Code, ErrorBody},
    hub::{Image, PruneResult},
    validate,
};

use super::{format, internal, pull, ImageStore, Record, Used, Users};

/// A file in `partial/` untouched this long, and claimed by no pull, is
/// abandoned: `prune` removes it (a pull resumes only a recent cut).
const PARTIAL_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

impl ImageStore {
    /// `(tenant, image id)` of everything in use: every template's image
    /// (resolved in its tenant) and every live sandbox's pin. Stale pins
    /// (of sandboxes the hub no longer holds) are dropped on the way.
    fn used(&self, users: &Users) -> Result<Used, ErrorBody> {
        let mut used = Used::new();
        for (tenant, reference) in &users.templates {
            if let Ok(r) = self.find(tenant, reference) {
                used.insert((tenant.clone(), r.image.id));
            }
        }
        let dir = std::fs::read_dir(self.root.join("pins"))
            .map_err(|e| internal("listing image pins", e))?;
        for e in dir {
            let e = e.map_err(|e| internal("listing image pins", e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !users.sandboxes.contains(&name) {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            if let Some((tenant, id)) = text.trim_end().split_once('\n') {
                used.insert((tenant.to_string(), id.to_string()));
            }
        }
        Ok(used)
    }

    /// Removes one of `tenant`'s tags, or (named by id or by its last tag)
    /// the tenant's hold on the image. An image the tenant's templates or
    /// sandboxes use is refused with `CONFLICT`. The image leaves the disk
    /// when no tenant holds it any more.
    pub fn remove(&self, tenant: &str, reference: &str, users: &Users) -> Result<Image, ErrorBody> {
        let (image, trash) = {
            let _g = self.guard();
            self.remove_locked(tenant, reference, users)?
        };
        drop(trash);
        Ok(image)
    }

    fn remove_locked(
        &self,
        tenant: &str,
        reference: &str,
        users: &Users,
    ) -> Result<(Image, Trash), ErrorBody> {
        let mut record = self.find(tenant, reference)?;
        let image = record.view(tenant);
        let by_id = format::sha256_hex(reference).is_some();
        if !by_id && image.tags.len() > 1 {
            let tag = validate::normalize_image_reference(reference);
            if let Some(tags) = record.tenants.get_mut(tenant) {
                tags.remove(&tag);
            }
            self.write_record(&record)?;
            return Ok((record.view(tenant), Trash::default()));
        }
        let used = self.used(users)?;
        if used.contains(&(tenant.to_string(), record.image.id.clone())) {
            return Err(ErrorBody::new(
                Code::Conflict,
                format!("image `{reference}` is in use by a template or a sandbox"),
            ));
        }
        record.tenants.remove(tenant);
        self.release(&record, &used, &mut PruneResult::default())?;
        let trash = self.collect(&mut PruneResult::default())?;
        self.refresh_ledger()?;
        Ok((image, trash))
    }

    /// Drops `tenant`'s holds on its untagged images it does not use, then
    /// removes every image no tenant holds and nothing uses, every layer
    /// and blob no image needs, and abandoned partial downloads.
    pub fn prune(&self, tenant: &str, users: &Users) -> Result<PruneResult, ErrorBody> {
        let (result, trash) = {
            let _g = self.guard();
            self.prune_locked(tenant, users)?
        };
        drop(trash);
        Ok(result)
    }

    fn prune_locked(&self, tenant: &str, users: &Users) -> Result<(PruneResult, Trash), ErrorBody> {
        let used = self.used(users)?;
        let mut result = PruneResult::default();
        for mut record in self.records()? {
            let untagged = record.tenants.get(tenant).is_some_and(|t| t.is_empty());
            if untagged && !used.contains(&(tenant.to_string(), record.image.id.clone())) {
                record.tenants.remove(tenant);
                if !record.tenants.is_empty() {
                    // Still another tenant's: to this one it is gone.
                    result.images.push(record.image.id.clone());
                }
            } else if !record.tenants.is_empty() {
                continue;
            }
            self.release(&record, &used, &mut result)?;
        }
        let trash = self.collect(&mut result)?;
        self.prune_partials(&mut result);
        self.refresh_ledger()?;
        Ok((result, trash))
    }

    /// Writes a record whose holders changed, or deletes it when no tenant
    /// holds it and no sandbox runs it.
    fn release(
        &self,
        record: &Record,
        used: &Used,
        result: &mut PruneResult,
    ) -> Result<(), ErrorBody> {
        let hex = record.hex()?;
        let running = used.iter().any(|(_, id)| *id == record.image.id);
        if !record.tenants.is_empty() || running {
            return self.write_record(record);
        }
        std::fs::remove_file(self.record_path(hex))
            .map_err(|e| internal("removing an image record", e))?;
        self.unmount(hex);
        result.images.push(record.image.id.clone());
        Ok(())
    }

    /// Removes layers and blobs no image record refers to and no import
    /// or pull in progress has claimed. Called with the lock held. Layers
    /// are only moved into `tmp/` here: deleting a large one takes long,
    /// so the caller does it once the lock is released.
    fn collect(&self, result: &mut PruneResult) -> Result<Trash, ErrorBody> {
        let mut keep = HashSet::new();
        for record in self.records()? {
            let image = &record.image;
            for d in image.layers.iter().chain(std::iter::once(&image.id)) {
                if let Some(h) = format::sha256_hex(d) {
                    keep.insert(h.to_string());
                }
            }
        }
        let mut trash = Trash::default();
        for (sub, is_layer) in [("layers", true), ("blobs/sha256", false)] {
            let dir = self.root.join(sub);
            for e in std::fs::read_dir(&dir).map_err(|e| internal("listing the store", e))? {
                let e = e.map_err(|e| internal("listing the store", e))?;
                let name = e.file_name().to_string_lossy().into_owned();
                if keep.contains(&name) || self.inflight.contains(&name) {
                    continue;
                }
                let res = if is_layer {
                    self.tmp_dir("trash-").and_then(|t| {
                        let to = t.keep().join(&name);
                        trash
                            .0
                            .push(to.parent().map(Path::to_path_buf).unwrap_or_default());
                        std::fs::rename(e.path(), &to)
                            .map_err(|e| internal(&format!("removing layers/{name}"), e))
                    })
                } else {
                    std::fs::remove_file(e.path())
                        .map_err(|e| internal(&format!("removing {sub}/{name}"), e))
                };
                res?;
                if is_layer {
                    result.layers += 1;
                } else {
                    result.blobs += 1;
                }
            }
        }
        Ok(trash)
    }

    /// Removes the files in `partial/` no pull is using and none has
    /// touched for [`PARTIAL_MAX_AGE`]: a pull cut and never retried.
    /// Counted as blobs. Called with the lock held.
    fn prune_partials(&self, result: &mut PruneResult) {
        let partial = self.root.join("partial");
        let old = |p: &Path| {
            p.symlink_metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > PARTIAL_MAX_AGE)
        };
        let mut drop_file = |path: &Path, key: &str| {
            if self.inflight.contains(&pull::partial_claim(key)) || !old(path) {
                return;
            }
            match std::fs::remove_file(path) {
                Ok(()) => {
                    self.pulls.forget(key);
                    result.blobs += 1;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "removing a partial blob")
                }
            }
        };
        for e in std::fs::read_dir(&partial).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                for f in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    let key = format!("{name}/{}", f.file_name().to_string_lossy());
                    drop_file(&f.path(), &key);
                }
                // Only when empty: a tenant's directory with files stays.
                let _ = std::fs::remove_dir(&path);
            } else {
                drop_file(&path, &name);
            }
        }
    }
}

/// Layer directories taken out of place under the lock, deleted when
/// dropped (after the lock is released).
#[derive(Default)]
struct Trash(Vec<PathBuf>);

impl Drop for Trash {
    fn drop(&mut self) {
        for p in &self.0 {
            if let Err(e) = std::fs::remove_dir_all(p) {
                tracing::warn!(path = %p.display(), error = %e, "removing a collected layer");
            }
        }
    }
}
