//! Python kernel zygotes (`Config::code_zygote`): one per tenant and template, each a process
//! that imported the template's preloaded modules once and forks the python kernel of every
//! new sandbox of that tenant and template (`glovebox_jail::kzygote`; docs/benchmarks.md, "A
//! per-template python kernel zygote, built"). The forked kernels share the libraries' pages.
//!
//! Invariants:
//! - A zygote runs the template's code: it never has host privilege (a uid slot's base uid of
//!   its own, no capability, its own namespaces, no network, the template's root read-only),
//!   and it is never shared between tenants: its children make the user namespaces of the
//!   sandboxes they seed, so it holds every capability over them.
//! - Best effort, never in the way: a zygote that is starting, dead or failing gives no child,
//!   and the sandbox is booted and its kernel started as without it; a dead or failing zygote
//!   is ended and another started by the request that finds it so. Every failure is logged.
//! - Each zygote holds a shell (uid slot, run directory, cgroups) like a sandbox's; closing
//!   kills it and every process in its cgroups and releases the shell. Its children are in
//!   its cgroups until they are handed to a sandbox (then in the sandbox's, dying with it).
//! - A forked kernel is in a cgroup of its own below the sandbox's ([`KERNEL_CGROUP`], where
//!   the agent puts each command's), so killing the kernel kills whatever it started, as for
//!   a kernel the agent starts.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use glovebox_jail::cgroup::Cgroup;
use glovebox_jail::config::JailConfig;
use glovebox_jail::kzygote::{self, Forked, KernelSpec};

use super::made_ahead::Shell;
use super::{Spec, ZygoteWant};
use crate::util::lock;

/// A zygote's limits: what it holds is the template's imported libraries, once.
const MEMORY_BYTES: u64 = 2 << 30;

/// A compiled seccomp filter as the jail config carries it: `(code, jt, jf, k)`.
type Filter = Vec<(u16, u8, u8, u32)>;
const PIDS: u64 = 256;

struct Zygote {
    run: kzygote::Running,
    shell: Shell,
}

impl Zygote {
    fn end(self) {
        let Zygote { run, shell } = self;
        drop(run);
        let _ = shell.cgroup.kill_all();
        shell.discard();
    }
}

/// The zygotes by tenant and template. The map's lock is held only to find or add an entry;
/// a fork (which waits up to seconds on the zygote's child, and the zygote runs a template's
/// code) holds only its own entry's, so one tenant's zygote never holds up another's creates.
#[derive(Default)]
pub(super) struct Zygotes {
    map: Mutex<(HashMap<String, Entry>, bool)>,
}

/// One tenant's and template's zygote, when it has one running.
type Entry = Arc<Mutex<Option<Zygote>>>;

/// What starting a zygote needs of the jail: its agent binary, its base skeleton, and a shell.
pub(super) struct Maker<'a> {
    pub agent: &'a Path,
    pub skel: &'a Path,
    pub cpu_quota: f64,
    pub shell: &'a dyn Fn(String, &glovebox_jail::cgroup::Limits) -> crate::error::Result<Shell>,
}

impl Zygotes {
    /// A child of the zygote of `want`'s tenant and `spec`'s template, its user namespace
    /// made and mapped to the host range at `base`; `None` (logged) when there is none to
    /// give: the zygote is being started (now, if it was not running) or failed.
    pub(super) fn child(&self, want: &ZygoteWant, spec: &Spec, base: u32, mk: &Maker<'_>) -> Option<Forked> {
        let entry = {
            let mut g = lock(&self.map);
            let (map, closed) = &mut *g;
            if *closed {
                return None;
            }
            map.entry(key(want, spec)).or_default().clone()
        };
        let mut slot = lock(&entry);
        if let Some(z) = slot.as_mut() {
            if z.run.alive() {
                if !z.run.ready() {
                    return None;
                }
                match z.run.fork(base, crate::slots::RANGE) {
                    Ok(f) => return Some(f),
                    // Dying, or broken: either way it is replaced.
                    Err(e) => tracing::warn!(tenant = %want.tenant, "python kernel zygote: {e}; starting another"),
                }
            } else {
                tracing::warn!(tenant = %want.tenant, "python kernel zygote exited; starting another");
            }
            if let Some(z) = slot.take() {
                z.end();
            }
        }
        // Closed meanwhile: `close` has taken (or will take) this entry; start nothing.
        if lock(&self.map).1 {
            return None;
        }
        match start(want, spec, mk) {
            Ok(z) => *slot = Some(z),
            Err(e) => tracing::warn!(tenant = %want.tenant, "python kernel zygote: {e}"),
        }
        None
    }

    /// Ends every zygote (and every process in their cgroups); none is started after this.
    pub(super) fn close(&self) {
        let entries: Vec<_> = {
            let mut g = lock(&self.map);
            g.1 = true;
            g.0.drain().map(|(_, z)| z).collect()
        };
        for e in entries {
            // Waits for a fork or start under way on it; a start that saw `closed` unset
            // before this made its zygote here, and it is ended here.
            if let Some(z) = lock(&e).take() {
                z.end();
            }
        }
    }
}

/// One zygote per tenant and template (its layers and root).
fn key(want: &ZygoteWant, spec: &Spec) -> String {
    let layers: Vec<String> = spec.layers.iter().map(|l| l.display().to_string()).collect();
    format!("{}\n{}\n{:?}\n{}", want.tenant, layers.join(":"), spec.root_skel, want.preload)
}

fn start(want: &ZygoteWant, spec: &Spec, mk: &Maker<'_>) -> Result<Zygote, String> {
    // Alphanumeric, as sandbox ids (the leak checks read ids out of paths).
    let id = format!("zygote{}", crate::util::random_token(12));
    let limits = glovebox_jail::cgroup::Limits { memory_bytes: MEMORY_BYTES, cpu_quota: mk.cpu_quota, pids: PIDS };
    let shell = (mk.shell)(id.clone(), &limits).map_err(|e| e.to_string())?;
    let skel = spec.root_skel.clone().unwrap_or_else(|| mk.skel.to_path_buf());
    let root = JailConfig {
        id: id.clone(),
        uid_base: 0,
        uid_count: 0,
        hostname: "zygote".into(),
        mount_dir: shell.dir.join("mnt"),
        socket_path: shell.dir.join("unused.sock"),
        layers: spec.layers.iter().cloned().chain(std::iter::once(skel)).collect(),
        host_usr: spec.root_skel.is_none(),
        disk_bytes: 64 << 20,
        disk_image: None,
        upper_dir: None,
        flat_root: spec.layers.is_empty(),
        shm_bytes: 1 << 20,
        cgroup_procs: shell.cgroup.procs_files(),
        cgroup_migrate: false,
        command_cgroup: None,
        pids: PIDS,
        seccomp: None,
        agent_seccomp: None,
        netns: None,
        resolv_conf: None,
        volumes: Vec::new(),
        userns: None,
    };
    let env = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("MPLBACKEND", "Agg"),
        ("MPLCONFIGDIR", "/tmp/matplotlib"),
        ("GLOVEBOX_PRELOAD", want.preload.as_str()),
        ("GLOVEBOX_KERNEL_ZYGOTE", "1"),
    ];
    let cfg = kzygote::ZygoteConfig {
        root,
        uid: shell.slot.uid_base(),
        exe: "/usr/bin/python3".into(),
        // A kernel's command line (`kernels::argv`): its forked kernels show it as theirs.
        argv: vec!["python3".into(), format!("{}/python_kernel.py", crate::kernels::KERNEL_DIR)],
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        cwd: "/".into(),
    };
    let log = std::fs::File::create(shell.dir.join("zygote.log")).map_err(|e| format!("zygote log: {e}"));
    match log.and_then(|log| kzygote::spawn(mk.agent, &cfg, log).map_err(|e| format!("start: {e}"))) {
        Ok(run) => {
            tracing::info!(tenant = %want.tenant, zygote = %id, pid = run.child.id(), "python kernel zygote started");
            Ok(Zygote { run, shell })
        }
        Err(e) => {
            let _ = shell.cgroup.kill_all();
            shell.discard();
            Err(e)
        }
    }
}

/// The forked kernel's cgroup, a child of the sandbox's command parent beside the agent's
/// `cmd-N` (never one of their names).
pub(super) const KERNEL_CGROUP: &str = "kernel-forked";

/// Makes the forked kernel's cgroup in the sandbox's (`cg`): the `cgroup.procs` files a
/// process joins to be in it (the sandbox's own in every other hierarchy), and the cgroup
/// with how to kill what is in it.
fn kernel_cgroup(cg: &dyn Cgroup) -> Result<(Vec<PathBuf>, crate::kernels::KernelCgroup), String> {
    let (parent, kill) = cg.command_parent();
    let dir = parent.join(KERNEL_CGROUP);
    std::fs::create_dir(&dir).map_err(|e| format!("kernel cgroup {}: {e}", dir.display()))?;
    let mut procs: Vec<PathBuf> =
        cg.procs_files().into_iter().filter(|p| p.parent() != Some(parent.as_path())).collect();
    procs.push(dir.join("cgroup.procs"));
    Ok((procs, crate::kernels::KernelCgroup { dir, kill }))
}

/// Hands a zygote's child the sandbox booted in its user namespace (PID 1 `pid1`, cgroups
/// `cg`): the kernel it forks there, in a cgroup of its own ([`KERNEL_CGROUP`]), confined
/// like a command of the agent's (the zygote's and the commands' seccomp filters, the
/// agent's Landlock rules, uid 0 of the sandbox without capabilities), and the daemon's ends
/// of its stdio. On failure the child is killed and the kernel's cgroup emptied and removed.
pub(super) fn hand_off(
    f: Forked,
    cg: &dyn Cgroup,
    pid1: i32,
    want: &ZygoteWant,
    pids: u64,
    filters: [&Option<Filter>; 2],
) -> Result<crate::kernels::Forked, String> {
    let (procs, cgroup) = kernel_cgroup(cg)?;
    let forked = hand_off_into(f, &procs, pid1, want, pids, filters);
    match forked {
        Ok((pidfd, stdin, stdout, stderr)) => {
            Ok(crate::kernels::Forked { pidfd, stdin, stdout, stderr, cgroup: Some(cgroup) })
        }
        Err(e) => {
            cgroup.kill_and_remove();
            Err(e)
        }
    }
}

/// The daemon's ends of a forked kernel: its pidfd, stdin, stdout, stderr.
type KernelEnds = (OwnedFd, OwnedFd, OwnedFd, OwnedFd);

fn hand_off_into(
    f: Forked,
    procs: &[PathBuf],
    pid1: i32,
    want: &ZygoteWant,
    pids: u64,
    filters: [&Option<Filter>; 2],
) -> Result<KernelEnds, String> {
    // The kernel keeps the zygote's filter (the commands' plus the way in: `zygote.json`), which
    // stands where a command has the agent's (the commands' plus nothing); on top it installs
    // the commands' own: two filters, the commands' confinement exactly, as a command has.
    let [Some(_agent), Some(commands)] = filters else {
        return Err("no compiled seccomp filters to give the kernel".into());
    };
    let root = PathBuf::from(format!("/proc/{pid1}/root"));
    let landlock = glovebox_jail::landlock::ruleset_beneath(&root).map_err(|e| format!("landlock ruleset: {e}"))?;
    let pipe = || glovebox_jail::sys::pipe().map_err(|e| format!("pipe: {e}"));
    let ((in_r, in_w), (out_r, out_w), (err_r, err_w)) = (pipe()?, pipe()?, pipe()?);
    let env = [
        ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        ("HOME", crate::kernels::DEFAULT_CWD),
        ("LANG", "C.UTF-8"),
        ("USER", "root"),
        ("MPLBACKEND", "Agg"),
        ("PYTHONUNBUFFERED", "1"),
        ("GLOVEBOX_PRELOAD", want.preload.as_str()),
    ];
    let spec = KernelSpec {
        cwd: crate::kernels::DEFAULT_CWD.into(),
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        uid: 0,
        gid: 0,
        seccomp: vec![commands.clone()],
        // PID 1's (`glovebox_jail::jailer`), which every command inherits.
        rlimits: vec![(libc::RLIMIT_CORE, 0), (libc::RLIMIT_NOFILE, 1 << 16), (libc::RLIMIT_NPROC, pids)],
    };
    let stdio = [in_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
    let kpid =
        f.hand_off(procs, pid1, &spec, stdio, landlock.as_ref().map(|l| l.as_fd())).map_err(|e| e.to_string())?;
    let pidfd =
        rustix::process::Pid::from_raw(kpid).ok_or_else(|| "the kernel reported no pid".to_string()).and_then(|p| {
            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).map_err(|e| format!("pidfd: {e}"))
        })?;
    Ok((pidfd, in_w, out_r, err_r))
}
