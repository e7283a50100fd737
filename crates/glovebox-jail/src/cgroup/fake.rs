//! A fake cgroupfs for unit tests: a directory tree in a temp dir that behaves like the kernel
//! where the drivers depend on it. `mkdir` fills a new cgroup with its hierarchy's control
//! files; `rmdir` refuses a cgroup with processes or children; writes to missing files fail with
//! ENOENT; v1 refuses memsw below the memory limit (EINVAL); `cgroup.subtree_control` takes
//! `+x`/`-x`; `cgroup.procs` adds a pid; `cgroup.kill` empties the tree; `cgroup.freeze`
//! updates `cgroup.events`; `kill` removes the pid everywhere. Every mutation is logged, and
//! any file or directory name can be made to fail.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::fs::{walk, Fs};

const V1_MAX: &str = "9223372036854771712";

#[derive(Debug, Clone, Copy)]
pub(crate) struct Opts {
    /// Swap accounting on: the memsw / swap.max files exist.
    pub swap: bool,
    /// v1: the freezer hierarchy is mounted.
    pub freezer: bool,
    /// v1: cpu and cpuacct co-mounted as `cpu,cpuacct`, with systemd's symlinks.
    pub cpu_cpuacct: bool,
    /// v2: `cgroup.kill` exists (5.14+).
    pub cgroup_kill: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self { swap: true, freezer: true, cpu_cpuacct: false, cgroup_kill: true }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Mkdir(PathBuf),
    Rmdir(PathBuf),
    Write(PathBuf, String),
    Chown(PathBuf, u32),
    Kill(i32),
}

type Files = Vec<(&'static str, String)>;

#[derive(Debug)]
pub(crate) struct FakeFs {
    pub root: PathBuf,
    /// Per hierarchy (v1) or the root (v2): the control files of a new cgroup below it.
    templates: Vec<(PathBuf, Files)>,
    ops: Mutex<Vec<Op>>,
    failing: Mutex<Vec<String>>,
}

fn files(list: &[(&'static str, &str)]) -> Files {
    list.iter().map(|(n, v)| (*n, (*v).to_owned())).collect()
}

impl FakeFs {
    fn new(dir: &Path) -> Self {
        Self {
            root: dir.canonicalize().unwrap(),
            templates: Vec::new(),
            ops: Mutex::new(Vec::new()),
            failing: Mutex::new(Vec::new()),
        }
    }

    fn hierarchy(&mut self, name: &str, files: Files) {
        let dir = self.root.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        self.templates.push((dir, files));
    }

    pub fn v1(dir: &Path, opts: Opts) -> Self {
        let mut fake = Self::new(dir);
        let base = [("cgroup.procs", ""), ("tasks", ""), ("notify_on_release", "0")];
        let mut memory = files(&base);
        memory.extend(files(&[
            ("memory.limit_in_bytes", V1_MAX),
            ("memory.usage_in_bytes", "0"),
            ("memory.max_usage_in_bytes", "0"),
            ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"),
        ]));
        if opts.swap {
            memory.extend(files(&[("memory.memsw.limit_in_bytes", V1_MAX), ("memory.memsw.usage_in_bytes", "0")]));
        }
        fake.hierarchy("memory", memory);
        let mut pids = files(&base);
        pids.extend(files(&[("pids.max", "max"), ("pids.current", "0")]));
        fake.hierarchy("pids", pids);
        let cpu = files(&[("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "-1"), ("cpu.shares", "1024")]);
        let cpuacct = files(&[("cpuacct.usage", "0")]);
        if opts.cpu_cpuacct {
            let mut both = files(&base);
            both.extend(cpu);
            both.extend(cpuacct);
            fake.hierarchy("cpu,cpuacct", both);
            std::os::unix::fs::symlink("cpu,cpuacct", fake.root.join("cpu")).unwrap();
            std::os::unix::fs::symlink("cpu,cpuacct", fake.root.join("cpuacct")).unwrap();
        } else {
            let mut only_cpu = files(&base);
            only_cpu.extend(cpu);
            fake.hierarchy("cpu", only_cpu);
            let mut only_cpuacct = files(&base);
            only_cpuacct.extend(cpuacct);
            fake.hierarchy("cpuacct", only_cpuacct);
        }
        if opts.freezer {
            let mut freezer = files(&base);
            freezer.extend(files(&[("freezer.state", "THAWED")]));
            fake.hierarchy("freezer", freezer);
        }
        // A hierarchy the driver does not use.
        fake.hierarchy("devices", files(&base));
        fake
    }

    pub fn v2(dir: &Path, opts: Opts) -> Self {
        let mut fake = Self::new(dir);
        let root = fake.root.clone();
        for (name, value) in [
            ("cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc"),
            ("cgroup.subtree_control", ""),
            ("cgroup.procs", ""),
            ("cgroup.threads", ""),
            ("cpu.stat", "usage_usec 0\n"),
        ] {
            std::fs::write(root.join(name), value).unwrap();
        }
        let mut child = files(&[
            ("cgroup.controllers", "cpu memory pids"),
            ("cgroup.subtree_control", ""),
            ("cgroup.procs", ""),
            ("cgroup.threads", ""),
            ("cgroup.events", "populated 0\nfrozen 0\n"),
            ("cgroup.freeze", "0"),
            ("memory.max", "max"),
            ("memory.current", "0"),
            ("memory.peak", "0"),
            ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"),
            ("pids.max", "max"),
            ("pids.current", "0"),
            ("cpu.max", "max 100000"),
            ("cpu.weight", "100"),
            ("cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"),
        ]);
        if opts.cgroup_kill {
            child.extend(files(&[("cgroup.kill", "")]));
        }
        if opts.swap {
            child.extend(files(&[("memory.swap.max", "max"), ("memory.swap.current", "0")]));
        }
        fake.templates.push((root, child));
        fake
    }

    /// Makes every later operation on a path with this file name fail with EIO.
    pub fn fail_on(&self, name: &str) {
        self.failing.lock().unwrap().push(name.to_owned());
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// Paths written, in order, with their values.
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.ops()
            .into_iter()
            .filter_map(|op| match op {
                Op::Write(path, value) => Some((path, value)),
                _ => None,
            })
            .collect()
    }

    /// Index of the first write of `value` to `path`, to check ordering.
    pub fn write_index(&self, path: &Path, value: &str) -> Option<usize> {
        self.writes().iter().position(|(p, v)| p == path && v == value)
    }

    pub fn chowned(&self) -> Vec<(PathBuf, u32)> {
        self.ops()
            .into_iter()
            .filter_map(|op| match op {
                Op::Chown(path, uid) => Some((path, uid)),
                _ => None,
            })
            .collect()
    }

    /// Puts a (fake) pid in a cgroup, as a write to its `cgroup.procs` would.
    pub fn add_proc(&self, dir: &Path, pid: i32) {
        append_pid(&dir.join("cgroup.procs"), pid).unwrap();
    }

    fn record(&self, op: Op, path: &Path) -> io::Result<()> {
        self.ops.lock().unwrap().push(op);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if self.failing.lock().unwrap().iter().any(|f| f == name) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

fn append_pid(procs: &Path, pid: i32) -> io::Result<()> {
    let mut text = std::fs::read_to_string(procs)?;
    text.push_str(&format!("{pid}\n"));
    std::fs::write(procs, text)
}

fn read_num(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn tree(dir: &Path) -> io::Result<Vec<PathBuf>> {
    walk(dir).map_err(io::Error::other)
}

impl Fs for FakeFs {
    fn mkdir(&self, path: &Path) -> io::Result<()> {
        self.record(Op::Mkdir(path.to_path_buf()), path)?;
        std::fs::create_dir(path)?;
        let template = self
            .templates
            .iter()
            .filter(|(root, _)| path.starts_with(root) && path != root)
            .max_by_key(|(root, _)| root.components().count());
        if let Some((_, files)) = template {
            for (name, value) in files {
                std::fs::write(path.join(name), value)?;
            }
        }
        Ok(())
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        self.record(Op::Rmdir(path.to_path_buf()), path)?;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
            files.push(entry.path());
        }
        if !std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default().trim().is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        for file in files {
            std::fs::remove_file(file)?;
        }
        std::fs::remove_dir(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        self.record(Op::Write(path.to_path_buf(), value.to_owned()), path)?;
        if !path.is_file() {
            return Err(io::ErrorKind::NotFound.into());
        }
        let dir = path.parent().unwrap();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        match name {
            "memory.limit_in_bytes" => {
                let value: u64 = value.parse().map_err(|_| einval())?;
                if read_num(&dir.join("memory.memsw.limit_in_bytes")).is_some_and(|sw| value > sw) {
                    return Err(einval());
                }
            }
            "memory.memsw.limit_in_bytes" => {
                let value: u64 = value.parse().map_err(|_| einval())?;
                if read_num(&dir.join("memory.limit_in_bytes")).is_some_and(|mem| value < mem) {
                    return Err(einval());
                }
            }
            "cgroup.subtree_control" => {
                let text = std::fs::read_to_string(path)?;
                let mut enabled: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
                for token in value.split_whitespace() {
                    match token.split_at(1) {
                        ("+", c) if !enabled.iter().any(|e| e == c) => enabled.push(c.to_owned()),
                        ("+", _) => {}
                        ("-", c) => enabled.retain(|e| e != c),
                        _ => return Err(einval()),
                    }
                }
                return std::fs::write(path, enabled.join(" "));
            }
            "cgroup.procs" => {
                return append_pid(path, value.trim().parse().map_err(|_| einval())?);
            }
            "cgroup.kill" => {
                for cgroup in tree(dir)? {
                    std::fs::write(cgroup.join("cgroup.procs"), "")?;
                }
                return Ok(());
            }
            "cgroup.freeze" => {
                let events = format!("populated 0\nfrozen {}\n", value.trim());
                std::fs::write(dir.join("cgroup.events"), events)?;
            }
            _ => {}
        }
        std::fs::write(path, value)
    }

    fn chown(&self, path: &Path, uid: u32, gid: u32) -> io::Result<()> {
        assert_eq!(uid, gid, "the sandbox's gid is its uid");
        self.record(Op::Chown(path.to_path_buf(), uid), path)?;
        if path.exists() {
            Ok(())
        } else {
            Err(io::ErrorKind::NotFound.into())
        }
    }

    fn kill(&self, pid: i32) -> io::Result<()> {
        self.ops.lock().unwrap().push(Op::Kill(pid));
        let mut found = false;
        for cgroup in tree(&self.root)? {
            let procs = cgroup.join("cgroup.procs");
            let Ok(text) = std::fs::read_to_string(&procs) else {
                continue;
            };
            let kept: Vec<&str> = text.lines().filter(|l| l.trim() != pid.to_string()).collect();
            if kept.len() != text.lines().count() {
                found = true;
                let mut kept = kept.join("\n");
                if !kept.is_empty() {
                    kept.push('\n');
                }
                std::fs::write(&procs, kept)?;
            }
        }
        if found {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::ESRCH))
        }
    }
}
