//! The cgroup core's `favordynmods`: a host setting that decides what a migration (a write to
//! `cgroup.procs`) costs.
//!
//! Every migration, in any hierarchy (v1 or v2), takes the kernel's global thread-group lock
//! for writing. That lock keeps forks and exits cheap by making a writer wait for an RCU grace
//! period unless another writer had it within about one: the first migration after a quiet
//! spell waits 2-16 ms on a 2-vCPU guest (docs/benchmarks.md), so a create after a pause pays
//! it — the jailer joins the sandbox's cgroups — and so does the agent's first spare. With
//! `favordynmods` on any cgroup mount (one flag for the whole lock) writers never wait, at a
//! small cost to every fork and exit on the host (their side of the lock stops being per-CPU).
//!
//! Glovebox changes it only when asked (`serve --cgroup-favor-dynmods`, which leaves it on);
//! `glovebox doctor`
//! reports it. The flag is a superblock option of the cgroup2 mount: it is set by
//! reconfiguring that superblock (`fspick` + `fsconfig`) with the options it already has plus
//! `favordynmods` (a reconfigure clears every flag it is not given, `nsdelegate` included).
//! Kernels since 6.0 have it; a boot with `cgroup_favordynmods=true` sets it too.

use std::io;
use std::path::PathBuf;

/// The host's cgroup2 mount as `/proc/self/mountinfo` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup2Mount {
    pub path: PathBuf,
    /// The superblock's options (`rw`, `nsdelegate`, `favordynmods`...).
    pub options: Vec<String>,
}

impl Cgroup2Mount {
    pub fn favors_dynmods(&self) -> bool {
        self.options.iter().any(|o| o == "favordynmods")
    }
}

/// The cgroup2 mount at `/sys/fs/cgroup` (a v2 host) or `/sys/fs/cgroup/unified` (a hybrid
/// one), from mountinfo's text; the last one mounted there wins, as it is the one seen.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<Cgroup2Mount> {
    let mut found = None;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNT_POINT MOUNT_OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        let Some((head, tail)) = line.split_once(" - ") else { continue };
        let mut t = tail.split(' ');
        let (Some("cgroup2"), Some(_source), Some(super_opts)) = (t.next(), t.next(), t.next()) else { continue };
        let Some(point) = head.split(' ').nth(4) else { continue };
        if point == "/sys/fs/cgroup" || point == "/sys/fs/cgroup/unified" {
            found = Some(Cgroup2Mount {
                path: PathBuf::from(point),
                options: super_opts.split(',').map(str::to_string).collect(),
            });
        }
    }
    found
}

/// The host's cgroup2 mount, if it has one.
pub fn cgroup2_mount() -> io::Result<Option<Cgroup2Mount>> {
    Ok(cgroup2_mount_in(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// What [`set_favor_dynmods`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Favored {
    /// It was so already (a boot option, another tool, an earlier start).
    Already(PathBuf),
    /// Changed now on this mount.
    Changed(PathBuf),
}

/// Turns `favordynmods` on (or off), keeping the mount's other options. Needs root in the
/// host's cgroup namespace; an error says why it could not (no cgroup2 mount, a kernel before
/// 6.0, a cgroup namespace of its own, where a reconfigure changes nothing).
pub fn set_favor_dynmods(on: bool) -> io::Result<Favored> {
    use rustix::mount::{fsconfig_reconfigure, fsconfig_set_flag, fspick, FsPickFlags};
    let Some(m) = cgroup2_mount()? else {
        return Err(io::Error::other(
            "no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified (a v1-only host: boot with cgroup_favordynmods=true)",
        ));
    };
    if m.favors_dynmods() == on {
        return Ok(Favored::Already(m.path));
    }
    let fs = fspick(rustix::fs::CWD, &m.path, FsPickFlags::FSPICK_CLOEXEC)?;
    // A reconfigure sets exactly the flags it is given: the mount's own, then ours.
    for o in m.options.iter().filter(|o| !matches!(o.as_str(), "rw" | "ro" | "favordynmods")) {
        fsconfig_set_flag(&fs, o.as_str()).map_err(|e| io::Error::other(format!("keep option {o}: {e}")))?;
    }
    if on {
        fsconfig_set_flag(&fs, "favordynmods")
            .map_err(|e| io::Error::other(format!("favordynmods: {e} (the kernel has it since 6.0)")))?;
    }
    fsconfig_reconfigure(&fs)?;
    match cgroup2_mount()? {
        Some(after) if after.favors_dynmods() == on => Ok(Favored::Changed(after.path)),
        _ => Err(io::Error::other(format!(
            "{} did not take the change (a cgroup namespace of its own?)",
            m.path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 33 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
44 33 0:39 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn the_host_s_cgroup2_mount_is_found_with_its_superblock_options() {
        let m = cgroup2_mount_in(HYBRID).unwrap();
        assert_eq!(m.path, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m.options, ["rw", "nsdelegate"]);
        assert!(!m.favors_dynmods());
        let v2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot,favordynmods\n";
        let m = cgroup2_mount_in(v2).unwrap();
        assert_eq!(m.path, PathBuf::from("/sys/fs/cgroup"));
        assert!(m.favors_dynmods());
    }

    #[test]
    fn other_cgroup2_mounts_and_v1_only_hosts_have_none() {
        // A cgroup2 mounted elsewhere (a container's, a test's) is not the host's.
        assert_eq!(cgroup2_mount_in("50 33 0:40 / /tmp/cg rw,relatime - cgroup2 cgroup2 rw\n"), None);
        let v1 = HYBRID.lines().filter(|l| !l.contains("cgroup2")).collect::<Vec<_>>().join("\n");
        assert_eq!(cgroup2_mount_in(&v1), None);
        assert_eq!(cgroup2_mount_in("garbage\n\n - \n"), None);
    }
}
