//! The filesystem operations whose behaviour differs between cgroupfs and a plain directory
//! tree, behind a trait so tests run against a fake tree in a temp dir (`fake.rs`).
//!
//! On cgroupfs `mkdir` makes the control files appear, `rmdir` removes a directory that still
//! holds them, writes never create files, and a process is removed by a signal. Those go through
//! [`Fs`]; reads and listings behave the same on both and are plain `std::fs` calls.

use std::collections::VecDeque;
use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use super::CgroupError;

/// The kernel side of every cgroup operation.
pub(crate) trait Fs: Send + Sync + fmt::Debug {
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// Writes `value` in one `write(2)` to an existing control file; never creates it.
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    fn chown(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()>;
    /// Sends SIGKILL to one process.
    fn kill(&self, pid: i32) -> io::Result<()>;
}

/// The real cgroupfs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RealFs;

impl Fs for RealFs {
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        // No create(true): a missing control file means a missing controller, not a file to make.
        let mut file = OpenOptions::new().write(true).open(path)?;
        file.write_all(value.as_bytes())
    }

    fn chown(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        sigkill(pid)
    }
}

/// kill(2) with SIGKILL, for exactly one process.
#[allow(unsafe_code)]
fn sigkill(pid: i32) -> io::Result<()> {
    // 0 and negative pids address process groups or every process we may signal.
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: kill(2) takes no pointers and reads or writes no memory of this process, so it
    // cannot break Rust's memory invariants; `pid > 0` is checked above, so it targets exactly
    // one process, never a process group or "every process" (0, -1, < -1).
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(super) fn write(fs: &dyn Fs, path: &Path, value: &str) -> Result<(), CgroupError> {
    fs.write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

/// Writes `value` unless the file already holds it. For control files whose every write
/// costs the kernel more than a read does (cpu bandwidth: each write walks every task group
/// on the host), so that a value set before (a fresh cgroup's default, a shell made ahead)
/// is not written again.
pub(super) fn write_changed(fs: &dyn Fs, path: &Path, value: &str) -> Result<(), CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(now) if now.trim() == value => Ok(()),
        _ => write(fs, path, value),
    }
}

/// Makes a directory that may already exist (the shared `glovebox` parents).
pub(super) fn ensure_dir(fs: &dyn Fs, path: &Path) -> Result<(), CgroupError> {
    match fs.mkdir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Mkdir { path: path.to_path_buf(), source }),
    }
}

/// Makes a directory that must not exist yet (a sandbox's own cgroup).
pub(super) fn mkdir_new(fs: &dyn Fs, path: &Path) -> Result<(), CgroupError> {
    fs.mkdir(path).map_err(|source| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            CgroupError::AlreadyExists { path: path.to_path_buf() }
        } else {
            CgroupError::Mkdir { path: path.to_path_buf(), source }
        }
    })
}

pub(super) fn chown(fs: &dyn Fs, path: &Path, uid: u32) -> Result<(), CgroupError> {
    fs.chown(path, uid, uid).map_err(|source| CgroupError::Chown { path: path.to_path_buf(), uid, source })
}

pub(super) fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(|source| CgroupError::Read { path: path.to_path_buf(), source })
}

fn parse_u64(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        reason: format!("not a number: {:?}", text.trim()),
    })
}

/// A file holding one number.
pub(super) fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    parse_u64(path, &read(path)?)
}

/// A file holding one number, which older kernels lack (e.g. v2 `memory.peak`).
pub(super) fn read_u64_opt(path: &Path) -> Result<Option<u64>, CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_u64(path, &text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError::Read { path: path.to_path_buf(), source }),
    }
}

/// The value of `key` in a flat keyed file of `key value` lines (`memory.events`, `cpu.stat`).
pub(super) fn read_keyed(path: &Path, key: &str) -> Result<u64, CgroupError> {
    keyed(path, &read(path)?, key)
}

/// A cgroup file kept open for repeated reads. Every read starts at offset 0, where the kernel
/// renders the file afresh, so one open serves them all; the open (the path walk through
/// cgroupfs) is most of a small read's cost. Reads fail once the cgroup is removed.
#[derive(Debug, Default)]
pub(super) struct Kept(std::sync::OnceLock<std::fs::File>);

impl Kept {
    /// [`read_keyed`] through the kept file (opened on first use).
    pub(super) fn read_keyed(&self, path: &Path, key: &str) -> Result<u64, CgroupError> {
        use std::os::unix::fs::FileExt;
        let err = |source| CgroupError::Read { path: path.to_path_buf(), source };
        let file = match self.0.get() {
            Some(f) => f,
            None => {
                let f = std::fs::File::open(path).map_err(err)?;
                // Two first reads racing: one file is kept, the other closed.
                let _ = self.0.set(f);
                self.0.get().expect("set just above")
            }
        };
        let mut buf = [0u8; 4096];
        let n = file.read_at(&mut buf, 0).map_err(err)?;
        keyed(path, &String::from_utf8_lossy(&buf[..n]), key)
    }
}

fn keyed(path: &Path, text: &str, key: &str) -> Result<u64, CgroupError> {
    let value = text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .ok_or_else(|| CgroupError::Parse { path: path.to_path_buf(), reason: format!("no key {key:?}") })?;
    parse_u64(path, value)
}

/// The pids listed in a `cgroup.procs` file; empty if the cgroup has just been removed.
pub(super) fn read_pids(path: &Path) -> Result<Vec<i32>, CgroupError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(CgroupError::Read { path: path.to_path_buf(), source }),
    };
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| match line.parse::<i32>() {
            Ok(pid) if pid > 0 => Ok(pid),
            // The kernel never lists pid 0 or negatives; refusing them keeps kill(2) away from
            // process groups.
            _ => Err(CgroupError::Parse { path: path.to_path_buf(), reason: format!("not a pid: {line:?}") }),
        })
        .collect()
}

/// `dir` and every cgroup below it, breadth first (so parents before children); empty if `dir`
/// does not exist. Iterative, so a deep tree made by the agent cannot exhaust our stack;
/// symlinks are not followed (cgroupfs has none, and a fake tree must not lead us out).
pub(super) fn walk(dir: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let mut out = Vec::new();
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Ok(out),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(source) => return Err(CgroupError::Read { path: dir.to_path_buf(), source }),
    }
    let mut queue = VecDeque::from([dir.to_path_buf()]);
    while let Some(current) = queue.pop_front() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            // Removed while we walk (the agent cleaning up a command's cgroup).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(CgroupError::Read { path: current, source }),
        };
        for entry in entries {
            let entry = entry.map_err(|source| CgroupError::Read { path: current.clone(), source })?;
            let is_dir = entry.file_type().map_err(|source| CgroupError::Read { path: entry.path(), source })?.is_dir();
            if is_dir {
                queue.push_back(entry.path());
            }
        }
        out.push(current);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_file_is_read_afresh_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.events");
        std::fs::write(&path, "oom 0\noom_kill 0\n").unwrap();
        let kept = Kept::default();
        assert_eq!(kept.read_keyed(&path, "oom_kill").unwrap(), 0);
        // Rewritten in place (the same inode, as a cgroup file is): the next read sees it.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all(b"oom 3\noom_kill 2\n").unwrap();
        assert_eq!(kept.read_keyed(&path, "oom_kill").unwrap(), 2);
        assert!(matches!(kept.read_keyed(&path, "nope"), Err(CgroupError::Parse { .. })));
        // A missing file is a read error, and nothing is kept for it.
        let other = Kept::default();
        assert!(matches!(other.read_keyed(&dir.path().join("gone"), "oom_kill"), Err(CgroupError::Read { .. })));
        assert!(other.0.get().is_none());
    }
}
