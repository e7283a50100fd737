//! freezer: stops every process of a cgroup tree so none forks or exits while we read its pids
//! and signal them (a frozen process keeps its pid, so the pid we kill is never a reused one).
//! v1: the freezer hierarchy's `freezer.state`; v2: the core `cgroup.freeze` file.

use std::path::Path;
use std::time::{Duration, Instant};

use super::fs::{self, Fs};
use super::CgroupError;

/// How long to wait for the kernel to report the tree frozen. A task in uninterruptible sleep
/// can hold freezing up; we signal anyway (SIGKILL stays pending) rather than hang.
const FREEZE_WAIT: Duration = Duration::from_millis(500);
/// The first poll comes soon (a sandbox with a few tasks freezes in well under a
/// millisecond), later ones back off to `POLL_MAX`.
const POLL_FIRST: Duration = Duration::from_micros(100);
const POLL_MAX: Duration = Duration::from_millis(5);

const V1_STATE: &str = "freezer.state";
const V2_FREEZE: &str = "cgroup.freeze";
const V2_EVENTS: &str = "cgroup.events";

pub(super) fn freeze_v1(fs: &dyn Fs, dir: &Path) -> Result<(), CgroupError> {
    let state = dir.join(V1_STATE);
    fs::write(fs, &state, "FROZEN")?;
    wait(|| Ok(fs::read(&state)?.trim() == "FROZEN"))
}

pub(super) fn thaw_v1(fs: &dyn Fs, dir: &Path) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join(V1_STATE), "THAWED")
}

pub(super) fn freeze_v2(fs: &dyn Fs, dir: &Path) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join(V2_FREEZE), "1")?;
    let events = dir.join(V2_EVENTS);
    wait(|| Ok(fs::read_keyed(&events, "frozen")? == 1))
}

pub(super) fn thaw_v2(fs: &dyn Fs, dir: &Path) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join(V2_FREEZE), "0")
}

fn wait(mut frozen: impl FnMut() -> Result<bool, CgroupError>) -> Result<(), CgroupError> {
    let deadline = Instant::now() + FREEZE_WAIT;
    let mut poll = POLL_FIRST;
    while !frozen()? && Instant::now() < deadline {
        std::thread::sleep(poll);
        poll = (poll * 2).min(POLL_MAX);
    }
    Ok(())
}
