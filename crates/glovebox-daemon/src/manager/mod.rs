//! The sandbox lifecycle service: the registry of live sandboxes, their records, create and
//! boot, the warm pool, the clocks, teardown and restart reconciliation. Sandboxes run on a
//! [`Backend`](crate::backend::Backend); the store, events and usage hear of them through
//! [`Observer`]s. Every way a sandbox ends goes through [`Manager::destroy`], which records
//! why, so later calls can say so (`Error::Gone`).
//!
//! Invariants:
//! - A sandbox is in the registry only while its agent runs; everything it owns on the host
//!   is released by `destroy`, and a failed create releases what it took (fail closed).
//! - The host never touches a path inside a sandbox: files go through the agent.

mod adopt;
mod agent;
mod clocks;
mod create;
mod exec;
mod journal;
mod network;
mod observer;
pub(crate) mod pause;
mod pools;
mod reconcile;
mod record;
pub mod records;
mod registry;
pub(crate) mod snapshots;
mod teardown;
mod templates;
mod update;

#[cfg(test)]
mod pause_tests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod update_tests;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glovebox_proto::api::Limits;

pub use crate::backend::jail::disk_bytes;
pub use crate::templates::Template;
pub use network::SANDBOX_CA;
pub use observer::{Announce, LastWords, Observer};
pub use record::{Deadline, Sb};
pub(crate) use record::{Running, Settings};
pub use registry::Registry;
pub use snapshots::NameTaken;

use crate::backend::Backend;
use crate::error::{Error, Result};

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
    /// Another daemon's data dir whose built templates this one also starts sandboxes from,
    /// read-only (`GLOVEBOX_TEMPLATES_DIR`; the test suite builds `code-interpreter` once there).
    pub shared_templates: Option<PathBuf>,
    /// Whether a sandbox asking for a shipped template that is not built yet has the daemon
    /// build it (`GLOVEBOX_AUTO_BUILD=0` turns it off).
    pub auto_build: bool,
    /// Network namespaces kept linked ahead (with their uid slot and cgroups) for creates
    /// whose policy needs a link (0 disables: such creates link their own).
    pub link_pool: usize,
    /// A process that creates its sandbox as soon as it has started, and ends with it (an
    /// embedded `glovebox run`). Nothing is kept made ahead for later creates (network
    /// namespaces, shells of uid slot, run directory and cgroups): the one create's are made
    /// while the process starts, and a refill would only compete with that create for the CPU
    /// and the kernel's locks, then be thrown away. The cgroup migration lock is kept warm for
    /// the first boot (see `glovebox_jail::cgroup::lock`). The store's checkpointer makes its
    /// first pass (the previous run's log folded into the file, three `fsync`s) on its own
    /// thread, not on the start's path.
    pub one_shot: bool,
    /// Re-adopt, at start, the intact sandboxes a previous daemon on this data dir left
    /// (`glovebox serve`); off for embedded runs, whose sandboxes end with them.
    pub adopt: bool,
    /// How long command records and ended sandboxes' records are kept.
    pub retention: Duration,
    /// The base domain of exposed ports' preview hosts (`P-<id>.<domain>`; see `ports`).
    pub preview_domain: String,
    /// The tier of sandboxes whose create names none and whose template names none either.
    pub default_isolation: glovebox_proto::api::Isolation,
    /// Code-interpreter sandboxes (a template that preloads python modules) get their python
    /// kernel forked from a zygote of their tenant and template (`backend::zygotes`), where
    /// the backend can; any failure falls back to the kernel the agent starts. Off by default.
    pub code_zygote: bool,
}

impl Config {
    pub fn new(data_dir: PathBuf, agent_exe: PathBuf) -> Config {
        Config {
            run_dir: default_run_dir(),
            agent_exe,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            defaults: Limits::default(),
            warm_pool: 0,
            link_pool: 2,
            one_shot: false,
            adopt: false,
            retention: Duration::from_secs(24 * 3600),
            preview_domain: crate::ports::DEFAULT_DOMAIN.to_string(),
            default_isolation: glovebox_proto::api::Isolation::Process,
            code_zygote: false,
            // Absolute: the jailer resolves layer paths from its own working directory.
            shared_templates: std::env::var_os("GLOVEBOX_TEMPLATES_DIR")
                .map(|d| std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d))),
            auto_build: std::env::var_os("GLOVEBOX_AUTO_BUILD").is_none_or(|v| v != "0"),
            data_dir,
        }
    }
}

/// `/run/glovebox` where `/run` is a tmpfs (systemd hosts), else `/dev/shm/glovebox`:
/// runtime state must not sit on a disk (metadata operations on one cost milliseconds).
/// Except before Linux 6.3 (Debian 12's 6.1), whose tmpfs cannot be id-mapped: the jail
/// id-maps the base skeleton kept there, so the run dir goes to `/var/lib/glovebox-run` (a
/// disk, where ext4, xfs and btrfs can be). One host-wide dir either way: every daemon on
/// the host hands out uid slots from it.
pub fn default_run_dir() -> PathBuf {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    if let Some(d) = std::env::var_os("GLOVEBOX_RUN_DIR") {
        return PathBuf::from(d);
    }
    if !tmpfs_idmaps(&fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()) {
        return PathBuf::from("/var/lib/glovebox-run");
    }
    match rustix::fs::statfs("/run") {
        Ok(s) if s.f_type as u64 == TMPFS_MAGIC => PathBuf::from("/run/glovebox"),
        _ => PathBuf::from("/dev/shm/glovebox"),
    }
}

/// Whether a kernel of this release (`uname -r`) can id-map a tmpfs mount: from 6.3 on.
fn tmpfs_idmaps(release: &str) -> bool {
    let mut v = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 3)
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

pub(crate) fn internal(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Internal(format!("{what}: {e}"))
}

pub struct Manager {
    pub(crate) cfg: Config,
    /// Where sandboxes run (the process jail).
    backend: Arc<dyn Backend>,
    /// The live sandboxes, and why recently ended ones ended.
    pub(crate) registry: Registry,
    /// Booted, never-used sandboxes with the default limits (see `Config::warm_pool`).
    warm: pools::WarmPool,
    /// Who hears of sandboxes created and ended (the store's records, events, usage; the
    /// command records).
    observers: Vec<Arc<dyn Observer>>,
    pub metrics: crate::metrics::Metrics,
    pub(crate) net: Arc<crate::net::Net>,
    /// Persistent state (`<data_dir>/glovebox.db`).
    pub store: Arc<crate::store::Store>,
    /// Writes command records off the requests' path (see `records`).
    pub records: crate::manager::records::Writer,
    /// API keys, tenants, quotas (see `tenants`).
    pub tenants: Arc<crate::tenants::Tenants>,
    /// Metered use of ended sandboxes (see `usage`).
    pub ended_usage: Arc<crate::usage::Ledger>,
    /// Host-side secrets that brokered headers reference (values never leave the daemon).
    pub secrets: Arc<crate::secrets::SecretStore>,
    /// Disk-backed volumes and who mounts them (see `volumes`).
    pub volumes: Arc<crate::volumes::Volumes>,
    pub events: Arc<crate::events::Events>,
    /// Built templates and their layers (see `templates`).
    pub templates: crate::templates::Templates,
    /// Snapshot records (their layers are in the template store; see `snapshots`).
    pub snapshots: crate::snapshots::Snapshots,
    /// Anonymous snapshots of forks still making their children (not collected meanwhile).
    pub(crate) forks_in_flight: Mutex<std::collections::BTreeSet<String>>,
    /// Releases of destroyed sandboxes still under way (see [`Manager::destroy_because`]).
    releases: Mutex<tokio::task::JoinSet<()>>,
    /// Held shared by every destroy under way (from before its sandbox leaves the registry):
    /// a shutdown takes it exclusively, so it never ends while a sandbox is half torn down.
    destroying: tokio::sync::RwLock<()>,
    /// Work on sandboxes in flight: creates, destroys, requests on one (see `http::activity`).
    /// What is made ahead waits for a quiet moment.
    pub(crate) sandbox_work: Arc<crate::idle::Activity>,
    /// Exposed ports: which are public, and the secret their tokens are made with.
    pub ports: crate::ports::Ports,
}

impl Manager {
    /// Opens the data directory, cleans up whatever a previous daemon left behind, and
    /// prepares the process jail. Must run inside a tokio runtime.
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
        // Without runsc, a daemon whose creates default to gVisor would answer each one 503:
        // it does not start, and says why (before anything is made on the host).
        if cfg.default_isolation == glovebox_proto::api::Isolation::Gvisor {
            crate::backend::gvisor::Runsc::detect()
                .map_err(|why| Error::Unavailable(format!("default isolation gvisor: {why}")))?;
        }
        let work: Arc<crate::idle::Activity> = Arc::default();
        // Beside the store's opening.
        let prepared =
            crate::backend::jail::Jail::prepare(&cfg.run_dir, &cfg.cgroup_root, &cfg.agent_exe, cfg.one_shot);
        // The store before the jail: a store too new for this binary stops the start early.
        let store = open_store(&cfg.data_dir, cfg.one_shot)?;
        let net = Arc::new(crate::net::Net::new());
        let jail = crate::backend::jail::Jail::open(
            prepared,
            &cfg.defaults,
            work.clone(),
            net.clone(),
            cfg.link_pool,
            !cfg.one_shot,
        )?
        .with_disks(cfg.data_dir.join("disks"));
        let jail = match cfg.default_isolation {
            glovebox_proto::api::Isolation::Gvisor => jail.linking_from_start(),
            glovebox_proto::api::Isolation::Process => jail,
        };
        Manager::with_backend(cfg, store, Arc::new(jail), work, net)
    }

    /// The manager over `backend`, its state in `store`: reconciles what a previous daemon
    /// left, then starts the samplers and what is made ahead. `work` is the sandbox
    /// activity the backend's refills wait on; `net` the host's networking, shared with the
    /// backend (which links namespaces ahead through it).
    pub(crate) fn with_backend(
        cfg: Config,
        store: Arc<crate::store::Store>,
        backend: Arc<dyn Backend>,
        work: Arc<crate::idle::Activity>,
        net: Arc<crate::net::Net>,
    ) -> Result<Arc<Manager>> {
        let templates = crate::templates::Templates::open(&cfg.data_dir, &cfg.run_dir)?;
        let secrets = crate::secrets::SecretStore::open(&cfg.data_dir).map_err(|e| Error::Internal(e.to_string()))?;
        let volumes = crate::volumes::Volumes::open(&cfg.data_dir);
        let events = Arc::new(crate::events::Events::new(store.clone()));
        let ports = crate::ports::Ports::open(&cfg.data_dir, &cfg.preview_domain).map_err(internal("open ports"))?;
        let ended_usage: Arc<crate::usage::Ledger> = Arc::default();
        let journal = crate::manager::journal::Journal {
            store: store.clone(),
            events: events.clone(),
            ended_usage: ended_usage.clone(),
        };
        let snapshots = crate::snapshots::Snapshots::open(&cfg.data_dir);
        let m = Arc::new(Manager {
            templates,
            snapshots,
            forks_in_flight: Mutex::default(),
            backend,
            registry: Registry::default(),
            warm: pools::WarmPool::default(),
            observers: vec![Arc::new(journal), Arc::new(crate::manager::records::Flush)],
            metrics: crate::metrics::Metrics::default(),
            net,
            tenants: Arc::new(crate::tenants::Tenants::new()),
            ended_usage,
            secrets: Arc::new(secrets),
            volumes: Arc::new(volumes),
            cfg,
            events,
            records: crate::manager::records::Writer::start(store.clone()),
            releases: Mutex::new(tokio::task::JoinSet::new()),
            destroying: tokio::sync::RwLock::new(()),
            sandbox_work: work,
            ports,
            store,
        });
        m.tenants.attach_store(m.store.clone())?;
        m.ended_usage.attach(m.store.clone())?;
        m.reconcile();
        // After the adopted sandboxes are listed: fork snapshots none of them uses, and
        // snapshot layers a crash left without a record (mid-snapshot), go.
        match m.templates.gc_lock.try_write() {
            Ok(_g) => m.collect_locked(true),
            Err(_) => tracing::warn!("snapshot sweep skipped: the template store is busy"),
        }
        // After the adopted sandboxes counted their volumes: the host mounts nobody uses go.
        m.volumes.sweep();
        m.spawn_sampler();
        crate::manager::records::spawn_pruner(Arc::downgrade(&m), m.cfg.retention);
        m.backend.start();
        m.refill_pool();
        Ok(m)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Where sandboxes run.
    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }
}

/// The store in `data_dir`; one that cannot be opened (e.g. a full disk) is replaced by one
/// in memory, loudly, rather than not serving at all.
fn open_store(data_dir: &Path, one_shot: bool) -> Result<Arc<crate::store::Store>> {
    let opened = match one_shot {
        true => crate::store::Store::open_one_shot(data_dir),
        false => crate::store::Store::open(data_dir),
    };
    let store = match opened {
        Ok(s) => s,
        Err(e @ crate::store::StoreError::TooNew(..)) => return Err(Error::Internal(format!("store: {e}"))),
        Err(e) => {
            tracing::error!("store: {e}; running without persistent state (nothing survives a restart)");
            crate::store::Store::open_in_memory().map_err(|e| Error::Internal(format!("store: {e}")))?
        }
    };
    Ok(Arc::new(store))
}
