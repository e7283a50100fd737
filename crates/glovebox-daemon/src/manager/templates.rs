//! Templates as the manager holds them: their API view with the sandboxes that use them,
//! deleting one (refused while in use), and collecting the layers nothing uses.

use std::collections::BTreeSet;

use glovebox_proto::api::TemplateInfo;

use super::Manager;
use crate::error::{Error, Result};
use crate::templates::{debian, TemplateMeta};

impl Manager {
    /// The API view of a built template.
    pub fn template_info(&self, meta: &TemplateMeta) -> TemplateInfo {
        let sandboxes = self.list().iter().filter(|s| s.template == meta.name).count();
        TemplateInfo {
            name: meta.name.clone(),
            base: meta.base.clone(),
            layers: meta.layers.clone(),
            size_bytes: meta.layers.iter().map(|l| self.templates.store.layer_size(l)).sum(),
            created_at: meta.created_at.clone(),
            env: meta.env.clone(),
            workdir: meta.workdir.clone(),
            user: meta.user.clone(),
            resources: meta.resources.clone(),
            start_cmd: meta.start_cmd.clone(),
            isolation: meta.isolation,
            sandboxes,
        }
    }

    pub fn template_list(&self) -> Vec<TemplateInfo> {
        self.templates.store.list().iter().map(|t| self.template_info(t)).collect()
    }

    pub fn template_get(&self, name: &str) -> Result<TemplateInfo> {
        match self.templates.store.load(name) {
            Some(t) => Ok(self.template_info(&t)),
            None => Err(Error::NotFound { what: "template", name: name.to_string() }),
        }
    }

    /// Deletes a built template; refused (409) while a live sandbox runs from it. Its layers
    /// that nothing else uses are collected right away.
    pub async fn template_delete(&self, name: &str) -> Result<u64> {
        if self.templates.store.load(name).is_none() {
            return Err(Error::NotFound { what: "template", name: name.to_string() });
        }
        let _g = self.templates.gc_lock.write().await;
        let users = self.list().iter().filter(|s| s.template == name).count();
        if users > 0 {
            return Err(Error::Conflict(format!(
                "template {name:?} is in use by {users} sandbox(es); kill them first"
            )));
        }
        self.discard_warm(name);
        self.templates.store.remove(name).map_err(|e| Error::Internal(format!("remove template: {e}")))?;
        Ok(self.gc_locked())
    }

    /// Removes every layer no template and no live sandbox uses. Returns the bytes freed.
    pub async fn template_gc(&self) -> u64 {
        let _g = self.templates.gc_lock.write().await;
        self.gc_locked()
    }

    fn gc_locked(&self) -> u64 {
        self.gc_layers(false)
    }

    /// Removes the layers nothing uses (with `only_snapshot_layers`, only snapshot layers: the
    /// start-up sweep leaves build caches alone). The GC lock must be held exclusively.
    pub(crate) fn gc_layers(&self, only_snapshot_layers: bool) -> u64 {
        let store = &self.templates.store;
        let mut keep: BTreeSet<String> = BTreeSet::new();
        for t in store.list() {
            keep.extend(t.layers);
        }
        // Snapshots name their own layer and their template's.
        for s in self.snapshots.all() {
            keep.extend(s.template.layers);
        }
        // Templates deleted or rebuilt while sandboxes still run from the old layers.
        for d in self.live_template_defaults() {
            keep.extend(d.layers.iter().cloned());
        }
        let warm = self.warm_keys();
        let mut freed = 0;
        for id in store.layer_ids() {
            if keep.contains(&id) || warm.iter().any(|k| k.contains(&id)) || debian::is_base_layer(store, &id) {
                continue;
            }
            if only_snapshot_layers && store.layer_step(&id).as_deref() != Some(crate::snapshots::LAYER_STEP) {
                continue;
            }
            match store.remove_layer(&id) {
                Ok(n) => freed += n,
                Err(e) => tracing::warn!(layer = %id, "gc: {e}"),
            }
        }
        freed
    }
}
