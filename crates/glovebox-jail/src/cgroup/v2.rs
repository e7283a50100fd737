//! cgroup v2: one cgroup, `<root>/glovebox/<name>`, with memory, pids and cpu enabled from the
//! root down. The sandbox cgroup's own `subtree_control` stays empty, so the agent may live in
//! it and still put commands in child cgroups (no-internal-processes only binds controllers).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fs::{self, Fs};
use super::tree::{self, Stop};
use super::{
    cpu, fail_closed, freezer, list_into, memory, pids, validate_name, Cgroup, CgroupDriver, CgroupError, KillMethod,
    Limits, Stats, Version, PARENT, PROCS,
};

const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
const SUBTREE_CONTROL: &str = "cgroup.subtree_control";
/// The files of a delegated cgroup its delegatee must own, besides the directory
/// (Documentation/admin-guide/cgroup-v2.rst, "Delegation Containment").
const DELEGATED: [&str; 3] = [PROCS, "cgroup.threads", SUBTREE_CONTROL];

#[derive(Debug)]
pub(super) struct V2Driver {
    fs: Arc<dyn Fs>,
    root: PathBuf,
}

impl V2Driver {
    pub(super) fn new(fs: Arc<dyn Fs>, root: PathBuf) -> Result<Self, CgroupError> {
        let path = root.join("cgroup.controllers");
        let available = fs::read(&path)?;
        let missing = missing(&available);
        if !missing.is_empty() {
            return Err(CgroupError::MissingControllers { path: root, missing: missing.join(" ") });
        }
        Ok(Self { fs, root })
    }

    fn cgroup(&self, name: &str) -> V2Cgroup {
        V2Cgroup {
            fs: Arc::clone(&self.fs),
            dir: self.root.join(PARENT).join(name),
            name: name.to_owned(),
            oom: fs::Kept::default(),
        }
    }
}

fn missing(list: &str) -> Vec<&'static str> {
    let have: Vec<&str> = list.split_whitespace().collect();
    CONTROLLERS.into_iter().filter(|c| !have.contains(c)).collect()
}

/// Enables our controllers for `dir`'s children, writing only what is missing (concurrent
/// creates race harmlessly: enabling twice is a no-op).
fn enable_controllers(fs: &dyn Fs, dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join(SUBTREE_CONTROL);
    let enabled = fs::read(&path)?;
    let missing = missing(&enabled);
    if missing.is_empty() {
        return Ok(());
    }
    let value: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
    fs::write(fs, &path, &value.join(" "))
}

impl CgroupDriver for V2Driver {
    fn version(&self) -> Version {
        Version::V2
    }

    fn create(&self, name: &str, limits: &Limits, owner_uid: u32) -> Result<Box<dyn Cgroup>, CgroupError> {
        validate_name(name)?;
        limits.validate()?;
        let fs = &*self.fs;
        let parent = self.root.join(PARENT);
        enable_controllers(fs, &self.root)?;
        fs::ensure_dir(fs, &parent)?;
        enable_controllers(fs, &parent)?;
        let cgroup = self.cgroup(name);
        fail_closed(fs, |made| {
            fs::mkdir_new(fs, &cgroup.dir)?;
            made.push(cgroup.dir.clone());
            cgroup.set_limits(limits)?;
            fs::chown(fs, &cgroup.dir, owner_uid)?;
            for file in DELEGATED {
                fs::chown(fs, &cgroup.dir.join(file), owner_uid)?;
            }
            Ok(())
        })?;
        Ok(Box::new(cgroup))
    }

    fn open(&self, name: &str) -> Result<Option<Box<dyn Cgroup>>, CgroupError> {
        validate_name(name)?;
        let cgroup = self.cgroup(name);
        Ok(cgroup.dir.is_dir().then(|| Box::new(cgroup) as Box<dyn Cgroup>))
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        let mut names = BTreeSet::new();
        list_into(&self.root.join(PARENT), &mut names)?;
        Ok(names.into_iter().collect())
    }
}

#[derive(Debug)]
struct V2Cgroup {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    name: String,
    /// The OOM counter's file, kept open: it is read before and after every command.
    oom: fs::Kept,
}

impl Cgroup for V2Cgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        vec![self.dir.join(PROCS)]
    }

    fn command_parent(&self) -> (PathBuf, KillMethod) {
        (self.dir.clone(), KillMethod::V2Kill)
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        limits.validate()?;
        let fs = &*self.fs;
        memory::apply_v2(fs, &self.dir, limits)?;
        pids::apply_v2(fs, &self.dir, limits)?;
        cpu::apply_v2(fs, &self.dir, limits)
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
        self.oom.read_keyed(&self.dir.join("memory.events"), "oom_kill")
    }

    fn set_background(&self, background: bool) -> Result<(), CgroupError> {
        cpu::background_v2(&*self.fs, &self.dir, background)
    }

    fn stats(&self) -> Result<Stats, CgroupError> {
        let memory = memory::stats_v2(&self.dir)?;
        Ok(Stats {
            memory_current_bytes: memory.current,
            memory_peak_bytes: memory.peak,
            cpu_usage_usec: cpu::stats_v2(&self.dir)?,
            pids_current: pids::stats_v2(&self.dir)?,
            oom_kills: memory.oom_kills,
        })
    }

    fn cpu_usage_usec(&self) -> Result<u64, CgroupError> {
        cpu::stats_v2(&self.dir)
    }

    fn kill_all(&self) -> Result<usize, CgroupError> {
        tree::kill(&*self.fs, std::slice::from_ref(&self.dir), Stop::V2(&self.dir))
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        freezer::freeze_v2(&*self.fs, &self.dir)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        freezer::thaw_v2(&*self.fs, &self.dir)
    }

    fn destroy(&self) -> Result<(), CgroupError> {
        tree::ensure_empty(&self.dir)?;
        tree::remove(&*self.fs, &self.dir)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::super::fake::{FakeFs, Op, Opts};
    use super::super::fs::Fs;
    use super::super::test_util::{driver, read, LIMITS, MIB};
    use super::super::{CgroupError, KillMethod, Limits, Version};

    fn setup(opts: Opts) -> (tempfile::TempDir, Arc<FakeFs>) {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeFs::v2(tmp.path(), opts));
        (tmp, fake)
    }

    fn dir(fake: &FakeFs, name: &str) -> PathBuf {
        fake.root.join("glovebox").join(name)
    }

    #[test]
    fn create_enables_controllers_writes_limits_and_delegates() {
        let (_tmp, fake) = setup(Opts::default());
        let d = driver(&fake);
        assert_eq!(d.version(), Version::V2);
        let cgroup = d.create("sb1", &LIMITS, 1234).unwrap();
        let sb = dir(&fake, "sb1");

        assert_eq!(read(fake.root.join("cgroup.subtree_control")), "memory pids cpu");
        assert_eq!(read(fake.root.join("glovebox/cgroup.subtree_control")), "memory pids cpu");
        // Left empty so the agent can live in the sandbox cgroup and still make children.
        assert_eq!(read(sb.join("cgroup.subtree_control")), "");
        assert_eq!(read(sb.join("memory.max")), (64 * MIB).to_string());
        assert_eq!(read(sb.join("memory.swap.max")), "0");
        assert_eq!(read(sb.join("pids.max")), "16");
        assert_eq!(read(sb.join("cpu.max")), "50000 100000");

        let delegated: Vec<(PathBuf, u32)> =
            [sb.clone(), sb.join("cgroup.procs"), sb.join("cgroup.threads"), sb.join("cgroup.subtree_control")]
                .into_iter()
                .map(|p| (p, 1234))
                .collect();
        assert_eq!(fake.chowned(), delegated);
        assert_eq!(cgroup.command_parent(), (sb.clone(), KillMethod::V2Kill));
        assert_eq!(cgroup.procs_files(), [sb.join("cgroup.procs")]);

        // Already enabled: not written again.
        let writes = fake.writes().len();
        d.create("sb2", &LIMITS, 1234).unwrap();
        let subtree_writes =
            fake.writes()[writes..].iter().filter(|(p, _)| p.ends_with("cgroup.subtree_control")).count();
        assert_eq!(subtree_writes, 0);
    }

    #[test]
    fn create_enables_only_missing_controllers() {
        let (_tmp, fake) = setup(Opts::default());
        std::fs::write(fake.root.join("cgroup.subtree_control"), "cpu io memory").unwrap();
        driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let root_control = fake.root.join("cgroup.subtree_control");
        assert_eq!(fake.write_index(&root_control, "+pids"), Some(0), "{:?}", fake.writes());
        assert_eq!(read(&root_control), "cpu io memory pids");
    }

    #[test]
    fn without_swap_accounting_swap_max_is_skipped() {
        let (_tmp, fake) = setup(Opts { swap: false, ..Opts::default() });
        driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        assert!(!fake.writes().iter().any(|(p, _)| p.ends_with("memory.swap.max")));
        assert_eq!(read(dir(&fake, "sb1").join("memory.max")), (64 * MIB).to_string());
    }

    #[test]
    fn create_fails_closed() {
        for failing in ["memory.max", "cpu.max", "cgroup.threads"] {
            let (_tmp, fake) = setup(Opts::default());
            let d = driver(&fake);
            fake.fail_on(failing);
            let err = d.create("sb1", &LIMITS, 1234).err().unwrap();
            let path = match &err {
                CgroupError::Write { path, .. } | CgroupError::Chown { path, .. } => path.clone(),
                other => panic!("{other:?}"),
            };
            assert_eq!(path, dir(&fake, "sb1").join(failing));
            assert!(!dir(&fake, "sb1").exists(), "{failing}: sandbox left behind");
            assert!(fake.root.join("glovebox").is_dir());
            assert!(d.list().unwrap().is_empty());
            assert!(d.open("sb1").unwrap().is_none());
        }
    }

    #[test]
    fn list_open_destroy() {
        let (_tmp, fake) = setup(Opts::default());
        let d = driver(&fake);
        d.create("y", &LIMITS, 1234).unwrap();
        d.create("x", &LIMITS, 1234).unwrap();
        assert_eq!(d.list().unwrap(), ["x", "y"]);
        let x = d.open("x").unwrap().unwrap();
        assert_eq!(x.name(), "x");
        assert!(d.open("z").unwrap().is_none());

        let child = dir(&fake, "x").join("cmd-1");
        fake.mkdir(&child).unwrap();
        fake.add_proc(&child, 5);
        let err = x.destroy().unwrap_err();
        assert!(matches!(err, CgroupError::NotEmpty { remaining: 1, .. }), "{err:?}");
        assert_eq!(x.kill_all().unwrap(), 1);
        x.destroy().unwrap();
        assert!(!dir(&fake, "x").exists());
        assert_eq!(d.list().unwrap(), ["y"]);
    }

    #[test]
    fn kill_all_uses_cgroup_kill() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let sb = dir(&fake, "sb1");
        let child = sb.join("cmd-1");
        fake.mkdir(&child).unwrap();
        fake.add_proc(&sb, 10);
        fake.add_proc(&child, 11);
        assert_eq!(cgroup.kill_all().unwrap(), 2);
        assert!(fake.write_index(&sb.join("cgroup.kill"), "1").is_some());
        assert!(!fake.ops().iter().any(|op| matches!(op, Op::Kill(_))));
        assert!(!fake.writes().iter().any(|(p, _)| p.ends_with("cgroup.freeze")));
    }

    #[test]
    fn kill_all_freezes_where_cgroup_kill_is_missing() {
        let (_tmp, fake) = setup(Opts { cgroup_kill: false, ..Opts::default() });
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let sb = dir(&fake, "sb1");
        let child = sb.join("cmd-1");
        fake.mkdir(&child).unwrap();
        fake.add_proc(&sb, 10);
        fake.add_proc(&child, 11);
        assert_eq!(cgroup.kill_all().unwrap(), 2);
        let freeze = sb.join("cgroup.freeze");
        let ops = fake.ops();
        let at = |op: Op| ops.iter().position(|o| *o == op).unwrap();
        let frozen = at(Op::Write(freeze.clone(), "1".into()));
        let thawed = at(Op::Write(freeze.clone(), "0".into()));
        for pid in [10, 11] {
            let killed = at(Op::Kill(pid));
            assert!(frozen < killed && killed < thawed, "{ops:?}");
        }
        assert_eq!(read(sb.join("cgroup.events")), "populated 0\nfrozen 0");
    }

    #[test]
    fn background_is_the_lowest_cpu_weight_and_back() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let weight = dir(&fake, "sb1").join("cpu.weight");
        cgroup.set_background(true).unwrap();
        assert_eq!(read(&weight), "1");
        cgroup.set_background(false).unwrap();
        assert_eq!(read(&weight), "100");
    }

    #[test]
    fn stats_read_every_controller() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let sb = dir(&fake, "sb1");
        let put = |file: &str, value: &str| std::fs::write(sb.join(file), value).unwrap();
        put("memory.current", "4096\n");
        put("memory.peak", "8192\n");
        put("memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n");
        put("cpu.stat", "usage_usec 777\nuser_usec 700\nsystem_usec 77\n");
        put("pids.current", "3\n");
        let stats = cgroup.stats().unwrap();
        assert_eq!(stats.memory_current_bytes, 4096);
        assert_eq!(stats.memory_peak_bytes, Some(8192));
        assert_eq!(stats.oom_kills, 2);
        assert_eq!(stats.cpu_usage_usec, 777);
        assert_eq!(cgroup.cpu_usage_usec().unwrap(), 777);
        assert_eq!(stats.pids_current, 3);

        // memory.peak is 5.19+.
        std::fs::remove_file(sb.join("memory.peak")).unwrap();
        assert_eq!(cgroup.stats().unwrap().memory_peak_bytes, None);
    }

    #[test]
    fn set_limits_rewrites_every_controller() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let limits = Limits { memory_bytes: 256 * MIB, cpu_quota: 1.5, pids: 100 };
        cgroup.set_limits(&limits).unwrap();
        let sb = dir(&fake, "sb1");
        assert_eq!(read(sb.join("memory.max")), (256 * MIB).to_string());
        assert_eq!(read(sb.join("cpu.max")), "150000 100000");
        assert_eq!(read(sb.join("pids.max")), "100");
    }
}
