//! The template store under the data directory:
//!
//! ```text
//! <data_dir>/layers/<id>/fs      one layer's files (ids 0-based: lowers are id-mapped at mount)
//! <data_dir>/layers/<id>/meta.json
//! <data_dir>/templates/<name>.json   a template: its layers (top-most first) and defaults
//! <data_dir>/builds/<random>/    scratch space of builds in progress (removed at the end)
//! ```
//!
//! Invariants: a layer id is a hash of what made it (parent id, step, content), so a layer
//! directory never changes once renamed into place; a template file is written whole
//! (write + rename) only after every layer it names exists, so a failed build leaves no
//! template behind.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use glovebox_proto::api::Resources;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A template as saved on disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TemplateMeta {
    pub name: String,
    pub base: String,
    /// Whether the host's /usr sits under the layers (`FROM host`); otherwise the bottom
    /// layer is a whole root filesystem.
    pub host_usr: bool,
    /// Layer ids, top-most first.
    pub layers: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// As written in the spec (`USER`), and as resolved inside the image.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub start_cmd: Option<Vec<String>>,
    /// The isolation its sandboxes get when their create names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<glovebox_proto::api::Isolation>,
    /// Modules the python kernels of its sandboxes preload.
    #[serde(default)]
    pub preload: Option<String>,
    pub created_at: String,
    #[serde(default)]
    pub size_bytes: u64,
}

/// Hex sha256 of the parts, each length-prefixed (so no two part lists collide).
pub fn hash_parts(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Template names: 1–63 chars of `a-z 0-9 . _ -`, starting with a letter or digit.
pub fn valid_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-'))
}

fn valid_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|c| c.is_ascii_hexdigit())
}

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store at `data_dir` without touching the disk (what `open` falls back to when
    /// the data dir is not writable: built templates still load, builds fail saying why).
    pub fn at(data_dir: &Path) -> Store {
        Store { root: data_dir.to_path_buf() }
    }

    pub fn open(data_dir: &Path) -> io::Result<Store> {
        let s = Store { root: data_dir.to_path_buf() };
        for d in ["layers", "templates", "builds"] {
            fs::create_dir_all(s.root.join(d))?;
        }
        // Builds a previous daemon left half done.
        if let Ok(entries) = fs::read_dir(s.root.join("builds")) {
            for e in entries.flatten() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        if let Ok(entries) = fs::read_dir(s.root.join("layers")) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with('.') {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(s)
    }

    pub fn layer_fs(&self, id: &str) -> PathBuf {
        self.root.join("layers").join(id).join("fs")
    }

    pub fn has_layer(&self, id: &str) -> bool {
        valid_id(id) && self.layer_fs(id).is_dir()
    }

    /// A fresh scratch directory for one build.
    pub fn scratch(&self) -> io::Result<PathBuf> {
        let d = self.root.join("builds").join(crate::util::random_token(12));
        fs::create_dir(&d)?;
        fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        Ok(d)
    }

    /// Moves a finished layer tree (`tree`, to become `fs/`) into place as layer `id`. If the
    /// layer already exists (a concurrent build made the same step), the new tree is dropped.
    pub fn commit_layer(&self, id: &str, tree: &Path, parent: Option<&str>, step: &str) -> io::Result<()> {
        if self.has_layer(id) {
            let _ = fs::remove_dir_all(tree);
            return Ok(());
        }
        let tmp = self.root.join("layers").join(format!(".{id}.{}", crate::util::random_token(6)));
        fs::create_dir(&tmp)?;
        fs::rename(tree, tmp.join("fs"))?;
        let size = du(&tmp.join("fs"));
        let meta = serde_json::json!({ "parent": parent, "step": step, "size_bytes": size });
        fs::write(tmp.join("meta.json"), meta.to_string())?;
        match fs::rename(&tmp, self.root.join("layers").join(id)) {
            Ok(()) => Ok(()),
            Err(_) if self.has_layer(id) => {
                let _ = fs::remove_dir_all(&tmp);
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    pub fn layer_size(&self, id: &str) -> u64 {
        fs::read_to_string(self.root.join("layers").join(id).join("meta.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v["size_bytes"].as_u64())
            .unwrap_or(0)
    }

    /// What made layer `id` (its `meta.json`'s `step`).
    pub fn layer_step(&self, id: &str) -> Option<String> {
        fs::read_to_string(self.root.join("layers").join(id).join("meta.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v["step"].as_str().map(str::to_string))
    }

    fn template_path(&self, name: &str) -> PathBuf {
        self.root.join("templates").join(format!("{name}.json"))
    }

    pub fn save(&self, t: &TemplateMeta) -> io::Result<()> {
        let p = self.template_path(&t.name);
        let tmp = p.with_extension(format!("json.{}", crate::util::random_token(6)));
        fs::write(&tmp, serde_json::to_vec_pretty(t).map_err(io::Error::other)?)?;
        fs::rename(&tmp, &p)
    }

    pub fn load(&self, name: &str) -> Option<TemplateMeta> {
        if !valid_name(name) {
            return None;
        }
        let s = fs::read(self.template_path(name)).ok()?;
        let t: TemplateMeta = serde_json::from_slice(&s).ok()?;
        // A template whose layer vanished is not usable (and not listed).
        t.layers.iter().all(|l| self.has_layer(l)).then_some(t)
    }

    pub fn list(&self) -> Vec<TemplateMeta> {
        let mut v = Vec::new();
        if let Ok(entries) = fs::read_dir(self.root.join("templates")) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if let Some(name) = n.strip_suffix(".json") {
                    if let Some(t) = self.load(name) {
                        v.push(t);
                    }
                }
            }
        }
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn remove(&self, name: &str) -> io::Result<bool> {
        match fs::remove_file(self.template_path(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every layer id on disk.
    pub fn layer_ids(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Ok(entries) = fs::read_dir(self.root.join("layers")) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if valid_id(&n) {
                    v.push(n);
                }
            }
        }
        v
    }

    /// Removes layer `id` (renamed out of the way first, so it is never half there).
    pub fn remove_layer(&self, id: &str) -> io::Result<u64> {
        if !valid_id(id) {
            return Ok(0);
        }
        let size = self.layer_size(id);
        let tmp = self.root.join("layers").join(format!(".gc-{id}"));
        fs::rename(self.root.join("layers").join(id), &tmp)?;
        fs::remove_dir_all(&tmp)?;
        Ok(size)
    }
}

/// Bytes used by a tree (regular files' sizes; nothing followed).
pub fn du(p: &Path) -> u64 {
    let Ok(md) = fs::symlink_metadata(p) else { return 0 };
    if md.is_dir() {
        fs::read_dir(p).map(|rd| rd.flatten().map(|e| du(&e.path())).sum()).unwrap_or(0)
    } else if md.is_file() {
        md.len()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["python", "a", "code-interpreter", "x.y_z-1", "9lives"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-x", "A", "a/b", "..", ".x", "a b", &"x".repeat(64)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn hash_is_unambiguous() {
        assert_ne!(hash_parts(&[b"ab", b"c"]), hash_parts(&[b"a", b"bc"]));
        assert_eq!(hash_parts(&[b"x"]).len(), 64);
    }

    #[test]
    fn commit_save_load_remove() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let id = hash_parts(&[b"step"]);
        let tree = d.path().join("t");
        fs::create_dir_all(tree.join("etc")).unwrap();
        fs::write(tree.join("etc/x"), "hello").unwrap();
        s.commit_layer(&id, &tree, None, "RUN x").unwrap();
        assert!(s.has_layer(&id));
        assert_eq!(s.layer_size(&id), 5);
        let t = TemplateMeta {
            name: "t".into(),
            base: "host".into(),
            host_usr: true,
            layers: vec![id.clone()],
            env: BTreeMap::new(),
            workdir: None,
            user: None,
            uid: None,
            gid: None,
            resources: Resources::default(),
            start_cmd: None,
            isolation: None,
            preload: None,
            created_at: "now".into(),
            size_bytes: 5,
        };
        s.save(&t).unwrap();
        assert_eq!(s.load("t"), Some(t.clone()));
        assert_eq!(s.list().len(), 1);
        assert!(s.load("../t").is_none());
        s.remove_layer(&id).unwrap();
        // Its layer gone, the template is not usable.
        assert!(s.load("t").is_none());
        assert!(s.remove("t").unwrap());
        assert!(!s.remove("t").unwrap());
    }
}
