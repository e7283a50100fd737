//! The kernel's cgroup migration lock (`cgroup_threadgroup_rwsem`), which every write to a
//! `cgroup.procs` takes, in any hierarchy, v1 or v2. It keeps forks cheap by making its
//! writers wait for an RCU grace period, unless another writer had it within about one grace
//! period: the first migration after a quiet spell costs a grace period (5-18 ms on a busy
//! 2-vCPU guest, measured; see docs/benchmarks.md), the next ones 10-100 us. A process about
//! to move a jailer into a sandbox's cgroups after a quiet spell (an embedded run's one
//! create) can have that grace period waited for beforehand, beside the rest of its start-up,
//! with [`touch`].

use std::io;
use std::path::{Path, PathBuf};

/// Takes and releases the lock without moving anything: this process is written into the
/// cgroup it is already in (found under `root`). Blocking (a grace period at most).
pub fn touch(root: &Path) -> io::Result<()> {
    let me = std::fs::read_to_string("/proc/self/cgroup")?;
    let file = own_procs_file(&me, root, |p| p.is_file())
        .ok_or_else(|| io::Error::other(format!("no cgroup of this process under {}", root.display())))?;
    std::fs::write(&file, std::process::id().to_string())
}

/// This process's own `cgroup.procs` under `root`, from the lines of `/proc/self/cgroup`
/// (`ID:CONTROLLERS:/PATH`; a v2 line has no controllers): the first that `exists`.
fn own_procs_file(proc_self_cgroup: &str, root: &Path, exists: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let rel = path.trim_start_matches('/');
        if rel.split('/').any(|c| c == "..") {
            continue;
        }
        let mounts: Vec<PathBuf> = if ctrls.is_empty() {
            vec![root.to_path_buf(), root.join("unified")]
        } else {
            std::iter::once(root.join(ctrls)).chain(ctrls.split(',').map(|c| root.join(c))).collect()
        };
        for m in mounts {
            let file = m.join(rel).join(super::PROCS);
            if exists(&file) {
                return Some(file);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_its_own_procs_file_in_a_mounted_hierarchy() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = "9:name=systemd:/\n4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/\n";
        let have = |want: &'static str| move |p: &Path| p == Path::new(want);
        assert_eq!(
            own_procs_file(v1, root, have("/sys/fs/cgroup/memory/a/b/cgroup.procs")),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b/cgroup.procs"))
        );
        assert_eq!(
            own_procs_file(v1, root, have("/sys/fs/cgroup/cpuacct/c/cgroup.procs")),
            Some(PathBuf::from("/sys/fs/cgroup/cpuacct/c/cgroup.procs")),
            "a co-mounted hierarchy under either controller's name"
        );
        let v2 = "0::/system.slice/glovebox.service\n";
        assert_eq!(
            own_procs_file(v2, root, have("/sys/fs/cgroup/system.slice/glovebox.service/cgroup.procs")),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/glovebox.service/cgroup.procs"))
        );
        assert_eq!(own_procs_file(v2, root, |_| false), None);
        assert_eq!(own_procs_file("1:pids:/../x\n", root, |_| true), None, "no climbing out of the root");
    }
}
