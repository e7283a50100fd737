//! pids: a cap on processes and threads, the fork-bomb stop. Same files in v1 and v2
//! (`pids.max`, `pids.current`); both versions are spelled out to keep every controller's shape.

use std::path::Path;

use super::fs::{self, Fs};
use super::{CgroupError, Limits};

pub(super) fn validate(limits: &Limits) -> Result<(), CgroupError> {
    if limits.pids == 0 {
        return Err(CgroupError::InvalidLimit { field: "pids", reason: "must be greater than 0".into() });
    }
    Ok(())
}

pub(super) fn apply_v1(fs: &dyn Fs, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join("pids.max"), &limits.pids.to_string())
}

pub(super) fn apply_v2(fs: &dyn Fs, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    apply_v1(fs, dir, limits)
}

pub(super) fn stats_v1(dir: &Path) -> Result<u64, CgroupError> {
    fs::read_u64(&dir.join("pids.current"))
}

pub(super) fn stats_v2(dir: &Path) -> Result<u64, CgroupError> {
    stats_v1(dir)
}
