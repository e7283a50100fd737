//! Templates: root filesystems built from a spec (`spec`), stored as content-addressed
//! layers (`store`), built step by step in Glovebox sandboxes (`build`) on a base that is the
//! host's /usr, a Debian root made with debootstrap (`debian`) or an OCI image (`oci`).
//!
//! Invariants: a sandbox mounts a template's layers read-only (id-mapped) under its own
//! upper, so starting from a large template copies nothing; a layer in use by a live (or
//! warm) sandbox or named by a template is never removed; a failed build saves no template.

pub mod debian;
pub mod oci;
pub mod spec;
pub mod store;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use glovebox_proto::api::CreateSandbox;

use crate::error::Result;
pub use store::{Store, TemplateMeta};

/// What a sandbox starts from: read-only layers above the base skeleton (top-most first),
/// and what its python kernels preload.
#[derive(Debug, Clone)]
pub struct Template {
    pub name: String,
    pub layers: Vec<PathBuf>,
    pub preload: Option<String>,
    /// The host's /usr under the layers (and the generated /etc skeleton); false when the
    /// bottom layer is a whole root filesystem (Debian, OCI images).
    pub host_usr: bool,
    /// Defaults from a built template's spec (env, workdir, user, resources, start command).
    pub defaults: Option<Arc<TemplateMeta>>,
}

impl Template {
    pub fn base() -> Template {
        Template { name: "base".into(), layers: Vec::new(), preload: None, host_usr: true, defaults: None }
    }

    /// What a warm sandbox must match to stand in for a fresh one of this template.
    pub(crate) fn pool_key(&self) -> String {
        format!("{}\0{:?}\0{}", self.name, self.layers, self.host_usr)
    }
}

/// The template name build sandboxes show (not a valid template name, so never a real one).
pub const BUILD_SANDBOX: &str = "(template build)";

/// The template part of the manager: the store, the small root skeleton under images that
/// bring their own root, and the lock that keeps GC out of running builds.
pub struct Templates {
    pub store: Store,
    mini: PathBuf,
    /// Whether `mini` was written (on first use: only whole-root templates need it).
    mini_built: std::sync::OnceLock<()>,
    /// Builds hold it shared, GC exclusively (a build's fresh layers are not yet named by
    /// any template).
    pub(crate) gc_lock: tokio::sync::RwLock<()>,
    /// Names being built (one build per name at a time).
    building: std::sync::Mutex<BTreeSet<String>>,
    /// Automatic builds of shipped templates, by name.
    auto: std::sync::Mutex<std::collections::BTreeMap<String, AutoBuild>>,
}

/// A template whose spec ships with Glovebox: a sandbox asking for it before it is built
/// has the daemon build it.
pub struct Shipped {
    pub name: &'static str,
    pub dockerfile: &'static str,
    /// How to build it by hand (the hint of a "not built" error).
    pub build_with: &'static str,
}

const SHIPPED: &[Shipped] = &[Shipped {
    name: "code-interpreter",
    dockerfile: include_str!("../../../../templates/code-interpreter/Dockerfile"),
    build_with: "glovebox template build -f templates/code-interpreter/Dockerfile -t code-interpreter",
}];

pub fn shipped(name: &str) -> Option<&'static Shipped> {
    SHIPPED.iter().find(|s| s.name == name)
}

/// Where an automatic build stands: the step running (1-based) of how many, or how it failed.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoBuild {
    Running { step: usize, total: usize },
    Failed(String),
}

impl AutoBuild {
    /// What a create asking for the template is told meanwhile.
    pub fn message(&self, name: &str) -> String {
        match self {
            AutoBuild::Running { step, total } if *total > 0 => format!(
                "building template {name}, {}% (step {step}/{total}); retry in a few seconds",
                (step.saturating_sub(1)) * 100 / total
            ),
            AutoBuild::Running { .. } => format!("building template {name}, 0% (preparing); retry in a few seconds"),
            AutoBuild::Failed(e) => format!("building template {name} failed: {e}"),
        }
    }
}

/// The built template `name` of `store`, as the manager starts it.
pub fn from_store(store: &Store, name: &str) -> Option<Template> {
    let meta = store.load(name)?;
    Some(Template {
        name: meta.name.clone(),
        layers: meta.layers.iter().map(|l| store.layer_fs(l)).collect(),
        preload: meta.preload.clone(),
        host_usr: meta.host_usr,
        defaults: Some(Arc::new(meta)),
    })
}

impl Templates {
    pub fn open(data_dir: &Path, run_dir: &Path) -> Result<Templates> {
        // A full or read-only data dir must not stop the daemon (sandboxes need no store).
        let store = Store::open(data_dir).unwrap_or_else(|e| {
            tracing::error!("template store in {}: {e}; building templates will fail", data_dir.display());
            Store::at(data_dir)
        });
        let mini = run_dir.join("base").join(format!("mini-{}", std::process::id()));
        Ok(Templates {
            store,
            mini,
            mini_built: std::sync::OnceLock::new(),
            gc_lock: tokio::sync::RwLock::new(()),
            building: Default::default(),
            auto: Default::default(),
        })
    }

    /// The bottom layer under whole-root images: mount points, `/home/user`, the kernels.
    /// Written by the first call (a process that starts none has none); if it cannot be, the
    /// boots on it fail saying which directory is missing.
    pub fn mini_skel(&self) -> PathBuf {
        self.mini_built.get_or_init(|| {
            if let Err(e) = build_mini_skel(&self.mini) {
                tracing::error!("mini skeleton {}: {e}", self.mini.display());
            }
        });
        self.mini.clone()
    }

    /// A built template as the manager starts it.
    pub fn get(&self, name: &str) -> Option<Template> {
        from_store(&self.store, name)
    }

    /// Marks an automatic build of `name` as started, unless one is running: `Err` with the
    /// running one's state, else `Ok` with how the last one ended (if it failed).
    pub fn claim_auto_build(&self, name: &str) -> std::result::Result<Option<AutoBuild>, AutoBuild> {
        let mut auto = self.auto.lock().unwrap_or_else(|p| p.into_inner());
        match auto.get(name) {
            Some(running @ AutoBuild::Running { .. }) => Err(running.clone()),
            _ => Ok(auto.insert(name.to_string(), AutoBuild::Running { step: 0, total: 0 })),
        }
    }

    pub fn set_auto_build(&self, name: &str, state: Option<AutoBuild>) {
        let mut auto = self.auto.lock().unwrap_or_else(|p| p.into_inner());
        match state {
            Some(s) => auto.insert(name.to_string(), s),
            None => auto.remove(name),
        };
    }

    /// Marks `name` as being built; false if it already is.
    pub(crate) fn begin(&self, name: &str) -> bool {
        self.building.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string())
    }

    pub(crate) fn end(&self, name: &str) {
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
    req.isolation = req.isolation.or(d.isolation);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_s_isolation_applies_unless_the_request_names_one() {
        use glovebox_proto::api::Isolation;
        let meta: TemplateMeta = serde_json::from_value(serde_json::json!({
            "name": "t", "base": "host", "host_usr": true, "layers": [], "created_at": "now", "isolation": "gvisor"
        }))
        .unwrap();
        let mut req = CreateSandbox::default();
        apply_defaults(&meta, &mut req);
        assert_eq!(req.isolation, Some(Isolation::Gvisor));
        let mut req = CreateSandbox { isolation: Some(Isolation::Process), ..Default::default() };
        apply_defaults(&meta, &mut req);
        assert_eq!(req.isolation, Some(Isolation::Process));
        // A template stored before the field existed has none.
        let old: TemplateMeta = serde_json::from_value(serde_json::json!({
            "name": "t", "base": "host", "host_usr": true, "layers": [], "created_at": "now"
        }))
        .unwrap();
        assert_eq!(old.isolation, None);
    }

    #[test]
    fn shipped_specs_parse() {
        let s = shipped("code-interpreter").expect("code-interpreter ships");
        let spec = spec::parse(s.dockerfile, &Default::default()).expect("the shipped spec parses");
        assert_eq!(spec.from, "host");
        assert!(s.dockerfile.contains("seaborn=="), "E2B's package set, pinned");
        assert!(shipped("base").is_none() && shipped("nope").is_none());
    }

    #[test]
    fn one_automatic_build_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let t = Templates::open(&dir.path().join("data"), &dir.path().join("run")).unwrap();
        assert_eq!(t.claim_auto_build("code-interpreter"), Ok(None));
        let running = AutoBuild::Running { step: 0, total: 0 };
        assert_eq!(t.claim_auto_build("code-interpreter"), Err(running), "a second create waits");
        t.set_auto_build("code-interpreter", Some(AutoBuild::Failed("boom".into())));
        assert_eq!(
            t.claim_auto_build("code-interpreter"),
            Ok(Some(AutoBuild::Failed("boom".into()))),
            "a failure is retried"
        );
    }

    #[test]
    fn auto_build_messages_say_how_far() {
        let m = |a: AutoBuild| a.message("code-interpreter");
        assert_eq!(
            m(AutoBuild::Running { step: 0, total: 0 }),
            "building template code-interpreter, 0% (preparing); retry in a few seconds"
        );
        assert_eq!(
            m(AutoBuild::Running { step: 3, total: 4 }),
            "building template code-interpreter, 50% (step 3/4); retry in a few seconds"
        );
        assert_eq!(
            m(AutoBuild::Failed("step 2: exit 1".into())),
            "building template code-interpreter failed: step 2: exit 1"
        );
    }
}
