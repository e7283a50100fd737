//! cpu: a bandwidth quota of `cpu_quota` cores per 100 ms period. v1: `cpu.cfs_period_us` and
//! `cpu.cfs_quota_us`; v2: `cpu.max` as "quota period". Usage: v1 `cpuacct.usage` (ns, in the
//! cpuacct hierarchy, which may or may not be the cpu one); v2 `cpu.stat` `usage_usec`.

use std::path::Path;

use super::fs::{self, Fs};
use super::{CgroupError, Limits};

pub(super) const PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts (1 ms).
const MIN_QUOTA_US: u64 = 1_000;

/// The quota in microseconds per [`PERIOD_US`] for `cpus` cores.
pub(super) fn quota_us(cpus: f64) -> Result<u64, CgroupError> {
    let invalid = |reason: String| CgroupError::InvalidLimit { field: "cpu_quota", reason };
    if !cpus.is_finite() || cpus <= 0.0 {
        return Err(invalid(format!("{cpus} cores: must be a number greater than 0")));
    }
    // Saturates for absurd values; the kernel then rejects the write, naming the file.
    let quota = (cpus * PERIOD_US as f64).round() as u64;
    if quota < MIN_QUOTA_US {
        return Err(invalid(format!(
            "{cpus} cores is below the kernel's minimum of {} cores",
            MIN_QUOTA_US as f64 / PERIOD_US as f64
        )));
    }
    Ok(quota)
}

pub(super) fn validate(limits: &Limits) -> Result<(), CgroupError> {
    quota_us(limits.cpu_quota).map(drop)
}

pub(super) fn apply_v1(fs: &dyn Fs, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    let quota = quota_us(limits.cpu_quota)?;
    // Each write walks every cpu cgroup on the host (the kernel checks the whole tree's
    // bandwidth), so a create's cost would grow with the number of sandboxes: a fresh
    // cgroup's period is already ours, and an unchanged quota is not written again.
    fs::write_changed(fs, &dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
    fs::write_changed(fs, &dir.join("cpu.cfs_quota_us"), &quota.to_string())
}

pub(super) fn apply_v2(fs: &dyn Fs, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    let quota = quota_us(limits.cpu_quota)?;
    fs::write_changed(fs, &dir.join("cpu.max"), &format!("{quota} {PERIOD_US}"))
}

/// v1 `cpu.shares`: 2 is the kernel's minimum, 1024 its default.
pub(super) fn background_v1(fs: &dyn Fs, dir: &Path, background: bool) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join("cpu.shares"), if background { "2" } else { "1024" })
}

/// v2 `cpu.weight`: 1 is the minimum, 100 the default.
pub(super) fn background_v2(fs: &dyn Fs, dir: &Path, background: bool) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join("cpu.weight"), if background { "1" } else { "100" })
}

/// CPU time used, in microseconds; `dir` is the sandbox's cpuacct cgroup.
pub(super) fn stats_v1(dir: &Path) -> Result<u64, CgroupError> {
    Ok(fs::read_u64(&dir.join("cpuacct.usage"))? / 1_000)
}

pub(super) fn stats_v2(dir: &Path) -> Result<u64, CgroupError> {
    fs::read_keyed(&dir.join("cpu.stat"), "usage_usec")
}
