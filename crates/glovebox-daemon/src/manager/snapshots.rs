//! Snapshots and forks as the lifecycle service runs them: capturing a sandbox's writable
//! layer (frozen meanwhile), the records' API view, creating from one (see `create`), forking
//! (an anonymous snapshot and N sandboxes on it), and collecting what nothing uses.
//!
//! Invariants: a sandbox is frozen for the whole copy and thawed after it unless it was
//! paused before (or was paused meanwhile); the fresh layer is committed under the GC lock
//! (shared), its record written before that lock is let go; an anonymous snapshot is
//! removed only when no live sandbox started from it and no fork is still making children of
//! it. Processes are never copied (no checkpointing here): children start with nothing running.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use glovebox_proto::api::{self, CreateSandbox, Resources, SnapshotInfo};

use super::{Manager, Sb, Template};
use crate::error::{Error, Result};
use crate::snapshots::{capture, SnapshotMeta};
use crate::store::Origin;
use crate::templates::store::valid_name;
use crate::templates::TemplateMeta;
use crate::util::lock;

/// Where a fork's child comes from.
#[derive(Debug, Clone)]
pub(crate) struct Lineage {
    pub parent_id: String,
    /// Parent first.
    pub ancestors: Vec<String>,
}

/// What a snapshot taken under a name the tenant already has does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameTaken {
    /// Refused (409): Glovebox's own API.
    Refuse,
    /// The name moves to the new snapshot; the old one's layer is collected once nothing
    /// uses it (E2B's "a new build of the same snapshot template").
    Replace,
}

/// A fork in progress: its anonymous snapshot is not collected meanwhile.
struct InFlight<'a>(&'a Manager, String);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.0.forks_in_flight).remove(&self.1);
    }
}

impl Manager {
    /// The API view of a snapshot record.
    fn snapshot_info(&self, m: &SnapshotMeta) -> SnapshotInfo {
        let sandboxes = self
            .registry
            .all()
            .iter()
            .filter(|s| s.tenant == m.tenant && s.origin.as_ref().is_some_and(|o| o.snapshot == m.name))
            .count();
        SnapshotInfo {
            name: m.name.clone(),
            template: m.template.name.clone(),
            source_sandbox: m.source_sandbox.clone(),
            created_at: m.created_at.clone(),
            layer: m.layer.clone(),
            size_bytes: m.size_bytes,
            skipped: m.skipped,
            sandboxes,
        }
    }

    /// The tenant's named snapshots.
    pub fn snapshot_list(&self, tenant: &str) -> Vec<SnapshotInfo> {
        self.snapshots
            .all()
            .iter()
            .filter(|m| m.tenant == tenant && !m.anonymous)
            .map(|m| self.snapshot_info(m))
            .collect()
    }

    fn snapshot_meta(&self, tenant: &str, name: &str) -> Result<SnapshotMeta> {
        self.snapshots.get(tenant, name).ok_or_else(|| Error::NotFound { what: "snapshot", name: name.to_string() })
    }

    pub fn snapshot_get(&self, tenant: &str, name: &str) -> Result<SnapshotInfo> {
        Ok(self.snapshot_info(&self.snapshot_meta(tenant, name)?))
    }

    /// Deletes a snapshot's record at once. Sandboxes started from it keep running on its
    /// layer, which is collected when the last of them ends (deferred, never refused).
    pub async fn snapshot_delete(&self, tenant: &str, name: &str) -> Result<()> {
        let m = self.snapshot_meta(tenant, name)?;
        if m.anonymous {
            // A fork's: it goes with its last child.
            return Err(Error::NotFound { what: "snapshot", name: name.to_string() });
        }
        self.snapshots.remove(tenant, name).map_err(crate::manager::internal("remove snapshot"))?;
        self.template_gc().await;
        Ok(())
    }

    /// `POST /v1/sandboxes/{id}/snapshots`: captures sandbox `id`'s files as snapshot `name`.
    pub async fn snapshot(
        self: &Arc<Self>,
        tenant: &str,
        id: &str,
        name: &str,
        taken: NameTaken,
    ) -> Result<SnapshotInfo> {
        let sb = self.get(id)?;
        let m = self.take_snapshot(&sb, tenant, name, false, taken).await.map_err(|e| self.unless_gone(id, e))?;
        if taken == NameTaken::Replace {
            // The layer of a snapshot this one replaced goes unless a sandbox runs on it.
            self.collect_snapshots().await;
        }
        Ok(self.snapshot_info(&m))
    }

    async fn take_snapshot(
        &self,
        sb: &Arc<Sb>,
        tenant: &str,
        name: &str,
        anonymous: bool,
        taken: NameTaken,
    ) -> Result<SnapshotMeta> {
        if !valid_name(name) {
            return Err(Error::Invalid(
                "snapshot name: 1-63 characters of a-z 0-9 . _ -, starting with a letter or digit".into(),
            ));
        }
        let exists = |m: &SnapshotMeta| {
            // A fork's anonymous snapshot is never replaced: its children run on it.
            Error::Conflict(match m.anonymous {
                true => format!("snapshot name {name:?} is in use; pick another name"),
                false => format!("snapshot {name:?} exists; delete it first or pick another name"),
            })
        };
        if let Some(m) = self.snapshots.get(tenant, name) {
            if m.anonymous || taken == NameTaken::Refuse {
                return Err(exists(&m));
            }
        }
        if sb.template == crate::templates::BUILD_SANDBOX {
            return Err(Error::Invalid("a template build's sandbox cannot be snapshotted".into()));
        }
        if sb.isolation == api::Isolation::Gvisor {
            return Err(Error::Invalid(
                "snapshots and forks are not available for isolation gvisor sandboxes (their writable layer \
                 is the gofer's alone)"
                    .into(),
            ));
        }
        let Some(layer) = sb.host.writable_layer() else {
            return Err(Error::SnapshotFailed("this sandbox's tier does not show its files to the host".into()));
        };
        // Shared: GC waits until the record names the new layer.
        let _gc = self.templates.gc_lock.read().await;
        let t0 = Instant::now();
        let disk = crate::backend::jail::disk_bytes(&sb.limits);
        let limits = capture::Limits { max_bytes: disk, max_entries: (disk / 4096).max(16 * 1024) };
        let (sb2, store) = (sb.clone(), self.templates.store.clone());
        let (captured, froze) = tokio::task::spawn_blocking(move || -> Result<(capture::Captured, bool)> {
            let froze = freeze_unless_paused(&sb2)?;
            let scratch = store.scratch().map_err(crate::manager::internal("snapshot scratch dir"))?;
            let tree = scratch.join("tree");
            let r = capture::capture(&layer.path, &tree, layer.uid_base, limits);
            // Opened while PID 1 lived: the descriptor was its (the pid not recycled).
            let alive = sb2.host.alive();
            thaw_unless_paused(&sb2, froze);
            let r = match (r, alive) {
                (Ok(c), true) => store
                    .commit_layer(&c.id, &tree, None, crate::snapshots::LAYER_STEP)
                    .map(|()| c)
                    .map_err(crate::manager::internal("commit the snapshot layer")),
                (Ok(_), false) => Err(Error::SnapshotFailed("the sandbox ended during the snapshot".into())),
                (Err(e @ capture::CaptureError::Io { .. }), _) if !alive => {
                    Err(Error::SnapshotFailed(format!("the sandbox ended during the snapshot ({e})")))
                }
                (Err(e @ capture::CaptureError::Io { .. }), _) => {
                    Err(Error::Internal(format!("snapshot of {}: {e}", sb2.id)))
                }
                (Err(e), _) => Err(Error::SnapshotFailed(e.to_string())),
            };
            let _ = std::fs::remove_dir_all(&scratch);
            r.map(|c| (c, froze))
        })
        .await
        .map_err(|e| Error::Internal(format!("snapshot task: {e}")))??;
        let mut template = match &sb.template_defaults {
            Some(d) => (**d).clone(),
            None => base_meta(&sb.template),
        };
        template.layers.insert(0, captured.id.clone());
        let meta = SnapshotMeta {
            name: name.to_string(),
            tenant: tenant.to_string(),
            anonymous,
            layer: captured.id.clone(),
            template,
            source_sandbox: sb.id.clone(),
            created_at: crate::util::rfc3339(SystemTime::now()),
            size_bytes: captured.bytes,
            skipped: captured.skipped,
        };
        let written = match (taken, self.snapshots.get(tenant, name)) {
            (_, Some(m)) if m.anonymous => return Err(exists(&m)),
            (NameTaken::Replace, _) => self.snapshots.replace(&meta),
            (NameTaken::Refuse, _) => self.snapshots.create(&meta),
        };
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::Conflict(format!("snapshot {name:?} exists; delete it first or pick another name")))
            }
            Err(e) => return Err(Error::Internal(format!("write snapshot record: {e}"))),
        }
        tracing::info!(
            sandbox = %sb.id, snapshot = name, layer = %captured.id, bytes = captured.bytes,
            files = captured.entries, skipped = captured.skipped, was_paused = !froze,
            ms = t0.elapsed().as_millis() as u64, "snapshot taken"
        );
        Ok(meta)
    }

    /// What a create from snapshot `name` starts: the snapshot's template with its layers.
    pub(crate) fn snapshot_template(&self, tenant: &str, name: &str) -> Result<(Template, Origin)> {
        let m = self.snapshot_meta(tenant, name)?;
        let mut layers = Vec::new();
        for id in &m.template.layers {
            match self.layer_path(id) {
                Some(p) => layers.push(p),
                None => {
                    return Err(Error::Conflict(format!("snapshot {name:?} cannot be used: its layer {id} is gone")))
                }
            }
        }
        let t = Template {
            name: m.template.name.clone(),
            layers,
            preload: m.template.preload.clone(),
            host_usr: m.template.host_usr,
            defaults: Some(Arc::new(m.template.clone())),
        };
        Ok((t, Origin { snapshot: m.name, layers: m.template.layers, parent_id: None, ancestors: Vec::new() }))
    }

    /// A layer's tree: in this daemon's store, else in the shared template store.
    fn layer_path(&self, id: &str) -> Option<std::path::PathBuf> {
        if self.templates.store.has_layer(id) {
            return Some(self.templates.store.layer_fs(id));
        }
        let shared = self.cfg.shared_templates.as_deref().map(crate::templates::Store::at)?;
        shared.has_layer(id).then(|| shared.layer_fs(id))
    }

    /// The template defaults an adopted sandbox runs with: its template's as stored now (own
    /// or shared store), with the layers it was started on when from a snapshot.
    pub(crate) fn adopted_defaults(&self, template: &str, origin: Option<&Origin>) -> Option<Arc<TemplateMeta>> {
        let stored = self.template(template).ok().and_then(|t| t.defaults).map(|d| (*d).clone());
        match origin {
            None => stored.map(Arc::new),
            Some(o) => {
                let mut m = stored.unwrap_or_else(|| base_meta(template));
                m.layers = o.layers.clone();
                Some(Arc::new(m))
            }
        }
    }

    /// `POST /v1/sandboxes/{id}/fork`: `count` new sandboxes from sandbox `id`'s files, each
    /// with a copy of its network policy, limits, environment, labels and idle settings, and
    /// the rest of its lifetime. All or nothing: one child failing ends the others.
    pub async fn fork(self: &Arc<Self>, tenant: &str, id: &str, count: u32) -> Result<(String, Vec<Arc<Sb>>)> {
        if !(1..=api::MAX_FORK).contains(&count) {
            return Err(Error::Invalid(format!("count must be between 1 and {}", api::MAX_FORK)));
        }
        let sb = self.get(id)?;
        let network = sb.network();
        if network.redacted() != network || serde_json::to_string(&network).is_ok_and(|s| s.contains(api::REDACTED)) {
            return Err(Error::Invalid(
                "the sandbox's network policy has literal header values, which cannot be copied; \
                 reference secrets (${secret:NAME}) to fork it"
                    .into(),
            ));
        }
        let name = format!("fork-{}", crate::util::random_token(16));
        lock(&self.forks_in_flight).insert(name.clone());
        let _in_flight = InFlight(self, name.clone());
        self.take_snapshot(&sb, tenant, &name, true, NameTaken::Refuse).await.map_err(|e| self.unless_gone(id, e))?;
        let left = sb.deadline().at.saturating_duration_since(Instant::now());
        let l = &sb.limits;
        let req = CreateSandbox {
            template: None,
            snapshot: Some(name.clone()),
            timeout_s: Some((left.as_secs() + 1).clamp(1, api::MAX_TIMEOUT_S)),
            resources: Resources {
                cpus: Some(l.cpus),
                memory_mb: Some(l.memory_mb),
                disk_mb: Some(l.disk_mb),
                pids: Some(l.pids),
            },
            env: sb.env.clone(),
            metadata: sb.metadata(),
            network,
            idle_timeout_s: sb.idle_timeout().map(|d| d.as_secs().max(1)),
            on_idle: Some(sb.on_idle),
            volumes: Vec::new(),
            auto_resume: Some(sb.auto_resume),
            isolation: Some(sb.isolation),
        };
        let mut ancestors = vec![sb.id.clone()];
        ancestors.extend(sb.origin.as_ref().map(|o| o.ancestors.clone()).unwrap_or_default());
        let lineage = Lineage { parent_id: sb.id.clone(), ancestors };
        let made = futures_util::future::join_all(
            (0..count).map(|_| self.create_with(tenant, req.clone(), None, Some(lineage.clone()))),
        )
        .await;
        let mut children = Vec::new();
        let mut failed = None;
        for r in made {
            match r {
                Ok(c) => children.push(c),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            for c in &children {
                self.destroy_because(&c.id, api::EndReason::Error, Some("another child of its fork failed to start"))
                    .await;
            }
            drop(_in_flight);
            self.collect_snapshots().await;
            return Err(e);
        }
        tracing::info!(sandbox = %sb.id, children = children.len(), snapshot = name, "forked");
        Ok((name, children))
    }

    /// Removes the anonymous snapshots no live sandbox uses (and no fork is making children
    /// of), then the layers nothing names. Skipped while GC is busy (the next call does it).
    pub(crate) async fn collect_snapshots(&self) {
        let Ok(_g) = self.templates.gc_lock.try_write() else { return };
        self.collect_locked(false);
    }

    pub(crate) fn collect_locked(&self, only_snapshot_layers: bool) {
        let live: BTreeSet<(String, String)> = self
            .registry
            .all()
            .iter()
            .filter_map(|s| s.origin.as_ref().map(|o| (s.tenant.clone(), o.snapshot.clone())))
            .collect();
        let in_flight = lock(&self.forks_in_flight).clone();
        for m in self.snapshots.all() {
            if m.anonymous && !in_flight.contains(&m.name) && !live.contains(&(m.tenant.clone(), m.name.clone())) {
                if let Err(e) = self.snapshots.remove(&m.tenant, &m.name) {
                    tracing::warn!(snapshot = m.name, "remove unused fork snapshot: {e}");
                }
            }
        }
        self.gc_layers(only_snapshot_layers);
    }
}

/// The template record of a sandbox whose template has none (`base`).
fn base_meta(name: &str) -> TemplateMeta {
    TemplateMeta {
        name: name.to_string(),
        base: "host".into(),
        host_usr: true,
        layers: Vec::new(),
        env: Default::default(),
        workdir: None,
        user: None,
        uid: None,
        gid: None,
        resources: Default::default(),
        start_cmd: None,
        isolation: None,
        preload: None,
        created_at: String::new(),
        size_bytes: 0,
    }
}

/// Freezes `sb` for a copy unless it is paused (then it is frozen already); true if frozen here.
fn freeze_unless_paused(sb: &Sb) -> Result<bool> {
    let paused = lock(&sb.clock.paused);
    if paused.is_some() {
        return Ok(false);
    }
    sb.host.freeze().map_err(|e| Error::SnapshotFailed(format!("the sandbox cannot be frozen: {e}")))?;
    Ok(true)
}

/// Thaws what [`freeze_unless_paused`] froze, unless a pause came in meanwhile.
fn thaw_unless_paused(sb: &Sb, froze: bool) {
    let paused = lock(&sb.clock.paused);
    if froze && paused.is_none() {
        if let Err(e) = sb.host.thaw() {
            tracing::warn!(sandbox = %sb.id, "thaw after the snapshot: {e}");
        }
    }
}
