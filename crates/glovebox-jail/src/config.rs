//! What the daemon tells the jailer about one sandbox. Sent as JSON over the jailer's stdin
//! (never argv or environment, which the sandbox could read back from /proc).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cgroup::KillMethod;

/// How long a jail may take to come up before the launch counts as failed.
pub const START_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Debug builds only: whether `GLOVEBOX_DEBUG_CGROUP_MIGRATE` is set in the daemon's
/// environment (see [`JailConfig::cgroup_migrate`]); read once.
pub fn debug_cgroup_migrate() -> bool {
    static SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cfg!(debug_assertions) && *SET.get_or_init(|| std::env::var_os("GLOVEBOX_DEBUG_CGROUP_MIGRATE").is_some())
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JailConfig {
    pub id: String,
    /// First host uid (and gid) of the sandbox's private range; sandbox uid 0 maps here.
    pub uid_base: u32,
    pub uid_count: u32,
    pub hostname: String,
    /// An empty host directory, traversable (0711) but not writable by the range, on which
    /// the jailer mounts the sandbox's private tmpfs (inside its own mount namespace only).
    pub mount_dir: PathBuf,
    /// Where the agent's listening socket is bound on the host (a root-only directory).
    pub socket_path: PathBuf,
    /// Read-only lower layers of `/`, top-most first. Each is id-mapped into the sandbox.
    pub layers: Vec<PathBuf>,
    /// Also overlay the host's `/usr` (read-only, id-mapped) at `/usr`.
    pub host_usr: bool,
    /// Size cap of the writable upper layer (everything the sandbox writes to disk).
    pub disk_bytes: u64,
    /// A disk-backed writable layer: an ext4 image file (made by the daemon, its size the
    /// cap) mounted through a loop device on `mount_dir` instead of the private tmpfs, so the
    /// sandbox's writes are charged to the host's disk rather than to its memory.
    #[serde(default)]
    pub disk_image: Option<PathBuf>,
    /// Template builds only: an empty host directory (root-only, on a filesystem overlayfs
    /// accepts as upper) that holds the writable upper and the overlay work dirs instead of
    /// the private tmpfs, so the daemon can read the step's writes back as a layer once the
    /// sandbox is gone. The disk cap does not apply to it.
    #[serde(default)]
    pub upper_dir: Option<PathBuf>,
    /// `layers` is only the generated skeleton: `/` is the private tmpfs itself rather than
    /// an overlay (only `/etc` and `/usr` are), so path walks through it pay no overlayfs
    /// cost (`rootfs::build`). Not with `upper_dir`, whose writes are read back as a layer.
    #[serde(default)]
    pub flat_root: bool,
    /// Size cap of `/dev/shm` (its pages count against the memory limit).
    pub shm_bytes: u64,
    /// `cgroup.procs` files the jailer joins before creating namespaces. On a cgroup v2 host
    /// (one file, on cgroup2) the jailer instead clones the sandbox's first process into that
    /// directory and never joins it itself (see `jailer::run`).
    pub cgroup_procs: Vec<PathBuf>,
    /// Join by writing `cgroup.procs` even where clone3 could start the sandbox's first
    /// process in its cgroup (debug builds' A/B switch, `GLOVEBOX_DEBUG_CGROUP_MIGRATE`).
    #[serde(default)]
    pub cgroup_migrate: bool,
    /// Directory (delegated to the range's uid) for per-command child cgroups.
    pub command_cgroup: Option<(PathBuf, KillMethod)>,
    /// Process cap (also applied as RLIMIT_NPROC: the uid range is this sandbox's alone).
    pub pids: u64,
    /// The commands' seccomp filter, compiled once by the daemon (`seccomp::compile`) as
    /// `(code, jt, jf, k)`; the agent compiles its own when this is absent.
    #[serde(default)]
    pub seccomp: Option<Vec<(u16, u8, u8, u32)>>,
    /// The agent's own seccomp filter (`seccomp::compile_agent`), in the same form; the agent
    /// compiles its own when this is absent.
    #[serde(default)]
    pub agent_seccomp: Option<Vec<(u16, u8, u8, u32)>>,
    /// A network namespace made ahead of time (loopback up; `sys::new_netns`), as a path
    /// the jailer opens (`/proc/<daemon pid>/fd/<n>`). Without it the jailer makes one.
    /// Owned by the host's user namespace, it also leaves the sandbox no capability over
    /// its own network: nothing inside can add addresses, routes or netfilter rules.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// The body of the sandbox's `/etc/resolv.conf`, written by PID 1 inside its root before
    /// the agent starts (a namespace linked ahead: the resolver's address is known at boot).
    #[serde(default)]
    pub resolv_conf: Option<String>,
    /// Volumes bound into the root, in order (see `rootfs::bind_volume`).
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// A user namespace made ahead by someone else (a python kernel zygote's child, see
    /// docs/benchmarks.md), as a path the jailer opens (`/proc/<daemon pid>/fd/<n>`), its
    /// maps already written (`0 uid_base uid_count`) by host root. The jailer builds the
    /// sandbox inside it instead of cloning a new one; everything else is as without it.
    #[serde(default)]
    pub userns: Option<PathBuf>,
}

/// A volume as the jail binds it: a host directory (the daemon's mount of the volume's disk
/// image, whose on-disk ids are the sandbox's own) at an absolute path inside the root.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Volume {
    pub source: PathBuf,
    /// Absolute, normal components only (the daemon checks; the jail refuses others too).
    pub target: PathBuf,
    pub read_only: bool,
}
