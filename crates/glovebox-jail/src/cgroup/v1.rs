//! cgroup v1: one cgroup per hierarchy, `<root>/<hierarchy>/glovebox/<name>`, in the memory,
//! pids, cpu and cpuacct hierarchies (often one, `cpu,cpuacct`) and, when it is mounted, the
//! freezer one: it makes kills reliable and holds the agent's per-command children.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fs::{self, Fs};
use super::tree::{self, Stop};
use super::{
    cpu, fail_closed, freezer, list_into, memory, pids, validate_name, Cgroup, CgroupDriver, CgroupError, KillMethod,
    Limits, Stats, Version, PARENT, PROCS,
};

/// The mounted hierarchies, canonical so that `cpu` and `cpuacct` symlinks to `cpu,cpuacct`
/// (the systemd layout) compare equal and get one cgroup.
#[derive(Debug)]
pub(super) struct Layout {
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
    cpuacct: PathBuf,
    freezer: Option<PathBuf>,
}

impl Layout {
    pub(super) fn detect(root: &Path) -> Result<Self, CgroupError> {
        let find = |names: &[&str]| -> Result<Option<PathBuf>, CgroupError> {
            for name in names {
                let path = root.join(name);
                if path.is_dir() {
                    return path.canonicalize().map(Some).map_err(|source| CgroupError::Read { path, source });
                }
            }
            Ok(None)
        };
        let need = |names: &[&str]| -> Result<PathBuf, CgroupError> {
            find(names)?.ok_or_else(|| CgroupError::Unsupported {
                path: root.to_path_buf(),
                reason: format!("not cgroup2 (no cgroup.controllers) and no v1 {} hierarchy", names[0]),
            })
        };
        Ok(Self {
            memory: need(&["memory"])?,
            pids: need(&["pids"])?,
            cpu: need(&["cpu", "cpu,cpuacct", "cpuacct,cpu"])?,
            cpuacct: need(&["cpuacct", "cpu,cpuacct", "cpuacct,cpu"])?,
            freezer: find(&["freezer"])?,
        })
    }

    /// The distinct hierarchies a sandbox has a cgroup in, in creation order.
    fn hierarchies(&self) -> Vec<&Path> {
        let all = [Some(&self.memory), Some(&self.pids), Some(&self.cpu), Some(&self.cpuacct), self.freezer.as_ref()];
        let mut out: Vec<&Path> = Vec::new();
        for hierarchy in all.into_iter().flatten() {
            if !out.contains(&hierarchy.as_path()) {
                out.push(hierarchy);
            }
        }
        out
    }
}

#[derive(Debug)]
pub(super) struct V1Driver {
    fs: Arc<dyn Fs>,
    layout: Arc<Layout>,
}

impl V1Driver {
    pub(super) fn new(fs: Arc<dyn Fs>, layout: Layout) -> Self {
        Self { fs, layout: Arc::new(layout) }
    }

    fn cgroup(&self, name: &str) -> V1Cgroup {
        V1Cgroup {
            fs: Arc::clone(&self.fs),
            layout: Arc::clone(&self.layout),
            name: name.to_owned(),
            oom: fs::Kept::default(),
        }
    }
}

impl CgroupDriver for V1Driver {
    fn version(&self) -> Version {
        Version::V1
    }

    fn create(&self, name: &str, limits: &Limits, owner_uid: u32) -> Result<Box<dyn Cgroup>, CgroupError> {
        validate_name(name)?;
        limits.validate()?;
        let cgroup = self.cgroup(name);
        let fs = &*self.fs;
        fail_closed(fs, |made| {
            for hierarchy in self.layout.hierarchies() {
                fs::ensure_dir(fs, &hierarchy.join(PARENT))?;
                let dir = cgroup.dir(hierarchy);
                fs::mkdir_new(fs, &dir)?;
                made.push(dir);
            }
            cgroup.set_limits(limits)?;
            fs::chown(fs, &cgroup.command_parent().0, owner_uid)
        })?;
        Ok(Box::new(cgroup))
    }

    fn open(&self, name: &str) -> Result<Option<Box<dyn Cgroup>>, CgroupError> {
        validate_name(name)?;
        let cgroup = self.cgroup(name);
        let exists = self.layout.hierarchies().into_iter().any(|h| cgroup.dir(h).is_dir());
        Ok(exists.then(|| Box::new(cgroup) as Box<dyn Cgroup>))
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        let mut names = BTreeSet::new();
        for hierarchy in self.layout.hierarchies() {
            list_into(&hierarchy.join(PARENT), &mut names)?;
        }
        Ok(names.into_iter().collect())
    }
}

#[derive(Debug)]
struct V1Cgroup {
    fs: Arc<dyn Fs>,
    layout: Arc<Layout>,
    name: String,
    /// The OOM counter's file, kept open: it is read before and after every command.
    oom: fs::Kept,
}

impl V1Cgroup {
    fn dir(&self, hierarchy: &Path) -> PathBuf {
        hierarchy.join(PARENT).join(&self.name)
    }

    fn freezer_dir(&self) -> Result<PathBuf, CgroupError> {
        match &self.layout.freezer {
            Some(f) => Ok(self.dir(f)),
            None => Err(CgroupError::Unsupported {
                path: self.dir(&self.layout.memory),
                reason: "no freezer hierarchy is mounted: a sandbox cannot be frozen".into(),
            }),
        }
    }

    fn dirs(&self) -> Vec<PathBuf> {
        self.layout.hierarchies().into_iter().map(|h| self.dir(h)).collect()
    }
}

impl Cgroup for V1Cgroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().into_iter().map(|d| d.join(PROCS)).collect()
    }

    fn command_parent(&self) -> (PathBuf, KillMethod) {
        match &self.layout.freezer {
            Some(freezer) => (self.dir(freezer), KillMethod::V1Freezer),
            None => (self.dir(&self.layout.pids), KillMethod::V1Pids),
        }
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        limits.validate()?;
        let fs = &*self.fs;
        memory::apply_v1(fs, &self.dir(&self.layout.memory), limits)?;
        pids::apply_v1(fs, &self.dir(&self.layout.pids), limits)?;
        cpu::apply_v1(fs, &self.dir(&self.layout.cpu), limits)
    }

    fn set_background(&self, background: bool) -> Result<(), CgroupError> {
        cpu::background_v1(&*self.fs, &self.dir(&self.layout.cpu), background)
    }

    fn stats(&self) -> Result<Stats, CgroupError> {
        let memory = memory::stats_v1(&self.dir(&self.layout.memory))?;
        Ok(Stats {
            memory_current_bytes: memory.current,
            memory_peak_bytes: memory.peak,
            cpu_usage_usec: cpu::stats_v1(&self.dir(&self.layout.cpuacct))?,
            pids_current: pids::stats_v1(&self.dir(&self.layout.pids))?,
            oom_kills: memory.oom_kills,
        })
    }

    fn cpu_usage_usec(&self) -> Result<u64, CgroupError> {
        cpu::stats_v1(&self.dir(&self.layout.cpuacct))
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
        self.oom.read_keyed(&self.dir(&self.layout.memory).join("memory.oom_control"), "oom_kill")
    }

    fn kill_all(&self) -> Result<usize, CgroupError> {
        // A process is in one cgroup per hierarchy; all are searched in case one was only
        // partly joined. The freezer, if any, stops the whole sandbox while we signal.
        let freezer = self.layout.freezer.as_ref().map(|f| self.dir(f)).filter(|d| d.is_dir());
        let stop = freezer.as_deref().map_or(Stop::None, Stop::V1Freezer);
        tree::kill(&*self.fs, &self.dirs(), stop)
    }

    fn freeze(&self) -> Result<(), CgroupError> {
        freezer::freeze_v1(&*self.fs, &self.freezer_dir()?)
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        freezer::thaw_v1(&*self.fs, &self.freezer_dir()?)
    }

    fn destroy(&self) -> Result<(), CgroupError> {
        let dirs = self.dirs();
        for dir in &dirs {
            tree::ensure_empty(dir)?;
        }
        // Try every hierarchy even if one fails, so as little as possible leaks.
        let mut first_error = None;
        for dir in &dirs {
            if let Err(e) = tree::remove(&*self.fs, dir) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use super::super::fake::{FakeFs, Op, Opts};
    use super::super::fs::Fs;
    use super::super::test_util::{driver, read, LIMITS, MIB};
    use super::super::{CgroupError, KillMethod, Limits, Version};

    fn setup(opts: Opts) -> (tempfile::TempDir, Arc<FakeFs>) {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeFs::v1(tmp.path(), opts));
        (tmp, fake)
    }

    fn dir(fake: &FakeFs, hierarchy: &str, name: &str) -> PathBuf {
        fake.root.join(hierarchy).join("glovebox").join(name)
    }

    const USED: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

    #[test]
    fn create_writes_limits_and_delegates_only_the_freezer_dir() {
        let (_tmp, fake) = setup(Opts::default());
        let d = driver(&fake);
        assert_eq!(d.version(), Version::V1);
        let cgroup = d.create("sb1", &LIMITS, 1234).unwrap();
        assert_eq!(cgroup.name(), "sb1");

        let mem = dir(&fake, "memory", "sb1");
        let limit = mem.join("memory.limit_in_bytes");
        let memsw = mem.join("memory.memsw.limit_in_bytes");
        assert_eq!(read(&limit), (64 * MIB).to_string());
        assert_eq!(read(&memsw), (64 * MIB).to_string());
        // Lowering from unlimited: the memory limit must go first.
        let value = (64 * MIB).to_string();
        assert!(fake.write_index(&limit, &value) < fake.write_index(&memsw, &value));
        assert_eq!(read(dir(&fake, "pids", "sb1").join("pids.max")), "16");
        let cpu = dir(&fake, "cpu", "sb1");
        assert_eq!(read(cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "50000");

        let freezer = dir(&fake, "freezer", "sb1");
        assert_eq!(fake.chowned(), [(freezer.clone(), 1234)]);
        assert_eq!(cgroup.command_parent(), (freezer, KillMethod::V1Freezer));
        let expected: Vec<PathBuf> = USED.iter().map(|h| dir(&fake, h, "sb1").join("cgroup.procs")).collect();
        assert_eq!(cgroup.procs_files(), expected);
        for p in &expected {
            assert!(p.is_file(), "{}", p.display());
        }
        assert!(!dir(&fake, "devices", "sb1").exists());
    }

    #[test]
    fn without_swap_accounting_memsw_is_skipped() {
        let (_tmp, fake) = setup(Opts { swap: false, ..Opts::default() });
        driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let mem = dir(&fake, "memory", "sb1");
        assert_eq!(read(mem.join("memory.limit_in_bytes")), (64 * MIB).to_string());
        assert!(!fake.writes().iter().any(|(p, _)| p.ends_with("memory.memsw.limit_in_bytes")));
    }

    #[test]
    fn without_freezer_the_pids_cgroup_is_the_command_parent() {
        let (_tmp, fake) = setup(Opts { freezer: false, ..Opts::default() });
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let pids = dir(&fake, "pids", "sb1");
        assert_eq!(cgroup.command_parent(), (pids.clone(), KillMethod::V1Pids));
        assert_eq!(fake.chowned(), [(pids, 1234)]);
        assert_eq!(cgroup.procs_files().len(), 4);
    }

    #[test]
    fn set_limits_orders_memsw_around_the_memory_limit() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let mem = dir(&fake, "memory", "sb1");
        let limit = mem.join("memory.limit_in_bytes");
        let memsw = mem.join("memory.memsw.limit_in_bytes");

        // The fake, like the kernel, refuses memsw < limit, so a wrong order fails here.
        let raised = Limits { memory_bytes: 128 * MIB, cpu_quota: 2.0, pids: 64 };
        cgroup.set_limits(&raised).unwrap();
        let value = (128 * MIB).to_string();
        assert!(fake.write_index(&memsw, &value) < fake.write_index(&limit, &value));
        assert_eq!(read(&limit), value);
        assert_eq!(read(&memsw), value);
        assert_eq!(read(dir(&fake, "cpu", "sb1").join("cpu.cfs_quota_us")), "200000");
        assert_eq!(read(dir(&fake, "pids", "sb1").join("pids.max")), "64");

        let lowered = Limits { memory_bytes: 32 * MIB, ..raised };
        cgroup.set_limits(&lowered).unwrap();
        let value = (32 * MIB).to_string();
        assert!(fake.write_index(&limit, &value) < fake.write_index(&memsw, &value));
        assert_eq!(read(&memsw), value);
    }

    #[test]
    fn cpu_bandwidth_is_written_only_when_it_changes() {
        // Each write of a bandwidth file walks every cpu cgroup on the host: a fresh cgroup's
        // period and an unchanged quota are left as they are.
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let cpu_writes = || fake.writes().iter().filter(|(p, _)| p.to_string_lossy().contains("cpu.cfs_")).count();
        assert_eq!(cpu_writes(), 1, "{:?}", fake.writes());
        cgroup.set_limits(&Limits { memory_bytes: 32 * MIB, ..LIMITS }).unwrap();
        assert_eq!(cpu_writes(), 1, "the quota did not change");
        assert_eq!(read(dir(&fake, "memory", "sb1").join("memory.limit_in_bytes")), (32 * MIB).to_string());
        cgroup.set_limits(&Limits { cpu_quota: 1.0, ..LIMITS }).unwrap();
        assert_eq!(cpu_writes(), 2);
        assert_eq!(read(dir(&fake, "cpu", "sb1").join("cpu.cfs_quota_us")), "100000");
    }

    #[test]
    fn create_fails_closed() {
        for failing in ["pids.max", "cpu.cfs_quota_us", "sb1"] {
            let (_tmp, fake) = setup(Opts::default());
            let d = driver(&fake);
            fake.fail_on(failing);
            let err = d.create("sb1", &LIMITS, 1234).err().unwrap();
            let path = match &err {
                CgroupError::Write { path, .. } | CgroupError::Mkdir { path, .. } | CgroupError::Chown { path, .. } => {
                    path.clone()
                }
                other => panic!("{other:?}"),
            };
            assert!(path.ends_with(failing), "{err:?}");
            for h in USED {
                assert!(!dir(&fake, h, "sb1").exists(), "{failing}: {h} left behind");
            }
            // Shared with other sandboxes: stays.
            assert!(fake.root.join("memory/glovebox").is_dir());
            assert!(d.list().unwrap().is_empty());
        }
    }

    #[test]
    fn create_refuses_an_existing_sandbox_and_leaves_it_alone() {
        let (_tmp, fake) = setup(Opts::default());
        let d = driver(&fake);
        d.create("sb1", &LIMITS, 1234).unwrap();
        let err = d.create("sb1", &LIMITS, 1234).err().unwrap();
        assert!(matches!(&err, CgroupError::AlreadyExists { path } if *path == dir(&fake, "memory", "sb1")), "{err:?}");
        assert_eq!(err.to_string(), format!("cgroup {} already exists", dir(&fake, "memory", "sb1").display()));
        for h in USED {
            assert!(dir(&fake, h, "sb1").is_dir());
        }
    }

    #[test]
    fn list_and_open_find_sandboxes_even_half_made_ones() {
        let (_tmp, fake) = setup(Opts::default());
        let d = driver(&fake);
        assert!(d.list().unwrap().is_empty());
        d.create("b", &LIMITS, 1234).unwrap();
        d.create("a", &LIMITS, 1234).unwrap();
        // A leak from a crash, in one hierarchy only, plus things that are not sandboxes.
        std::fs::create_dir(dir(&fake, "freezer", "leak")).unwrap();
        std::fs::create_dir(dir(&fake, "pids", "not.a.sandbox")).unwrap();
        std::fs::write(dir(&fake, "pids", "stray-file"), "").unwrap();
        assert_eq!(d.list().unwrap(), ["a", "b", "leak"]);

        let a = d.open("a").unwrap().unwrap();
        assert_eq!(a.name(), "a");
        assert_eq!(a.command_parent().0, dir(&fake, "freezer", "a"));
        assert!(d.open("c").unwrap().is_none());
        assert!(matches!(d.open("../a").err(), Some(CgroupError::InvalidName { .. })));

        d.open("leak").unwrap().unwrap().destroy().unwrap();
        a.destroy().unwrap();
        assert_eq!(d.list().unwrap(), ["b"]);
        for h in USED {
            assert!(!dir(&fake, h, "a").exists());
        }
    }

    #[test]
    fn destroy_refuses_while_processes_remain() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let pids = dir(&fake, "pids", "sb1");
        fake.add_proc(&pids, 4242);
        let err = cgroup.destroy().unwrap_err();
        assert!(matches!(&err, CgroupError::NotEmpty { path, remaining: 1 } if *path == pids), "{err:?}");
        for h in USED {
            assert!(dir(&fake, h, "sb1").is_dir(), "{h} removed despite the error");
        }
    }

    #[test]
    fn kill_all_freezes_signals_every_hierarchy_and_child_then_thaws() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let (parent, _) = cgroup.command_parent();
        let child = parent.join("cmd-1");
        fake.mkdir(&child).unwrap();
        for h in ["memory", "pids", "freezer"] {
            fake.add_proc(&dir(&fake, h, "sb1"), 100);
        }
        fake.add_proc(&child, 101);
        fake.add_proc(&dir(&fake, "memory", "sb1"), 101);
        // Only in the memory hierarchy (half joined): still found and killed.
        fake.add_proc(&dir(&fake, "memory", "sb1"), 102);

        assert_eq!(cgroup.kill_all().unwrap(), 3);
        let state = parent.join("freezer.state");
        let ops = fake.ops();
        let at = |op: Op| ops.iter().position(|o| *o == op).unwrap();
        let frozen = at(Op::Write(state.clone(), "FROZEN".into()));
        let thawed = at(Op::Write(state.clone(), "THAWED".into()));
        for pid in [100, 101, 102] {
            let killed = at(Op::Kill(pid));
            assert!(frozen < killed && killed < thawed, "{ops:?}");
        }
        assert_eq!(read(&state), "THAWED");
        assert_eq!(cgroup.stats().unwrap().pids_current, 0);
        assert_eq!(cgroup.kill_all().unwrap(), 0);

        cgroup.destroy().unwrap();
        assert!(!child.exists());
        for h in USED {
            assert!(!dir(&fake, h, "sb1").exists());
        }
    }

    #[test]
    fn background_is_the_lowest_cpu_weight_and_back() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let shares = dir(&fake, "cpu", "sb1").join("cpu.shares");
        cgroup.set_background(true).unwrap();
        assert_eq!(read(&shares), "2");
        cgroup.set_background(false).unwrap();
        assert_eq!(read(&shares), "1024");
    }

    #[test]
    fn stats_read_every_controller() {
        let (_tmp, fake) = setup(Opts::default());
        let cgroup = driver(&fake).create("sb1", &LIMITS, 1234).unwrap();
        let put = |h: &str, file: &str, value: &str| {
            std::fs::write(dir(&fake, h, "sb1").join(file), value).unwrap();
        };
        put("memory", "memory.usage_in_bytes", "4096\n");
        put("memory", "memory.max_usage_in_bytes", "8192\n");
        put("memory", "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
        put("cpuacct", "cpuacct.usage", "5000000\n");
        put("pids", "pids.current", "2\n");
        let stats = cgroup.stats().unwrap();
        assert_eq!(stats.memory_current_bytes, 4096);
        assert_eq!(stats.memory_peak_bytes, Some(8192));
        assert_eq!(stats.oom_kills, 3);
        assert_eq!(stats.cpu_usage_usec, 5000);
        assert_eq!(cgroup.cpu_usage_usec().unwrap(), 5000);
        assert_eq!(stats.pids_current, 2);

        put("pids", "pids.current", "lots\n");
        let err = cgroup.stats().unwrap_err();
        let expected: &Path = &dir(&fake, "pids", "sb1").join("pids.current");
        assert!(matches!(&err, CgroupError::Parse { path, .. } if path == expected), "{err:?}");
    }
}
