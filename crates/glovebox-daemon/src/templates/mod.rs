//! Templates: root filesystems built from a spec (`spec`), stored as content-addressed
//! layers (`store`), built step by step in Glovebox sandboxes (`build`) on a base that is the
//! host's /usr, a Debian root made with debootstrap (`debian`) or an OCI image (`oci`).
//!
//! Invariants: a sandbox mounts a template's layers read-only (id-mapped) under its own
//! upper, so starting from a large template copies nothing; a layer in use by a live (or
//! warm) sandbox or named by a template is never removed; a failed build saves no template.

pub mod build;
pub mod debian;
pub mod oci;
pub mod spec;
pub mod store;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use glovebox_proto::api::{self, CreateSandbox, TemplateInfo};

use crate::error::{Error, Result};
use crate::manager::{Manager, Sb, Template};
pub use store::{Store, TemplateMeta};

/// The template part of the manager: the store, the small root skeleton under images that
/// bring their own root, and the lock that keeps GC out of running builds.
pub struct Templates {
    pub store: Store,
    mini: PathBuf,
    /// Builds hold it shared, GC exclusively (a build's fresh layers are not yet named by
    /// any template).
    pub(crate) gc_lock: tokio::sync::RwLock<()>,
    /// Names being built (one build per name at a time).
    building: std::sync::Mutex<BTreeSet<String>>,
}

impl Templates {
    pub fn open(data_dir: &Path, run_dir: &Path) -> Result<Templates> {
        // A full or read-only data dir must not stop the daemon (sandboxes need no store).
        let store = Store::open(data_dir).unwrap_or_else(|e| {
            tracing::error!("template store in {}: {e}; building templates will fail", data_dir.display());
            Store::at(data_dir)
        });
        let mini = run_dir.join("base").join(format!("mini-{}", std::process::id()));
        build_mini_skel(&mini).map_err(|e| Error::Internal(format!("mini skeleton: {e}")))?;
        Ok(Templates { store, mini, gc_lock: tokio::sync::RwLock::new(()), building: Default::default() })
    }

    /// The bottom layer under whole-root images: mount points, `/home/user`, the kernels.
    pub fn mini_skel(&self) -> PathBuf {
        self.mini.clone()
    }

    /// A built template as the manager starts it.
    pub fn get(&self, name: &str) -> Option<Template> {
        let meta = self.store.load(name)?;
        Some(Template {
            name: meta.name.clone(),
            layers: meta.layers.iter().map(|l| self.store.layer_fs(l)).collect(),
            preload: meta.preload.clone(),
            host_usr: meta.host_usr,
            defaults: Some(Arc::new(meta)),
        })
    }

    /// Marks `name` as being built; false if it already is.
    fn begin(&self, name: &str) -> bool {
        self.building.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string())
    }

    fn end(&self, name: &str) {
        self.building.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }
}

fn build_mini_skel(dir: &Path) -> std::io::Result<()> {
    let _ = fs::remove_dir_all(dir);
    for (p, mode) in [
        ("proc", 0o755),
        ("dev", 0o755),
        ("sys", 0o755),
        ("run", 0o755),
        ("etc", 0o755),
        ("tmp", 0o1777),
        ("root", 0o700),
        ("home", 0o755),
        ("home/user", 0o755),
    ] {
        let d = dir.join(p);
        fs::create_dir_all(&d)?;
        fs::set_permissions(&d, fs::Permissions::from_mode(mode))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    let kdir = dir.join(crate::kernels::KERNEL_DIR.trim_start_matches('/'));
    fs::create_dir_all(&kdir)?;
    for (name, body) in crate::kernels::KERNEL_FILES {
        fs::write(kdir.join(name), body)?;
    }
    Ok(())
}

/// Fills what a create request leaves out from the template's defaults. Env: the request's
/// variables win; resources: the request's values win (and are checked against the limits
/// as usual).
pub fn apply_defaults(d: &TemplateMeta, req: &mut CreateSandbox) {
    for (k, v) in &d.env {
        req.env.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let (r, t) = (&mut req.resources, &d.resources);
    r.cpus = r.cpus.or(t.cpus);
    r.memory_mb = r.memory_mb.or(t.memory_mb);
    r.disk_mb = r.disk_mb.or(t.disk_mb);
    r.pids = r.pids.or(t.pids);
}

/// The template's default user and working directory for a command that names none.
pub fn exec_defaults(sb: &Sb) -> (Option<String>, Option<u32>, Option<u32>) {
    match &sb.template_defaults {
        Some(d) => (d.workdir.clone(), d.uid, d.gid),
        None => (None, None, None),
    }
}

/// Starts the template's `CMD` in the background of a new sandbox (best effort: a start
/// command that fails is logged, the sandbox stays usable).
pub async fn start_cmd(m: &Arc<Manager>, sb: &Arc<Sb>, cmd: Vec<String>) {
    let req = api::ExecRequest {
        cmd: api::Command::Argv(cmd),
        cwd: None,
        env: Default::default(),
        stdin: None,
        stdin_base64: None,
        timeout_ms: Some(api::TimeBudget::UNBOUNDED),
        max_output_bytes: None,
        encoding: api::Encoding::Utf8,
        background: true,
    };
    if let Err(e) = crate::ops::exec_background(m, sb, req).await {
        tracing::warn!(sandbox = %sb.id, "template start command: {e}");
    }
}

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
        let store = &self.templates.store;
        let mut keep: BTreeSet<String> = BTreeSet::new();
        for t in store.list() {
            keep.extend(t.layers);
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
            match store.remove_layer(&id) {
                Ok(n) => freed += n,
                Err(e) => tracing::warn!(layer = %id, "gc: {e}"),
            }
        }
        freed
    }
}

/// Which files a build may reach in the build context: none outside it (a path with `..`
/// was refused by the parser; symlinks are copied as links, never followed).
pub(crate) fn context_path(ctx: &Path, rel: &str) -> Option<PathBuf> {
    let mut p = ctx.to_path_buf();
    for c in rel.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => p.push(c),
        }
    }
    // Every ancestor inside the context must be a real directory (no symlink leads out).
    let mut cur = ctx.to_path_buf();
    let rel_parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    for c in rel_parts.iter().take(rel_parts.len().saturating_sub(1)) {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(md) if md.is_dir() => {}
            _ => return None,
        }
    }
    Some(p)
}
