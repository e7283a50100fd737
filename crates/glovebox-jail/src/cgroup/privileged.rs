//! Privileged tests: the drivers against the real `/sys/fs/cgroup` (v1 on the dev box, v2 on
//! most hosts; whichever this machine has). They need root, which CI has; elsewhere they say so
//! and pass without running. Every cgroup and process is registered with a guard that kills
//! and removes it even if the test fails.

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use super::test_util::MIB;
use super::{detect, kill_tree, remove_tree, Cgroup, CgroupDriver, Limits, Version};

const ROOT: &str = "/sys/fs/cgroup";
const OWNER: u32 = 65534;

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    // Real, effective, saved, fs: the effective one decides.
    uid_line.split_whitespace().nth(2) == Some("0")
}

/// Kills and reaps its processes, then kills and removes its cgroup, whatever happened.
struct Guard {
    cgroup: Option<Box<dyn Cgroup>>,
    children: Vec<Child>,
}

impl Guard {
    fn cgroup(&self) -> &dyn Cgroup {
        self.cgroup.as_deref().unwrap()
    }

    /// Starts `sleep 30` and moves it into every file of `procs`.
    fn spawn_into(&mut self, procs: &[PathBuf]) -> u32 {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        self.children.push(child);
        for file in procs {
            std::fs::write(file, pid.to_string()).unwrap_or_else(|e| panic!("join {}: {e}", file.display()));
        }
        pid
    }

    /// Reaps the child with `pid`, asserting SIGKILL ended it.
    fn reap_killed(&mut self, pid: u32) {
        let i = self.children.iter().position(|c| c.id() == pid).unwrap();
        let status = self.children.remove(i).wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "pid {pid}: {status}");
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(cgroup) = self.cgroup.take() {
            let _ = cgroup.kill_all();
            let _ = cgroup.destroy();
        }
    }
}

fn setup(test: &str) -> Option<(Box<dyn CgroupDriver>, Guard, String)> {
    if !is_root() {
        eprintln!("skipping {test}: privileged cgroup tests need root");
        return None;
    }
    let driver = detect(Path::new(ROOT)).unwrap();
    let name = format!("test-{}-{test}", std::process::id());
    let limits = Limits { memory_bytes: 64 * MIB, cpu_quota: 0.5, pids: 16 };
    let cgroup = driver.create(&name, &limits, OWNER).unwrap();
    let guard = Guard { cgroup: Some(cgroup), children: Vec::new() };
    Some((driver, guard, name))
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_owned()
}

fn uid(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().uid()
}

#[test]
fn real_create_limit_kill_destroy() {
    let Some((driver, mut guard, name)) = setup("lifecycle") else {
        return;
    };
    let root = Path::new(ROOT);
    let limit_file = match driver.version() {
        Version::V1 => {
            let cg = |h: &str| root.join(h).join("glovebox").join(&name);
            assert_eq!(read(cg("memory").join("memory.limit_in_bytes")), (64 * MIB).to_string());
            let memsw = cg("memory").join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                assert_eq!(read(memsw), (64 * MIB).to_string());
            }
            assert_eq!(read(cg("pids").join("pids.max")), "16");
            let cpu = root.join("cpu").canonicalize().unwrap().join("glovebox").join(&name);
            assert_eq!(read(cpu.join("cpu.cfs_period_us")), "100000");
            assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "50000");
            cg("memory").join("memory.limit_in_bytes")
        }
        Version::V2 => {
            let cg = root.join("glovebox").join(&name);
            assert_eq!(read(cg.join("memory.max")), (64 * MIB).to_string());
            assert_eq!(read(cg.join("pids.max")), "16");
            assert_eq!(read(cg.join("cpu.max")), "50000 100000");
            cg.join("memory.max")
        }
    };
    let (parent, _) = guard.cgroup().command_parent();
    assert_eq!(uid(&parent), OWNER, "command parent delegated");
    assert_eq!(uid(&limit_file), 0, "limits stay root's");

    let procs = guard.cgroup().procs_files();
    let pids: Vec<u32> = (0..3).map(|_| guard.spawn_into(&procs)).collect();
    let stats = guard.cgroup().stats().unwrap();
    assert_eq!(stats.pids_current, 3, "{stats:?}");
    assert_eq!(stats.oom_kills, 0);
    assert!(driver.list().unwrap().contains(&name));
    assert_eq!(driver.open(&name).unwrap().unwrap().procs_files(), procs);

    assert_eq!(guard.cgroup().kill_all().unwrap(), 3);
    for pid in pids {
        guard.reap_killed(pid);
    }
    assert_eq!(guard.cgroup().stats().unwrap().pids_current, 0);

    guard.cgroup().destroy().unwrap();
    for file in &procs {
        let dir = file.parent().unwrap();
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    assert!(!driver.list().unwrap().contains(&name));
    assert!(driver.open(&name).unwrap().is_none());
    guard.cgroup = None;
}

#[test]
fn real_kill_tree_kills_one_command_child() {
    let Some((driver, mut guard, name)) = setup("command") else {
        return;
    };
    let (parent, method) = guard.cgroup().command_parent();
    let child = parent.join("cmd-1");
    std::fs::create_dir(&child).unwrap();
    let procs = guard.cgroup().procs_files();
    let mut in_child = procs.clone();
    in_child.push(child.join("cgroup.procs"));
    let a = guard.spawn_into(&in_child);
    let b = guard.spawn_into(&in_child);
    let bystander = guard.spawn_into(&procs);

    assert_eq!(kill_tree(&child, method).unwrap(), 2);
    guard.reap_killed(a);
    guard.reap_killed(b);
    let still = guard.children.iter_mut().find(|c| c.id() == bystander).unwrap();
    assert!(still.try_wait().unwrap().is_none(), "kill_tree reached outside its tree");
    remove_tree(&child).unwrap();
    assert!(!child.exists());

    assert_eq!(guard.cgroup().kill_all().unwrap(), 1);
    guard.reap_killed(bystander);
    guard.cgroup().destroy().unwrap();
    for file in &procs {
        assert!(!file.parent().unwrap().exists());
    }
    assert!(!driver.list().unwrap().contains(&name));
    guard.cgroup = None;
}
