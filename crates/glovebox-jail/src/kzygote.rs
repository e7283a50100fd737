//! The launcher of a python kernel zygote (`glovebox-agent kernel-zygote`, config on stdin,
//! the zygote's control socket at fd 3): one process per tenant and template that has
//! imported the template's libraries, and whose forked children become the python kernels
//! of that template's sandboxes (docs/benchmarks.md, "A per-template python kernel zygote").
//!
//! It runs the template's library code, so it is as unprivileged as a process on the host
//! can be: a host uid of its own (no sandbox's, not root), no capability, `no_new_privs`, in
//! new mount, PID, network (loopback only, down), IPC, UTS and cgroup namespaces (its PID namespace the host's: see `launch`), with the
//! template's root (the same layers a sandbox of it gets, not id-mapped: on-disk root is
//! host root, so nothing of it is the zygote's to write) as its `/` and nothing of the host
//! reachable. What it can do that a sandbox's command cannot is make a user namespace
//! (`unshare(CLONE_NEWUSER)`), which its forked children need: host root writes the new
//! namespace's maps and builds the sandbox inside it.
//!
//! Steps, in one process: join its own cgroups; unshare mount, network, IPC, UTS and cgroup
//! namespaces (not PID: see `launch`); build the root, pivot_root, a /proc showing only its
//! own processes; rlimits; close every fd but 0-3; drop every capability (bounding set
//! too), setuid to its uid, no_new_privs; exec `python3 python_kernel.py --zygote`.

use std::ffi::CString;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::JailConfig;
use crate::error::{Ctx, JailError, Result};
use crate::{rootfs, sys};

/// What the daemon sends on the launcher's stdin.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ZygoteConfig {
    /// The root (layers, skeleton, host `/usr`, private tmpfs on `mount_dir`) and the
    /// cgroups the zygote joins (its own, never a sandbox's). `uid_base` is unused (0).
    pub root: JailConfig,
    /// The zygote's host uid and gid: one of its own, used by nothing else.
    pub uid: u32,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// The control socket's fd in the zygote.
pub const CONTROL_FD: i32 = 3;

/// Entry point of `glovebox-agent kernel-zygote`. Never returns.
pub fn main_from_stdin() -> ! {
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut buf) {
        eprintln!("glovebox: kernel zygote: read config: {e}");
        sys::exit_now(1);
    }
    let cfg = match serde_json::from_slice::<ZygoteConfig>(&buf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("glovebox: kernel zygote: config: {e}");
            sys::exit_now(1);
        }
    };
    match launch(&cfg) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("glovebox: kernel zygote: {e}");
            sys::exit_now(1)
        }
    }
}

fn launch(cfg: &ZygoteConfig) -> Result<std::convert::Infallible> {
    if cfg.uid == 0 || cfg.argv.is_empty() {
        return Err(JailError::Config("a zygote runs as a host uid of its own, never root".into()));
    }
    sys::default_signals().ctx("reset signal dispositions")?;
    let me = sys::getpid().to_string();
    for procs in &cfg.root.cgroup_procs {
        std::fs::write(procs, &me).ctx_at("join cgroup", procs)?;
    }
    // No PID namespace of its own: a process may only enter a PID namespace below its own,
    // and the zygote's children enter their sandboxes'. It sees no other process through
    // its /proc (`hidepid`, below) and can signal only its own (its uid is its alone).
    sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWCGROUP)
        .ctx("unshare namespaces")?;
    sys::mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None).ctx("make / private")?;
    let root = rootfs::build_guest(&cfg.root)?;
    rootfs::build_dev_for(&root, cfg.root.shm_bytes)?;
    rootfs::enter(&root)?;
    // A /proc that shows the zygote its own processes only.
    sys::umount2(Path::new("/proc"), libc::MNT_DETACH).ctx("detach /proc")?;
    sys::mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("hidepid=invisible,subset=pid"),
    )
    .ctx("mount /proc")?;
    // Its root read-only: nothing there is the zygote's to change; a small /tmp of its own
    // for the libraries' caches (matplotlib's font list).
    sys::mount(None, Path::new("/"), None, libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY, None)
        .ctx("remount / read-only")?;
    sys::mount(
        Some("tmp"),
        Path::new("/tmp"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("size=16m,mode=1777,nr_inodes=4096"),
    )
    .ctx("mount /tmp")?;
    sys::lower_rlimit(libc::RLIMIT_CORE, 0, 0).ctx("rlimit core")?;
    sys::lower_rlimit(libc::RLIMIT_NOFILE, 1 << 12, 1 << 12).ctx("rlimit nofile")?;
    let devnull = std::fs::File::open("/dev/null").ctx("open /dev/null")?;
    sys::dup2(std::os::fd::AsRawFd::as_raw_fd(&devnull), 0).ctx("stdin")?;
    drop(devnull);
    sys::close_range(CONTROL_FD as u32 + 1, u32::MAX).ctx("close inherited fds")?;
    sys::chdir(Path::new(&cfg.cwd)).ctx_at("chdir", &cfg.cwd)?;
    let cstr = |s: &str| CString::new(s).map_err(|_| JailError::Config(format!("NUL in {s:?}")));
    let argv = cfg.argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>>>()?;
    let envp = cfg.env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect::<Result<Vec<_>>>()?;
    sys::setgroups_empty().ctx("setgroups")?;
    sys::setresgid(cfg.uid).ctx("setresgid")?;
    // The bounding set first (it needs CAP_SETPCAP), then the uid change (CAP_SETUID) clears
    // the permitted and effective sets; then what is left goes, and no_new_privs.
    for cap in 0..=63 {
        if sys::prctl(libc::PR_CAPBSET_DROP, cap).is_err() {
            break;
        }
    }
    sys::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong).ctx("clear ambient")?;
    sys::setresuid(cfg.uid).ctx("setresuid")?;
    sys::drop_all_caps().ctx("drop capabilities")?;
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = envp.iter().map(|c| c.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: NUL-terminated arrays of pointers into CStrings alive across the call.
    unsafe { libc::execve(a[0], a.as_ptr(), e.as_ptr()) };
    Err(JailError::sys("exec the zygote", std::io::Error::last_os_error()))
}
