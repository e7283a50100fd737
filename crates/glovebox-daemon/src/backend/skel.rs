//! The base skeleton of the process jail's `base` root (the generated `/etc` and directories
//! over the host's `/usr`, with the code interpreter's kernels): built once per set of inputs
//! and shared by every Glovebox process of the host, between runs too. Writing it takes
//! 10-20 ms (about 900 entries: `/etc/ssl`'s and `/etc/alternatives`' symlinks, copied files);
//! checking that the one already built is current takes one `lstat` per input.
//!
//! A skeleton lives at `<bases>/host-<fingerprint>`; the fingerprint covers what it is
//! written from: this executable (its code: the lists, the generated files, the kernels)
//! and every host entry it copies (see `glovebox_jail::rootfs::host_skel_inputs`). A
//! changed input gives another name, so a skeleton is never rewritten in place under the
//! sandboxes whose root it is.
//!
//! Invariants: a skeleton appears only complete (written under a private name, then
//! renamed); a process using one holds a shared `flock` on its directory, and only a process
//! holding it exclusively removes it (checked again after locking: the path must still name
//! the directory that was locked); one that a sandbox's run directory names (`skel`, kept
//! across restarts) is never removed; beyond those, the [`KEEP`] newest stay for the next
//! processes, and older ones go.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Unused skeletons kept for the processes that come next (two: two builds of Glovebox used
/// in turn do not rebuild each other's every time).
const KEEP: usize = 2;

/// The prefix of skeletons' names under the bases directory.
const PREFIX: &str = "host-";

/// A skeleton this process uses: held (shared) as long as the value lives.
pub(super) struct Skeleton {
    path: PathBuf,
    _lock: fs::File,
}

impl Skeleton {
    /// The current skeleton under `bases`, built first if no process has built it yet.
    pub(super) fn open(bases: &Path) -> std::io::Result<Skeleton> {
        let path = bases.join(format!("{PREFIX}{}", fingerprint()?));
        for _ in 0..3 {
            if !path.exists() {
                build(&path)?;
            }
            let dir = match fs::File::open(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            rustix::fs::flock(&dir, rustix::fs::FlockOperation::LockShared)?;
            // A reaper may have removed it between the open and the lock.
            if crate::util::path_names_file(&path, &dir) {
                return Ok(Skeleton { path, _lock: dir });
            }
        }
        Err(std::io::Error::other(format!("{} kept disappearing while it was opened", path.display())))
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// What the skeleton is written from, as a name: this executable (its device, inode, size
/// and change time: a rebuilt or replaced binary is another), the kernels it adds, and the
/// host entries it copies.
fn fingerprint() -> std::io::Result<String> {
    let mut h = Sha256::new();
    h.update(b"glovebox host skeleton 1\0");
    let exe = fs::metadata("/proc/self/exe")?;
    h.update(format!("{}:{} {} {}.{}\0", exe.dev(), exe.ino(), exe.size(), exe.ctime(), exe.ctime_nsec()));
    for (name, body) in crate::kernels::KERNEL_FILES {
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(body.as_bytes());
        h.update(b"\0");
    }
    glovebox_jail::rootfs::host_skel_inputs(&mut |b| h.update(b));
    let d = h.finalize();
    Ok(d[..12].iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes the skeleton under a name of this process's, then renames it into place (if another
/// process got there first, its copy stays and ours goes).
fn build(path: &Path) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let written = glovebox_jail::rootfs::write_host_skel(&tmp).and_then(|()| {
        let kdir = tmp.join(crate::kernels::KERNEL_DIR.trim_start_matches('/'));
        fs::create_dir_all(&kdir)?;
        for (name, body) in crate::kernels::KERNEL_FILES {
            fs::write(kdir.join(name), body)?;
        }
        Ok(())
    });
    let done = written.and_then(|()| fs::rename(&tmp, path));
    if done.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    match done {
        Err(_) if path.is_dir() => Ok(()),
        r => r,
    }
}

/// Removes, under `bases`, what no process and no sandbox uses: skeletons (beyond the
/// [`KEEP`] newest unused ones), unfinished ones of processes that are gone, and the
/// per-process trees (`mini-<pid>`, the whole-root templates' bottom layer; `host-<pid>`,
/// earlier versions' skeletons) of processes that are gone. `used`: the skeletons sandboxes' run directories name.
pub(super) fn reap(bases: &Path, used: &HashSet<PathBuf>) {
    let Ok(entries) = fs::read_dir(bases) else { return };
    let mut unused = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if used.contains(&path) {
            continue;
        }
        if let Some(pid) = owner_pid(&name) {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(&path);
            }
        } else if name.starts_with(PREFIX) && !name.contains('.') {
            let age = e.metadata().and_then(|m| m.modified()).ok();
            unused.push((age, path));
        }
    }
    // Newest first: the first KEEP stay.
    unused.sort_by_key(|u| std::cmp::Reverse(u.0));
    for (_, path) in unused.into_iter().skip(KEEP) {
        let Ok(dir) = fs::File::open(&path) else { continue };
        let locked = rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        if locked.is_ok() && crate::util::path_names_file(&path, &dir) {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// The process a base tree's name says made it: `mini-<pid>` and `host-<pid>` (one tree per
/// process), and `<name>.tmp-<pid>` (being written).
fn owner_pid(name: &str) -> Option<u32> {
    if let Some((_, pid)) = name.rsplit_once(".tmp-") {
        return pid.parse().ok();
    }
    let rest = name.strip_prefix(PREFIX).or_else(|| name.strip_prefix("mini-"))?;
    let rest = rest.strip_suffix(".tmp").unwrap_or(rest);
    // A fingerprint is 24 hex digits; a pid, at most 10 decimal ones.
    (rest.len() <= 10).then(|| rest.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_owners_from_fingerprints() {
        assert_eq!(owner_pid("host-1234"), Some(1234));
        assert_eq!(owner_pid("mini-77"), Some(77));
        assert_eq!(owner_pid("host-1234.tmp"), Some(1234));
        assert_eq!(owner_pid("host-0a1b2c3d4e5f60718293a4b5.tmp-42"), Some(42));
        assert_eq!(owner_pid("host-012345678901234567890123"), None, "a fingerprint of digits only");
        assert_eq!(owner_pid("host-0a1b2c3d4e5f60718293a4b5"), None);
    }

    #[test]
    fn the_fingerprint_is_stable() {
        assert_eq!(fingerprint().unwrap(), fingerprint().unwrap());
    }

    /// Root only (the skeleton's directories are chowned to root).
    #[test]
    fn one_skeleton_is_shared_and_unused_ones_beyond_keep_go() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let bases = t.path();
        let a = Skeleton::open(bases).unwrap();
        let b = Skeleton::open(bases).unwrap();
        assert_eq!(a.path(), b.path(), "the same inputs share one skeleton");
        assert!(a.path().join("etc/passwd").is_file());
        assert!(a.path().join("opt/glovebox/kernels").is_dir());
        let ino = fs::metadata(a.path()).unwrap().ino();
        // Three older unused skeletons (as other builds would have left), a dead process's
        // unfinished one and an earlier version's per-process tree.
        for (i, n) in
            ["host-aaaaaaaaaaaaaaaaaaaaaaaa", "host-bbbbbbbbbbbbbbbbbbbbbbbb", "host-cccccccccccccccccccccccc"]
                .iter()
                .enumerate()
        {
            fs::create_dir(bases.join(n)).unwrap();
            let at = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
            fs::File::open(bases.join(n)).unwrap().set_modified(at).unwrap();
        }
        fs::create_dir(bases.join("host-aaaaaaaaaaaaaaaaaaaaaaaa.tmp-999999999")).unwrap();
        fs::create_dir(bases.join("host-999999999")).unwrap();
        // One a sandbox's run directory names stays, however old.
        let used: HashSet<PathBuf> = [bases.join("host-aaaaaaaaaaaaaaaaaaaaaaaa")].into();
        reap(bases, &used);
        let mut left: Vec<String> =
            fs::read_dir(bases).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        let own = a.path().file_name().unwrap().to_string_lossy().into_owned();
        let mut want =
            vec!["host-aaaaaaaaaaaaaaaaaaaaaaaa".to_string(), "host-cccccccccccccccccccccccc".into(), own.clone()];
        want.sort();
        assert_eq!(left, want, "kept: the used one, and the two newest unused (ours and c)");
        // Ours is held: even beyond KEEP it stays while a process uses it.
        drop(b);
        for n in ["host-dddddddddddddddddddddddd", "host-eeeeeeeeeeeeeeeeeeeeeeee"] {
            fs::create_dir(bases.join(n)).unwrap();
        }
        reap(bases, &HashSet::new());
        assert_eq!(fs::metadata(a.path()).unwrap().ino(), ino, "a held skeleton is never removed");
        drop(a);
        reap(bases, &HashSet::new());
        assert!(!bases.join(&own).exists(), "unheld and older than the two newest: removed");
        assert!(
            bases.join("host-dddddddddddddddddddddddd").exists()
                && bases.join("host-eeeeeeeeeeeeeeeeeeeeeeee").exists()
        );
    }
}
