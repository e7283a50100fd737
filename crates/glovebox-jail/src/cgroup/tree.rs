//! Operations on a whole cgroup tree (a cgroup and the per-command children the agent made
//! below it): list its processes, kill them, remove its directories. Written once, used by the
//! drivers' `kill_all`/`destroy` and by the agent's [`super::kill_tree`]/[`super::remove_tree`].

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fs::{self, Fs};
use super::{freezer, CgroupError};

/// Bound on how long a kill waits for the tree to empty.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// After this long without the tree emptying, freeze and signal again (a process may have been
/// moved in, or forked before the freezer existed).
const ROUND: Duration = Duration::from_millis(200);
const POLL: Duration = Duration::from_millis(10);

const PROCS: &str = "cgroup.procs";
const V2_KILL: &str = "cgroup.kill";

/// How to stop the tree while its pids are read and signalled.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop<'a> {
    /// v1 without a freezer hierarchy: signal without freezing (see `KillMethod::V1Pids`).
    None,
    /// The v1 freezer cgroup at the top of the tree.
    V1Freezer(&'a Path),
    /// The v2 cgroup at the top of the tree: `cgroup.kill` if the kernel has it (5.14+), else
    /// `cgroup.freeze`.
    V2(&'a Path),
}

/// Every process in the trees rooted at `tops`, by pid, with the cgroup it was found in. A
/// process is in one cgroup per v1 hierarchy, so the same pid shows up once per tree.
pub(super) fn pids(tops: &[PathBuf]) -> Result<BTreeMap<i32, PathBuf>, CgroupError> {
    let mut out = BTreeMap::new();
    for top in tops {
        for dir in fs::walk(top)? {
            let procs = dir.join(PROCS);
            for pid in fs::read_pids(&procs)? {
                out.entry(pid).or_insert_with(|| procs.clone());
            }
        }
    }
    Ok(out)
}

/// Kills every process in the trees rooted at `tops` and waits, bounded, until they are empty.
/// Returns how many processes it killed.
pub(super) fn kill(fs: &dyn Fs, tops: &[PathBuf], stop: Stop<'_>) -> Result<usize, CgroupError> {
    let deadline = Instant::now() + KILL_TIMEOUT;
    let mut killed = BTreeSet::new();
    loop {
        if pids(tops)?.is_empty() {
            return Ok(killed.len());
        }
        match stop {
            Stop::V2(dir) if dir.join(V2_KILL).exists() => {
                // The kernel kills the whole subtree atomically, forks included; the pids read
                // just before are only for the count.
                killed.extend(pids(tops)?.into_keys());
                fs::write(fs, &dir.join(V2_KILL), "1")?;
            }
            _ => killed.extend(freeze_and_signal(fs, tops, stop)?),
        }
        let round_end = (Instant::now() + ROUND).min(deadline);
        loop {
            let left = pids(tops)?;
            if left.is_empty() {
                return Ok(killed.len());
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::NotEmpty {
                    path: tops.first().cloned().unwrap_or_default(),
                    remaining: left.len(),
                });
            }
            if Instant::now() >= round_end {
                break;
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Freezes, SIGKILLs every pid, thaws (always, even if signalling failed: a tree left frozen
/// would hold its processes forever). Frozen processes die as soon as they are thawed.
fn freeze_and_signal(fs: &dyn Fs, tops: &[PathBuf], stop: Stop<'_>) -> Result<Vec<i32>, CgroupError> {
    match stop {
        Stop::None => {}
        Stop::V1Freezer(dir) => freezer::freeze_v1(fs, dir)?,
        Stop::V2(dir) => freezer::freeze_v2(fs, dir)?,
    }
    let signalled = signal_all(fs, tops);
    let thawed = match stop {
        Stop::None => Ok(()),
        Stop::V1Freezer(dir) => freezer::thaw_v1(fs, dir),
        Stop::V2(dir) => freezer::thaw_v2(fs, dir),
    };
    let signalled = signalled?;
    thawed?;
    Ok(signalled)
}

fn signal_all(fs: &dyn Fs, tops: &[PathBuf]) -> Result<Vec<i32>, CgroupError> {
    let mut signalled = Vec::new();
    for (pid, procs) in pids(tops)? {
        match fs.kill(pid) {
            Ok(()) => signalled.push(pid),
            // Exited between the read and the signal (only possible without a freezer).
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(source) => return Err(CgroupError::Kill { path: procs, pid, source }),
        }
    }
    Ok(signalled)
}

/// Fails if any process is left in the tree, naming it and the count: rmdir would only say
/// EBUSY.
pub(super) fn ensure_empty(top: &Path) -> Result<(), CgroupError> {
    let left = pids(&[top.to_path_buf()])?;
    if left.is_empty() {
        return Ok(());
    }
    Err(CgroupError::NotEmpty { path: top.to_path_buf(), remaining: left.len() })
}

/// Removes `top` and every cgroup below it, deepest first. Absent directories are fine.
pub(super) fn remove(fs: &dyn Fs, top: &Path) -> Result<(), CgroupError> {
    // Breadth-first order lists parents before children, so reversed it is deepest first.
    for dir in fs::walk(top)?.iter().rev() {
        match fs.rmdir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(CgroupError::Rmdir { path: dir.clone(), source }),
        }
    }
    Ok(())
}
