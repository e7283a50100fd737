//! Volumes: disk-backed directories with a hard size cap that outlive sandboxes and daemon
//! restarts, mounted into sandboxes at create (`CreateSandbox::volumes`).
//!
//! Layout: `<data_dir>/volumes/<tenant>/<name>/{volume.json, disk.ext4, mnt/}`. A volume is
//! an ext4 image (a sparse file of its size, `mkfs.ext4 -m 0`): the filesystem is the cap,
//! so a full volume answers ENOSPC to its writers and to nobody else. `volume.json` is
//! written last (atomically): a directory without it is a create that was interrupted, and
//! [`Volumes::sweep`] removes it.
//!
//! Invariants:
//! - An image is mounted on the host at most once, on its `mnt`, while any live sandbox uses
//!   it (refcounted here; the count is rebuilt from adopted sandboxes' records after a
//!   restart). Sandboxes bind that mount, id-mapped, so its on-disk uid 0 is each sandbox's
//!   root whatever its host uid range. Many sandboxes may mount one volume, readers and
//!   writers alike: they share one filesystem instance in one kernel, as processes on one
//!   host share a disk.
//! - The host mount goes through the loop device already bound to the image if there is one
//!   (its filesystem still held, e.g. by a dying sandbox), so an image is never live in two
//!   filesystem instances; a device is auto-cleared once the filesystem's last user is gone
//!   (`glovebox_jail::loopdev`).
//! - Volumes are a tenant's own: another tenant's volume of the same name is another volume.
//! - Paths inside a sandbox are checked here ([`check_mounts`]) and resolved by the jail
//!   inside the sandbox's root, never joined onto a host path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use glovebox_proto::api::{CreateVolume, VolumeInfo, VolumeMount, MAX_VOLUME_MB, MIN_VOLUME_MB};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::templates::store::valid_name;

const META: &str = "volume.json";
const IMAGE: &str = "disk.ext4";
const MNT: &str = "mnt";

/// Directories a volume may not be mounted on or under: the system's own (the sandbox's
/// programs, devices, kernel interfaces, the daemon's kernels) and the root itself.
const SYSTEM_DIRS: &[&str] = &[
    "bin",
    "boot",
    "dev",
    "etc",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "proc",
    "run",
    "sbin",
    "sys",
    "usr",
    "opt/glovebox",
];

/// Most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 16;

#[derive(Debug, Error)]
pub enum VolumeError {
    #[error("{0:?} is not a valid volume name (1-63 of a-z 0-9 . _ -, starting with a letter or digit)")]
    BadName(String),
    #[error("size_mb must be between {MIN_VOLUME_MB} and {MAX_VOLUME_MB}")]
    BadSize,
    #[error("volumes: {0}")]
    BadMount(String),
    #[error("volume {0:?} already exists")]
    Exists(String),
    #[error("volume {0:?} not found")]
    NotFound(String),
    #[error("volume {0:?} is mounted by {1} live sandbox(es)")]
    InUse(String, u32),
    #[error("volume {name:?}: {what}: {err}")]
    Io { name: String, what: &'static str, err: std::io::Error },
    #[error("volume {name:?}: {what} failed: {out}")]
    Tool { name: String, what: &'static str, out: String },
}

impl From<VolumeError> for crate::error::Error {
    fn from(e: VolumeError) -> Self {
        use crate::error::Error;
        match e {
            VolumeError::BadName(_) | VolumeError::BadSize | VolumeError::BadMount(_) => Error::Invalid(e.to_string()),
            VolumeError::NotFound(n) => Error::NotFound { what: "volume", name: n },
            VolumeError::Exists(_) => Error::Conflict(e.to_string()),
            VolumeError::InUse(..) => Error::VolumeInUse(e.to_string()),
            VolumeError::Io { .. } | VolumeError::Tool { .. } => Error::Internal(e.to_string()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    name: String,
    size_mb: u64,
    created_at: String,
}

/// Checks the volumes a create asks for: known names, plain absolute paths outside the
/// system directories, no volume twice and no path inside another (a bind under a shared
/// volume would be made through a directory another sandbox can change).
pub fn check_mounts(mounts: &[VolumeMount]) -> Result<(), VolumeError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(VolumeError::BadMount(format!("at most {MAX_MOUNTS} per sandbox")));
    }
    for (i, m) in mounts.iter().enumerate() {
        if !valid_name(&m.name) {
            return Err(VolumeError::BadName(m.name.clone()));
        }
        check_path(&m.path).map_err(|why| VolumeError::BadMount(format!("path {:?} {why}", m.path)))?;
        for o in &mounts[..i] {
            if o.name == m.name {
                return Err(VolumeError::BadMount(format!("{:?} is mounted twice", m.name)));
            }
            if nested(&o.path, &m.path) || nested(&m.path, &o.path) {
                return Err(VolumeError::BadMount(format!("{:?} and {:?} overlap", o.path, m.path)));
            }
        }
    }
    Ok(())
}

/// Whether `inner` is `outer` or below it (both checked paths).
fn nested(outer: &str, inner: &str) -> bool {
    inner == outer || inner.strip_prefix(outer).is_some_and(|r| r.starts_with('/'))
}

fn check_path(p: &str) -> Result<(), &'static str> {
    let Some(rest) = p.strip_prefix('/') else { return Err("must be absolute") };
    if p.len() > 1024 || p.contains('\0') {
        return Err("is too long or has a NUL");
    }
    if rest.is_empty() {
        return Err("may not be the root");
    }
    if rest.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("may not have empty, '.' or '..' components");
    }
    if SYSTEM_DIRS.iter().any(|d| nested(&format!("/{d}"), p)) {
        return Err("is a system directory (or below one)");
    }
    Ok(())
}

/// Every tenant's volumes, and how many live sandboxes use each.
pub struct Volumes {
    dir: PathBuf,
    /// (tenant, name) -> live sandboxes using it; its host mount exists while > 0.
    users: Mutex<HashMap<(String, String), u32>>,
    /// Held across creates, deletes and sweeps (before `users`, never after), so none sees
    /// another half done; mounts and listings do not wait for a create's mkfs.
    changes: Mutex<()>,
}

/// Volumes a sandbox holds: dropped (the sandbox gone, or its create failed), each one's
/// count goes down and a volume nobody uses is unmounted from the host.
pub struct Held {
    volumes: Arc<Volumes>,
    owner: String,
    pub mounts: Vec<VolumeMount>,
    /// What the jail binds.
    pub jail: Vec<glovebox_jail::config::Volume>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut users = self.volumes.lock();
        for m in &self.mounts {
            self.volumes.release(&mut users, &self.owner, &m.name);
        }
    }
}

impl Volumes {
    /// The volumes under `<data_dir>/volumes` (made if missing).
    /// Never fails: a data dir that cannot hold the volumes directory (full, read-only) is
    /// logged, and each `create` then fails with its own clear error; the daemon still runs.
    pub fn open(data_dir: &Path) -> Volumes {
        let dir = data_dir.join("volumes");
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!("volume store in {}: {e}; creating volumes will fail", dir.display());
        }
        Volumes { dir, users: Mutex::default(), changes: Mutex::default() }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), u32>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, owner: &str, name: &str) -> PathBuf {
        self.dir.join(owner).join(name)
    }

    fn meta(&self, owner: &str, name: &str) -> Option<Meta> {
        let b = std::fs::read(self.path(owner, name).join(META)).ok()?;
        serde_json::from_slice(&b).ok()
    }

    fn info_of(&self, users: &HashMap<(String, String), u32>, owner: &str, m: Meta) -> VolumeInfo {
        let mounted_by = users.get(&(owner.to_string(), m.name.clone())).copied().unwrap_or(0);
        VolumeInfo { name: m.name, size_mb: m.size_mb, created_at: m.created_at, mounted_by }
    }

    /// Makes a volume: its image (sparse) and filesystem, then its record. Blocking (mkfs).
    pub fn create(&self, owner: &str, req: &CreateVolume) -> Result<VolumeInfo, VolumeError> {
        let name = req.name.as_str();
        if !valid_name(name) {
            return Err(VolumeError::BadName(name.to_string()));
        }
        if !(MIN_VOLUME_MB..=MAX_VOLUME_MB).contains(&req.size_mb) {
            return Err(VolumeError::BadSize);
        }
        let _changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let io = |what, err| VolumeError::Io { name: name.to_string(), what, err };
        let dir = self.path(owner, name);
        std::fs::create_dir_all(dir.parent().unwrap_or(&self.dir)).map_err(|e| io("mkdir", e))?;
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(VolumeError::Exists(name.to_string()))
            }
            Err(e) => return Err(io("mkdir", e)),
        }
        let made = (|| {
            std::fs::create_dir(dir.join(MNT)).map_err(|e| io("mkdir", e))?;
            let img = dir.join(IMAGE);
            let f = std::fs::File::create_new(&img).map_err(|e| io("create image", e))?;
            f.set_len(req.size_mb << 20).map_err(|e| io("size image", e))?;
            drop(f);
            // No blocks reserved for root (the cap is the size); the root directory owned by
            // the sandboxes' root (ids on disk are sandbox ids: the mounts are id-mapped).
            run(
                name,
                "mkfs.ext4",
                Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0", "-E", "root_owner=0:0"]).arg(&img),
            )?;
            let meta = Meta {
                name: name.to_string(),
                size_mb: req.size_mb,
                created_at: crate::util::rfc3339(SystemTime::now()),
            };
            let tmp = dir.join("volume.json.tmp");
            let bytes = serde_json::to_vec(&meta).map_err(|e| io("encode", std::io::Error::other(e)))?;
            std::fs::write(&tmp, bytes).map_err(|e| io("write record", e))?;
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| io("sync record", e))?;
            std::fs::rename(&tmp, dir.join(META)).map_err(|e| io("write record", e))?;
            Ok(meta)
        })();
        match made {
            Ok(meta) => Ok(self.info_of(&self.lock(), owner, meta)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// The tenant's volumes, by name.
    pub fn list(&self, owner: &str) -> Vec<VolumeInfo> {
        let users = self.lock();
        let mut names: Vec<String> = std::fs::read_dir(self.dir.join(owner))
            .map(|rd| rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        names.sort();
        names.into_iter().filter_map(|n| self.meta(owner, &n)).map(|m| self.info_of(&users, owner, m)).collect()
    }

    pub fn info(&self, owner: &str, name: &str) -> Result<VolumeInfo, VolumeError> {
        if !valid_name(name) {
            return Err(VolumeError::BadName(name.to_string()));
        }
        let users = self.lock();
        let m = self.meta(owner, name).ok_or_else(|| VolumeError::NotFound(name.to_string()))?;
        Ok(self.info_of(&users, owner, m))
    }

    /// Removes a volume and its data; refused while a live sandbox has it mounted. Blocking.
    pub fn delete(&self, owner: &str, name: &str) -> Result<(), VolumeError> {
        if !valid_name(name) {
            return Err(VolumeError::BadName(name.to_string()));
        }
        let _changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let users = self.lock();
        if self.meta(owner, name).is_none() {
            return Err(VolumeError::NotFound(name.to_string()));
        }
        if let Some(&n) = users.get(&(owner.to_string(), name.to_string())).filter(|n| **n > 0) {
            return Err(VolumeError::InUse(name.to_string(), n));
        }
        let dir = self.path(owner, name);
        let mnt = dir.join(MNT);
        if mounted(&mnt) {
            unmount(name, &mnt)?;
        }
        std::fs::remove_dir_all(&dir).map_err(|err| VolumeError::Io { name: name.to_string(), what: "remove", err })
    }

    /// Takes the volumes a sandbox of `owner` mounts: each mounted on the host if it is not
    /// yet. Blocking (mount). Checks the request first ([`check_mounts`]).
    pub fn acquire(self: &Arc<Self>, owner: &str, mounts: &[VolumeMount]) -> Result<Held, VolumeError> {
        check_mounts(mounts)?;
        let mut held = Held { volumes: self.clone(), owner: owner.to_string(), mounts: Vec::new(), jail: Vec::new() };
        let mut users = self.lock();
        for m in mounts {
            self.take(&mut users, owner, &m.name)?;
            held.mounts.push(m.clone());
            held.jail.push(glovebox_jail::config::Volume {
                source: self.path(owner, &m.name).join(MNT),
                target: PathBuf::from(&m.path),
                read_only: m.read_only,
            });
        }
        drop(users);
        Ok(held)
    }

    /// Counts the volumes of a sandbox re-adopted after a restart (whose mount namespace
    /// kept its binds); remounts on the host any whose host mount is gone.
    pub fn adopt(self: &Arc<Self>, owner: &str, mounts: &[VolumeMount]) -> Held {
        let mut held = Held { volumes: self.clone(), owner: owner.to_string(), mounts: Vec::new(), jail: Vec::new() };
        let mut users = self.lock();
        for m in mounts {
            match self.take(&mut users, owner, &m.name) {
                Ok(()) => held.mounts.push(m.clone()),
                Err(e) => tracing::warn!(tenant = owner, "adopted sandbox's volume: {e}"),
            }
        }
        drop(users);
        held
    }

    fn take(&self, users: &mut HashMap<(String, String), u32>, owner: &str, name: &str) -> Result<(), VolumeError> {
        if self.meta(owner, name).is_none() {
            return Err(VolumeError::NotFound(name.to_string()));
        }
        let n = users.entry((owner.to_string(), name.to_string())).or_insert(0);
        if *n == 0 {
            let dir = self.path(owner, name);
            let mnt = dir.join(MNT);
            if !mounted(&mnt) {
                glovebox_jail::loopdev::mount_image(&dir.join(IMAGE), &mnt, "ext4", libc::MS_NOSUID | libc::MS_NODEV)
                    .map_err(|err| VolumeError::Io { name: name.to_string(), what: "mount", err })?;
            }
        }
        *n += 1;
        Ok(())
    }

    fn release(&self, users: &mut HashMap<(String, String), u32>, owner: &str, name: &str) {
        let key = (owner.to_string(), name.to_string());
        let Some(n) = users.get_mut(&key) else { return };
        *n = n.saturating_sub(1);
        if *n == 0 {
            users.remove(&key);
            let mnt = self.path(owner, name).join(MNT);
            if let Err(e) = unmount(name, &mnt) {
                tracing::warn!(tenant = owner, "{e}");
            }
        }
    }

    /// Garbage: host mounts of volumes no live sandbox uses (a daemon that died with
    /// sandboxes that were not re-adopted) and volumes whose create was interrupted.
    /// Returns what it removed, as `tenant/name (what)`. Blocking.
    pub fn sweep(&self) -> Vec<String> {
        let _changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let users = self.lock();
        let mut swept = Vec::new();
        let tenants: Vec<std::fs::DirEntry> =
            std::fs::read_dir(&self.dir).map(|rd| rd.filter_map(|e| e.ok()).collect()).unwrap_or_default();
        for t in tenants {
            let owner = t.file_name().to_string_lossy().into_owned();
            let Ok(vols) = std::fs::read_dir(t.path()) else { continue };
            for v in vols.filter_map(|e| e.ok()) {
                let name = v.file_name().to_string_lossy().into_owned();
                let dir = v.path();
                let mnt = dir.join(MNT);
                let used = users.get(&(owner.clone(), name.clone())).is_some_and(|n| *n > 0);
                if !used && mounted(&mnt) {
                    match unmount(&name, &mnt) {
                        Ok(()) => swept.push(format!("{owner}/{name} (host mount nobody used)")),
                        Err(e) => tracing::warn!("{e}"),
                    }
                }
                if !dir.join(META).exists() && !mounted(&mnt) && std::fs::remove_dir_all(&dir).is_ok() {
                    swept.push(format!("{owner}/{name} (interrupted create)"));
                }
            }
        }
        for s in &swept {
            tracing::info!("volumes: swept {s}");
        }
        swept
    }
}

fn run(name: &str, what: &'static str, cmd: &mut Command) -> Result<(), VolumeError> {
    let out = cmd.stdin(std::process::Stdio::null()).output().map_err(|err| VolumeError::Io {
        name: name.to_string(),
        what,
        err,
    })?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(VolumeError::Tool { name: name.to_string(), what, out: format!("{}: {text}", out.status) })
}

fn unmount(name: &str, mnt: &Path) -> Result<(), VolumeError> {
    rustix::mount::unmount(mnt, rustix::mount::UnmountFlags::empty()).map_err(|e| VolumeError::Io {
        name: name.to_string(),
        what: "unmount",
        err: e.into(),
    })
}

/// Whether something is mounted on `p` in this mount namespace (`/proc/self/mountinfo`,
/// whose paths escape space, tab, newline and backslash as octal).
fn mounted(p: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = p.to_string_lossy();
    info.lines().filter_map(|l| l.split(' ').nth(4)).any(|m| unescape(m) == want)
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, path: &str) -> VolumeMount {
        VolumeMount { name: name.into(), path: path.into(), read_only: false }
    }

    #[test]
    fn mount_paths_are_plain_and_outside_the_system() {
        for ok in ["/data", "/home/user/work", "/tmp/x", "/opt/data", "/root/v", "/mnt"] {
            assert!(check_mounts(&[m("v", ok)]).is_ok(), "{ok}");
        }
        for bad in [
            "data",
            "/",
            "/data/../etc",
            "/data/./x",
            "//data",
            "/data/",
            "/proc",
            "/proc/x",
            "/sys",
            "/dev/shm",
            "/usr/local",
            "/etc",
            "/opt/glovebox",
            "/opt/glovebox/kernels",
            "/bin",
            "/lib64",
            "/run",
        ] {
            assert!(matches!(check_mounts(&[m("v", bad)]), Err(VolumeError::BadMount(_))), "{bad}");
        }
        assert!(check_mounts(&[m("v", "/usrdata"), m("w", "/etcetera")]).is_ok(), "prefixes are by component");
        assert!(matches!(check_mounts(&[m("Bad Name", "/data")]), Err(VolumeError::BadName(_))));
        assert!(matches!(check_mounts(&[m("v", "/a"), m("v", "/b")]), Err(VolumeError::BadMount(_))));
        assert!(matches!(check_mounts(&[m("v", "/a"), m("w", "/a/b")]), Err(VolumeError::BadMount(_))));
        assert!(matches!(check_mounts(&[m("v", "/a/b"), m("w", "/a")]), Err(VolumeError::BadMount(_))));
        assert!(check_mounts(&[m("v", "/a"), m("w", "/ab")]).is_ok());
        let many: Vec<_> = (0..=MAX_MOUNTS).map(|i| m(&format!("v{i}"), &format!("/d{i}"))).collect();
        assert!(check_mounts(&many).is_err());
    }

    #[test]
    fn mountinfo_paths_unescape() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }

    #[test]
    fn bad_requests_are_refused_before_any_work() {
        let d = tempfile::tempdir().unwrap();
        let v = Volumes::open(d.path());
        let req = |name: &str, size_mb| CreateVolume { name: name.into(), size_mb };
        assert!(matches!(v.create("default", &req("../x", 32)), Err(VolumeError::BadName(_))));
        assert!(matches!(v.create("default", &req("ok", 1)), Err(VolumeError::BadSize)));
        assert!(matches!(v.create("default", &req("ok", MAX_VOLUME_MB + 1)), Err(VolumeError::BadSize)));
        assert!(matches!(v.info("default", "nope"), Err(VolumeError::NotFound(_))));
        assert!(matches!(v.delete("default", "nope"), Err(VolumeError::NotFound(_))));
        assert!(v.list("default").is_empty());
        // An interrupted create (no record) is swept.
        std::fs::create_dir_all(d.path().join("volumes/default/half/mnt")).unwrap();
        assert_eq!(v.sweep(), vec!["default/half (interrupted create)".to_string()]);
        assert!(!d.path().join("volumes/default/half").exists());
    }
}
