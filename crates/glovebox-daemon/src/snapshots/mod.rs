//! Snapshots: a sandbox's files at one moment, kept as one more content-addressed layer in the
//! template store (`capture`), and a record naming it with the layers of the template it sat
//! on (this module). A sandbox started from a snapshot mounts those layers read-only under its
//! own writes: nothing is copied at create.
//!
//! ```text
//! <data_dir>/snapshots/<key>.json   one snapshot (key: hash of tenant and name), written whole
//! ```
//!
//! How the daemon reads a running sandbox's writable layer: the layer lives on a tmpfs in a
//! mount namespace no host process stays in (the jailer's exits after the boot), so the
//! sandbox's PID 1 keeps an `O_PATH` descriptor of it (`glovebox_jail::jailer::UPPER_FD`) and
//! the daemon, as host root, opens `/proc/<pid 1>/fd/<n>` — no `setns` (which a multi-threaded
//! daemon cannot do), no helper process, and it works for sandboxes adopted after a restart.
//! The walk from there is fd-relative and never follows a link (see `capture`).
//!
//! Invariants: a record is written (write + rename) only after its layer is in the store, so a
//! crash leaves at most an unnamed layer, which the start-up sweep removes; a layer named by a
//! record or used by a live sandbox is never collected; anonymous snapshots (a fork's) are
//! removed once no live sandbox uses them. Names are per tenant: another tenant's snapshot is
//! "not found".

pub mod capture;

/// The `step` of a snapshot layer's `meta.json` (what the start-up sweep looks for).
pub const LAYER_STEP: &str = "snapshot";

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::templates::store::{hash_parts, TemplateMeta};

/// One snapshot as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotMeta {
    pub name: String,
    pub tenant: String,
    /// A fork's: not listed, removed once no sandbox uses it.
    #[serde(default)]
    pub anonymous: bool,
    /// Its own layer (top-most of `template.layers`).
    pub layer: String,
    /// The template its sandbox ran, with `layers` = this snapshot's layer, then the template's.
    pub template: TemplateMeta,
    pub source_sandbox: String,
    pub created_at: String,
    pub size_bytes: u64,
    #[serde(default)]
    pub skipped: u64,
}

/// The snapshot records under the data dir.
#[derive(Debug, Clone)]
pub struct Snapshots {
    dir: PathBuf,
}

impl Snapshots {
    /// The records in `data_dir/snapshots`; half-written ones a crash left are removed.
    pub fn open(data_dir: &Path) -> Snapshots {
        let dir = data_dir.join("snapshots");
        if let Err(e) = fs::create_dir_all(&dir) {
            tracing::error!("snapshot records in {}: {e}; snapshots will fail", dir.display());
        }
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !n.ends_with(".json") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Snapshots { dir }
    }

    fn path(&self, tenant: &str, name: &str) -> PathBuf {
        let key = hash_parts(&[tenant.as_bytes(), name.as_bytes()]);
        self.dir.join(format!("{}.json", &key[..40]))
    }

    pub fn get(&self, tenant: &str, name: &str) -> Option<SnapshotMeta> {
        let s = fs::read(self.path(tenant, name)).ok()?;
        let m: SnapshotMeta = serde_json::from_slice(&s).ok()?;
        (m.tenant == tenant && m.name == name).then_some(m)
    }

    /// Writes a record whole; refuses a name the tenant already has.
    pub fn create(&self, m: &SnapshotMeta) -> io::Result<()> {
        let p = self.path(&m.tenant, &m.name);
        let tmp = p.with_extension(format!("tmp.{}", crate::util::random_token(6)));
        fs::write(&tmp, serde_json::to_vec_pretty(m).map_err(io::Error::other)?)?;
        // A hard link fails if the name exists: two creates of one name cannot both win.
        let r = fs::hard_link(&tmp, &p);
        let _ = fs::remove_file(&tmp);
        r
    }

    /// Writes a record whole in place of the tenant's record of that name, if any (a rename:
    /// readers see the old record or the new one, never a mix).
    pub fn replace(&self, m: &SnapshotMeta) -> io::Result<()> {
        let p = self.path(&m.tenant, &m.name);
        let tmp = p.with_extension(format!("tmp.{}", crate::util::random_token(6)));
        fs::write(&tmp, serde_json::to_vec_pretty(m).map_err(io::Error::other)?)?;
        fs::rename(&tmp, &p).inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
    }

    pub fn remove(&self, tenant: &str, name: &str) -> io::Result<bool> {
        if self.get(tenant, name).is_none() {
            return Ok(false);
        }
        match fs::remove_file(self.path(tenant, name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every record (all tenants, anonymous ones too), by tenant and name.
    pub fn all(&self) -> Vec<SnapshotMeta> {
        let mut v: Vec<SnapshotMeta> = Vec::new();
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if let Some(m) = fs::read(e.path()).ok().and_then(|s| serde_json::from_slice(&s).ok()) {
                    v.push(m);
                }
            }
        }
        v.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tenant: &str, name: &str) -> SnapshotMeta {
        SnapshotMeta {
            name: name.into(),
            tenant: tenant.into(),
            anonymous: false,
            layer: "a".repeat(64),
            template: TemplateMeta {
                name: "base".into(),
                base: "host".into(),
                host_usr: true,
                layers: vec!["a".repeat(64)],
                env: Default::default(),
                workdir: None,
                user: None,
                uid: None,
                gid: None,
                resources: Default::default(),
                start_cmd: None,
                isolation: None,
                preload: None,
                created_at: "now".into(),
                size_bytes: 0,
            },
            source_sandbox: "sb".into(),
            created_at: "now".into(),
            size_bytes: 1,
            skipped: 0,
        }
    }

    #[test]
    fn names_are_per_tenant_and_unique() {
        let d = tempfile::tempdir().unwrap();
        let s = Snapshots::open(d.path());
        s.create(&meta("t1", "x")).unwrap();
        assert!(s.create(&meta("t1", "x")).is_err(), "a name is taken once");
        let mut newer = meta("t1", "x");
        newer.layer = "b".repeat(64);
        s.replace(&newer).unwrap();
        assert_eq!(s.get("t1", "x").unwrap().layer, newer.layer, "replace moves the name");
        s.replace(&meta("t1", "x")).unwrap();
        s.create(&meta("t2", "x")).unwrap();
        assert_eq!(s.get("t1", "x").unwrap().tenant, "t1");
        assert!(s.get("t3", "x").is_none());
        assert_eq!(s.all().len(), 2);
        assert!(!s.remove("t3", "x").unwrap());
        assert!(s.remove("t1", "x").unwrap());
        assert!(s.get("t1", "x").is_none() && s.get("t2", "x").is_some());
        // Only whole records are left in the directory.
        assert!(fs::read_dir(d.path().join("snapshots"))
            .unwrap()
            .all(|e| { e.unwrap().file_name().to_string_lossy().ends_with(".json") }));
    }
}
