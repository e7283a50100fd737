//! The process jail tier: each sandbox is a `glovebox-agent` jailed in its own namespaces,
//! cgroups and uid range (see `glovebox_jail`). The jail config is built here, in one place,
//! from the backend-neutral [`Spec`].
//!
//! Invariants:
//! - Everything a sandbox owns on the host (uid slot, cgroups, its run directory) is taken in
//!   that order and released in reverse; a failed boot releases what it took.
//! - Signals and waits go through a pidfd, so they never hit a recycled pid.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use glovebox_jail::cgroup::{self, CgroupDriver};
use glovebox_jail::config::JailConfig;
use glovebox_proto::api::Limits;

use super::jailed::{pidfd_alive, Jailed};
use super::made_ahead::{between_requests, quiet_moment, Linked, LinkedShells, NetnsPool, Shell, Shells, LINK_LOW};
use super::skel::Skeleton;
use super::{Backend, Instance, Orphan, Recorded, Spec};
use crate::error::{Error, Result};
use crate::idle::Activity;
use crate::net::Net;
use crate::slots::{Slots, RANGE};
use crate::util::random_token;

/// What a jailed sandbox's host side is made of.
struct Host {
    cgroups: Box<dyn CgroupDriver>,
    slots: Slots,
    /// `<run_dir>/sandboxes`: one private directory per sandbox.
    sandboxes: PathBuf,
    /// `<run_dir>/base`: the base skeletons (see `skel`).
    bases: PathBuf,
    /// The limits shells are made ahead with (the daemon's defaults).
    defaults: cgroup::Limits,
    shells: Shells,
    /// Shells linked ahead, for creates whose policy needs a link.
    linked: LinkedShells,
    /// The host's side of sandbox networking (links made ahead, their rules).
    net: Arc<Net>,
    /// Whether network namespaces and a shell are kept made ahead of creates (else only
    /// the first create's are).
    make_ahead: bool,
    /// Set once the first boot's jailer has joined its cgroups: the cgroup migration lock
    /// is no longer kept warm for it (see `keep_migration_lock_warm`).
    first_joined: Arc<std::sync::atomic::AtomicBool>,
    /// Sandbox work in flight: what is made ahead waits for a quiet moment.
    work: Arc<Activity>,
}

/// The process jail.
pub struct Jail {
    host: Arc<Host>,
    /// Starts jailers (through a fork server, see `glovebox_jail::launch::Launcher`).
    launcher: glovebox_jail::launch::Launcher,
    /// The root skeleton over the host's /usr (see `skel`).
    skel: PathBuf,
    /// Our hold on it, until no sandbox of ours needs it.
    skel_hold: std::sync::Mutex<Option<Skeleton>>,
    /// The commands' seccomp filter, compiled once for every sandbox's agent.
    seccomp: Option<Vec<(u16, u8, u8, u32)>>,
    /// The agent's own seccomp filter, compiled once for every sandbox's agent.
    agent_seccomp: Option<Vec<(u16, u8, u8, u32)>>,
    /// Network namespaces made ahead of the sandboxes that will use them.
    netns: Arc<NetnsPool>,
    /// Where disk-backed sandboxes' images are made (on the data dir's disk; each is
    /// unlinked once its sandbox has it mounted, so it lives exactly as long as the sandbox).
    disks: std::result::Result<PathBuf, String>,
    /// The agent binary (bound into gVisor sandboxes as their PID 1).
    agent_exe: PathBuf,
    /// The gVisor tier's runtime, or why there is none on this host.
    gvisor: std::result::Result<super::gvisor::Runsc, String>,
    /// Whether shells are linked ahead from the start (every gVisor boot takes one), not
    /// only from the first create that wants one.
    link_from_start: bool,
    /// The python kernel zygotes of code-interpreter sandboxes (`Spec::zygote`).
    zygotes: super::zygotes::Zygotes,
}

/// The cgroup limits for a sandbox's limits.
pub(super) fn cgroup_limits(l: &Limits) -> cgroup::Limits {
    cgroup::Limits { memory_bytes: l.memory_mb << 20, cpu_quota: l.cpus, pids: l.pids }
}

/// What [`Jail::open`] needs that takes milliseconds of its own and depends on nothing else
/// of the daemon's start-up, made on a thread of its own beside it (the store's opening, the
/// seccomp filters' compiling): the jailer fork server, started, and the base skeleton,
/// opened (built if needed). For a process that boots one sandbox right after it starts, the
/// cgroup migration lock is warmed from here on too (see [`keep_migration_lock_warm`]).
pub struct Preparing {
    work: Option<std::thread::JoinHandle<Prepared>>,
    run_dir: PathBuf,
    cgroup_root: PathBuf,
    agent_exe: PathBuf,
    first_joined: Arc<std::sync::atomic::AtomicBool>,
}

struct Prepared {
    launcher: glovebox_jail::launch::Launcher,
    skel: std::io::Result<Skeleton>,
}

impl Prepared {
    fn now(bases: &Path, agent_exe: &Path) -> Prepared {
        // It starts while the rest is prepared; `Jail::open` reads its hello last.
        let launcher = glovebox_jail::launch::Launcher::new(agent_exe);
        // Shared by every process whose inputs are the same, never rewritten in place.
        let skel = Skeleton::open(bases);
        Prepared { launcher, skel }
    }
}

impl Jail {
    /// Starts what [`Jail::open`] needs first (see [`Preparing`]) under `run_dir` (its `base`
    /// directory exists), the jailer fork server of `agent_exe` among it; with `one_boot` (no
    /// `make_ahead`), warms the cgroup migration lock in `cgroup_root` until the first boot.
    pub fn prepare(run_dir: &Path, cgroup_root: &Path, agent_exe: &Path, one_boot: bool) -> Preparing {
        // Orphans reparent to us, so the agents we start stay our children to reap. Before
        // the fork server starts: its jailers' orphans must find us as their reaper.
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        let first_joined = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if one_boot {
            keep_migration_lock_warm(cgroup_root, first_joined.clone());
        }
        let (bases, exe) = (run_dir.join("base"), agent_exe.to_path_buf());
        let work =
            std::thread::Builder::new().name("glovebox-prepare".into()).spawn(move || Prepared::now(&bases, &exe));
        // Without a thread, `open` does the same work itself.
        Preparing {
            work: work.ok(),
            run_dir: run_dir.to_path_buf(),
            cgroup_root: cgroup_root.to_path_buf(),
            agent_exe: agent_exe.to_path_buf(),
            first_joined,
        }
    }

    /// Prepares the jail that `prepared` started (see [`Jail::prepare`]; its run dir's
    /// `sandboxes`, `base` and `slots` directories exist): detects the cgroups, takes the base
    /// skeleton (with the language kernels' files) and the jailer fork server. `work` tells
    /// refills when it is quiet; `link_pool` shells are kept linked ahead through `net`;
    /// without `make_ahead`, one namespace and one shell are made at the start and never
    /// replaced (a process that creates one sandbox and ends: see `Config::one_shot`).
    pub fn open(
        prepared: Preparing,
        defaults: &Limits,
        work: Arc<Activity>,
        net: Arc<Net>,
        link_pool: usize,
        make_ahead: bool,
    ) -> Result<Jail> {
        let Preparing { work: preparing, run_dir, cgroup_root, agent_exe, first_joined } = prepared;
        let slots = Slots::new(&run_dir.join("slots")).map_err(internal("slots dir"))?;
        fs::set_permissions(run_dir.join("slots"), fs::Permissions::from_mode(0o700))
            .map_err(internal("chmod slots dir"))?;
        let cgroups = cgroup::detect(&cgroup_root).map_err(|e| Error::Internal(format!("cgroups: {e}")))?;
        // Compiled here, beside the preparation thread's work.
        let seccomp = match glovebox_jail::seccomp::compile() {
            Ok(p) => Some(glovebox_jail::seccomp::to_tuples(&p)),
            Err(e) => {
                tracing::warn!("seccomp: {e}; each agent compiles its own");
                None
            }
        };
        let agent_seccomp = match glovebox_jail::seccomp::compile_agent() {
            Ok(p) => Some(glovebox_jail::seccomp::to_tuples(&p)),
            Err(e) => {
                tracing::warn!("agent seccomp: {e}; each agent compiles its own");
                None
            }
        };
        let Prepared { launcher, skel: skel_hold } = match preparing {
            Some(t) => t.join().map_err(|_| Error::Internal("jail preparation thread panicked".into()))?,
            None => Prepared::now(&run_dir.join("base"), &agent_exe),
        };
        let skel_hold = skel_hold.map_err(internal("base root skeleton"))?;
        let skel = skel_hold.path().to_path_buf();
        if let Err(why) = launcher.server() {
            tracing::warn!("jailer fork server: {why}; each sandbox's jailer is spawned instead");
        }
        Ok(Jail {
            host: Arc::new(Host {
                cgroups,
                slots,
                sandboxes: run_dir.join("sandboxes"),
                bases: run_dir.join("base"),
                defaults: cgroup_limits(defaults),
                shells: Shells::default(),
                linked: LinkedShells::new(link_pool),
                net,
                make_ahead,
                first_joined,
                work: work.clone(),
            }),
            launcher,
            skel,
            skel_hold: std::sync::Mutex::new(Some(skel_hold)),
            seccomp,
            agent_seccomp,
            netns: Arc::new(NetnsPool::new(work)),
            disks: Err("no directory for disk images was given".into()),
            agent_exe,
            gvisor: super::gvisor::Runsc::detect(),
            link_from_start: false,
            zygotes: Default::default(),
        })
    }

    /// For a daemon whose creates default to gVisor: shells are linked ahead from the start
    /// (every gVisor boot takes one), so the first create finds one ready as later ones do.
    pub fn linking_from_start(mut self) -> Jail {
        self.link_from_start = true;
        self
    }

    /// Makes disk-backed sandboxes' images in `dir` (created, root-only). If it cannot be made
    /// (e.g. a full data dir) the daemon still runs: a disk larger than fits in memory is then
    /// refused, saying why.
    pub fn with_disks(mut self, dir: PathBuf) -> Jail {
        let made = fs::create_dir_all(&dir).and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)));
        self.disks = match made {
            Ok(()) => Ok(dir),
            Err(e) => {
                tracing::warn!("disk-backed sandboxes unavailable: {}: {e}", dir.display());
                Err(format!("{}: {e}", dir.display()))
            }
        };
        self
    }

    /// The jail config for one sandbox: the one place a [`Spec`] becomes a jail.
    fn config(&self, spec: &Spec, shell: &Shell, netns: Option<&OwnedFd>, ahead: bool) -> JailConfig {
        let (l, dir) = (&spec.limits, &shell.dir);
        let skel = spec.root_skel.clone().unwrap_or_else(|| self.skel.clone());
        JailConfig {
            id: shell.id.clone(),
            uid_base: shell.slot.uid_base(),
            uid_count: RANGE,
            hostname: "glovebox".into(),
            mount_dir: dir.join("mnt"),
            socket_path: dir.join("agent.sock"),
            layers: spec.layers.iter().cloned().chain(std::iter::once(skel)).collect(),
            host_usr: spec.root_skel.is_none(),
            upper_dir: spec.upper.clone(),
            flat_root: spec.layers.is_empty() && spec.upper.is_none(),
            disk_bytes: disk_bytes(l),
            shm_bytes: shm_bytes(l),
            cgroup_procs: shell.cgroup.procs_files(),
            cgroup_migrate: glovebox_jail::config::debug_cgroup_migrate(),
            command_cgroup: Some(shell.cgroup.command_parent()),
            pids: l.pids,
            seccomp: self.seccomp.clone(),
            agent_seccomp: self.agent_seccomp.clone(),
            netns: netns.map(|fd| PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()))),
            resolv_conf: ahead.then(|| crate::net::resolv_conf(shell.slot.index)),
            volumes: spec.volumes.clone(),
            disk_image: None,
            userns: None,
        }
    }
}

impl Backend for Jail {
    /// Slot, directory, cgroups, jail. Undoes all of it on failure. A background (warm-pool)
    /// boot runs at the lowest CPU weight until it is handed out, so that refilling the pool
    /// (a boot, a python kernel's imports) yields to requests.
    fn boot(&self, spec: &Spec) -> Result<Box<dyn Instance>> {
        if spec.isolation == glovebox_proto::api::Isolation::Gvisor {
            return self.boot_gvisor(spec);
        }
        let cl = cgroup_limits(&spec.limits);
        // A request's boot takes what was made ahead (a shell linked ahead when its policy
        // needs a link and one is ready); the pool's refills make their own.
        let linked = if spec.background || !spec.link { None } else { self.host.linked.take() };
        let (premade, netns, ahead) = match linked {
            Some(Linked { shell, netns }) => (Some(shell), Some(netns), true),
            None => (if spec.background { None } else { self.host.shells.take() }, None, false),
        };
        let shell = match premade {
            Some(s) if s.limits == cl => s,
            Some(s) => match s.cgroup.set_limits(&cl) {
                Ok(()) => Shell { limits: cl, ..s },
                Err(e) => {
                    self.unlink(&s, ahead);
                    s.discard();
                    return Err(Error::Start(format!("cgroup: {e}")));
                }
            },
            None => self.host.make_shell(random_token(16), &cl)?,
        };
        // Namespaces are linked ahead from the first create that wants one on: a host whose
        // sandboxes never have a link never gets any.
        if spec.link && !spec.background {
            refill_linked(&self.host);
        }
        if !ahead && !spec.background && self.host.make_ahead {
            refill_shells(&self.host);
        }
        let skel = spec.root_skel.as_ref().unwrap_or(&self.skel);
        // Which base skeleton its root uses (kept while it lives, across restarts).
        if let Err(e) = fs::write(shell.dir.join("skel"), skel.as_os_str().as_encoded_bytes()) {
            self.unlink(&shell, ahead);
            shell.discard();
            return Err(Error::Internal(format!("sandbox dir: {e}")));
        }
        if spec.background {
            if let Err(e) = shell.cgroup.set_background(true) {
                // Only slower for everyone else while it boots.
                tracing::debug!(sandbox = %shell.id, "background cpu weight: {e}");
            }
        }
        // Its python kernel forked from its template's zygote: the sandbox is built inside the
        // user namespace the zygote's child made, and in a network namespace made there too
        // (one made ahead is the host's user namespace's, which the child could not join).
        let forked = match &spec.zygote {
            Some(w) if !spec.background && !spec.link && spec.upper.is_none() => {
                let host = self.host.clone();
                let make = move |id: String, cl: &cgroup::Limits| host.make_shell(id, cl);
                let mk = super::zygotes::Maker {
                    agent: &self.agent_exe,
                    skel,
                    cpu_quota: self.host.defaults.cpu_quota,
                    shell: &make,
                };
                self.zygotes.child(w, spec, shell.slot.uid_base(), &mk)
            }
            _ => None,
        };
        if let Some(f) = &forked {
            f.fault("booting");
        }
        let netns = match forked {
            Some(_) => None,
            None => netns.or_else(|| if self.host.make_ahead { self.netns.take() } else { self.netns.take_last() }),
        };
        let mut jc = self.config(spec, &shell, netns.as_ref(), ahead);
        if let Some(ns) = forked.as_ref().and_then(|f| f.userns()) {
            jc.userns = Some(PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd())));
        }
        let image = match (in_memory(&spec.limits) || spec.upper.is_some(), &self.disks) {
            (true, _) => Ok(None),
            (false, Ok(dir)) => make_disk_image(dir, &shell.id, spec.limits.disk_mb).map(Some),
            (false, Err(why)) => Err(Error::Unavailable(format!(
                "resources.disk_mb {} does not fit in memory, and disk-backed sandboxes are unavailable on this \
                 daemon ({why})",
                spec.limits.disk_mb
            ))),
        };
        let launched = image.and_then(|img| {
            jc.disk_image = img;
            let log = fs::File::create(shell.dir.join("agent.log"));
            log.map_err(|e| Error::Internal(format!("agent log: {e}")))
                .and_then(|log| self.launcher.launch(&jc, log).map_err(|e| Error::Start(e.to_string())))
        });
        self.host.first_joined.store(true, std::sync::atomic::Ordering::Release);
        // The jailer joined it before reporting ready (or failed): ours can go. So can the
        // image's name: its mount holds it (and frees its blocks when the sandbox is gone).
        drop(netns);
        if let Some(img) = &jc.disk_image {
            if let Err(e) = fs::remove_file(img) {
                tracing::warn!(sandbox = %shell.id, "unlink disk image: {e}");
            }
        }
        let pid = match launched {
            Ok(p) => p,
            Err(e) => {
                let _ = shell.cgroup.kill_all();
                self.unlink(&shell, ahead);
                shell.discard();
                return Err(e);
            }
        };
        let pidfd = rustix::process::Pid::from_raw(pid)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
        let kernel = match (forked, &spec.zygote) {
            (Some(f), Some(w)) => {
                let filters = [&self.agent_seccomp, &self.seccomp];
                match super::zygotes::hand_off(f, &*shell.cgroup, pid, w, spec.limits.pids, filters) {
                    Ok(k) => {
                        tracing::info!(sandbox = %shell.id, tenant = %w.tenant, "python kernel forked from the zygote");
                        Some(k)
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %shell.id, "python kernel from the zygote: {e}; the agent starts one");
                        None
                    }
                }
            }
            _ => None,
        };
        let Shell { id, slot, dir, cgroup, .. } = shell;
        let ahead = ahead.then(|| self.host.net.clone());
        let kernel = std::sync::Mutex::new(kernel);
        let mounts = super::jailed::hold_mounts(pid, pidfd.as_ref());
        Ok(Box::new(Jailed { id, pid, pidfd, socket: jc.socket_path, dir, cgroup, slot, ahead, kernel, mounts }))
    }

    /// Checks, in order: PID 1 is the very process recorded (pid and start time, through a
    /// pidfd), its cgroup exists, its agent socket accepts, its uid slot can be re-taken.
    fn reopen(&self, rec: &Recorded<'_>) -> std::result::Result<Box<dyn Instance>, String> {
        if fs::read_to_string(rec.dir.join(super::gvisor::TIER_FILE)).is_ok_and(|t| t == super::gvisor::TIER) {
            return self.reopen_gvisor(rec);
        }
        let pid = rustix::process::Pid::from_raw(rec.pid).ok_or("no PID 1 recorded")?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|_| "PID 1 is not running".to_string())?;
        // Checked after the pidfd is open: the pidfd then names this very process.
        if crate::store::proc_start_time(rec.pid) != Some(rec.pid_start) || !pidfd_alive(Some(&pidfd)) {
            return Err("PID 1 is not running (its pid belongs to another process)".into());
        }
        let cgroup = match self.host.cgroups.open(rec.id) {
            Ok(Some(c)) => c,
            Ok(None) => return Err("its cgroup is gone".into()),
            Err(e) => return Err(format!("cgroup: {e}")),
        };
        let socket = rec.dir.join("agent.sock");
        std::os::unix::net::UnixStream::connect(&socket).map_err(|e| format!("agent socket: {e}"))?;
        let slot = match self.host.slots.adopt(rec.slot, rec.id) {
            Ok(Some(s)) => s,
            _ => return Err(format!("uid slot {} could not be re-taken", rec.slot)),
        };
        Ok(Box::new(Jailed {
            id: rec.id.to_string(),
            pid: rec.pid,
            mounts: super::jailed::hold_mounts(rec.pid, Some(&pidfd)),
            pidfd: Some(pidfd),
            socket,
            dir: rec.dir.to_path_buf(),
            cgroup,
            slot,
            ahead: None,
            kernel: Default::default(),
        }))
    }

    fn orphans(&self) -> Vec<Orphan> {
        let entries: Vec<_> = fs::read_dir(&self.host.sandboxes).map(|rd| rd.flatten().collect()).unwrap_or_default();
        let mut out = Vec::new();
        for e in entries {
            // One being made (see `making_name`): not a sandbox yet.
            if e.file_name().as_encoded_bytes().starts_with(MAKING.as_bytes()) {
                continue;
            }
            let slot = fs::read_to_string(e.path().join("slot")).ok().and_then(|s| s.trim().parse::<u32>().ok());
            if slot.is_some_and(|n| self.host.slots.is_held(n)) {
                continue;
            }
            out.push(Orphan { id: e.file_name().to_string_lossy().into_owned(), dir: e.path(), slot });
        }
        out
    }

    /// Kills its processes, removes its cgroups and directory, frees its slot.
    fn clean(&self, o: &Orphan) {
        if let Ok(Some(cg)) = self.host.cgroups.open(&o.id) {
            let _ = cg.kill_all();
            if let Err(e) = cg.destroy() {
                tracing::error!(sandbox = %o.id, "remove cgroup: {e}");
            }
        }
        let _ = fs::remove_dir_all(&o.dir);
        if let Some(n) = o.slot {
            // Adopting then dropping frees the slot file.
            if let Ok(Some(s)) = self.host.slots.adopt(n, &o.id) {
                drop(s);
            }
        }
    }

    fn sweep(&self) {
        if let Ok(d) = &self.disks {
            sweep_disk_images(d);
        }
        let (h, dir) = (&self.host, &self.host.sandboxes);
        // Slot files naming a sandbox that has no directory (a crash between taking the slot
        // and making the directory, or at the end of a teardown): free them.
        if let Ok(entries) = fs::read_dir(h.slots.dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = name.strip_suffix(".lock").and_then(|n| n.parse::<u32>().ok()) else { continue };
                if h.slots.is_held(n) {
                    continue;
                }
                let owner = fs::read_to_string(e.path()).unwrap_or_default();
                let owner = owner.trim();
                // Not adopted: someone holds it now (a process taking it between the two
                // looks), and its file stays, or another process could take the slot too.
                if owner.is_empty() || !dir.join(owner).exists() {
                    if let Ok(Some(s)) = h.slots.adopt(n, owner) {
                        drop(s);
                    }
                }
            }
        }
        // Sandbox directories whose making a process did not finish (it died: its slot is
        // no longer held).
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = making_slot(&name) else { continue };
                if !h.slots.is_held(n) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        // Cgroups with no directory (a daemon killed mid-create or mid-teardown).
        if let Ok(names) = h.cgroups.list() {
            for name in names {
                if !dir.join(&name).exists() {
                    if let Ok(Some(cg)) = h.cgroups.open(&name) {
                        let _ = cg.kill_all();
                        let _ = cg.destroy();
                    }
                }
            }
        }
    }

    fn reap_stale_bases(&self) {
        self.reap_skeletons();
    }

    fn start(&self) {
        if self.host.make_ahead {
            self.netns.refill();
            refill_shells(&self.host);
            if self.link_from_start {
                refill_linked(&self.host);
            }
        } else {
            // The one create such a process is started for comes in a few milliseconds:
            // its namespace and shell are made now, beside the rest of the start-up.
            let (host, netns) = (self.host.clone(), self.netns.clone());
            tokio::task::spawn_blocking(move || {
                use std::sync::atomic::Ordering;
                if host.shells.filling.swap(true, Ordering::AcqRel) {
                    return;
                }
                netns.make_one();
                if !host.shells.closed() {
                    match host.make_shell(random_token(16), &host.defaults) {
                        Ok(s) => host.shells.put(s),
                        Err(e) => tracing::debug!("shell made ahead: {e}"),
                    }
                }
                host.shells.filling.store(false, Ordering::Release);
            });
        }
    }

    fn close(&self) {
        self.zygotes.close();
        self.host.shells.close();
        self.host.linked.close(&self.host.net);
    }

    fn release_own_state(&self) {
        drop(crate::util::lock(&self.skel_hold).take());
    }
}

impl Jail {
    /// Boots a gVisor sandbox (see `backend::gvisor`): always in a namespace linked ahead,
    /// its cgroups capped for the sentry as well, its root built like a jailed one's.
    fn boot_gvisor(&self, spec: &Spec) -> Result<Box<dyn Instance>> {
        let runsc = self.gvisor.as_ref().map_err(|why| Error::Unavailable(format!("isolation gvisor: {why}")))?;
        if spec.upper.is_some() {
            return Err(Error::Invalid("template builds run in the process jail".into()));
        }
        let cl = super::gvisor::gvisor_cgroup_limits(&spec.limits);
        let Linked { shell, netns } = match self.host.linked.take() {
            Some(l) => l,
            None => self.host.make_linked()?,
        };
        refill_linked(&self.host);
        let fail = |shell: Shell, e: Error| {
            let _ = shell.cgroup.kill_all();
            self.unlink(&shell, true);
            shell.discard();
            Err(e)
        };
        let shell = match shell.cgroup.set_limits(&cl) {
            Ok(()) => Shell { limits: cl, ..shell },
            Err(e) => return fail(shell, Error::Start(format!("cgroup: {e}"))),
        };
        let skel = spec.root_skel.as_ref().unwrap_or(&self.skel);
        let marked = fs::write(shell.dir.join("skel"), skel.as_os_str().as_encoded_bytes())
            .and_then(|()| fs::write(shell.dir.join(super::gvisor::TIER_FILE), super::gvisor::TIER));
        if let Err(e) = marked {
            return fail(shell, Error::Internal(format!("sandbox dir: {e}")));
        }
        let mut jc = self.config(spec, &shell, Some(&netns), true);
        // The guest's ids are its own: nothing is shifted, no uid range is mapped, and the
        // host cgroup holds the whole guest (commands are killed by process group inside).
        jc.uid_base = 0;
        jc.uid_count = 0;
        jc.command_cgroup = None;
        jc.seccomp = None;
        jc.agent_seccomp = None;
        let image = match (in_memory(&spec.limits), &self.disks) {
            (true, _) => Ok(None),
            (false, Ok(dir)) => make_disk_image(dir, &shell.id, spec.limits.disk_mb).map(Some),
            (false, Err(why)) => Err(Error::Unavailable(format!(
                "resources.disk_mb {} does not fit in memory, and disk-backed sandboxes are unavailable on this \
                 daemon ({why})",
                spec.limits.disk_mb
            ))),
        };
        let gc = glovebox_jail::gvisor::GvisorConfig {
            jail: jc,
            dir: shell.dir.clone(),
            runsc: runsc.path.clone(),
            platform: runsc.platform.clone(),
            agent_exe: self.agent_exe.clone(),
            debug_log: runsc.debug_log.as_ref().map(|d| d.join(&shell.id)),
        };
        let socket = gc.socket_path();
        let launched = image.and_then(|img| {
            let mut gc = gc;
            gc.jail.disk_image = img;
            let log =
                fs::File::create(shell.dir.join("agent.log")).map_err(|e| Error::Internal(format!("agent log: {e}")));
            let r = log.and_then(|log| {
                glovebox_jail::gvisor::launch(&self.agent_exe, &gc, log)
                    .map_err(|e| Error::Start(format!("gvisor: {e}")))
            });
            if let Some(img) = &gc.jail.disk_image {
                if let Err(e) = fs::remove_file(img) {
                    tracing::warn!(sandbox = %shell.id, "unlink disk image: {e}");
                }
            }
            r
        });
        // The sentry joined it (or failed): ours can go.
        drop(netns);
        let glovebox_jail::gvisor::Launched { started, helper } = match launched {
            Ok(l) => l,
            Err(e) => return fail(shell, e),
        };
        let pidfd = super::gvisor::pidfd;
        let (sentry_fd, gofer_fd, helper_fd) = (pidfd(started.sentry), pidfd(started.gofer), pidfd(helper));
        // For a restart's re-adoption (the helper is then another daemon's orphan).
        super::gvisor::record_helper(&shell.dir, helper);
        let Shell { id, slot, dir, cgroup, .. } = shell;
        Ok(Box::new(super::gvisor::Gvisored {
            id,
            sentry: started.sentry,
            sentry_fd,
            gofer_fd,
            helper_fd,
            socket,
            dir,
            cgroup,
            slot,
            ahead: Some(self.host.net.clone()),
            members: Default::default(),
        }))
    }

    /// Takes over a gVisor sandbox a previous daemon left: its sentry is the very process
    /// recorded, its cgroup exists, its agent answers, its slot can be re-taken.
    fn reopen_gvisor(&self, rec: &Recorded<'_>) -> std::result::Result<Box<dyn Instance>, String> {
        let sentry_fd = super::gvisor::pidfd(rec.pid).ok_or("the sentry is not running")?;
        if crate::store::proc_start_time(rec.pid) != Some(rec.pid_start) || !pidfd_alive(Some(&sentry_fd)) {
            return Err("the sentry is not running (its pid belongs to another process)".into());
        }
        let gofer_fd = super::gvisor::recorded_pids(rec.dir, rec.id)
            .filter(|(s, _)| *s == rec.pid)
            .and_then(|(_, g)| super::gvisor::pidfd(g));
        let cgroup = match self.host.cgroups.open(rec.id) {
            Ok(Some(c)) => c,
            Ok(None) => return Err("its cgroup is gone".into()),
            Err(e) => return Err(format!("cgroup: {e}")),
        };
        let socket = rec.dir.join("agent").join(glovebox_jail::guest::SOCKET_NAME);
        std::os::unix::net::UnixStream::connect(&socket).map_err(|e| format!("agent socket: {e}"))?;
        let slot = match self.host.slots.adopt(rec.slot, rec.id) {
            Ok(Some(s)) => s,
            _ => return Err(format!("uid slot {} could not be re-taken", rec.slot)),
        };
        Ok(Box::new(super::gvisor::Gvisored {
            id: rec.id.to_string(),
            sentry: rec.pid,
            sentry_fd: Some(sentry_fd),
            gofer_fd,
            helper_fd: super::gvisor::recorded_helper(rec.dir),
            socket,
            dir: rec.dir.to_path_buf(),
            cgroup,
            slot,
            ahead: None,
            members: Default::default(),
        }))
    }

    /// Removes the hold of a shell linked ahead that no sandbox will use (its namespace
    /// goes with the caller's descriptor).
    fn unlink(&self, shell: &Shell, ahead: bool) {
        if ahead {
            self.host.net.detach(shell.slot.index);
        }
    }

    /// Removes the base trees nobody uses (see `skel::reap`); a sandbox adopted after a
    /// restart keeps the one its root is on.
    fn reap_skeletons(&self) {
        let mut used = std::collections::HashSet::new();
        if let Ok(rd) = fs::read_dir(&self.host.sandboxes) {
            for e in rd.flatten() {
                if let Ok(p) = fs::read_to_string(e.path().join("skel")) {
                    used.insert(PathBuf::from(p));
                }
            }
        }
        super::skel::reap(&self.host.bases, &used);
    }
}

impl Host {
    /// A sandbox's uid slot, run directory and cgroups (limits `cl`, owned by the slot's
    /// root), for sandbox `id`. Undoes what it made on failure.
    fn make_shell(&self, id: String, cl: &cgroup::Limits) -> Result<Shell> {
        let slot = self.slots.take(&id).map_err(|e| Error::Unavailable(format!("uid range: {e}")))?;
        let dir = self.sandboxes.join(&id);
        // Made under a name orphan scans skip, then renamed whole: another Glovebox process on
        // this run dir (an embedded run's start-up reconciliation) takes a sandbox directory
        // that names no held slot for one its owner left, and removes it.
        let new = self.sandboxes.join(making_name(slot.index, &id));
        let mk = || -> std::io::Result<()> {
            fs::create_dir(&new)?;
            fs::set_permissions(&new, fs::Permissions::from_mode(0o711))?;
            fs::write(new.join("slot"), slot.index.to_string())?;
            let mnt = new.join("mnt");
            fs::create_dir(&mnt)?;
            fs::set_permissions(&mnt, fs::Permissions::from_mode(0o711))?;
            fs::rename(&new, &dir)
        };
        if let Err(e) = mk() {
            let _ = fs::remove_dir_all(&new);
            return Err(Error::Internal(format!("sandbox dir: {e}")));
        }
        match self.cgroups.create(&id, cl, slot.uid_base()) {
            Ok(cgroup) => Ok(Shell { id, slot, dir, cgroup, limits: *cl }),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(Error::Start(format!("cgroup: {e}")))
            }
        }
    }
}

/// The prefix of a sandbox directory being made (see `Host::make_shell`).
const MAKING: &str = ".making-";

/// The name sandbox `id`'s directory is made under before it is renamed to `id`; it names
/// the uid slot held meanwhile, so a sweep can tell whether its maker is still alive.
fn making_name(slot: u32, id: &str) -> String {
    format!("{MAKING}{slot}-{id}")
}

/// The slot a directory being made names (see [`making_name`]).
fn making_slot(name: &str) -> Option<u32> {
    name.strip_prefix(MAKING)?.split_once('-')?.0.parse().ok()
}

/// How long the cgroup migration lock is kept warm for a first boot that does not come.
const WARM_LOCK_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// For a process that boots one sandbox right after it starts (see `Config::one_shot`):
/// takes the kernel's cgroup migration lock now and then every millisecond on a thread of its
/// own, until `joined` (the first boot's jailer is in its cgroups) or [`WARM_LOCK_BOUND`], so
/// that the jailer's `cgroup.procs` writes find it warm instead of waiting for an RCU grace
/// period first (see `glovebox_jail::cgroup::lock`); the first wait happens here, beside the
/// rest of the start-up.
fn keep_migration_lock_warm(cgroup_root: &Path, joined: Arc<std::sync::atomic::AtomicBool>) {
    let root = cgroup_root.to_path_buf();
    let spawned = std::thread::Builder::new().name("glovebox-cgroup-lock".into()).spawn(move || {
        let t = std::time::Instant::now();
        while !joined.load(std::sync::atomic::Ordering::Acquire) && t.elapsed() < WARM_LOCK_BOUND {
            if let Err(e) = glovebox_jail::cgroup::lock::touch(&root) {
                tracing::debug!("cgroup migration lock: {e}");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    if let Err(e) = spawned {
        tracing::debug!("cgroup migration lock thread: {e}");
    }
}

/// Makes the next request's shell in the background, at a quiet moment (its cgroup
/// `mkdir`s take the kernel's cgroup lock, which a boot beside it needs too).
fn refill_shells(host: &Arc<Host>) {
    use std::sync::atomic::Ordering;
    if host.shells.filling.swap(true, Ordering::AcqRel) {
        return;
    }
    let h = host.clone();
    tokio::task::spawn_blocking(move || {
        quiet_moment(&h.work);
        if !h.shells.closed() {
            match h.make_shell(random_token(16), &h.defaults) {
                Ok(s) => h.shells.put(s),
                Err(e) => tracing::debug!("shell made ahead: {e}"),
            }
        }
        h.shells.filling.store(false, Ordering::Release);
    });
}

impl Host {
    /// A shell with the default limits and a new network namespace linked for its slot.
    fn make_linked(&self) -> Result<Linked> {
        let shell = self.make_shell(random_token(16), &self.defaults)?;
        let netns = match glovebox_jail::sys::new_netns() {
            Ok(fd) => fd,
            Err(e) => {
                shell.discard();
                return Err(Error::Internal(format!("network namespace: {e}")));
            }
        };
        if let Err(e) = self.net.link_ahead(shell.slot.index, netns.as_fd()) {
            drop(netns);
            shell.discard();
            return Err(e);
        }
        Ok(Linked { shell, netns })
    }
}

/// Tops the shells linked ahead up to their size in the background, one at a time: between
/// requests while fewer than [`LINK_LOW`] are ready, else at a quiet moment. Making one
/// takes the kernel's cgroup and network configuration locks, which a boot beside it needs
/// too: the create that took one is not slowed by its replacement.
fn refill_linked(host: &Arc<Host>) {
    use std::sync::atomic::Ordering;
    if !host.linked.wanted() || host.linked.filling.swap(true, Ordering::AcqRel) {
        return;
    }
    let h = host.clone();
    tokio::task::spawn_blocking(move || {
        while h.linked.wanted() {
            if h.linked.ready() >= LINK_LOW {
                quiet_moment(&h.work);
            } else {
                between_requests(&h.work);
            }
            match h.make_linked() {
                Ok(l) => h.linked.put(l, &h.net),
                Err(e) => {
                    tracing::warn!("shell linked ahead: {e}; creates link their own");
                    break;
                }
            }
        }
        h.linked.filling.store(false, Ordering::Release);
    });
}

/// Whether the writable layer of a sandbox with `l` is the in-memory tmpfs: its `disk_mb`
/// fits there. Otherwise it is an ext4 image on the host's disk, of exactly `disk_mb`.
pub fn in_memory(l: &Limits) -> bool {
    l.disk_mb << 20 <= disk_bytes(l)
}

/// Makes the disk image of sandbox `id`: a sparse file of `mb` MiB in `dir` with an ext4
/// filesystem (no journal: the layer lives as long as the sandbox; no reserved blocks: the
/// cap is the size asked for). Named after this process, so a sweep can tell a crashed
/// daemon's leftovers from another live daemon's images in flight.
fn make_disk_image(dir: &Path, id: &str, mb: u64) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    // Sparse, so not reserved: but a disk the host could not hold even empty is refused.
    let free_mb = rustix::fs::statvfs(dir).map(|s| s.f_bavail.saturating_mul(s.f_frsize) >> 20).unwrap_or(u64::MAX);
    if mb > free_mb {
        return Err(Error::Invalid(format!(
            "resources.disk_mb {mb} does not fit in memory and is more than the host's free disk ({free_mb} MiB) \
             for disk-backed sandboxes"
        )));
    }
    let img = dir.join(format!("{}-{id}.ext4", std::process::id()));
    let made = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&img)
        .and_then(|f| f.set_len(mb << 20))
        .map_err(internal("disk image"))
        .and_then(|()| {
            let out = std::process::Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "root_owner=0:0"])
                .arg(&img)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| Error::Start(format!("mkfs.ext4 (install e2fsprogs for disk-backed sandboxes): {e}")))?;
            match out.status.success() {
                true => Ok(()),
                false => Err(Error::Start(format!(
                    "mkfs.ext4 of the sandbox's disk failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))),
            }
        });
    match made {
        Ok(()) => Ok(img),
        Err(e) => {
            let _ = fs::remove_file(&img);
            Err(e)
        }
    }
}

/// Removes disk images that no live daemon is making (one that crashed between the image's
/// mkfs and its sandbox's start; a started sandbox's image is already unlinked).
fn sweep_disk_images(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| p == std::process::id() || Path::new(&format!("/proc/{p}")).exists()) {
            continue;
        }
        match fs::remove_file(e.path()) {
            Ok(()) => tracing::info!("removed a leftover sandbox disk image {name}"),
            Err(err) => tracing::warn!("leftover sandbox disk image {name}: {err}"),
        }
    }
}

fn internal(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("{what}: {e}"))
}

/// Size of `/dev/shm`: a quarter of the memory budget, at most 64 MiB.
fn shm_bytes(l: &Limits) -> u64 {
    ((l.memory_mb << 20) / 4).min(64 << 20)
}

/// Size of the in-memory writable layer. It is a tmpfs whose pages are charged to the
/// sandbox's memory cgroup, so it is capped below the memory budget (minus /dev/shm and an
/// eighth for the processes themselves): filling the disk then fails with ENOSPC instead of
/// waking the OOM killer. A larger disk is disk-backed (see [`in_memory`]).
pub fn disk_bytes(l: &Limits) -> u64 {
    let mem = l.memory_mb << 20;
    let room = mem.saturating_sub(shm_bytes(l) + (mem / 8).max(8 << 20));
    (l.disk_mb << 20).min(room).max(4 << 20)
}
