//! The sandbox record: everything the daemon holds of one live sandbox, grouped by what
//! reads it (its request, its host side, its network, its clock), and the views built from it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use glovebox_jail::cgroup::Stats;
use glovebox_proto::api::{self, Limits, NetworkPolicy, OnIdle, Sandbox, SandboxState};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::backend::Instance;
use crate::util::{lock, rfc3339};

/// The policy in force (replaceable live), as asked for (secrets redacted).
pub struct Network {
    pub policy: NetworkPolicy,
    /// Whether the sandbox has its link (veth, firewall, resolver).
    pub linked: bool,
}

/// A sandbox's network: the policy, the egress services' state and their stop signal.
pub struct NetState {
    pub(crate) current: Mutex<Network>,
    /// Cancelled by the destroy: the resolver and proxy stop (see `egress::spawn_services`).
    pub(crate) services_stop: CancellationToken,
    /// Held across a policy change: two at once must not both give the sandbox its link.
    pub(crate) changing: tokio::sync::Mutex<()>,
    /// Environment the trust store adds to every command once the sandbox has a CA.
    pub(crate) trust_env: Mutex<BTreeMap<String, String>>,
}

impl NetState {
    pub(crate) fn new(policy: NetworkPolicy) -> NetState {
        NetState {
            current: Mutex::new(Network { policy, linked: false }),
            services_stop: CancellationToken::new(),
            changing: tokio::sync::Mutex::new(()),
            trust_env: Mutex::new(BTreeMap::new()),
        }
    }

    pub(crate) fn linked(&self) -> bool {
        lock(&self.current).linked
    }
}

/// What of a sandbox's settings can change while it runs.
pub struct Mutable {
    pub metadata: BTreeMap<String, String>,
    /// `None`: no idle clock.
    pub idle_timeout: Option<Duration>,
}

/// When the lifetime clock ends the sandbox: for the timer and for the API and the store.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at: Instant,
    pub wall: SystemTime,
}

impl Deadline {
    /// `life` from now.
    pub fn after(life: Duration) -> Deadline {
        Deadline { at: Instant::now() + life, wall: SystemTime::now() + life }
    }
}

/// The lifetime clock: its deadline, the wake-up of its watch when it moves, and whether it
/// is stopped (the sandbox paused) with the time it had left.
pub struct Lifetime {
    pub(crate) deadline: Mutex<Deadline>,
    pub(crate) wake: Notify,
    /// `Some(left)` while the sandbox is paused (see `manager::pause`).
    pub(crate) paused: Mutex<Option<Duration>>,
    /// Whether it is paused, for requests in flight to watch (set with `paused`, under its
    /// lock, by pause and resume).
    pub(crate) pauses: tokio::sync::watch::Sender<bool>,
    /// Why it ended, when a request saw its processes gone before its watch did (a gVisor
    /// sentry takes a while to exit once killed): from then on it is gone to every caller,
    /// and the woken watch destroys it.
    pub(crate) ended: std::sync::OnceLock<api::EndReason>,
}

impl Lifetime {
    pub(crate) fn new(d: Deadline) -> Lifetime {
        Lifetime {
            deadline: Mutex::new(d),
            wake: Notify::new(),
            paused: Mutex::new(None),
            pauses: tokio::sync::watch::Sender::new(false),
            ended: Default::default(),
        }
    }

    /// Completes when the sandbox is paused (at once if it is): a request in flight that
    /// waits on its processes races this, as they will not answer until a resume.
    pub(crate) fn paused_meanwhile(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.pauses.subscribe();
        async move {
            if rx.wait_for(|p| *p).await.is_err() {
                // The sandbox's record is gone: never paused from here on.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Records that the sandbox ended (the first reason stays) and wakes its watch; the
    /// reason in force.
    pub(crate) fn end(&self, reason: api::EndReason) -> api::EndReason {
        let r = *self.ended.get_or_init(|| reason);
        self.wake.notify_one();
        r
    }

    /// The deadline; while paused, the one resuming now would set.
    pub fn deadline(&self) -> Deadline {
        match *lock(&self.paused) {
            Some(left) => Deadline::after(left),
            None => *lock(&self.deadline),
        }
    }

    /// The lifetime left when paused, `None` while running.
    pub fn paused(&self) -> Option<Duration> {
        *lock(&self.paused)
    }
}

/// A CPU counter reading, for `cpu_percent` between two calls.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSample {
    pub at: Instant,
    pub usec: u64,
}

/// What a sandbox was asked to be (the create request, with the template's defaults).
pub struct Settings {
    pub template: String,
    pub created_at: SystemTime,
    pub limits: Limits,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub idle_timeout: Option<Duration>,
    /// What the idle clock does at `idle_timeout`.
    pub on_idle: OnIdle,
    /// Modules the template's python kernels preload.
    pub preload: Option<String>,
    /// The tenant that owns it (see `tenants`).
    pub tenant: String,
    /// The template's defaults (commands' user and cwd) and its layers (kept by GC).
    pub template_defaults: Option<Arc<crate::templates::TemplateMeta>>,
    /// The volumes it mounts, held until its last handle goes (after its processes).
    pub volumes: Option<crate::volumes::Held>,
    /// Whether a request that reaches its processes resumes it while paused.
    pub auto_resume: bool,
    /// The snapshot (and fork parent) it started from.
    pub origin: Option<crate::store::Origin>,
    /// Which kernel its processes run on.
    pub isolation: api::Isolation,
}

/// One live sandbox.
pub struct Sb {
    pub id: String,
    pub template: String,
    pub created_at: SystemTime,
    pub limits: Limits,
    /// Labels and idle timeout, replaceable live (see `Manager::update`).
    pub(crate) mutable: Mutex<Mutable>,
    pub env: BTreeMap<String, String>,
    pub(crate) net: NetState,
    /// Name-based egress state: resolver, proxy, audit.
    pub egress: Arc<crate::egress::Egress>,
    pub pid: i32,
    /// PID 1's start time (`/proc/PID/stat`), which with the pid names it across restarts.
    pub pid_start: u64,
    /// The backend's handle: its agent, its processes, its host resources.
    pub(crate) host: Box<dyn Instance>,
    pub(crate) clock: Lifetime,
    /// For the idle clock (`idle_timeout`).
    pub activity: Arc<crate::idle::Activity>,
    /// What the idle clock does at `idle_timeout`.
    pub on_idle: OnIdle,
    /// Code contexts (language kernels).
    pub kernels: crate::kernels::Kernels,
    /// The previous CPU sample (for `cpu_percent`).
    pub(crate) cpu_sample: Mutex<CpuSample>,
    /// Modules the template's python kernels preload.
    pub preload: Option<String>,
    /// The tenant that owns it (see `tenants`).
    pub tenant: String,
    pub meter: crate::usage::Meter,
    /// The template's defaults (commands' user and cwd) and its layers (kept by GC).
    pub template_defaults: Option<Arc<crate::templates::TemplateMeta>>,
    /// Commands started through the API and commands recorded (see `records::flush`).
    pub(crate) commands: crate::manager::records::Counts,
    /// The volumes it mounts; let go by the teardown once its processes are gone (each
    /// one's count goes down). Kept by a daemon that leaves it running for the next start.
    pub(crate) volumes: Mutex<Option<crate::volumes::Held>>,
    /// Whether a request that reaches its processes resumes it while paused.
    pub auto_resume: bool,
    /// The snapshot (and fork parent) it started from.
    pub origin: Option<crate::store::Origin>,
    /// Which kernel its processes run on.
    pub isolation: api::Isolation,
}

/// The running parts a record is made around.
pub(crate) struct Running {
    pub host: Box<dyn Instance>,
    pub pid_start: u64,
    pub kernels: crate::kernels::Kernels,
    pub egress: Arc<crate::egress::Egress>,
    pub deadline: Deadline,
    pub meter: crate::usage::Meter,
    pub commands: crate::manager::records::Counts,
}

impl Sb {
    /// The record of a sandbox running as `run`, set up as `s` says, under `network`.
    pub(crate) fn new(s: Settings, network: NetworkPolicy, run: Running) -> Sb {
        Sb {
            id: run.host.id().to_string(),
            pid: run.host.pid(),
            template: s.template,
            created_at: s.created_at,
            limits: s.limits,
            mutable: Mutex::new(Mutable { metadata: s.metadata, idle_timeout: s.idle_timeout }),
            env: s.env,
            net: NetState::new(network),
            egress: run.egress,
            pid_start: run.pid_start,
            host: run.host,
            clock: Lifetime::new(run.deadline),
            activity: Arc::default(),
            on_idle: s.on_idle,
            kernels: run.kernels,
            cpu_sample: Mutex::new(CpuSample { at: Instant::now(), usec: 0 }),
            preload: s.preload,
            tenant: s.tenant,
            meter: run.meter,
            template_defaults: s.template_defaults,
            commands: run.commands,
            volumes: Mutex::new(s.volumes),
            auto_resume: s.auto_resume,
            origin: s.origin,
            isolation: s.isolation,
        }
    }

    /// The environment every command starts with: the create request's, plus the CA bundle
    /// variables once brokering installed the sandbox's CA.
    pub fn base_env(&self) -> BTreeMap<String, String> {
        let mut e = lock(&self.net.trust_env).clone();
        e.extend(self.env.clone());
        e
    }

    pub fn target(&self) -> crate::kernels::Target<'_> {
        crate::kernels::Target { id: &self.id, socket: self.host.agent_socket(), forked: self.host.forked_kernel() }
    }

    /// The sandbox's host-wide slot (names its network link).
    pub fn slot(&self) -> u32 {
        self.host.slot()
    }

    /// The lifetime deadline.
    pub fn deadline(&self) -> Deadline {
        self.clock.deadline()
    }

    /// The network policy in force (secrets redacted).
    pub fn network(&self) -> NetworkPolicy {
        lock(&self.net.current).policy.clone()
    }

    /// Its labels (`metadata`).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        lock(&self.mutable).metadata.clone()
    }

    /// Whether its labels hold every `(key, value)` of `pairs`.
    pub fn has_metadata(&self, pairs: &[(&str, &str)]) -> bool {
        let m = lock(&self.mutable);
        pairs.iter().all(|(k, v)| m.metadata.get(*k).is_some_and(|have| have == v))
    }

    /// Its idle timeout (`None`: no idle clock).
    pub fn idle_timeout(&self) -> Option<Duration> {
        lock(&self.mutable).idle_timeout
    }

    pub fn view(&self) -> Sandbox {
        Sandbox {
            id: self.id.clone(),
            template: self.template.clone(),
            state: if self.clock.paused().is_some() { SandboxState::Paused } else { SandboxState::Running },
            created_at: rfc3339(self.created_at),
            expires_at: rfc3339(self.deadline().wall),
            limits: self.limits.clone(),
            metadata: self.metadata(),
            network: self.network(),
            end_reason: None,
            idle_timeout_s: self.idle_timeout().map(|d| d.as_secs()),
            on_idle: (self.on_idle != OnIdle::Kill).then_some(self.on_idle),
            volumes: self.volume_mounts(),
            auto_resume: (!self.auto_resume).then_some(false),
            snapshot: self.origin.as_ref().map(|o| o.snapshot.clone()),
            parent_id: self.origin.as_ref().and_then(|o| o.parent_id.clone()),
            ancestors: self.origin.as_ref().map(|o| o.ancestors.clone()).unwrap_or_default(),
            isolation: self.isolation,
        }
    }

    /// The sandbox's configuration as the store keeps it.
    pub(crate) fn config(&self) -> crate::store::SandboxConfig {
        crate::store::SandboxConfig {
            limits: self.limits.clone(),
            metadata: self.metadata(),
            env: self.env.clone(),
            network: self.network(),
            idle_timeout_s: self.idle_timeout().map(|d| d.as_secs()),
            preload: self.preload.clone(),
            tenant: Some(self.tenant.clone()),
            cpu_base_usec: Some(self.meter.cpu_base_usec()),
            on_idle: (self.on_idle != OnIdle::Kill).then_some(self.on_idle),
            paused_left_ms: self.clock.paused().map(|d| d.as_millis() as u64),
            volumes: self.volume_mounts(),
            auto_resume: (!self.auto_resume).then_some(false),
            origin: self.origin.clone(),
            isolation: (self.isolation != api::Isolation::Process).then_some(self.isolation),
        }
    }

    /// The volumes it mounts, as asked for.
    pub fn volume_mounts(&self) -> Vec<glovebox_proto::api::VolumeMount> {
        lock(&self.volumes).as_ref().map(|v| v.mounts.clone()).unwrap_or_default()
    }

    pub fn oom_kills(&self) -> u64 {
        self.host.oom_kills()
    }

    pub fn stats(&self) -> Option<Stats> {
        self.host.stats()
    }

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

    /// Resource use (CPU % over the time since the previous call).
    pub fn metrics(&self) -> api::SandboxMetrics {
        let st = self.stats();
        let now = Instant::now();
        let usage = st.as_ref().map(|s| s.cpu_usage_usec).unwrap_or(0);
        let cpu_percent = {
            let mut last = lock(&self.cpu_sample);
            let dt = now.duration_since(last.at).as_micros().max(1) as f64;
            let p = usage.saturating_sub(last.usec) as f64 / dt * 100.0;
            *last = CpuSample { at: now, usec: usage };
            (p * 10.0).round() / 10.0
        };
        api::SandboxMetrics {
            cpu_percent,
            cpu_usage_ms: usage / 1000,
            memory_used_bytes: st.as_ref().map(|s| s.memory_current_bytes).unwrap_or(0),
            memory_peak_bytes: st.as_ref().and_then(|s| s.memory_peak_bytes),
            memory_limit_bytes: self.limits.memory_mb << 20,
            disk_used_bytes: 0,
            disk_limit_bytes: self.limits.disk_mb << 20,
            pids: st.as_ref().map(|s| s.pids_current).unwrap_or(0),
            pids_limit: self.limits.pids,
            oom_kills: st.as_ref().map(|s| s.oom_kills).unwrap_or(0),
        }
    }
}
