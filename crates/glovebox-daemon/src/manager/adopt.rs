//! Restart recovery: taking over the sandboxes a previous daemon on the same data dir left
//! running (they outlive it: nothing kills them when it dies).
//!
//! A sandbox is re-adopted only when all of it is intact: its store record says it is
//! live, its uid slot is free to re-take and names it, PID 1 is the very process recorded
//! (pid and start time, so a recycled pid is never mistaken for it) and a pidfd to it is
//! open, its cgroup exists, and its agent socket accepts. It keeps its id, its clocks (the
//! deadline comes from the store), its background commands (the agent kept them) and its
//! network policy (the link is rebuilt: firewall tables belong to the daemon process, and
//! the resolver and proxy ran inside it). Anything less is cleaned up completely by the
//! caller and recorded with the reason why.
//!
//! Whose is an orphan: a sandbox dir carries `owner` (the data dir of the daemon that handed
//! it out). A sandbox owned by another data dir that still has a store is left for that
//! data dir's daemon; embedded runs (which never adopt) leave every owned sandbox alone.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use glovebox_proto::api::{EndReason, EventKind};

use crate::manager::{Deadline, Manager, Running, Sb, Settings};
use crate::store::SandboxRecord;

/// What reconciliation does with one orphaned sandbox dir.
pub(crate) enum Disposition {
    /// Live again in this daemon.
    Adopted,
    /// Another data dir's daemon will adopt it (or it is ours and we are an embedded run).
    NotOurs,
    /// Clean it up; the detail says why it could not be adopted.
    Cleanup(String),
}

/// The file in a sandbox's run dir naming its owner's data dir.
pub(crate) const OWNER_FILE: &str = "owner";

fn canonical(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Marks a sandbox handed out by an adopting daemon as its data dir's.
pub(crate) fn write_owner(m: &Manager, dir: &Path) {
    if m.cfg.adopt {
        let _ = fs::write(dir.join(OWNER_FILE), canonical(&m.cfg.data_dir).to_string_lossy().as_bytes());
    }
}

impl Manager {
    /// Decides about the orphan `id` (its slot lock is free) and adopts it if it can.
    pub(crate) fn adopt_orphan(self: &Arc<Self>, id: &str, dir: &Path, slot: Option<u32>) -> Disposition {
        let owner = fs::read_to_string(dir.join(OWNER_FILE)).ok().map(|s| PathBuf::from(s.trim()));
        let Some(owner) = owner else { return Disposition::Cleanup("not handed out by a daemon".into()) };
        let mine = owner == canonical(&self.cfg.data_dir);
        if !mine || !self.cfg.adopt {
            // Its daemon's state is gone (the data dir was removed): nobody will adopt it.
            return if owner.join("glovebox.db").exists() {
                Disposition::NotOurs
            } else {
                Disposition::Cleanup("its data dir is gone".into())
            };
        }
        let rec = match self.store.sandbox(id) {
            Ok(Some(r)) if r.end_reason.is_none() => r,
            Ok(Some(_)) => return Disposition::Cleanup("it had ended (teardown interrupted)".into()),
            Ok(None) => return Disposition::Cleanup("not in the store".into()),
            Err(e) => return Disposition::Cleanup(format!("store: {e}")),
        };
        match self.reopen(&rec, dir, slot) {
            Ok(sb) => {
                self.adopted(sb, &rec);
                Disposition::Adopted
            }
            Err(why) => Disposition::Cleanup(why),
        }
    }

    /// Re-takes everything a sandbox owns on the host, checking each piece.
    fn reopen(&self, rec: &SandboxRecord, dir: &Path, slot: Option<u32>) -> Result<Arc<Sb>, String> {
        if slot != Some(rec.slot) {
            return Err(format!("uid slot {slot:?} is not the recorded {}", rec.slot));
        }
        if rec.template == crate::templates::BUILD_SANDBOX {
            // Its build ended with the daemon that ran it (and its upper dir with it).
            return Err("a template build step's sandbox".into());
        }
        let host = self.backend().reopen(&crate::backend::Recorded {
            id: &rec.id,
            pid: rec.pid,
            pid_start: rec.pid_start,
            slot: rec.slot,
            dir,
        })?;
        let policy = glovebox_proto::policy::parse(&rec.config.network).map_err(|e| format!("network policy: {e}"))?;
        if rec.config.isolation == Some(glovebox_proto::api::Isolation::Gvisor) {
            // gVisor's netstack took the link over at start and would not see a new one: it is
            // held shut by this daemon's table instead (deny-all too), until its rules are back.
            self.net.hold_stale(rec.slot).map_err(|e| format!("hold the link: {e}"))?;
        } else if policy.needs_link() {
            // The old link's firewall table dies with the old daemon: cut the link now (the
            // sandbox is offline until it is rebuilt, never unfiltered).
            crate::net::cut_stale_link(rec.slot);
        }
        let now = SystemTime::now();
        let left = rec.deadline.duration_since(now).unwrap_or(Duration::ZERO);
        let cpu_now = host.cpu_usage_usec().unwrap_or(0);
        let tenant = rec.config.tenant.clone().unwrap_or_else(|| "default".to_string());
        let settings = Settings {
            template: rec.template.clone(),
            created_at: rec.created_at,
            limits: rec.config.limits.clone(),
            metadata: rec.config.metadata.clone(),
            env: rec.config.env.clone(),
            idle_timeout: rec.config.idle_timeout_s.map(Duration::from_secs),
            on_idle: rec.config.on_idle.unwrap_or_default(),
            preload: rec.config.preload.clone(),
            // The template as stored now (its defaults; its layers kept by GC).
            template_defaults: self.adopted_defaults(&rec.template, rec.config.origin.as_ref()),
            origin: rec.config.origin.clone(),
            volumes: (!rec.config.volumes.is_empty()).then(|| self.volumes.adopt(&tenant, &rec.config.volumes)),
            tenant: tenant.clone(),
            auto_resume: rec.config.auto_resume.unwrap_or(true),
            isolation: rec.config.isolation.unwrap_or_default(),
        };
        let run = Running {
            host,
            pid_start: rec.pid_start,
            kernels: crate::kernels::Kernels::default(),
            egress: crate::egress::Egress::new(policy, self.secrets.clone(), &tenant),
            deadline: Deadline { at: Instant::now() + left, wall: rec.deadline },
            // CPU: the cgroup's counter kept running while the daemon was down, so everything
            // above the base recorded at create is billed (older records have none: from
            // now). Memory is integrated again from now; wall time from the creation.
            meter: crate::usage::Meter::resumed(rec.created_at, rec.config.cpu_base_usec.unwrap_or(cpu_now)),
            // Its commands from before the restart are unknown: the teardown asks its agent.
            commands: crate::manager::records::Counts::unknown(),
        };
        let sb = Sb::new(settings, rec.config.network.clone(), run);
        // Paused when the previous daemon ended: still frozen, its clock stopped as stored.
        *crate::util::lock(&sb.clock.paused) = rec.config.paused_left_ms.map(Duration::from_millis);
        sb.clock.pauses.send_replace(rec.config.paused_left_ms.is_some());
        Ok(Arc::new(sb))
    }

    /// Makes an adopted sandbox live and finishes its recovery in the background: the
    /// agent must answer, the network link is rebuilt, background commands are watched.
    fn adopted(self: &Arc<Self>, sb: Arc<Sb>, rec: &SandboxRecord) {
        self.tenants.count_adopted(&sb.tenant, &sb.limits);
        self.registry.insert(sb.clone());
        self.watch(sb.clone());
        let policy = glovebox_proto::policy::parse(&rec.config.network).ok();
        let this = self.clone();
        tokio::spawn(async move {
            // A paused sandbox is thawed while its agent is checked and its link rebuilt,
            // then frozen again (unless a request resumed it meanwhile). One not paused is
            // thawed too: a snapshot under way when the previous daemon died left it frozen.
            let paused = sb.clock.paused().is_some();
            if let Err(e) = sb.host.thaw() {
                tracing::warn!(sandbox = %sb.id, "adopted sandbox: thaw: {e}");
            }
            let ping = sb.agent().ping().await;
            if ping.is_err() {
                tracing::warn!(sandbox = %sb.id, "adopted sandbox's agent does not answer: {ping:?}");
                this.destroy_because(&sb.id, EndReason::DaemonRestart, Some("agent did not answer after restart"))
                    .await;
                return;
            }
            let gvisor = sb.isolation == glovebox_proto::api::Isolation::Gvisor;
            if let Some(policy) = policy.filter(|p| p.needs_link() || gvisor) {
                // A brokering policy gets a new CA (the old one's key lived in the old daemon).
                let linked = match this.prepare(&sb, &policy).await {
                    Ok(()) => this.link(&sb, &policy).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = linked {
                    tracing::warn!(sandbox = %sb.id, "adopted sandbox's network: {e}");
                    this.destroy_because(&sb.id, EndReason::Error, Some("network link could not be rebuilt")).await;
                    return;
                }
            }
            crate::manager::records::watch_running(&this, &sb).await;
            if paused {
                this.refreeze(&sb);
            }
            this.events.record(&sb.id, EventKind::Adopted, None, None);
            tracing::info!(sandbox = %sb.id, "sandbox re-adopted");
        });
    }

    /// Ends store records of sandboxes that reconciliation found nothing of (a host reboot
    /// empties the run dir) — unless a live process holds their slot.
    pub(crate) fn forget_vanished(&self) {
        let Ok(recs) = self.store.live_sandboxes() else { return };
        let dir = self.cfg.run_dir.join("sandboxes");
        for r in recs {
            if self.registry.contains(&r.id) {
                continue;
            }
            // A live sandbox always has its dir (made before its record, removed after its end).
            if dir.join(&r.id).exists() {
                continue;
            }
            self.record_end(&r.id, EndReason::DaemonRestart, Some("nothing of it was left after a restart"));
        }
    }

    /// Stores a sandbox's end and its event.
    pub(crate) fn record_end(&self, id: &str, reason: EndReason, detail: Option<&str>) {
        if let Err(e) = self.store.end_sandbox(id, reason, SystemTime::now()) {
            tracing::error!(sandbox = %id, "store end: {e}");
        }
        self.events.record(id, EventKind::Ended, Some(reason), detail);
    }
}
