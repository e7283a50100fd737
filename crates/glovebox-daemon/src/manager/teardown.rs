//! How sandboxes end: one at a time ([`Manager::destroy`], every way a sandbox ends goes
//! through it and records why), all at shutdown, or left running for the next start.
//!
//! A destroy answers once nothing of the sandbox runs; the release of what dead processes
//! leave (cgroups, run directory, link, uid slot) finishes off the request's path.

use std::sync::Arc;

use glovebox_proto::api::EndReason;

use super::pools::Booted;
use super::{Manager, Sb};
use crate::util::lock;

impl Manager {
    /// Ends a sandbox for `reason`: kill everything, release everything, remember why.
    /// Returns false if it was not live.
    pub async fn destroy(&self, id: &str, reason: EndReason) -> bool {
        self.destroy_because(id, reason, None).await
    }

    /// [`Manager::destroy`] with a detail for the event.
    pub async fn destroy_because(&self, id: &str, reason: EndReason, detail: Option<&str>) -> bool {
        // A timeout's or an idle clock's destroy runs on a task of its own: a shutdown
        // meanwhile waits for it (see `settle_releases`).
        let _ending = self.destroying.read().await;
        let Some(sb) = self.registry.retire(id, reason) else { return false };
        let _work = self.sandbox_work.guard();
        sb.meter.finish(sb.stats().as_ref());
        self.tenants.release(&sb.tenant, &sb.limits);
        self.tenants.ended(id, &sb.tenant);
        self.ports.forget(id);
        self.metrics.ended(reason);
        // What its agent still knows (of its commands), before the kill; a paused sandbox's
        // agent answers only thawed.
        if sb.clock.paused().is_some() {
            if let Err(e) = sb.host.thaw() {
                tracing::warn!(sandbox = %id, "thaw before the kill: {e}");
            }
        }
        for o in &self.observers {
            if let Some(last) = o.before_kill(self, &sb) {
                last.await;
            }
        }
        sb.clock.wake.notify_one();
        sb.net.services_stop.cancel();
        // The kill is waited for: when this returns, nothing of the sandbox runs any more.
        // Its end is recorded (one commit) while the kernel tears its processes down.
        let sb2 = sb.clone();
        let killing = tokio::task::spawn_blocking(move || sb2.host.kill());
        let announced: Vec<_> = self.observers.iter().filter_map(|o| o.ended(&sb, reason, detail)).collect();
        for a in announced {
            a();
        }
        let gone = match killing.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(sandbox = %id, "kill task: {e}");
                false
            }
        };
        // Its volumes are free when the destroy answers (a `volume rm` right after it must
        // not find this sandbox a user): its processes are gone, the binds went with their
        // mount namespace, and a volume nobody uses is unmounted from the host here.
        let held = if gone { lock(&sb.volumes).take() } else { None };
        if let Some(held) = held {
            if let Err(e) = tokio::task::spawn_blocking(move || drop(held)).await {
                tracing::error!(sandbox = %id, "volume release task: {e}");
            }
        }
        // What is left is bookkeeping of dead processes (cgroups, the run directory, the
        // veth, the uid slot): released after the answer, off the request's path. Unless
        // PID 1 was not seen gone (no pidfd, or it outlived the 5 s wait): then the release's
        // cgroup kill is what ends the rest, and it is waited for.
        let from_snapshot = sb.origin.is_some();
        // A policy change under way finishes first (it may be making the link the release
        // must remove); one that comes after finds the sandbox gone.
        drop(sb.net.changing.lock().await);
        let work = self.release_work(sb, reason, gone);
        if !gone {
            if let Err(e) = tokio::task::spawn_blocking(work).await {
                tracing::error!("teardown task: {e}");
            }
        } else {
            let mut releases = lock(&self.releases);
            while releases.try_join_next().is_some() {}
            releases.spawn_blocking(work);
        }
        if from_snapshot {
            // Its processes are gone (the kill was waited for): a fork's snapshot it was the
            // last user of, and layers of deleted snapshots, can go.
            self.collect_snapshots().await;
        }
        true
    }

    /// The release of a killed sandbox's host resources and link. Blocking.
    fn release_work(&self, sb: Arc<Sb>, reason: EndReason, gone: bool) -> impl FnOnce() + Send + 'static {
        // A link made ahead is the backend's to remove (with the sandbox's release).
        let linked = sb.net.linked() && !sb.host.linked_ahead();
        let net = self.net.clone();
        // At a quiet moment (no sandbox request in flight for 5 ms, waited for at most 50 ms),
        // like the refills: unmounting its tree, removing its cgroups and directory beside the
        // next request slowed that request (an exec right after another sandbox's destroy
        // took 0.28-0.36 ms longer, docs/benchmarks.md). Unless requests come back to back
        // (no quiet moment in the last 50 ms): then at once (8-client cycles ~3.5 % faster
        // than with every release held to the bound). A one-shot run waits for its one
        // release before it exits: nothing to wait for.
        // A release the destroy waits for (PID 1 not seen gone) runs at once.
        let work = (!self.cfg.one_shot && gone).then(|| self.sandbox_work.clone());
        move || {
            if let Some(w) = work {
                crate::backend::made_ahead::release_moment(&w);
            }
            let r = sb.host.release(gone);
            // Its processes are gone (the release's cgroup kill ended any left): its volumes
            // (if the destroy did not free them) may be unmounted from the host.
            drop(lock(&sb.volumes).take());
            if linked {
                net.detach(sb.slot());
            }
            match r {
                Ok(()) => tracing::info!(sandbox = %sb.id, reason = reason.as_str(), "sandbox destroyed"),
                Err(e) => tracing::error!(sandbox = %sb.id, "teardown: {e}"),
            }
            // Dropping the last handle frees the uid slot.
            drop(sb);
        }
    }

    /// Waits for the destroys and the releases of destroyed sandboxes still under way.
    async fn settle_releases(&self) {
        drop(self.destroying.write().await);
        let mut pending = std::mem::take(&mut *lock(&self.releases));
        while let Some(r) = pending.join_next().await {
            if let Err(e) = r {
                tracing::error!("teardown task: {e}");
            }
        }
    }

    /// Destroys every live sandbox (daemon shutdown, end of an embedded run).
    pub async fn destroy_all(&self, reason: EndReason) {
        for id in self.registry.ids() {
            self.destroy(&id, reason).await;
        }
        self.drop_made_ahead().await;
        self.release_own_state();
        self.backend.reap_stale_bases();
    }

    /// At shutdown: the warm pool and what the backend made ahead (never handed out) go,
    /// and the releases of destroyed sandboxes still running finish.
    async fn drop_made_ahead(&self) {
        let pooled: Vec<Booted> = self.warm.drain();
        for b in pooled {
            b.discard();
        }
        // A refill's boot under way ends by discarding its sandbox (the pool is closed): wait
        // for it (bounded), so nothing booted is left running when the daemon exits.
        let t = std::time::Instant::now();
        while self.warm.filling() > 0 && t.elapsed() < std::time::Duration::from_secs(20) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let backend = self.backend.clone();
        let _ = tokio::task::spawn_blocking(move || backend.close()).await;
        self.settle_releases().await;
    }

    /// What only this process's sandboxes need: its firewall table and base skeleton.
    fn release_own_state(&self) {
        self.net.teardown_table();
        self.backend.release_own_state();
    }

    /// Daemon shutdown that leaves every sandbox running for the next start to re-adopt:
    /// only the warm pool (never handed out) is torn down. The firewall table stays, so
    /// linked sandboxes stay filtered (cut off from the resolver and proxy) until then —
    /// unless no sandbox is left, when the table and the base skeleton go too.
    pub async fn leave_for_restart(&self) {
        self.drop_made_ahead().await;
        // Dropping a sandbox's handle frees its uid slot: forget them instead (the process
        // is ending), so the slots stay taken for the next start to re-take.
        let live = self.registry.drain();
        tracing::info!("leaving {} sandboxes running for the next start", live.len());
        if live.is_empty() {
            // Nothing for a next start to re-adopt, and maybe no next start: this process's
            // state goes, and so do earlier daemons' skeletons that adopted sandboxes kept.
            self.release_own_state();
            self.backend.reap_stale_bases();
        }
        for sb in live {
            std::mem::forget(sb);
        }
    }
}
