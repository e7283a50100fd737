//! Sandbox cgroups: limits, stats and reliable killing, cgroup v1 and v2 behind one trait.
//!
//! Invariants:
//! - A sandbox's cgroups are `<root>/[<hierarchy>/]glovebox/<name>`, `name` one component of
//!   `[A-Za-z0-9_-]` (checked on every entry point, so it can never walk out of the tree).
//! - Limit files stay root-owned. Only the command parent (and in v2 its `cgroup.procs`,
//!   `cgroup.threads`, `cgroup.subtree_control`, the kernel's delegation set) is chowned to the
//!   sandbox's uid, so the agent can make per-command children below the limits but not lift
//!   them (cgroup limits are hierarchical).
//! - `create` fails closed: on any error every directory it made for the sandbox is removed.
//!   The shared `glovebox` parents stay (other sandboxes live there).
//! - Killing never signals a pid it did not just read from the tree, and freezes the tree first
//!   where it can (v2 `cgroup.kill`, v1/v2 freezer), so nothing forks or exits — and no pid is
//!   reused — between the read and the signal. The freeze/kill/thaw logic is `tree::kill`,
//!   shared by [`Cgroup::kill_all`] and the agent's [`kill_tree`].
//! - Every kernel-side operation goes through `fs::Fs`, so tests run against a fake tree in a
//!   temp dir; the privileged tests run the same code against the real `/sys/fs/cgroup`.

mod cpu;
mod error;
#[cfg(test)]
mod fake;
mod freezer;
mod fs;
pub mod lock;
mod memory;
mod pids;
mod tree;
mod v1;
mod v2;

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use error::CgroupError;
use fs::{Fs, RealFs};

/// The directory, in each hierarchy (v1) or the root (v2), holding every sandbox's cgroup.
const PARENT: &str = "glovebox";
const PROCS: &str = "cgroup.procs";
const MAX_NAME_LEN: usize = 64;

/// A sandbox's resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Hard memory limit; no swap on top of it.
    pub memory_bytes: u64,
    /// CPU bandwidth in cores, e.g. 0.5 (at least 0.01).
    pub cpu_quota: f64,
    /// Maximum number of processes and threads.
    pub pids: u64,
}

impl Limits {
    pub fn validate(&self) -> Result<(), CgroupError> {
        memory::validate(self)?;
        cpu::validate(self)?;
        pids::validate(self)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Version {
    V1,
    V2,
}

/// How the agent kills a per-command child cgroup from inside (see [`kill_tree`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillMethod {
    /// v1 freezer cgroup: freeze, SIGKILL every pid, thaw.
    V1Freezer,
    /// v1 pids cgroup, no freezer hierarchy: SIGKILL every pid until empty. Without a freezer a
    /// process can exit between the read and the signal; see `tree::Stop::None`.
    V1Pids,
    /// v2: `cgroup.kill`, or freeze/SIGKILL/thaw on kernels before 5.14.
    V2Kill,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub memory_current_bytes: u64,
    /// High-water mark, if the kernel keeps one (v2 `memory.peak` is 5.19+).
    pub memory_peak_bytes: Option<u64>,
    pub cpu_usage_usec: u64,
    pub pids_current: u64,
    /// Processes the OOM killer killed in the sandbox, command children included.
    pub oom_kills: u64,
}

pub trait CgroupDriver: Send + Sync {
    fn version(&self) -> Version;
    /// Creates the sandbox's cgroup(s) with `limits`, the command parent delegated to
    /// `owner_uid`. Fails with [`CgroupError::AlreadyExists`] if `name` is taken; on any
    /// failure removes what it made.
    fn create(&self, name: &str, limits: &Limits, owner_uid: u32) -> Result<Box<dyn Cgroup>, CgroupError>;
    /// Re-opens an existing sandbox cgroup (after a daemon restart), or `None`. A sandbox left
    /// half-made (present in only some v1 hierarchies) opens too, so it can be destroyed.
    fn open(&self, name: &str) -> Result<Option<Box<dyn Cgroup>>, CgroupError>;
    /// Names of all existing sandbox cgroups, sorted.
    fn list(&self) -> Result<Vec<String>, CgroupError>;
}

pub trait Cgroup: Send + Sync {
    fn name(&self) -> &str;
    /// Every `cgroup.procs` a process must be written to to join the sandbox.
    fn procs_files(&self) -> Vec<PathBuf>;
    /// Where the agent makes one child cgroup per command, and how it kills one.
    fn command_parent(&self) -> (PathBuf, KillMethod);
    /// Applies new limits. Not atomic: on error some controllers may have the new values.
    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError>;
    /// Background (the lowest CPU weight: runs only on CPU time nobody else wants, e.g. a
    /// warm-pool sandbox booting) or the default weight.
    fn set_background(&self, background: bool) -> Result<(), CgroupError>;
    fn stats(&self) -> Result<Stats, CgroupError>;
    /// Just the CPU time used, in microseconds (one file read).
    fn cpu_usage_usec(&self) -> Result<u64, CgroupError>;
    /// Just the OOM kill count (one file read; checked around every command).
    fn oom_kills(&self) -> Result<u64, CgroupError>;
    /// Kills every process in the sandbox, command children included, and waits (up to about
    /// 2 s) until none is left. Returns how many it killed.
    fn kill_all(&self) -> Result<usize, CgroupError>;
    /// Stops every process of the sandbox, command children included, where they stand
    /// (the freezer), and waits (bounded) for the kernel to report them stopped. Fails with
    /// [`CgroupError::Unsupported`] on a v1 host without a freezer hierarchy.
    fn freeze(&self) -> Result<(), CgroupError>;
    /// Lets a frozen sandbox run again (a no-op on one not frozen).
    fn thaw(&self) -> Result<(), CgroupError>;
    /// Removes the sandbox's cgroup dirs, deepest first. Fails with
    /// [`CgroupError::NotEmpty`] if processes remain (call [`Cgroup::kill_all`] first).
    fn destroy(&self) -> Result<(), CgroupError>;
}

/// Detects the cgroup layout under `root` (normally `/sys/fs/cgroup`): v2 if `root` is a
/// cgroup2 mount (has `cgroup.controllers`) offering memory, pids and cpu; else v1 if the
/// memory, pids, cpu and cpuacct hierarchies are mounted below it. Decided from files only,
/// so a fake tree can stand in for the kernel.
pub fn detect(root: &Path) -> Result<Box<dyn CgroupDriver>, CgroupError> {
    detect_with(root, Arc::new(RealFs))
}

fn detect_with(root: &Path, fs: Arc<dyn Fs>) -> Result<Box<dyn CgroupDriver>, CgroupError> {
    let root = root.canonicalize().map_err(|source| CgroupError::Read { path: root.to_path_buf(), source })?;
    if root.join("cgroup.controllers").exists() {
        return Ok(Box::new(v2::V2Driver::new(fs, root)?));
    }
    Ok(Box::new(v1::V1Driver::new(fs, v1::Layout::detect(&root)?)))
}

/// For the agent: kills every process in the per-command cgroup `dir` and its children, and
/// waits (bounded) until it is empty. Returns how many it killed.
pub fn kill_tree(dir: &Path, method: KillMethod) -> Result<usize, CgroupError> {
    kill_tree_with(&RealFs, dir, method)
}

fn kill_tree_with(fs: &dyn Fs, dir: &Path, method: KillMethod) -> Result<usize, CgroupError> {
    let stop = match method {
        KillMethod::V1Freezer => tree::Stop::V1Freezer(dir),
        KillMethod::V1Pids => tree::Stop::None,
        KillMethod::V2Kill => tree::Stop::V2(dir),
    };
    tree::kill(fs, &[dir.to_path_buf()], stop)
}

/// For the agent: removes the per-command cgroup `dir` and its children, deepest first.
pub fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    tree::remove(&RealFs, dir)
}

fn validate_name(name: &str) -> Result<(), CgroupError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidName { name: name.into() })
    }
}

/// Runs `build`, which pushes every directory it makes onto its argument; if it fails, removes
/// them again (last made first) and returns its error.
fn fail_closed(
    fs: &dyn Fs,
    build: impl FnOnce(&mut Vec<PathBuf>) -> Result<(), CgroupError>,
) -> Result<(), CgroupError> {
    let mut made = Vec::new();
    let result = build(&mut made);
    if result.is_err() {
        for dir in made.iter().rev() {
            // Best effort: nothing has joined a cgroup that create has not returned yet, so
            // this only fails if the kernel does; the original error is the one to report,
            // and a leftover shows up in `list`.
            let _ = tree::remove(fs, dir);
        }
    }
    result
}

/// Adds the sandbox names under `parent` (a `glovebox` dir) to `out`.
fn list_into(parent: &Path, out: &mut BTreeSet<String>) -> Result<(), CgroupError> {
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(CgroupError::Read { path: parent.to_path_buf(), source }),
    };
    for entry in entries {
        let entry = entry.map_err(|source| CgroupError::Read { path: parent.to_path_buf(), source })?;
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
            if validate_name(name).is_ok() {
                out.insert(name.to_owned());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod privileged;

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::Path;
    use std::sync::Arc;

    use super::fake::FakeFs;
    use super::{detect_with, CgroupDriver, Limits};

    pub const MIB: u64 = 1 << 20;
    pub const LIMITS: Limits = Limits { memory_bytes: 64 * MIB, cpu_quota: 0.5, pids: 16 };

    pub fn driver(fake: &Arc<FakeFs>) -> Box<dyn CgroupDriver> {
        detect_with(&fake.root, Arc::clone(fake) as _).unwrap()
    }

    pub fn read(path: impl AsRef<Path>) -> String {
        std::fs::read_to_string(path.as_ref())
            .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
            .trim()
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::fake::{FakeFs, Op, Opts};
    use super::test_util::{driver, LIMITS};
    use super::*;

    fn detect_err(fake: FakeFs) -> CgroupError {
        match detect_with(&fake.root.clone(), Arc::new(fake)) {
            Ok(d) => panic!("detected {:?}", d.version()),
            Err(e) => e,
        }
    }

    #[test]
    fn detect_picks_v1_from_hierarchy_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeFs::v1(tmp.path(), Opts::default()));
        assert_eq!(driver(&fake).version(), Version::V1);
    }

    #[test]
    fn detect_picks_v1_with_comounted_cpu_cpuacct() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = Opts { cpu_cpuacct: true, ..Opts::default() };
        let fake = Arc::new(FakeFs::v1(tmp.path(), opts));
        let cgroup = driver(&fake).create("sb", &LIMITS, 1000).unwrap();
        // memory, pids, cpu,cpuacct (once, though reachable as cpu and cpuacct), freezer.
        let hierarchies: Vec<_> = cgroup
            .procs_files()
            .iter()
            .map(|p| p.strip_prefix(&fake.root).unwrap().iter().next().unwrap().to_owned())
            .collect();
        assert_eq!(hierarchies, ["memory", "pids", "cpu,cpuacct", "freezer"]);
    }

    #[test]
    fn detect_picks_v2_from_cgroup_controllers() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeFs::v2(tmp.path(), Opts::default()));
        assert_eq!(driver(&fake).version(), Version::V2);
    }

    #[test]
    fn detect_rejects_v2_without_our_controllers() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = FakeFs::v2(tmp.path(), Opts::default());
        std::fs::write(fake.root.join("cgroup.controllers"), "cpuset cpu io memory\n").unwrap();
        let err = detect_err(fake);
        assert!(matches!(&err, CgroupError::MissingControllers { missing, .. } if missing == "pids"), "{err:?}");
    }

    #[test]
    fn detect_rejects_unknown_layouts() {
        let tmp = tempfile::tempdir().unwrap();
        let empty = FakeFs::v1(tmp.path(), Opts::default());
        for h in ["memory", "pids", "cpu", "cpuacct", "freezer", "devices"] {
            std::fs::remove_dir_all(empty.root.join(h)).unwrap();
        }
        let err = detect_err(empty);
        assert!(matches!(err, CgroupError::Unsupported { .. }), "{err:?}");

        let tmp = tempfile::tempdir().unwrap();
        let no_pids = FakeFs::v1(tmp.path(), Opts::default());
        std::fs::remove_dir_all(no_pids.root.join("pids")).unwrap();
        let err = detect_err(no_pids);
        assert_eq!(
            err.to_string(),
            format!(
                "no supported cgroup layout under {}: not cgroup2 (no cgroup.controllers) and no v1 pids hierarchy",
                tmp.path().canonicalize().unwrap().display()
            )
        );
    }

    #[test]
    fn names_are_one_safe_component() {
        for good in ["sb-1", "a", "Sandbox_01", &"x".repeat(64)] {
            validate_name(good).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "../x", "cgroup.procs", "a b", "é", &"x".repeat(65)] {
            let err = validate_name(bad).unwrap_err();
            assert!(matches!(err, CgroupError::InvalidName { .. }), "{bad:?}");
        }
    }

    #[test]
    fn cpu_quota_is_cores_times_period() {
        assert_eq!(cpu::quota_us(0.5).unwrap(), 50_000);
        assert_eq!(cpu::quota_us(2.0).unwrap(), 200_000);
        assert_eq!(cpu::quota_us(0.01).unwrap(), 1_000);
        assert_eq!(cpu::PERIOD_US, 100_000);
        for bad in [0.0, -1.0, 0.004, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = cpu::quota_us(bad).unwrap_err();
            assert!(matches!(err, CgroupError::InvalidLimit { field: "cpu_quota", .. }), "{bad}");
        }
    }

    #[test]
    fn limits_are_validated_before_anything_is_made() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeFs::v1(tmp.path(), Opts::default()));
        let d = driver(&fake);
        let bad =
            [Limits { memory_bytes: 0, ..LIMITS }, Limits { pids: 0, ..LIMITS }, Limits { cpu_quota: 0.0, ..LIMITS }];
        for limits in bad {
            let err = d.create("sb", &limits, 1000).err().unwrap();
            let msg = err.to_string();
            assert!(msg.starts_with("invalid limit "), "{msg}");
            assert!(!msg.ends_with('.'), "{msg}");
        }
        assert!(fake.ops().is_empty(), "{:?}", fake.ops());
    }

    #[test]
    fn kill_tree_freezes_only_with_a_freezer() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeFs::v1(tmp.path(), Opts::default()));
        let cgroup = driver(&fake).create("sb", &LIMITS, 1000).unwrap();
        let (parent, method) = cgroup.command_parent();
        assert_eq!(method, KillMethod::V1Freezer);
        let child = parent.join("cmd");
        fake.mkdir(&child).unwrap();
        fake.add_proc(&child, 7);
        fake.add_proc(&parent, 8);

        assert_eq!(kill_tree_with(&*fake, &child, KillMethod::V1Freezer).unwrap(), 1);
        let state = child.join("freezer.state");
        let ops = fake.ops();
        let at = |op: Op| ops.iter().position(|o| *o == op).unwrap();
        let frozen = at(Op::Write(state.clone(), "FROZEN".into()));
        let killed = at(Op::Kill(7));
        let thawed = at(Op::Write(state.clone(), "THAWED".into()));
        assert!(frozen < killed && killed < thawed, "{ops:?}");
        assert!(!ops.contains(&Op::Kill(8)), "only the child's tree is killed");
        assert_eq!(test_util::read(&state), "THAWED");

        fake.add_proc(&child, 9);
        assert_eq!(kill_tree_with(&*fake, &child, KillMethod::V1Pids).unwrap(), 1);
        assert!(fake.ops().contains(&Op::Kill(9)));
        assert_eq!(fake.writes().iter().filter(|(p, _)| *p == state).count(), 2);

        tree::remove(&*fake, &child).unwrap();
        assert!(!child.exists());
    }
}
