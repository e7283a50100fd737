//! The sandbox registry and state machine: create, the lifetime clock, agent death, destroy,
//! and restart reconciliation. Every way a sandbox ends goes through [`Manager::destroy`],
//! which records why, so later calls can say so (`Error::Gone`).
//!
//! Invariants:
//! - A sandbox is in `live` only while its agent runs; everything it owns on the host (uid
//!   slot, cgroups, its directory) is released by `destroy`, in that order of acquisition
//!   reversed, and a failed create releases what it took (fail closed).
//! - The host never touches a path inside a sandbox: files go through the agent.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use glovebox_jail::cgroup::{self, Cgroup, CgroupDriver};
use glovebox_jail::config::JailConfig;
use glovebox_proto::agent::{self as ap, Reply, Request};
use glovebox_proto::api::{self, CreateSandbox, EndReason, Limits, NetworkPolicy, Sandbox, SandboxState};
use glovebox_proto::io::{Reader, Writer};
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::slots::{Slot, Slots, RANGE};
use crate::util::{random_token, rfc3339};

/// How many ended sandboxes are remembered (to answer "gone, because …").
const GONE_MEMORY: usize = 10_000;

#[derive(Debug, Clone)]
pub struct Config {
    /// Persistent state (the API key; later the store and templates).
    pub data_dir: PathBuf,
    /// Runtime state on a tmpfs: sandboxes' private dirs and sockets, uid slots, the base
    /// skeleton. Shared by every Glovebox process on the host (uid ranges are host-wide).
    pub run_dir: PathBuf,
    /// The `glovebox-agent` binary (the jailer and PID 1 of every sandbox).
    pub agent_exe: PathBuf,
    pub cgroup_root: PathBuf,
    pub defaults: Limits,
    /// Sandboxes of each template kept booted ahead of requests (0 disables).
    pub warm_pool: usize,
    /// Where built templates live (default `<data_dir>/templates`).
    pub templates_dir: PathBuf,
    /// Re-adopt, at start, the intact sandboxes a previous daemon on this data dir left
    /// (`glovebox serve`); off for embedded runs, whose sandboxes end with them.
    pub adopt: bool,
    /// How long command records and ended sandboxes' records are kept.
    pub retention: Duration,
}

impl Config {
    pub fn new(data_dir: PathBuf, agent_exe: PathBuf) -> Config {
        Config {
            run_dir: default_run_dir(),
            agent_exe,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            defaults: Limits::default(),
            warm_pool: 0,
            adopt: false,
            retention: Duration::from_secs(24 * 3600),
            templates_dir: std::env::var_os("GLOVEBOX_TEMPLATES_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| data_dir.join("templates")),
            data_dir,
        }
    }
}

/// `/run/glovebox` where `/run` is a tmpfs (systemd hosts), else `/dev/shm/glovebox`:
/// runtime state must not sit on a disk (metadata operations on one cost milliseconds).
pub fn default_run_dir() -> PathBuf {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    if let Some(d) = std::env::var_os("GLOVEBOX_RUN_DIR") {
        return PathBuf::from(d);
    }
    match rustix::fs::statfs("/run") {
        Ok(s) if s.f_type as u64 == TMPFS_MAGIC => PathBuf::from("/run/glovebox"),
        _ => PathBuf::from("/dev/shm/glovebox"),
    }
}

/// Creates (or checks) the runtime dir: a real directory owned by root and writable by
/// root alone, so nobody else on the host can plant links in it (its parent may be a
/// world-writable sticky dir such as /dev/shm).
fn prepare_run_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::Internal(format!("create run dir {}: {e}", dir.display()))),
    }
    let md = fs::symlink_metadata(dir).map_err(internal("stat run dir"))?;
    if !md.is_dir() || md.uid() != 0 || md.mode() & 0o022 != 0 {
        return Err(Error::Internal(format!(
            "run dir {} must be a directory owned by root and not group/world writable",
            dir.display()
        )));
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o711)).map_err(internal("chmod run dir"))
}

/// Network namespaces made ahead of time (loopback up, nothing else). Making one costs about a
/// millisecond of kernel time (the loopback device, per-namespace sysctl tables) that a
/// sandbox's start then does not wait for; the pool is topped up on a thread of its own.
pub(crate) struct NetnsPool {
    fds: Mutex<Vec<std::os::fd::OwnedFd>>,
    filling: std::sync::atomic::AtomicBool,
    /// Sandbox work in flight (the manager's): refills wait for a quiet moment while
    /// namespaces are still at hand (see [`NETNS_LOW`]).
    work: Arc<crate::idle::Activity>,
}

/// Network namespaces kept ready.
const NETNS_POOL: usize = 4;
/// Below this many ready, a refill makes the next one at once instead of waiting for a
/// quiet moment.
const NETNS_LOW: usize = 2;

/// How much longer to wait, since `start`, for a moment with no sandbox work in flight for
/// [`QUIET`] (never past [`QUIET_BOUND`]); `None` once it has come.
fn quiet_wait(work: &crate::idle::Activity, start: Instant) -> Option<Duration> {
    let quiet_for = if work.busy() { Duration::ZERO } else { work.last().elapsed() };
    let waited = start.elapsed();
    if quiet_for >= QUIET || waited >= QUIET_BOUND {
        return None;
    }
    Some((QUIET - quiet_for).min(QUIET_BOUND - waited).max(Duration::from_millis(1)))
}

/// Blocks until a quiet moment (see [`quiet_wait`]).
fn quiet_moment(work: &crate::idle::Activity) {
    let start = Instant::now();
    while let Some(step) = quiet_wait(work, start) {
        std::thread::sleep(step);
    }
}

impl NetnsPool {
    /// One namespace, if one is ready; starts a refill either way.
    fn take(self: &Arc<Self>) -> Option<std::os::fd::OwnedFd> {
        let ns = lock(&self.fds).pop();
        self.refill();
        ns
    }

    fn refill(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("glovebox-netns-pool".into()).spawn(move || {
            while let Some(p) = this.upgrade() {
                let have = lock(&p.fds).len();
                if have >= NETNS_POOL {
                    p.filling.store(false, Ordering::Release);
                    return;
                }
                if have >= NETNS_LOW {
                    quiet_moment(&p.work);
                }
                match glovebox_jail::sys::new_netns() {
                    Ok(fd) => lock(&p.fds).push(fd),
                    Err(e) => {
                        // Left "filling" on purpose: no retries; sandboxes make their own.
                        tracing::warn!("pre-made network namespace: {e}; sandboxes make their own");
                        return;
                    }
                }
            }
        });
        if spawned.is_err() {
            self.filling.store(false, Ordering::Release);
        }
    }
}

/// The parts of a sandbox that need no process (see [`Manager::make_shell`]).
struct Shell {
    id: String,
    slot: Slot,
    dir: PathBuf,
    cgroup: Box<dyn Cgroup>,
    limits: cgroup::Limits,
}

/// One shell made ahead with the default limits, so that a create without a warm sandbox
/// does not wait for its five cgroup `mkdir`s and its run directory. It is claimed like a
/// sandbox (the uid slot held, the run directory present), so no other daemon's
/// reconciliation removes it; its id is the next created sandbox's.
#[derive(Default)]
struct Shells {
    /// The shell, and whether the manager is closing (no more are made then).
    ready: Mutex<(Option<Shell>, bool)>,
    filling: std::sync::atomic::AtomicBool,
}

impl Shells {
    fn take(&self) -> Option<Shell> {
        lock(&self.ready).0.take()
    }

    fn closed(&self) -> bool {
        lock(&self.ready).1
    }

    /// Keeps `s` for the next create (discards it if the manager is closing).
    fn put(&self, s: Shell) {
        let mut g = lock(&self.ready);
        let old = if g.1 { Some(s) } else { g.0.replace(s) };
        drop(g);
        if let Some(old) = old {
            discard_shell(old);
        }
    }

    /// No more shells: removes the one ready and waits (at most 2 s) for one being made,
    /// which then removes itself. Neither blocks the runtime's thread.
    async fn close(&self) {
        let s = {
            let mut g = lock(&self.ready);
            g.1 = true;
            g.0.take()
        };
        if let Some(s) = s {
            let _ = tokio::task::spawn_blocking(move || discard_shell(s)).await;
        }
        let t = Instant::now();
        while self.filling.load(std::sync::atomic::Ordering::Acquire) && t.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Removes a shell no sandbox was started in.
fn discard_shell(s: Shell) {
    if let Err(e) = s.cgroup.destroy() {
        tracing::error!(sandbox = %s.id, "remove cgroup: {e}");
    }
    let _ = fs::remove_dir_all(&s.dir);
}

pub struct Manager {
    pub(crate) cfg: Config,
    /// Starts jailers (through a fork server, see `glovebox_jail::launch::Launcher`).
    launcher: glovebox_jail::launch::Launcher,
    pub(crate) cgroups: Box<dyn CgroupDriver>,
    pub(crate) slots: Slots,
    skel: PathBuf,
    pub(crate) live: RwLock<HashMap<String, Arc<Sb>>>,
    gone: Mutex<(HashMap<String, EndReason>, VecDeque<String>)>,
    /// Booted, never-used sandboxes with the default limits (see `Config::warm_pool`).
    pool: Mutex<Vec<Booted>>,
    pool_filling: std::sync::atomic::AtomicUsize,
    pub metrics: crate::metrics::Metrics,
    pub(crate) net: Arc<crate::net::Net>,
    /// Persistent state (`<data_dir>/glovebox.db`).
    pub store: Arc<crate::store::Store>,
    /// Writes command records off the requests' path (see `records`).
    pub records: crate::records::Writer,
    /// The commands' seccomp filter, compiled once for every sandbox's agent.
    seccomp: Option<Vec<(u16, u8, u8, u32)>>,
    /// Network namespaces made ahead of the sandboxes that will use them.
    netns: Arc<NetnsPool>,
    /// The next create's slot, run directory and cgroups, made ahead.
    shells: Shells,
    /// API keys, tenants, quotas (see `tenants`).
    pub tenants: Arc<crate::tenants::Tenants>,
    /// Metered use of ended sandboxes (see `usage`).
    pub ended_usage: crate::usage::Ledger,
    /// Host-side secrets that brokered headers reference (values never leave the daemon).
    pub secrets: Arc<crate::secrets::SecretStore>,
    pub events: Arc<crate::events::Events>,
    /// Built templates and their layers (see `templates`).
    pub templates: crate::templates::Templates,
    /// Releases of destroyed sandboxes still under way (see [`Manager::destroy_because`]).
    releases: Mutex<tokio::task::JoinSet<()>>,
    /// Work on sandboxes in flight: creates, destroys, requests on one (see `idle::track`).
    /// Pool refills wait for a quiet moment (see [`Manager::until_quiet`]).
    pub(crate) sandbox_work: Arc<crate::idle::Activity>,
}

/// How long no sandbox work must have been in flight before a pool refill starts...
const QUIET: Duration = Duration::from_millis(5);
/// ...waiting at most this long (under sustained load there is no quiet moment).
const QUIET_BOUND: Duration = Duration::from_millis(50);

/// What a sandbox starts from: read-only layers above the base skeleton (top-most first),
/// and what its python kernels preload.
#[derive(Debug, Clone)]
pub struct Template {
    pub name: String,
    pub layers: Vec<PathBuf>,
    pub preload: Option<String>,
    /// The host's /usr under the layers (and the generated /etc skeleton); false when the
    /// bottom layer is a whole root filesystem (Debian, OCI images).
    pub host_usr: bool,
    /// Defaults from a built template's spec (env, workdir, user, resources, start command).
    pub defaults: Option<Arc<crate::templates::TemplateMeta>>,
}

impl Template {
    pub fn base() -> Template {
        Template { name: "base".into(), layers: Vec::new(), preload: None, host_usr: true, defaults: None }
    }

    /// What a warm sandbox must match to stand in for a fresh one of this template.
    fn pool_key(&self) -> String {
        format!("{}\0{:?}\0{}", self.name, self.layers, self.host_usr)
    }
}

/// A running jail not yet handed to anyone: what `boot` makes and `Sb` wraps.
struct Booted {
    template: String,
    kernels: crate::code::Kernels,
    id: String,
    pid: i32,
    pidfd: Option<std::os::fd::OwnedFd>,
    socket: PathBuf,
    dir: PathBuf,
    cgroup: Box<dyn Cgroup>,
    limits: Limits,
    slot: Slot,
}

impl Booted {
    fn alive(&self) -> bool {
        pidfd_alive(self.pidfd.as_ref())
    }
}

/// Whether a process still runs (a pidfd becomes readable when it exits).
pub(crate) fn pidfd_alive(fd: Option<&std::os::fd::OwnedFd>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    match fd {
        Some(fd) => {
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            matches!(poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(0))
        }
        None => false,
    }
}

/// One live sandbox.
pub struct Sb {
    pub id: String,
    pub template: String,
    pub created_at: SystemTime,
    pub limits: Limits,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// The policy in force (replaceable live), and whether the sandbox has its link.
    pub(crate) network: Mutex<(NetworkPolicy, bool)>,
    pub(crate) dns_stop: Arc<Notify>,
    /// Name-based egress state: resolver, proxy, audit.
    pub egress: Arc<crate::egress::Egress>,
    /// Environment the trust store adds to every command once the sandbox has a CA.
    pub(crate) trust_env: Mutex<BTreeMap<String, String>>,
    pub pid: i32,
    /// PID 1's start time (`/proc/PID/stat`), which with the pid names it across restarts.
    pub pid_start: u64,
    /// A pidfd of the agent (PID 1): signals and waits cannot hit a recycled pid.
    pub(crate) pidfd: Option<std::os::fd::OwnedFd>,
    pub(crate) socket: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) cgroup: Box<dyn Cgroup>,
    pub(crate) deadline: Mutex<(Instant, SystemTime)>,
    pub(crate) clock: Notify,
    /// For the idle clock (`idle_timeout`).
    pub activity: Arc<crate::idle::Activity>,
    pub idle_timeout: Option<Duration>,
    /// Code contexts (language kernels).
    pub kernels: crate::code::Kernels,
    /// The previous CPU sample (for `cpu_percent`).
    pub(crate) cpu_sample: Mutex<(Instant, u64)>,
    /// Modules the template's python kernels preload.
    pub preload: Option<String>,
    /// The tenant that owns it (see `tenants`).
    pub tenant: String,
    pub meter: crate::usage::Meter,
    /// The template's defaults (commands' user and cwd) and its layers (kept by GC).
    pub template_defaults: Option<Arc<crate::templates::TemplateMeta>>,
    /// Commands started through the API and commands recorded (see `records::flush`).
    pub(crate) commands: crate::records::Counts,
    pub(crate) _slot: Slot,
}

impl Sb {
    /// The environment every command starts with: the create request's, plus the CA bundle
    /// variables once brokering installed the sandbox's CA.
    pub fn base_env(&self) -> BTreeMap<String, String> {
        let mut e = lock(&self.trust_env).clone();
        e.extend(self.env.clone());
        e
    }

    pub fn target(&self) -> crate::code::Target<'_> {
        crate::code::Target { id: &self.id, socket: &self.socket }
    }

    pub fn view(&self) -> Sandbox {
        Sandbox {
            id: self.id.clone(),
            template: self.template.clone(),
            state: SandboxState::Running,
            created_at: rfc3339(self.created_at),
            expires_at: rfc3339(lock(&self.deadline).1),
            limits: Limits { disk_mb: disk_bytes(&self.limits) >> 20, ..self.limits.clone() },
            metadata: self.metadata.clone(),
            network: lock(&self.network).0.clone(),
            end_reason: None,
            idle_timeout_s: self.idle_timeout.map(|d| d.as_secs()),
        }
    }

    /// The sandbox's configuration as the store keeps it.
    pub(crate) fn config(&self) -> crate::store::SandboxConfig {
        crate::store::SandboxConfig {
            limits: self.limits.clone(),
            metadata: self.metadata.clone(),
            env: self.env.clone(),
            network: lock(&self.network).0.clone(),
            idle_timeout_s: self.idle_timeout.map(|d| d.as_secs()),
            preload: self.preload.clone(),
            tenant: Some(self.tenant.clone()),
            cpu_base_usec: Some(self.meter.cpu_base_usec()),
        }
    }

    /// A new connection to the sandbox's agent.
    pub async fn connect(&self) -> Result<(Reader, Writer)> {
        glovebox_proto::io::connect(&self.socket).await.map_err(|e| Error::Agent(e.to_string()))
    }

    pub fn oom_kills(&self) -> u64 {
        self.cgroup.oom_kills().unwrap_or(0)
    }

    pub fn stats(&self) -> Option<cgroup::Stats> {
        self.cgroup.stats().ok()
    }

    /// Resource use from the cgroups (CPU % over the time since the previous call).
    /// Metered use so far (a fresh reading folded in).
    pub fn usage(&self) -> api::SandboxUsage {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.meter.ended() {
            if let Some(st) = self.stats() {
                self.meter.sample(&st);
            }
        }
        let egress = (self.egress.bytes_up.load(Relaxed), self.egress.bytes_down.load(Relaxed));
        self.meter.report(&self.id, &self.tenant, egress)
    }

    pub fn metrics(&self) -> api::SandboxMetrics {
        let st = self.cgroup.stats().ok();
        let now = Instant::now();
        let usage = st.as_ref().map(|s| s.cpu_usage_usec).unwrap_or(0);
        let cpu_percent = {
            let mut last = lock(&self.cpu_sample);
            let dt = now.duration_since(last.0).as_micros().max(1) as f64;
            let p = usage.saturating_sub(last.1) as f64 / dt * 100.0;
            *last = (now, usage);
            (p * 10.0).round() / 10.0
        };
        api::SandboxMetrics {
            cpu_percent,
            cpu_usage_ms: usage / 1000,
            memory_used_bytes: st.as_ref().map(|s| s.memory_current_bytes).unwrap_or(0),
            memory_peak_bytes: st.as_ref().and_then(|s| s.memory_peak_bytes),
            memory_limit_bytes: self.limits.memory_mb << 20,
            disk_used_bytes: 0,
            disk_limit_bytes: disk_bytes(&self.limits),
            pids: st.as_ref().map(|s| s.pids_current).unwrap_or(0),
            pids_limit: self.limits.pids,
            oom_kills: st.as_ref().map(|s| s.oom_kills).unwrap_or(0),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Poisoning only follows a panic while holding the lock; the maps stay consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn internal(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("{what}: {e}"))
}

impl Manager {
    /// Opens the data directory, cleans up whatever a previous daemon left behind, and
    /// prepares the `base` root skeleton. Must run inside a tokio runtime.
    pub fn open(cfg: Config) -> Result<Arc<Manager>> {
        if !cfg.agent_exe.is_file() {
            return Err(Error::Internal(format!("agent binary not found at {}", cfg.agent_exe.display())));
        }
        fs::create_dir_all(&cfg.data_dir).map_err(internal("create data dir"))?;
        fs::set_permissions(&cfg.data_dir, fs::Permissions::from_mode(0o700)).map_err(internal("chmod data dir"))?;
        prepare_run_dir(&cfg.run_dir)?;
        for d in [&cfg.run_dir.join("sandboxes"), &cfg.run_dir.join("base")] {
            fs::create_dir_all(d).map_err(internal("create data dir"))?;
            // Traversable, not listable: the sandbox's PID 1 (an unprivileged host uid) walks
            // through here to its own mount point once; nothing here is readable to it.
            fs::set_permissions(d, fs::Permissions::from_mode(0o711)).map_err(internal("chmod data dir"))?;
        }
        let slots = Slots::new(&cfg.run_dir.join("slots")).map_err(internal("slots dir"))?;
        fs::set_permissions(cfg.run_dir.join("slots"), fs::Permissions::from_mode(0o700))
            .map_err(internal("chmod slots dir"))?;
        let store = match crate::store::Store::open(&cfg.data_dir) {
            Ok(s) => s,
            Err(e @ crate::store::StoreError::TooNew(..)) => return Err(Error::Internal(format!("store: {e}"))),
            // E.g. a full disk: serve anyway, loudly, rather than not at all.
            Err(e) => {
                tracing::error!("store: {e}; running without persistent state (nothing survives a restart)");
                crate::store::Store::open_in_memory().map_err(|e| Error::Internal(format!("store: {e}")))?
            }
        };
        let store = Arc::new(store);
        let cgroups = cgroup::detect(&cfg.cgroup_root).map_err(|e| Error::Internal(format!("cgroups: {e}")))?;
        // Each process sharing the data dir gets its own skeleton copy, so one daemon's
        // start never replaces the tree under another's running sandboxes.
        let skel = cfg.run_dir.join("base").join(format!("host-{}", std::process::id()));
        glovebox_jail::rootfs::build_host_skel(&skel).map_err(internal("build base root"))?;
        let kdir = skel.join(crate::code::KERNEL_DIR.trim_start_matches('/'));
        fs::create_dir_all(&kdir).map_err(internal("kernel dir"))?;
        for (name, body) in crate::code::KERNEL_FILES {
            fs::write(kdir.join(name), body).map_err(internal("write kernel"))?;
        }
        // Orphans reparent to us, so the agents we start stay our children to reap.
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        let templates = crate::templates::Templates::open(&cfg.data_dir, &cfg.run_dir)?;
        // After the subreaper bit: the server's jailers' orphans must find us as their reaper.
        let launcher = glovebox_jail::launch::Launcher::new(&cfg.agent_exe);
        if let Err(why) = launcher.server() {
            tracing::warn!("jailer fork server: {why}; each sandbox's jailer is spawned instead");
        }
        let sandbox_work: Arc<crate::idle::Activity> = Arc::default();
        let m = Arc::new(Manager {
            templates,
            launcher,
            cgroups,
            slots,
            skel,
            live: RwLock::new(HashMap::new()),
            gone: Mutex::new((HashMap::new(), VecDeque::new())),
            pool: Mutex::new(Vec::new()),
            pool_filling: std::sync::atomic::AtomicUsize::new(0),
            metrics: crate::metrics::Metrics::default(),
            net: Arc::new(crate::net::Net::new()),
            tenants: Arc::new(crate::tenants::Tenants::new()),
            ended_usage: crate::usage::Ledger::default(),
            secrets: Arc::new(
                crate::secrets::SecretStore::open(&cfg.data_dir).map_err(|e| Error::Internal(e.to_string()))?,
            ),
            cfg,
            events: Arc::new(crate::events::Events::new(store.clone())),
            records: crate::records::Writer::start(store.clone()),
            netns: Arc::new(NetnsPool {
                fds: Mutex::default(),
                filling: Default::default(),
                work: sandbox_work.clone(),
            }),
            releases: Mutex::new(tokio::task::JoinSet::new()),
            sandbox_work,
            shells: Shells::default(),
            seccomp: match glovebox_jail::seccomp::compile() {
                Ok(p) => Some(glovebox_jail::seccomp::to_tuples(&p)),
                Err(e) => {
                    tracing::warn!("seccomp: {e}; each agent compiles its own");
                    None
                }
            },
            store,
        });
        m.tenants.attach_store(m.store.clone())?;
        m.ended_usage.attach(m.store.clone())?;
        m.reconcile();
        m.spawn_sampler();
        crate::records::spawn_pruner(Arc::downgrade(&m), m.cfg.retention);
        m.netns.refill();
        m.refill_pool();
        m.refill_shells();
        Ok(m)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Re-adopts the intact sandboxes a previous daemon on this data dir left (see `adopt`)
    /// and cleans up every other sandbox whose owner died (its uid slot is no longer locked):
    /// kills its processes, removes its cgroups and directory, records why. Sandboxes of
    /// other live processes sharing the run dir, and those another data dir's daemon will
    /// adopt, are left alone.
    fn reconcile(self: &Arc<Self>) {
        let t0 = Instant::now();
        let mut adopted = 0usize;
        let dir = self.cfg.run_dir.join("sandboxes");
        let entries: Vec<_> = fs::read_dir(&dir).map(|rd| rd.flatten().collect()).unwrap_or_default();
        for e in entries {
            let id = e.file_name().to_string_lossy().into_owned();
            let slot = fs::read_to_string(e.path().join("slot")).ok().and_then(|s| s.trim().parse::<u32>().ok());
            if let Some(n) = slot {
                if self.slots.is_held(n) {
                    continue;
                }
            }
            let why = match self.adopt_orphan(&id, &e.path(), slot) {
                crate::adopt::Disposition::Adopted => {
                    adopted += 1;
                    continue;
                }
                crate::adopt::Disposition::NotOurs => continue,
                crate::adopt::Disposition::Cleanup(why) => why,
            };
            tracing::warn!(sandbox = %id, "cleaning up sandbox left by a previous daemon: {why}");
            if let Ok(Some(cg)) = self.cgroups.open(&id) {
                let _ = cg.kill_all();
                if let Err(e) = cg.destroy() {
                    tracing::error!(sandbox = %id, "remove cgroup: {e}");
                }
            }
            let _ = fs::remove_dir_all(e.path());
            if let Some(n) = slot {
                // Adopting then dropping frees the slot file.
                if let Ok(Some(s)) = self.slots.adopt(n, &id) {
                    drop(s);
                }
            }
            let reason = match self.store.sandbox(&id) {
                // Ended before the crash (teardown interrupted): its reason stands.
                Ok(Some(r)) if r.end_reason.is_some() => r.end_reason.unwrap_or(EndReason::DaemonRestart),
                Ok(Some(_)) => {
                    self.record_end(&id, EndReason::DaemonRestart, Some(&why));
                    EndReason::DaemonRestart
                }
                // Never handed out (a warm sandbox) or not this data dir's: only remembered.
                _ => {
                    let _ = self.store.end_sandbox(&id, EndReason::DaemonRestart, SystemTime::now());
                    EndReason::DaemonRestart
                }
            };
            self.remember(&id, reason);
        }
        self.forget_vanished();
        if adopted > 0 {
            tracing::info!("re-adopted {adopted} sandboxes in {} ms", t0.elapsed().as_millis());
        }
        // Slot files naming a sandbox that has no directory (a crash between taking the slot
        // and making the directory, or at the end of a teardown): free them.
        if let Ok(entries) = fs::read_dir(self.cfg.run_dir.join("slots")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = name.strip_suffix(".lock").and_then(|n| n.parse::<u32>().ok()) else { continue };
                if self.slots.is_held(n) {
                    continue;
                }
                let owner = fs::read_to_string(e.path()).unwrap_or_default();
                let owner = owner.trim();
                if owner.is_empty() || !dir.join(owner).exists() {
                    if let Ok(Some(s)) = self.slots.adopt(n, owner) {
                        drop(s);
                    } else if owner.is_empty() {
                        let _ = fs::remove_file(e.path());
                    }
                }
            }
        }
        // Firewall tables of dead daemons (their sandboxes' links died with the sandboxes).
        crate::net::reap_stale_tables();
        // Cgroups with no directory (a daemon killed mid-create or mid-teardown).
        if let Ok(names) = self.cgroups.list() {
            for name in names {
                if !dir.join(&name).exists() {
                    if let Ok(Some(cg)) = self.cgroups.open(&name) {
                        let _ = cg.kill_all();
                        let _ = cg.destroy();
                    }
                }
            }
        }
        self.reap_skeletons();
    }

    /// Removes the base skeletons of processes that are gone, unless a sandbox (adopted
    /// after a restart) still has its root on one.
    pub(crate) fn reap_skeletons(&self) {
        let mut used = std::collections::HashSet::new();
        if let Ok(rd) = fs::read_dir(self.cfg.run_dir.join("sandboxes")) {
            for e in rd.flatten() {
                if let Ok(p) = fs::read_to_string(e.path().join("skel")) {
                    used.insert(PathBuf::from(p));
                }
            }
        }
        if let Ok(entries) = fs::read_dir(self.cfg.run_dir.join("base")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name
                    .strip_prefix("host-")
                    .or_else(|| name.strip_prefix("mini-"))
                    .and_then(|p| p.trim_end_matches(".tmp").parse::<i32>().ok())
                {
                    if pid != std::process::id() as i32
                        && !Path::new(&format!("/proc/{pid}")).exists()
                        && !used.contains(&e.path())
                    {
                        let _ = fs::remove_dir_all(e.path());
                    }
                }
            }
        }
    }

    fn remember(&self, id: &str, reason: EndReason) {
        let mut g = lock(&self.gone);
        let (map, order) = &mut *g;
        if map.insert(id.to_string(), reason).is_none() {
            order.push_back(id.to_string());
        }
        while order.len() > GONE_MEMORY {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// The live sandbox, or why it is not.
    pub fn get(&self, id: &str) -> Result<Arc<Sb>> {
        if let Some(sb) = self.live.read().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(sb.clone());
        }
        if let Some(reason) = lock(&self.gone).0.get(id) {
            return Err(Error::Gone { id: id.to_string(), reason: *reason });
        }
        match self.store.end_reason(id) {
            Ok(Some(reason)) => Err(Error::Gone { id: id.to_string(), reason }),
            _ => Err(Error::SandboxNotFound(id.to_string())),
        }
    }

    pub fn list(&self) -> Vec<Sandbox> {
        self.list_for(&crate::tenants::Caller::admin())
    }

    /// The live sandboxes `caller` may see.
    pub fn list_for(&self, caller: &crate::tenants::Caller) -> Vec<Sandbox> {
        let mut v: Vec<Sandbox> = self
            .live
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| caller.may_access(&s.tenant))
            .map(|s| s.view())
            .collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// The tenant owning sandbox `id` (live or recently ended), if it is known.
    pub fn owner_of(&self, id: &str) -> Option<String> {
        if let Some(sb) = self.live.read().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Some(sb.tenant.clone());
        }
        self.tenants
            .ended_owner(id)
            .or_else(|| self.ended_usage.get(id).map(|u| u.tenant))
            .or_else(|| self.store.sandbox(id).ok().flatten().and_then(|r| r.config.tenant))
    }

    /// Metered use of a sandbox, live or ended.
    pub fn usage_of(&self, id: &str) -> Option<api::SandboxUsage> {
        if let Some(sb) = self.live.read().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Some(sb.usage());
        }
        self.ended_usage.get(id)
    }

    /// Usage totals per tenant (all tenants when `tenant` is None), live sandboxes included.
    pub fn usage_report(&self, tenant: Option<&str>) -> Vec<api::TenantUsage> {
        let live: Vec<api::SandboxUsage> =
            self.live.read().unwrap_or_else(|p| p.into_inner()).values().map(|s| s.usage()).collect();
        self.ended_usage.report(tenant, &live)
    }

    /// Samples every live sandbox's cgroup for the usage meters.
    fn spawn_sampler(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::usage::SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for n in 0u64.. {
                tick.tick().await;
                if n % 5 == 4 {
                    trim_heap();
                }
                let Some(m) = weak.upgrade() else { return };
                let live: Vec<Arc<Sb>> = m.live.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
                drop(m);
                for sb in live {
                    if let Some(st) = sb.stats() {
                        sb.meter.sample(&st);
                    }
                }
            }
        });
    }

    /// The defaults (so the layers) of every live sandbox's built template.
    pub fn live_template_defaults(&self) -> Vec<Arc<crate::templates::TemplateMeta>> {
        let live = self.live.read().unwrap_or_else(|p| p.into_inner());
        live.values().filter_map(|s| s.template_defaults.clone()).collect()
    }

    /// Keys of the warm sandboxes (they name their layers' paths).
    pub(crate) fn warm_keys(&self) -> Vec<String> {
        lock(&self.pool).iter().map(|b| b.template.clone()).collect()
    }

    /// Tears down the warm sandboxes of template `name` (it is being deleted).
    pub(crate) fn discard_warm(&self, name: &str) {
        let prefix = format!("{name}\0");
        let gone: Vec<Booted> = {
            let mut pool = lock(&self.pool);
            let (gone, keep) = pool.drain(..).partition(|b| b.template.starts_with(&prefix));
            *pool = keep;
            gone
        };
        for b in gone {
            discard(b);
        }
    }

    pub fn live_count(&self) -> usize {
        self.live.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn warm_count(&self) -> usize {
        lock(&self.pool).len()
    }

    /// Fills in defaults and checks bounds; the error says which value is wrong.
    pub fn limits_for(&self, r: &api::Resources) -> Result<Limits> {
        let d = &self.cfg.defaults;
        let l = Limits {
            cpus: r.cpus.unwrap_or(d.cpus),
            memory_mb: r.memory_mb.unwrap_or(d.memory_mb),
            disk_mb: r.disk_mb.unwrap_or(d.disk_mb),
            pids: r.pids.unwrap_or(d.pids),
        };
        if !(l.cpus.is_finite() && l.cpus >= 0.01 && l.cpus <= api::MAX_CPUS) {
            return Err(Error::Invalid(format!("resources.cpus must be between 0.01 and {}", api::MAX_CPUS)));
        }
        if !(api::MIN_MEMORY_MB..=api::MAX_MEMORY_MB).contains(&l.memory_mb) {
            return Err(Error::Invalid(format!(
                "resources.memory_mb must be between {} and {}",
                api::MIN_MEMORY_MB,
                api::MAX_MEMORY_MB
            )));
        }
        if !(api::MIN_DISK_MB..=api::MAX_DISK_MB).contains(&l.disk_mb) {
            return Err(Error::Invalid(format!(
                "resources.disk_mb must be between {} and {}",
                api::MIN_DISK_MB,
                api::MAX_DISK_MB
            )));
        }
        if !(api::MIN_PIDS..=api::MAX_PIDS).contains(&l.pids) {
            return Err(Error::Invalid(format!(
                "resources.pids must be between {} and {}",
                api::MIN_PIDS,
                api::MAX_PIDS
            )));
        }
        Ok(l)
    }

    /// Creates a sandbox for the `default` tenant.
    pub async fn create(self: &Arc<Self>, req: CreateSandbox) -> Result<Arc<Sb>> {
        self.create_for(crate::tenants::DEFAULT_TENANT, req).await
    }

    /// Creates a sandbox owned by `tenant`, within its quotas.
    pub async fn create_for(self: &Arc<Self>, tenant: &str, req: CreateSandbox) -> Result<Arc<Sb>> {
        let t = Instant::now();
        let r = self.create_inner(tenant, req).await;
        match &r {
            Ok(_) => {
                crate::metrics::Metrics::inc(&self.metrics.created);
                self.metrics.create_latency.observe(t.elapsed());
            }
            Err(Error::Start(_) | Error::Internal(_) | Error::Unavailable(_)) => {
                crate::metrics::Metrics::inc(&self.metrics.create_failed)
            }
            Err(Error::Quota(_)) => crate::metrics::Metrics::inc(&self.metrics.quota_refusals),
            Err(_) => {}
        }
        r
    }

    /// A sandbox for one template build step: from `tpl` (the layers built so far), its
    /// writes kept in the host directory `upper` (see `templates::build`).
    pub(crate) async fn create_for_build(
        self: &Arc<Self>,
        req: CreateSandbox,
        tpl: Template,
        upper: PathBuf,
    ) -> Result<Arc<Sb>> {
        self.create_with(crate::tenants::DEFAULT_TENANT, req, Some((tpl, upper))).await
    }

    async fn create_inner(self: &Arc<Self>, tenant: &str, req: CreateSandbox) -> Result<Arc<Sb>> {
        self.create_with(tenant, req, None).await
    }

    async fn create_with(
        self: &Arc<Self>,
        tenant: &str,
        mut req: CreateSandbox,
        build: Option<(Template, PathBuf)>,
    ) -> Result<Arc<Sb>> {
        let _work = self.sandbox_work.guard();
        let template = req.template.clone().unwrap_or_else(|| "base".to_string());
        let (tpl, upper) = match build {
            Some((t, u)) => (t, Some(u)),
            None => (self.template(&template)?, None),
        };
        if let Some(d) = &tpl.defaults {
            crate::templates::apply_defaults(d, &mut req);
        }
        let limits = self.limits_for(&req.resources)?;
        let policy = glovebox_proto::policy::parse(&req.network).map_err(Error::Invalid)?;
        crate::egress::Egress::check_secrets(&self.secrets, tenant, &policy).map_err(Error::Invalid)?;
        let timeout_s = req.timeout_s.unwrap_or(api::DEFAULT_TIMEOUT_S);
        if timeout_s == 0 || timeout_s > api::MAX_TIMEOUT_S {
            return Err(Error::Invalid(format!("timeout_s must be between 1 and {}", api::MAX_TIMEOUT_S)));
        }
        if req.idle_timeout_s.is_some_and(|t| t == 0 || t > api::MAX_TIMEOUT_S) {
            return Err(Error::Invalid(format!("idle_timeout_s must be between 1 and {}", api::MAX_TIMEOUT_S)));
        }
        for (k, v) in &req.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(Error::Invalid(format!("bad environment variable name or value: {k:?}")));
            }
        }
        let admission = self.tenants.admit(tenant, &limits)?;
        let warm = if upper.is_none() { self.take_warm(&tpl.pool_key(), &limits) } else { None };
        let (booted, warm) = match warm {
            Some(b) => (b, true),
            None => {
                let this = self.clone();
                let l = limits.clone();
                let t = tpl.clone();
                // A caller that goes away meanwhile (a client hanging up drops the request's
                // future) is not there to take the sandbox: the boot's end tears it down.
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::task::spawn_blocking(move || {
                    let b = this.boot(&l, &t, upper.as_deref(), false);
                    // Undelivered (nobody listening, or the listener gone with the value
                    // still in the channel), the hand-off discards it.
                    let _ = tx.send(b.map(|b| Handoff(Some(b))));
                });
                let b = rx.await.map_err(|_| Error::Internal("create task ended without a sandbox".into()))??;
                (b.take(), false)
            }
        };
        self.refill_pool();
        // What the sandbox used before it was handed out (boot, a warm kernel) is not billed.
        let cpu_base = booted.cgroup.cpu_usage_usec().unwrap_or(0);
        let now = SystemTime::now();
        let life = Duration::from_secs(timeout_s);
        let sb = Arc::new(Sb {
            id: booted.id,
            template,
            created_at: now,
            limits,
            metadata: req.metadata,
            env: req.env,
            network: Mutex::new((req.network.redacted(), false)),
            dns_stop: Arc::new(Notify::new()),
            egress: crate::egress::Egress::new(policy.clone(), self.secrets.clone(), tenant),
            trust_env: Mutex::new(BTreeMap::new()),
            pid: booted.pid,
            pid_start: crate::store::proc_start_time(booted.pid).unwrap_or(0),
            pidfd: booted.pidfd,
            socket: booted.socket,
            dir: booted.dir,
            cgroup: booted.cgroup,
            deadline: Mutex::new((Instant::now() + life, now + life)),
            clock: Notify::new(),
            kernels: booted.kernels,
            cpu_sample: Mutex::new((Instant::now(), 0)),
            activity: Arc::default(),
            idle_timeout: req.idle_timeout_s.map(Duration::from_secs),
            preload: tpl.preload.clone(),
            tenant: tenant.to_string(),
            meter: crate::usage::Meter::new(now, cpu_base),
            template_defaults: tpl.defaults.clone(),
            commands: crate::records::Counts::default(),
            _slot: booted.slot,
        });
        admission.commit();
        crate::adopt::write_owner(self, &sb.dir);
        let rec = crate::store::SandboxRecord {
            id: sb.id.clone(),
            template: sb.template.clone(),
            config: sb.config(),
            created_at: sb.created_at,
            deadline: crate::adopt::deadline_of(&sb),
            slot: sb._slot.index,
            pid: sb.pid,
            pid_start: sb.pid_start,
            state: crate::store::State::Running,
            end_reason: None,
            ended_at: None,
        };
        // Stored before it is listed, so a destroy racing the answer always finds the record
        // to end; followers hear of the event once it is listed.
        let stored = self.store.transaction(|c| {
            crate::store::put_sandbox_on(c, &rec)?;
            crate::events::Events::add_on(c, &sb.id, api::EventKind::Created, None, None)
        });
        self.live.write().unwrap_or_else(|p| p.into_inner()).insert(sb.id.clone(), sb.clone());
        // From here the sandbox is listed; a caller gone before the answer has it destroyed.
        let mut unanswered = Unanswered { manager: self.clone(), id: Some(sb.id.clone()) };
        match stored {
            Ok(e) => self.events.published(&e),
            Err(e) => tracing::error!(sandbox = %sb.id, "store sandbox: {e}"),
        }
        self.watch(sb.clone());
        if policy.needs_link() {
            let r = match self.prepare(&sb, &policy).await {
                Ok(()) => self.link(&sb, &policy).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                unanswered.id = None;
                self.destroy(&sb.id, EndReason::Error).await;
                return Err(e);
            }
        }
        if !warm && tpl.preload.is_some() {
            // Start the kernel now so the first cell pays as little as possible.
            let sb2 = sb.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::code::prewarm(&sb2.kernels, &sb2.target(), sb2.preload.as_deref()).await {
                    tracing::warn!(sandbox = %sb2.id, "prewarm kernel: {e}");
                }
            });
        }
        if let Some(cmd) = tpl.defaults.as_ref().and_then(|d| d.start_cmd.clone()) {
            crate::templates::start_cmd(self, &sb, cmd).await;
        }
        tracing::info!(sandbox = %sb.id, pid = sb.pid, "sandbox started");
        unanswered.id = None;
        Ok(sb)
    }

    /// A warm sandbox for `limits`, if one is ready: same disk size as the pool's (the tmpfs
    /// size is fixed at boot); other limits are applied to its cgroups here.
    fn take_warm(&self, template: &str, limits: &Limits) -> Option<Booted> {
        if disk_bytes(limits) != disk_bytes(&self.cfg.defaults) {
            return None;
        }
        loop {
            let b = {
                let mut pool = lock(&self.pool);
                let i = pool.iter().position(|b| b.template == template)?;
                pool.swap_remove(i)
            };
            if !b.alive() {
                tracing::warn!(sandbox = %b.id, "warm sandbox died; discarding it");
                discard(b);
                continue;
            }
            if let Err(e) = b.cgroup.set_background(false) {
                tracing::warn!(sandbox = %b.id, "warm sandbox cpu weight: {e}");
                discard(b);
                return None;
            }
            if b.limits != *limits {
                let cl =
                    cgroup::Limits { memory_bytes: limits.memory_mb << 20, cpu_quota: limits.cpus, pids: limits.pids };
                if let Err(e) = b.cgroup.set_limits(&cl) {
                    tracing::warn!(sandbox = %b.id, "warm sandbox limits: {e}");
                    discard(b);
                    return None;
                }
            }
            return Some(b);
        }
    }

    /// Waits until no sandbox work has been in flight for [`QUIET`], at most [`QUIET_BOUND`].
    /// A boot beside a request slows the request by more than its share of CPU (measured: a
    /// refill started as a create returned added 1.2 ms to the exec after it and 1.4 ms to
    /// the destroy): the jailer's cgroup migrations and mounts take kernel-wide locks, and
    /// the request's processes wait for the CPUs the boot's processes hold.
    async fn until_quiet(&self) {
        let start = Instant::now();
        while let Some(step) = quiet_wait(&self.sandbox_work, start) {
            tokio::time::sleep(step).await;
        }
    }

    /// Tops the warm pool up to its size in the background: `warm_pool` sandboxes of each
    /// available template, code-interpreter ones with their python kernel already started.
    fn refill_pool(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        let want = self.cfg.warm_pool;
        if want == 0 {
            return;
        }
        let mut templates = vec![Template::base()];
        if let Ok(t) = self.template("code-interpreter") {
            templates.push(t);
        }
        for tpl in templates {
            let key = tpl.pool_key();
            let have = lock(&self.pool).iter().filter(|b| b.template == key).count();
            let filling = self.pool_filling.load(Ordering::Acquire);
            // One boot at a time per template: refills must not starve real requests.
            if have >= want || filling > 0 {
                continue;
            }
            self.pool_filling.fetch_add(1, Ordering::AcqRel);
            let this = self.clone();
            tokio::spawn(async move {
                this.until_quiet().await;
                let limits = this.cfg.defaults.clone();
                let (m, t) = (this.clone(), tpl.clone());
                let booted = tokio::task::spawn_blocking(move || m.boot(&limits, &t, None, true)).await;
                match booted {
                    Ok(Ok(b)) => {
                        let ok = match &tpl.preload {
                            Some(p) => {
                                let target = crate::code::Target { id: &b.id, socket: &b.socket };
                                match crate::code::prewarm(&b.kernels, &target, Some(p)).await {
                                    Ok(()) => true,
                                    Err(e) => {
                                        tracing::warn!(sandbox = %b.id, "warm kernel: {e}");
                                        false
                                    }
                                }
                            }
                            None => true,
                        };
                        if ok {
                            tracing::info!(sandbox = %b.id, "warm sandbox ready: {}", tpl.name);
                            lock(&this.pool).push(b);
                        } else {
                            tokio::task::spawn_blocking(move || discard(b));
                        }
                    }
                    Ok(Err(e)) => tracing::warn!("warm pool: {e}"),
                    Err(e) => tracing::warn!("warm pool task: {e}"),
                }
                this.pool_filling.fetch_sub(1, Ordering::AcqRel);
                // Keep going until the pool is full.
                this.refill_pool();
            });
        }
    }

    /// The template `name`: `base` (host /usr) or one built into the data dir.
    pub fn template(&self, name: &str) -> Result<Template> {
        if name != "base" {
            if let Some(t) = self.templates.get(name) {
                return Ok(t);
            }
        }
        match name {
            "base" => Ok(Template::base()),
            "code-interpreter" => {
                let layer = self.cfg.templates_dir.join("code-interpreter/rootfs");
                if layer.is_dir() {
                    Ok(Template {
                        name: name.to_string(),
                        layers: vec![layer],
                        preload: Some("numpy,pandas,matplotlib,matplotlib.pyplot".into()),
                        host_usr: true,
                        defaults: None,
                    })
                } else {
                    Err(Error::NotFound {
                        what: "template",
                        name: format!("{name} (build it with scripts/build-code-interpreter)"),
                    })
                }
            }
            _ => Err(Error::NotFound { what: "template", name: name.to_string() }),
        }
    }

    /// Blocking part of create: slot, directory, cgroups, jail. Undoes all of it on failure.
    /// `upper`: a host directory for the writable layer (template builds), else a tmpfs.
    /// `background`: a warm-pool boot, at the lowest CPU weight until it is handed out, so
    /// that refilling the pool (a boot, a python kernel's imports) yields to requests.
    fn boot(
        self: &Arc<Self>,
        limits: &Limits,
        tpl: &Template,
        upper: Option<&Path>,
        background: bool,
    ) -> Result<Booted> {
        let cl = cgroup::Limits { memory_bytes: limits.memory_mb << 20, cpu_quota: limits.cpus, pids: limits.pids };
        // A request's boot takes the shell made ahead; the pool's refills make their own.
        let premade = if background { None } else { self.shells.take() };
        let shell = match premade {
            Some(s) if s.limits == cl => s,
            Some(s) => match s.cgroup.set_limits(&cl) {
                Ok(()) => Shell { limits: cl, ..s },
                Err(e) => {
                    discard_shell(s);
                    return Err(Error::Start(format!("cgroup: {e}")));
                }
            },
            None => self.make_shell(random_token(16), &cl)?,
        };
        if !background {
            self.refill_shells();
        }
        let Shell { id, slot, dir, cgroup: cg, .. } = shell;
        let id = id.as_str();
        let skel = if tpl.host_usr { self.skel.clone() } else { self.templates.mini_skel() };
        let undo_dir = |d: &Path| {
            let _ = fs::remove_dir_all(d);
        };
        // Which base skeleton its root uses (kept while it lives, across restarts).
        if let Err(e) = fs::write(dir.join("skel"), skel.as_os_str().as_encoded_bytes()) {
            let _ = cg.destroy();
            undo_dir(&dir);
            return Err(Error::Internal(format!("sandbox dir: {e}")));
        }
        if background {
            if let Err(e) = cg.set_background(true) {
                // Only slower for everyone else while it boots.
                tracing::debug!(sandbox = %id, "background cpu weight: {e}");
            }
        }
        let socket = dir.join("agent.sock");
        let netns = self.netns.take();
        let jc = JailConfig {
            id: id.to_string(),
            uid_base: slot.uid_base(),
            uid_count: RANGE,
            hostname: "glovebox".into(),
            mount_dir: dir.join("mnt"),
            socket_path: socket.clone(),
            layers: tpl.layers.iter().cloned().chain(std::iter::once(skel.clone())).collect(),
            host_usr: tpl.host_usr,
            upper_dir: upper.map(Path::to_path_buf),
            flat_root: tpl.layers.is_empty() && upper.is_none(),
            disk_bytes: disk_bytes(limits),
            shm_bytes: shm_bytes(limits),
            cgroup_procs: cg.procs_files(),
            command_cgroup: Some(cg.command_parent()),
            pids: limits.pids,
            seccomp: self.seccomp.clone(),
            netns: netns.as_ref().map(|fd| {
                use std::os::fd::AsRawFd;
                PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()))
            }),
        };
        let log = fs::File::create(dir.join("agent.log"));
        let launched = log
            .map_err(|e| Error::Internal(format!("agent log: {e}")))
            .and_then(|log| self.launcher.launch(&jc, log).map_err(|e| Error::Start(e.to_string())));
        // The jailer joined it before reporting ready (or failed): ours can go.
        drop(netns);
        let pid = match launched {
            Ok(p) => p,
            Err(e) => {
                let _ = cg.kill_all();
                let _ = cg.destroy();
                undo_dir(&dir);
                return Err(e);
            }
        };
        let pidfd = rustix::process::Pid::from_raw(pid)
            .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
        Ok(Booted {
            template: tpl.pool_key(),
            kernels: crate::code::Kernels::default(),
            id: id.to_string(),
            pid,
            pidfd,
            socket,
            dir,
            cgroup: cg,
            limits: limits.clone(),
            slot,
        })
    }

    /// A sandbox's uid slot, run directory and cgroups (limits `cl`, owned by the slot's
    /// root), for sandbox `id`. Undoes what it made on failure.
    fn make_shell(&self, id: String, cl: &cgroup::Limits) -> Result<Shell> {
        let slot = self.slots.take(&id).map_err(|e| Error::Unavailable(format!("uid range: {e}")))?;
        let dir = self.cfg.run_dir.join("sandboxes").join(&id);
        let mk = || -> std::io::Result<()> {
            fs::create_dir(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))?;
            fs::write(dir.join("slot"), slot.index.to_string())?;
            let mnt = dir.join("mnt");
            fs::create_dir(&mnt)?;
            fs::set_permissions(&mnt, fs::Permissions::from_mode(0o711))
        };
        if let Err(e) = mk() {
            let _ = fs::remove_dir_all(&dir);
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

    /// Makes the next request's shell in the background, at a quiet moment (its cgroup
    /// `mkdir`s take the kernel's cgroup lock, which a boot beside it needs too).
    fn refill_shells(self: &Arc<Self>) {
        if self.shells.filling.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            quiet_moment(&this.sandbox_work);
            if this.shells.closed() {
                this.shells.filling.store(false, std::sync::atomic::Ordering::Release);
                return;
            }
            let d = &this.cfg.defaults;
            let cl = cgroup::Limits { memory_bytes: d.memory_mb << 20, cpu_quota: d.cpus, pids: d.pids };
            match this.make_shell(random_token(16), &cl) {
                Ok(s) => this.shells.put(s),
                Err(e) => tracing::debug!("shell made ahead: {e}"),
            }
            this.shells.filling.store(false, std::sync::atomic::Ordering::Release);
        });
    }

    /// The lifetime clock, the idle clock and the agent-death watch of one sandbox.
    pub(crate) fn watch(self: &Arc<Self>, sb: Arc<Sb>) {
        let this = self.clone();
        tokio::spawn(async move {
            let pidfd = sb.pidfd.as_ref().and_then(|fd| fd.try_clone().ok()).and_then(|fd| {
                // `new` is deprecated for fds whose owner could close them underneath the
                // reactor; this one is an OwnedFd moved in, so that cannot happen.
                #[allow(deprecated)]
                let r = tokio::io::unix::AsyncFd::new(fd).ok();
                r
            });
            let died = async {
                match &pidfd {
                    Some(fd) => {
                        let _ = fd.readable().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::pin!(died);
            loop {
                let deadline = lock(&sb.deadline).0;
                // The idle check: at the end of the idle period since the last activity
                // (or a second from now while something is busy).
                let idle_at = sb.idle_timeout.map(|t| {
                    let at = sb.activity.last() + t;
                    if sb.activity.busy() {
                        at.max(Instant::now() + Duration::from_secs(1))
                    } else {
                        at
                    }
                });
                let idle_check = async {
                    match idle_at {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {
                        if Instant::now() >= lock(&sb.deadline).0 {
                            this.destroy(&sb.id, EndReason::Timeout).await;
                            return;
                        }
                    }
                    _ = idle_check => {
                        let Some(t) = sb.idle_timeout else { continue };
                        if sb.activity.busy() || sb.activity.last().elapsed() < t {
                            continue;
                        }
                        if crate::idle::commands_running(&this, &sb).await {
                            sb.activity.touch();
                            continue;
                        }
                        if sb.activity.busy() || sb.activity.last().elapsed() < t {
                            continue; // a request came in while we asked
                        }
                        this.destroy(&sb.id, EndReason::Idle).await;
                        return;
                    }
                    _ = sb.clock.notified() => continue,
                    _ = &mut died => {
                        if this.get(&sb.id).is_err() {
                            return; // destroyed on purpose; the exit was ours
                        }
                        let reason = if sb.oom_kills() > 0 { EndReason::Oom } else { EndReason::Error };
                        tracing::warn!(sandbox = %sb.id, reason = reason.as_str(), "sandbox agent exited");
                        this.destroy(&sb.id, reason).await;
                        return;
                    }
                }
            }
        });
    }

    /// Gives a sandbox its network link, resolver and DNS forwarder (see `net`).
    pub(crate) async fn link(&self, sb: &Arc<Sb>, policy: &glovebox_proto::policy::Policy) -> Result<()> {
        let (slot, pid) = (sb._slot.index, sb.pid);
        let p = policy.clone();
        let net = self.net.clone();
        let (host, _) = crate::net::link_addrs(slot);
        let resolv = format!("nameserver {host}\noptions timeout:2 attempts:2\n");
        // The resolver's address is known before the link exists: the agent writes it while
        // the link is made.
        let (linked, written) = tokio::join!(
            tokio::task::spawn_blocking(move || net.attach(slot, pid, &p)),
            write_file(sb, "/etc/resolv.conf", resolv.as_bytes())
        );
        linked.map_err(|e| Error::Internal(format!("network task: {e}")))??;
        lock(&sb.network).1 = true;
        written?;
        crate::net::spawn_services(slot, sb.egress.clone(), sb.dns_stop.clone())?;
        Ok(())
    }

    /// Gives the sandbox its CA (first brokering policy): the CA certificate goes into its
    /// system bundle (the host's bundle plus the CA) and `/etc/glovebox/sandbox-ca.pem`, and
    /// commands get the variables Python, Node and curl read. The CA key stays here.
    async fn install_ca(&self, sb: &Arc<Sb>) -> Result<()> {
        let (ca, new) = sb.egress.ensure_ca(&sb.id).map_err(|e| Error::Internal(format!("sandbox CA: {e}")))?;
        if !new {
            return Ok(());
        }
        let mut bundle = fs::read(crate::broker::SYSTEM_BUNDLE).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca.cert_pem().as_bytes());
        write_file(sb, crate::broker::SYSTEM_BUNDLE, &bundle).await?;
        write_file(sb, SANDBOX_CA, ca.cert_pem().as_bytes()).await?;
        let mut env = lock(&sb.trust_env);
        for k in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
            env.insert(k.into(), crate::broker::SYSTEM_BUNDLE.into());
        }
        env.insert("NODE_EXTRA_CA_CERTS".into(), SANDBOX_CA.into());
        Ok(())
    }

    /// Sets up what a policy needs beyond the link (the CA for brokering).
    pub(crate) async fn prepare(&self, sb: &Arc<Sb>, policy: &glovebox_proto::policy::Policy) -> Result<()> {
        if policy.brokers() {
            self.install_ca(sb).await?;
        }
        Ok(())
    }

    /// Replaces a sandbox's network policy, atomically; connections the new policy does not
    /// allow are reset.
    pub async fn set_network(&self, id: &str, np: NetworkPolicy) -> Result<Arc<Sb>> {
        let sb = self.get(id)?;
        let policy = glovebox_proto::policy::parse(&np).map_err(Error::Invalid)?;
        crate::egress::Egress::check_secrets(&self.secrets, &sb.tenant, &policy).map_err(Error::Invalid)?;
        self.prepare(&sb, &policy).await?;
        let linked = lock(&sb.network).1;
        if !linked {
            if policy.needs_link() {
                self.link(&sb, &policy).await?;
            }
        } else {
            let (slot, p, net) = (sb._slot.index, policy.clone(), self.net.clone());
            tokio::task::spawn_blocking(move || net.apply(slot, &p, false))
                .await
                .map_err(|e| Error::Internal(format!("network task: {e}")))??;
        }
        sb.egress.set_policy(policy);
        lock(&sb.network).0 = np.redacted();
        if let Err(e) = self.store.set_config(&sb.id, &sb.config()) {
            tracing::error!(sandbox = %sb.id, "store network: {e}");
        }
        Ok(sb)
    }

    /// Moves the lifetime deadline to `timeout_s` from now.
    pub fn set_timeout(&self, id: &str, timeout_s: u64) -> Result<Arc<Sb>> {
        if timeout_s == 0 || timeout_s > api::MAX_TIMEOUT_S {
            return Err(Error::Invalid(format!("timeout_s must be between 1 and {}", api::MAX_TIMEOUT_S)));
        }
        let sb = self.get(id)?;
        let life = Duration::from_secs(timeout_s);
        *lock(&sb.deadline) = (Instant::now() + life, SystemTime::now() + life);
        sb.clock.notify_one();
        if let Err(e) = self.store.set_deadline(&sb.id, crate::adopt::deadline_of(&sb)) {
            tracing::error!(sandbox = %sb.id, "store deadline: {e}");
        }
        Ok(sb)
    }

    /// Ends a sandbox for `reason`: kill everything, release everything, remember why.
    /// Returns false if it was not live.
    pub async fn destroy(&self, id: &str, reason: EndReason) -> bool {
        self.destroy_because(id, reason, None).await
    }

    /// [`Manager::destroy`] with a detail for the event.
    pub async fn destroy_because(&self, id: &str, reason: EndReason, detail: Option<&str>) -> bool {
        let sb = self.live.write().unwrap_or_else(|p| p.into_inner()).remove(id);
        let Some(sb) = sb else { return false };
        let _work = self.sandbox_work.guard();
        sb.meter.finish(sb.stats().as_ref());
        self.tenants.release(&sb.tenant, &sb.limits);
        self.tenants.ended(id, &sb.tenant);
        // Its usage, end state and `ended` event: one transaction, one commit.
        let usage = sb.usage();
        let stored = self.store.transaction(|c| {
            crate::usage::persist_on(c, &usage)?;
            crate::store::end_sandbox_on(c, id, reason, SystemTime::now())?;
            crate::events::Events::add_on(c, id, api::EventKind::Ended, Some(reason), detail)
        });
        self.ended_usage.remember(usage);
        self.remember(id, reason);
        self.metrics.ended(reason);
        match stored {
            Ok(e) => self.events.published(&e),
            Err(e) => tracing::error!(sandbox = %id, "store end: {e}"),
        }
        // What its agent still knows of its commands, before the kill.
        crate::records::flush(self, &sb).await;
        sb.clock.notify_one();
        sb.dns_stop.notify_waiters();
        // The kill is waited for: when this returns, nothing of the sandbox runs any more.
        let sb2 = sb.clone();
        let gone = match tokio::task::spawn_blocking(move || kill(sb2.pidfd.as_ref())).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(sandbox = %id, "kill task: {e}");
                false
            }
        };
        // What is left is bookkeeping of dead processes (cgroups, the run directory, the
        // veth, the uid slot): released after the answer, off the request's path. Unless
        // PID 1 was not seen gone (no pidfd, or it outlived the 5 s wait): then the release's
        // cgroup kill is what ends the rest, and it is waited for.
        let linked = lock(&sb.network).1;
        let net = self.net.clone();
        let id = id.to_string();
        let work = move || {
            let r = release(&sb.id, &*sb.cgroup, &sb.dir, gone);
            if linked {
                net.detach(sb._slot.index);
            }
            match r {
                Ok(()) => tracing::info!(sandbox = %id, reason = reason.as_str(), "sandbox destroyed"),
                Err(e) => tracing::error!(sandbox = %id, "teardown: {e}"),
            }
            // Dropping the last handle frees the uid slot.
            drop(sb);
        };
        if !gone {
            if let Err(e) = tokio::task::spawn_blocking(work).await {
                tracing::error!("teardown task: {e}");
            }
            return true;
        }
        let mut releases = lock(&self.releases);
        while releases.try_join_next().is_some() {}
        releases.spawn_blocking(work);
        true
    }

    /// Waits for the releases of destroyed sandboxes still under way.
    async fn settle_releases(&self) {
        let mut pending = std::mem::take(&mut *lock(&self.releases));
        while let Some(r) = pending.join_next().await {
            if let Err(e) = r {
                tracing::error!("teardown task: {e}");
            }
        }
    }

    /// Destroys every live sandbox (daemon shutdown, end of an embedded run).
    pub async fn destroy_all(&self, reason: EndReason) {
        let ids: Vec<String> = self.live.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        for id in ids {
            self.destroy(&id, reason).await;
        }
        self.drop_made_ahead().await;
        self.release_own_state();
        self.reap_skeletons();
    }

    /// At shutdown: the warm pool and the shells made ahead (never handed out) go, and the
    /// releases of destroyed sandboxes still running finish.
    async fn drop_made_ahead(&self) {
        let pooled: Vec<Booted> = lock(&self.pool).drain(..).collect();
        for b in pooled {
            discard(b);
        }
        self.shells.close().await;
        self.settle_releases().await;
    }

    /// What only this process's sandboxes need: its firewall table and base skeleton.
    fn release_own_state(&self) {
        self.net.teardown_table();
        let _ = fs::remove_dir_all(&self.skel);
    }

    /// Daemon shutdown that leaves every sandbox running for the next start to re-adopt:
    /// only the warm pool (never handed out) is torn down. The firewall table stays, so
    /// linked sandboxes stay filtered (cut off from the resolver and proxy) until then —
    /// unless no sandbox is left, when the table and the base skeleton go too.
    pub async fn leave_for_restart(&self) {
        self.drop_made_ahead().await;
        // Dropping a sandbox's handle frees its uid slot: forget them instead (the process
        // is ending), so the slots stay taken for the next start to re-take.
        let live: Vec<Arc<Sb>> =
            self.live.write().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, sb)| sb).collect();
        tracing::info!("leaving {} sandboxes running for the next start", live.len());
        if live.is_empty() {
            // Nothing for a next start to re-adopt, and maybe no next start.
            self.release_own_state();
        }
        for sb in live {
            std::mem::forget(sb);
        }
    }

    /// One request to a sandbox's agent, answered by one reply.
    pub async fn agent_call(&self, sb: &Sb, req: &Request) -> Result<Reply> {
        let call = async {
            let (mut r, mut w) = sb.connect().await?;
            w.json(req).await?;
            r.json::<Reply>().await.map_err(|e| self.agent_error(&sb.id, e))
        };
        tokio::time::timeout(crate::ops::AGENT_REPLY, call)
            .await
            .map_err(|_| self.agent_error(&sb.id, "the agent did not answer in time"))?
    }

    /// Turns a broken agent connection into the reason the sandbox is gone, when it is.
    pub fn agent_error(&self, id: &str, e: impl std::fmt::Display) -> Error {
        match self.get(id) {
            Err(gone @ Error::Gone { .. }) => gone,
            // The agent died and the watch has not recorded it yet: say why it is gone now.
            Ok(sb) if !pidfd_alive(sb.pidfd.as_ref()) => Error::Gone {
                id: id.to_string(),
                reason: if sb.oom_kills() > 0 { EndReason::Oom } else { EndReason::Error },
            },
            _ => Error::Agent(e.to_string()),
        }
    }
}

/// Gives freed heap pages back to the kernel. A long-running daemon's heap is fragmented by
/// bursts (thousands of sandboxes' bookkeeping freed at once); without this its RSS stays at
/// the burst's high-water mark.
fn trim_heap() {
    glovebox_jail::sys::trim_heap();
}

/// Size of `/dev/shm`: a quarter of the memory budget, at most 64 MiB.
fn shm_bytes(l: &Limits) -> u64 {
    ((l.memory_mb << 20) / 4).min(64 << 20)
}

/// Size of the writable layer. It is a tmpfs whose pages are charged to the sandbox's memory
/// cgroup, so it is capped below the memory budget (minus /dev/shm and an eighth for the
/// processes themselves): filling the disk then fails with ENOSPC instead of waking the OOM
/// killer. A disk-backed upper layer will lift this.
pub fn disk_bytes(l: &Limits) -> u64 {
    let mem = l.memory_mb << 20;
    let room = mem.saturating_sub(shm_bytes(l) + (mem / 8).max(8 << 20));
    (l.disk_mb << 20).min(room).max(4 << 20)
}

/// A listed sandbox whose create is not answered yet: dropped while `id` is set (the caller
/// went away mid-create), it has the sandbox destroyed.
struct Unanswered {
    manager: Arc<Manager>,
    id: Option<String>,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        // Without a runtime (it is being dropped) the restart's reconciliation cleans up.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let m = self.manager.clone();
        rt.spawn(async move {
            tracing::info!(sandbox = %id, "the caller went away before the create was answered: destroying it");
            m.destroy_because(&id, EndReason::Killed, Some("the client went away before the create was answered"))
                .await;
        });
    }
}

/// A booted sandbox on its way to the create that asked for it. Dropped undelivered — the
/// caller's future gone before the send, or after it with the value still in the channel —
/// it tears the sandbox down.
struct Handoff(Option<Booted>);

impl Handoff {
    fn take(mut self) -> Booted {
        self.0.take().expect("a hand-off is taken once")
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let Some(b) = self.0.take() else { return };
        tracing::info!(sandbox = %b.id, "the caller went away during the boot: discarding the sandbox");
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || discard(b))),
            Err(_) => discard(b),
        }
    }
}

/// Tears down a warm sandbox nobody got.
fn discard(b: Booted) {
    let gone = kill(b.pidfd.as_ref());
    if let Err(e) = release(&b.id, &*b.cgroup, &b.dir, gone) {
        tracing::error!(sandbox = %b.id, "teardown: {e}");
    }
}

/// Kills a sandbox and waits until it is gone. Killing PID 1 of its pid namespace makes the
/// kernel kill every other process in it, and PID 1's exit completes only once they are all
/// gone, so its exit is the proof: reaped when it is our child, its pidfd readable when it is
/// not (adopted after a restart). Returns whether it was seen gone (false: no pidfd, or still
/// there after 5 s; [`release`] then kills through the cgroup).
fn kill(pidfd: Option<&std::os::fd::OwnedFd>) -> bool {
    use rustix::process::{pidfd_send_signal, waitid, Signal, WaitId, WaitIdOptions};
    let Some(fd) = pidfd else { return false };
    let _ = pidfd_send_signal(fd, Signal::KILL);
    if waitid(WaitId::PidFd(std::os::fd::AsFd::as_fd(fd)), WaitIdOptions::EXITED).is_ok() {
        return true;
    }
    // Not our child: wait, bounded, for it to exit.
    let t = Instant::now();
    while pidfd_alive(Some(fd)) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    !pidfd_alive(Some(fd))
}

/// Removes what a killed sandbox leaves: its cgroups (killing through them whatever is
/// still there, the fallback for anything odd) and its run directory.
fn release(id: &str, cgroup: &dyn Cgroup, dir: &Path, gone: bool) -> std::result::Result<(), String> {
    let destroyed = match cgroup.destroy() {
        Ok(()) => Ok(()),
        Err(_) => {
            if !gone {
                tracing::debug!(sandbox = %id, "agent not seen gone; killing the cgroup");
            }
            // Processes of a killed pid namespace take a moment to leave their cgroups.
            let mut last = Err(String::new());
            for _ in 0..50 {
                let killed = cgroup.kill_all().map(drop).map_err(|e| format!("kill: {e}"));
                last = killed.and(cgroup.destroy().map_err(|e| format!("cgroup: {e}")));
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last
        }
    };
    let _ = fs::remove_dir_all(dir);
    destroyed
}

/// Maps an agent `Reply::Error` to the manager's error.
pub fn reply_error(code: ap::ErrorCode, message: String) -> Error {
    Error::File { code, message }
}

/// The sandbox CA certificate alone (for `NODE_EXTRA_CA_CERTS`, which adds to Node's roots).
pub const SANDBOX_CA: &str = "/etc/glovebox/sandbox-ca.pem";

/// Writes `body` to `path` inside the sandbox, through its agent (0644, parents made).
async fn write_file(sb: &Sb, path: &str, body: &[u8]) -> Result<()> {
    let (mut r, mut w) = sb.connect().await?;
    w.json(&glovebox_proto::agent::Request::WriteFile { path: path.into(), mode: Some(0o644), parents: true }).await?;
    for chunk in body.chunks(64 * 1024) {
        w.data(glovebox_proto::frame::Kind::Data, chunk).await?;
    }
    w.json(&glovebox_proto::agent::Request::EndData).await?;
    match r.json::<glovebox_proto::agent::Reply>().await? {
        glovebox_proto::agent::Reply::FileInfo(_) => Ok(()),
        other => Err(Error::Agent(format!("write {path}: {other:?}"))),
    }
}
