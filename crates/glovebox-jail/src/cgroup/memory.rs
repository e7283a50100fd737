//! memory: a hard limit with no swap on top of it. v1: `memory.limit_in_bytes` and
//! `memory.memsw.limit_in_bytes` (memory + swap) equal; v2: `memory.max`, `memory.swap.max` 0.
//! The swap files are absent when swap accounting is off; then there is no swap to limit.

use std::path::Path;

use super::fs::{self, Fs};
use super::{CgroupError, Limits};

const V1_LIMIT: &str = "memory.limit_in_bytes";
const V1_MEMSW: &str = "memory.memsw.limit_in_bytes";
const V2_MAX: &str = "memory.max";
const V2_SWAP_MAX: &str = "memory.swap.max";

/// What the memory controller reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MemoryStats {
    pub current: u64,
    pub peak: Option<u64>,
    pub oom_kills: u64,
}

pub(super) fn validate(limits: &Limits) -> Result<(), CgroupError> {
    if limits.memory_bytes == 0 {
        return Err(CgroupError::InvalidLimit { field: "memory_bytes", reason: "must be greater than 0".into() });
    }
    Ok(())
}

pub(super) fn apply_v1(fs: &dyn Fs, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    let value = limits.memory_bytes.to_string();
    let limit = dir.join(V1_LIMIT);
    let memsw = dir.join(V1_MEMSW);
    if !memsw.exists() {
        return fs::write(fs, &limit, &value);
    }
    // The kernel rejects (EINVAL) any write leaving memsw below the memory limit, so raise memsw
    // first and lower the memory limit first.
    if limits.memory_bytes > fs::read_u64(&limit)? {
        fs::write(fs, &memsw, &value)?;
        fs::write(fs, &limit, &value)
    } else {
        fs::write(fs, &limit, &value)?;
        fs::write(fs, &memsw, &value)
    }
}

pub(super) fn apply_v2(fs: &dyn Fs, dir: &Path, limits: &Limits) -> Result<(), CgroupError> {
    fs::write(fs, &dir.join(V2_MAX), &limits.memory_bytes.to_string())?;
    let swap = dir.join(V2_SWAP_MAX);
    if swap.exists() {
        fs::write(fs, &swap, "0")?;
    }
    Ok(())
}

pub(super) fn stats_v1(dir: &Path) -> Result<MemoryStats, CgroupError> {
    Ok(MemoryStats {
        current: fs::read_u64(&dir.join("memory.usage_in_bytes"))?,
        peak: fs::read_u64_opt(&dir.join("memory.max_usage_in_bytes"))?,
        oom_kills: fs::read_keyed(&dir.join("memory.oom_control"), "oom_kill")?,
    })
}

pub(super) fn stats_v2(dir: &Path) -> Result<MemoryStats, CgroupError> {
    Ok(MemoryStats {
        current: fs::read_u64(&dir.join("memory.current"))?,
        // memory.peak appeared in 5.19.
        peak: fs::read_u64_opt(&dir.join("memory.peak"))?,
        // Hierarchical: counts the per-command children too.
        oom_kills: fs::read_keyed(&dir.join("memory.events"), "oom_kill")?,
    })
}
