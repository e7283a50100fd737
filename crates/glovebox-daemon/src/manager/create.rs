//! Creating a sandbox: the request checked and completed (template defaults, limits,
//! policy, clocks), a warm sandbox taken or a fresh one booted, its record listed, its
//! network linked. A caller that goes away mid-create leaves nothing behind.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use glovebox_proto::api::{self, CreateSandbox, EndReason, Limits};
use glovebox_proto::policy::Policy;

use super::pools::Booted;
use super::record::{Deadline, Running, Settings};
use super::{Manager, Sb, Template};
use crate::error::{Error, Result};

impl Manager {
    /// Fills in defaults and checks bounds; the error says which value is wrong.
    pub fn limits_for(&self, r: &api::Resources) -> Result<Limits> {
        let d = &self.cfg.defaults;
        let mut l = Limits {
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
        // A disk asked for is given: in memory where it fits, else on the host's disk. The
        // default disk is what fits in memory (up to the default size): no disk image unless
        // one is asked for. `disk_mb` is from here the cap the sandbox gets (the smallest
        // in-memory disk is 4 MiB).
        if r.disk_mb.is_none() || crate::backend::jail::in_memory(&l) {
            l.disk_mb = crate::backend::jail::disk_bytes(&l) >> 20;
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
        let r = self.create_with(tenant, req, None, None).await;
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
    /// writes kept in the host directory `upper` (see `builds`).
    pub(crate) async fn create_for_build(
        self: &Arc<Self>,
        req: CreateSandbox,
        tpl: Template,
        upper: PathBuf,
    ) -> Result<Arc<Sb>> {
        self.create_with(crate::tenants::DEFAULT_TENANT, req, Some((tpl, upper)), None).await
    }

    /// Creates a sandbox: for a template build step (`build`: its layers and upper dir), a
    /// fork's child (`lineage`), or a request.
    pub(super) async fn create_with(
        self: &Arc<Self>,
        tenant: &str,
        mut req: CreateSandbox,
        build: Option<(Template, PathBuf)>,
        lineage: Option<super::snapshots::Lineage>,
    ) -> Result<Arc<Sb>> {
        let _work = self.sandbox_work.guard();
        let create_started = Instant::now();
        let mut template = req.template.clone().unwrap_or_else(|| "base".to_string());
        // From a snapshot, GC (exclusive) waits until the sandbox is listed (its layers kept).
        let _gc = match req.snapshot.is_some() && build.is_none() {
            true => Some(self.templates.gc_lock.read().await),
            false => None,
        };
        let mut origin = None;
        let (tpl, upper) = match (build, &req.snapshot) {
            (Some((t, u)), _) => (t, Some(u)),
            (None, Some(snap)) => {
                let (t, mut o) = self.snapshot_template(tenant, snap)?;
                if req.template.as_ref().is_some_and(|n| *n != t.name) {
                    return Err(Error::Invalid(format!(
                        "snapshot {snap:?} is of template {:?}; leave template out or name that one",
                        t.name
                    )));
                }
                if let Some(l) = lineage {
                    o.parent_id = Some(l.parent_id);
                    o.ancestors = l.ancestors;
                }
                template = t.name.clone();
                origin = Some(o);
                (t, None)
            }
            (None, None) => (self.template(&template)?, None),
        };
        if let Some(d) = &tpl.defaults {
            crate::templates::apply_defaults(d, &mut req);
        }
        let limits = self.limits_for(&req.resources)?;
        let isolation = req.isolation.unwrap_or(self.cfg.default_isolation);
        let policy = glovebox_proto::policy::parse(&req.network).map_err(Error::Invalid)?;
        crate::egress::Egress::check_secrets(&self.secrets, tenant, &policy).map_err(Error::Invalid)?;
        let timeout_s = req.timeout_s.unwrap_or(api::DEFAULT_TIMEOUT_S);
        if timeout_s == 0 || timeout_s > api::MAX_TIMEOUT_S {
            return Err(Error::Invalid(format!("timeout_s must be between 1 and {}", api::MAX_TIMEOUT_S)));
        }
        if req.idle_timeout_s.is_some_and(|t| t == 0 || t > api::MAX_TIMEOUT_S) {
            return Err(Error::Invalid(format!("idle_timeout_s must be between 1 and {}", api::MAX_TIMEOUT_S)));
        }
        if req.on_idle == Some(api::OnIdle::Hibernate) {
            return Err(crate::manager::pause::hibernate_unavailable().await);
        }
        for (k, v) in &req.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(Error::Invalid(format!("bad environment variable name or value: {k:?}")));
            }
        }
        crate::volumes::check_mounts(&req.volumes)?;
        let admission = self.tenants.admit(tenant, &limits)?;
        // Volumes are bound at boot: a sandbox with any is booted for the request.
        let volumes = match req.volumes.is_empty() {
            true => None,
            false => {
                let (vols, owner, mounts) = (self.volumes.clone(), tenant.to_string(), req.volumes.clone());
                let held = tokio::task::spawn_blocking(move || vols.acquire(&owner, &mounts))
                    .await
                    .map_err(|e| Error::Internal(format!("volume task: {e}")))??;
                Some(held)
            }
        };
        let binds = volumes.as_ref().map(|v| v.jail.clone()).unwrap_or_default();
        // Warm sandboxes are jailed ones: a gVisor sandbox is booted for its request.
        let warm = if upper.is_none() && volumes.is_none() && origin.is_none() && isolation == api::Isolation::Process {
            self.take_warm(&tpl.pool_key(), &limits)
        } else {
            None
        };
        let egress = crate::egress::Egress::new(policy.clone(), self.secrets.clone(), tenant);
        let boot_started = Instant::now();
        let link = policy.needs_link().then(|| (policy.clone(), egress.clone()));
        let (booted, warm, attached) = match warm {
            Some(b) => (b, true, false),
            None => {
                let wants = Wants { link, volumes: binds, isolation, tenant: tenant.to_string() };
                let (b, attached) = self.boot_for_request(&limits, &tpl, upper, wants).await?;
                (b, false, attached)
            }
        };
        let boot_us = boot_started.elapsed().as_micros() as u64;
        self.refill_pool();
        // What the sandbox used before it was handed out (boot, a warm kernel) is not billed.
        let cpu_base = booted.host.cpu_usage_usec().unwrap_or(0);
        let now = SystemTime::now();
        let settings = Settings {
            template,
            created_at: now,
            limits,
            metadata: req.metadata,
            env: req.env,
            idle_timeout: req.idle_timeout_s.map(Duration::from_secs),
            on_idle: req.on_idle.unwrap_or_default(),
            preload: tpl.preload.clone(),
            tenant: tenant.to_string(),
            template_defaults: tpl.defaults.clone(),
            volumes,
            auto_resume: req.auto_resume.unwrap_or(true),
            origin,
            isolation,
        };
        let run = Running {
            pid_start: crate::store::proc_start_time(booted.host.pid()).unwrap_or(0),
            host: booted.host,
            kernels: booted.kernels,
            egress,
            deadline: Deadline::after(Duration::from_secs(timeout_s)),
            meter: crate::usage::Meter::new(now, cpu_base),
            commands: crate::manager::records::Counts::default(),
        };
        let sb = Arc::new(Sb::new(settings, req.network.redacted(), run));
        admission.commit();
        crate::manager::adopt::write_owner(self, sb.host.dir());
        let announced: Vec<_> = self.observers.iter().filter_map(|o| o.created(&sb)).collect();
        self.registry.insert(sb.clone());
        // From here the sandbox is listed; a caller gone before the answer has it destroyed.
        let mut unanswered = Unanswered { manager: self.clone(), id: Some(sb.id.clone()) };
        for a in announced {
            a();
        }
        self.watch(sb.clone());
        let link_started = Instant::now();
        // A gVisor sandbox is linked even when deny-all: its link exists from boot (runsc's
        // netstack takes it over), and with the deny-all rules on it every attempt is refused
        // at once (a reset, an unreachable) and lands in the egress audit, where the link held
        // shut would drop it silently.
        if policy.needs_link() || isolation == api::Isolation::Gvisor {
            let r = match self.prepare(&sb, &policy).await {
                Ok(()) if attached => self.linked(&sb),
                Ok(()) => self.link(&sb, &policy).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                unanswered.id = None;
                self.destroy(&sb.id, EndReason::Error).await;
                return Err(e);
            }
        }
        // The network's part after the boot (a policy attached ahead is in the boot's time).
        let link_us = link_started.elapsed().as_micros() as u64;
        if !warm && tpl.preload.is_some() {
            // Start the kernel now so the first cell pays as little as possible.
            let sb2 = sb.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::kernels::prewarm(&sb2.kernels, &sb2.target(), sb2.preload.as_deref()).await {
                    tracing::warn!(sandbox = %sb2.id, "prewarm kernel: {e}");
                }
            });
        }
        if let Some(cmd) = tpl.defaults.as_ref().and_then(|d| d.start_cmd.clone()) {
            self.start_template_cmd(&sb, cmd).await;
        }
        let total_us = create_started.elapsed().as_micros() as u64;
        tracing::info!(sandbox = %sb.id, pid = sb.pid, warm, boot_us, link_us, total_us, "sandbox started");
        unanswered.id = None;
        Ok(sb)
    }

    /// Boots a fresh sandbox for a create (in a namespace linked ahead, when `link` is given
    /// and one is ready). A sandbox that got a namespace linked ahead has its policy attached
    /// on the boot's own thread, right after the boot (the second value is then true): the
    /// create does not wait for a second blocking task, and the rules are committed before the
    /// sandbox is handed out. A caller that goes away meanwhile (a client hanging up drops the
    /// request's future) is not there to take the sandbox: the boot's end tears it down.
    async fn boot_for_request(
        self: &Arc<Self>,
        limits: &Limits,
        tpl: &Template,
        upper: Option<PathBuf>,
        w: Wants,
    ) -> Result<(Booted, bool)> {
        let zygote = match (&tpl.preload, self.cfg.code_zygote, &upper, w.link.is_some(), w.isolation) {
            (Some(preload), true, None, false, api::Isolation::Process) => {
                Some(crate::backend::ZygoteWant { tenant: w.tenant.clone(), preload: preload.clone() })
            }
            _ => None,
        };
        let spec = crate::backend::Spec {
            link: w.link.is_some(),
            volumes: w.volumes,
            isolation: w.isolation,
            zygote,
            ..self.spec(limits, tpl, upper, false)
        };
        let link = w.link;
        let (this, t) = (self.clone(), tpl.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let booted = this.boot(&spec, &t).and_then(|b| match link {
                Some((policy, egress)) if b.host.linked_ahead() => match this.attach_ahead(&b, &policy, &egress) {
                    Ok(()) => Ok((b, true)),
                    Err(e) => {
                        b.discard();
                        Err(e)
                    }
                },
                _ => Ok((b, false)),
            });
            // Undelivered (nobody listening, or the listener gone with the value still in the
            // channel), the hand-off discards it.
            let _ = tx.send(booted.map(|(b, attached)| (Handoff(Some(b)), attached)));
        });
        let (b, attached) = rx.await.map_err(|_| Error::Internal("create task ended without a sandbox".into()))??;
        Ok((b.take(), attached))
    }

    /// The template `name`: `base` (host /usr), one built into the data dir, or one built
    /// into the shared template store.
    pub fn template(&self, name: &str) -> Result<Template> {
        if name == "base" {
            return Ok(Template::base());
        }
        if let Some(t) = self.templates.get(name) {
            return Ok(t);
        }
        let shared = self.cfg.shared_templates.as_deref().map(crate::templates::Store::at);
        if let Some(t) = shared.and_then(|s| crate::templates::from_store(&s, name)) {
            return Ok(t);
        }
        match crate::templates::shipped(name) {
            Some(s) => Err(Error::TemplateNotBuilt { name: name.to_string(), build_with: s.build_with }),
            None => Err(Error::NotFound { what: "template", name: name.to_string() }),
        }
    }
}

/// What a create's boot asks of the backend beyond its template and limits.
struct Wants {
    /// The policy and audit of a policy that needs a network link.
    link: Option<(Policy, Arc<crate::egress::Egress>)>,
    volumes: Vec<glovebox_jail::config::Volume>,
    /// Whose sandbox it is (its python kernel's zygote is its tenant's own).
    tenant: String,
    isolation: api::Isolation,
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
        tracing::info!(sandbox = %b.host.id(), "the caller went away during the boot: discarding the sandbox");
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || b.discard())),
            Err(_) => b.discard(),
        }
    }
}
