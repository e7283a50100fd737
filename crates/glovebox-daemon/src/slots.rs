//! Host uid ranges: one 65,536-id range per live sandbox, never shared.
//!
//! Slot `n` is the range starting at `BASE + n * RANGE`. A slot is taken by holding an
//! exclusive `flock` on `slots/<n>.lock` whose content names the sandbox; the lock dies with
//! its holder, so a crashed daemon's slots are recognisable (unlocked but not empty) and are
//! left for reconciliation to free once it has cleaned the sandbox up. Several processes
//! (the daemon and embedded `glovebox run`s) can share one data directory safely.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// First host uid handed to sandboxes: far above any regular or system account.
pub const BASE: u32 = 1 << 30;
pub const RANGE: u32 = 65_536;
/// Number of slots (so the highest uid is below 2^31).
pub const COUNT: u32 = 16_384;

pub struct Slots {
    dir: PathBuf,
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    pub index: u32,
    file: File,
    path: PathBuf,
}

impl Slot {
    pub fn uid_base(&self) -> u32 {
        BASE + self.index * RANGE
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        let _ = fs::remove_file(&self.path);
        let _ = flock(self.file.as_fd(), FlockOperation::Unlock);
    }
}

impl Slots {
    pub fn new(dir: &Path) -> std::io::Result<Slots> {
        fs::create_dir_all(dir)?;
        Ok(Slots { dir: dir.to_path_buf() })
    }

    /// Where the slots' lock files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, n: u32) -> PathBuf {
        self.dir.join(format!("{n}.lock"))
    }

    /// Takes a free slot for sandbox `id`.
    pub fn take(&self, id: &str) -> std::io::Result<Slot> {
        let start = (crate::util::random_token(4).bytes().fold(0u32, |a, b| a * 31 + b as u32)) % COUNT;
        for i in 0..COUNT {
            let n = (start + i) % COUNT;
            if let Some(s) = self.try_take(n, id)? {
                return Ok(s);
            }
        }
        Err(std::io::Error::other("no free uid range"))
    }

    fn try_take(&self, n: u32, id: &str) -> std::io::Result<Option<Slot>> {
        let path = self.path(n);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        Self::claim(n, path, file, id)
    }

    /// Takes slot `n`, whose lock file at `path` was opened as `file`, for `id` if it is free.
    fn claim(n: u32, path: PathBuf, mut file: File, id: &str) -> std::io::Result<Option<Slot>> {
        if flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err() {
            return Ok(None);
        }
        // The file may have been unlinked by its previous holder between our open and lock,
        // and another made in its place since: the lock counts only on the file the path names.
        if !crate::util::path_names_file(&path, &file) {
            return Ok(None);
        }
        let mut prev = String::new();
        file.read_to_string(&mut prev)?;
        if !prev.trim().is_empty() {
            // Left by a holder that died: its sandbox awaits reconciliation.
            return Ok(None);
        }
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(id.as_bytes())?;
        Ok(Some(Slot { index: n, file, path }))
    }

    /// Re-takes slot `n` for `id` after a restart, if nobody holds it and it names `id`.
    pub fn adopt(&self, n: u32, id: &str) -> std::io::Result<Option<Slot>> {
        let path = self.path(n);
        let Ok(mut file) = OpenOptions::new().read(true).write(true).open(&path) else { return Ok(None) };
        if flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err() {
            return Ok(None);
        }
        let mut prev = String::new();
        file.read_to_string(&mut prev)?;
        if prev.trim() != id {
            let _ = flock(file.as_fd(), FlockOperation::Unlock);
            return Ok(None);
        }
        Ok(Some(Slot { index: n, file, path }))
    }

    /// Whether some live process holds slot `n`.
    pub fn is_held(&self, n: u32) -> bool {
        let Ok(file) = File::open(self.path(n)) else { return false };
        match flock(file.as_fd(), FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                let _ = flock(file.as_fd(), FlockOperation::Unlock);
                false
            }
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_freed_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let s = Slots::new(t.path()).unwrap();
        let a = s.take("a").unwrap();
        let b = s.take("b").unwrap();
        assert_ne!(a.index, b.index);
        assert!(s.is_held(a.index));
        assert!(a.uid_base() >= BASE && a.uid_base().is_multiple_of(RANGE));
        let n = a.index;
        drop(a);
        assert!(!s.is_held(n));
        assert!(!t.path().join(format!("{n}.lock")).exists());
    }

    #[test]
    fn a_dead_holders_slot_is_not_reused_until_adopted() {
        let t = tempfile::tempdir().unwrap();
        let s = Slots::new(t.path()).unwrap();
        // Simulate a crashed holder: the file names a sandbox but nobody holds the lock.
        fs::write(t.path().join("7.lock"), "old").unwrap();
        assert!(s.try_take(7, "new").unwrap().is_none());
        assert!(s.adopt(7, "other").unwrap().is_none());
        let slot = s.adopt(7, "old").unwrap().unwrap();
        assert_eq!(slot.index, 7);
        assert!(s.is_held(7));
    }

    #[test]
    fn a_lock_file_replaced_between_open_and_lock_is_not_taken() {
        let t = tempfile::tempdir().unwrap();
        let s = Slots::new(t.path()).unwrap();
        let path = t.path().join("7.lock");
        // A taker opens slot 7's file (empty: its holder is ending)...
        fs::write(&path, "").unwrap();
        let stale = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        // ...the holder unlinks it and lets go, and another taker makes a new one and holds it.
        fs::remove_file(&path).unwrap();
        let other = s.try_take(7, "other").unwrap().expect("slot 7 was free");
        // The first taker's lock on the unlinked file must not count: two sandboxes would
        // share one uid range (and one link name).
        assert!(Slots::claim(7, path.clone(), stale, "mine").unwrap().is_none());
        assert!(s.is_held(7));
        assert_eq!(fs::read_to_string(&path).unwrap(), "other");
        drop(other);
        assert!(!s.is_held(7));
    }
}
