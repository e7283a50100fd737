//! The warm pool: sandboxes booted ahead of requests (`Config::warm_pool` of each template,
//! code-interpreter ones with their python kernel started), handed out by a create whose
//! template and disk size match. Refills run one boot at a time, at quiet moments.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glovebox_proto::api::Limits;

use super::{Manager, Template};
use crate::backend::jail::disk_bytes;
use crate::backend::made_ahead::quiet_wait;
use crate::backend::{Instance, Spec};
use crate::util::lock;

/// A running sandbox not yet handed to anyone: what a boot makes and a record wraps.
pub(crate) struct Booted {
    /// The pool key of its template (see [`Template::pool_key`]).
    pub template: String,
    pub kernels: crate::kernels::Kernels,
    pub host: Box<dyn Instance>,
    pub limits: Limits,
}

impl Booted {
    /// Tears down a sandbox nobody got. Blocking.
    pub(crate) fn discard(self) {
        let gone = self.host.kill();
        if let Err(e) = self.host.release(gone) {
            tracing::error!(sandbox = %self.host.id(), "teardown: {e}");
        }
    }
}

#[derive(Default)]
pub(crate) struct WarmPool {
    ready: Mutex<Vec<Booted>>,
    /// Boots under way.
    filling: AtomicUsize,
    /// Set at shutdown: no more refills, and a boot that ends after it is discarded.
    closed: AtomicBool,
    /// Refill boots that failed in a row (a broken template, a full disk): the next waits
    /// longer each time instead of retrying at once.
    failures: std::sync::atomic::AtomicU32,
}

/// How long a refill waits after `failures` boots failed in a row: 250 ms, doubling, at most
/// a minute.
fn refill_backoff(failures: u32) -> Duration {
    let ms = 250u64.saturating_mul(1u64 << failures.saturating_sub(1).min(8));
    Duration::from_millis(ms.min(60_000))
}

impl WarmPool {
    /// Every warm sandbox, and no more from now on (shutdown).
    pub(crate) fn drain(&self) -> Vec<Booted> {
        self.closed.store(true, Ordering::Release);
        lock(&self.ready).drain(..).collect()
    }

    /// Boots of the pool still under way (each ends by pooling or discarding its sandbox).
    pub(crate) fn filling(&self) -> usize {
        self.filling.load(Ordering::Acquire)
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl Manager {
    /// Keys of the warm sandboxes (they name their layers' paths).
    pub(crate) fn warm_keys(&self) -> Vec<String> {
        lock(&self.warm.ready).iter().map(|b| b.template.clone()).collect()
    }

    /// Tears down the warm sandboxes of template `name` (it is being deleted).
    pub(crate) fn discard_warm(&self, name: &str) {
        let prefix = format!("{name}\0");
        let gone: Vec<Booted> = {
            let mut pool = lock(&self.warm.ready);
            let (gone, keep) = pool.drain(..).partition(|b| b.template.starts_with(&prefix));
            *pool = keep;
            gone
        };
        for b in gone {
            b.discard();
        }
    }

    pub fn warm_count(&self) -> usize {
        lock(&self.warm.ready).len()
    }

    /// The limits warm sandboxes are booted with: the defaults, with the in-memory disk that
    /// fits them (what a request that names no limits gets; never a disk image).
    pub(super) fn pool_limits(&self) -> Limits {
        let mut l = self.cfg.defaults.clone();
        l.disk_mb = disk_bytes(&l) >> 20;
        l
    }

    /// A warm sandbox for `limits`, if one is ready: same in-memory disk as the pool's (the
    /// tmpfs size is fixed at boot; a disk-backed sandbox is booted for its request); other
    /// limits are applied to it here.
    pub(super) fn take_warm(&self, template: &str, limits: &Limits) -> Option<Booted> {
        if !crate::backend::jail::in_memory(limits) || disk_bytes(limits) != disk_bytes(&self.pool_limits()) {
            return None;
        }
        loop {
            let b = {
                let mut pool = lock(&self.warm.ready);
                let i = pool.iter().position(|b| b.template == template)?;
                pool.swap_remove(i)
            };
            if !b.host.alive() {
                tracing::warn!(sandbox = %b.host.id(), "warm sandbox died; discarding it");
                b.discard();
                continue;
            }
            if let Err(e) = b.host.set_background(false) {
                tracing::warn!(sandbox = %b.host.id(), "warm sandbox cpu weight: {e}");
                b.discard();
                return None;
            }
            if b.limits != *limits {
                if let Err(e) = b.host.set_limits(limits) {
                    tracing::warn!(sandbox = %b.host.id(), "warm sandbox limits: {e}");
                    b.discard();
                    return None;
                }
            }
            return Some(b);
        }
    }

    /// Waits until no sandbox work has been in flight for a moment (bounded).
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
    pub(crate) fn refill_pool(self: &Arc<Self>) {
        let want = self.cfg.warm_pool;
        if want == 0 || self.warm.closed() {
            return;
        }
        let mut templates = vec![Template::base()];
        if let Ok(t) = self.template("code-interpreter") {
            templates.push(t);
        }
        for tpl in templates {
            let key = tpl.pool_key();
            let have = lock(&self.warm.ready).iter().filter(|b| b.template == key).count();
            let filling = self.warm.filling.load(Ordering::Acquire);
            // One boot at a time per template: refills must not starve real requests.
            if have >= want || filling > 0 {
                continue;
            }
            self.warm.filling.fetch_add(1, Ordering::AcqRel);
            let this = self.clone();
            tokio::spawn(async move {
                this.until_quiet().await;
                if this.warm.closed() {
                    this.warm.filling.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                let spec = this.spec(&this.pool_limits(), &tpl, None, true);
                let (m, t) = (this.clone(), tpl.clone());
                let booted = tokio::task::spawn_blocking(move || m.boot(&spec, &t)).await;
                let failed = match booted {
                    Ok(Ok(b)) => {
                        this.warm.failures.store(0, Ordering::Release);
                        this.warm_up(b, &tpl).await;
                        None
                    }
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(e) => Some(format!("task: {e}")),
                };
                this.warm.filling.fetch_sub(1, Ordering::AcqRel);
                if let Some(e) = failed {
                    let n = this.warm.failures.fetch_add(1, Ordering::AcqRel) + 1;
                    let wait = refill_backoff(n);
                    tracing::warn!("warm pool: {e} ({n} in a row; next try in {wait:?})");
                    tokio::time::sleep(wait).await;
                }
                // Keep going until the pool is full.
                this.refill_pool();
            });
        }
    }

    /// Starts a warm sandbox's python kernel (when its template preloads one) and pools it.
    async fn warm_up(&self, b: Booted, tpl: &Template) {
        if let Some(p) = &tpl.preload {
            let target = crate::kernels::Target { id: b.host.id(), socket: b.host.agent_socket(), forked: None };
            if let Err(e) = crate::kernels::prewarm(&b.kernels, &target, Some(p)).await {
                tracing::warn!(sandbox = %b.host.id(), "warm kernel: {e}");
                tokio::task::spawn_blocking(move || b.discard());
                return;
            }
        }
        // Under the pool's lock, so a shutdown's drain either takes it or has closed the pool.
        let mut ready = lock(&self.warm.ready);
        if self.warm.closed() {
            drop(ready);
            let _ = tokio::task::spawn_blocking(move || b.discard()).await;
            return;
        }
        tracing::info!(sandbox = %b.host.id(), "warm sandbox ready: {}", tpl.name);
        ready.push(b);
    }

    /// The backend's spec for a sandbox of `tpl` with `limits`.
    pub(super) fn spec(
        &self,
        limits: &Limits,
        tpl: &Template,
        upper: Option<std::path::PathBuf>,
        background: bool,
    ) -> Spec {
        Spec {
            limits: limits.clone(),
            layers: tpl.layers.clone(),
            root_skel: if tpl.host_usr { None } else { Some(self.templates.mini_skel()) },
            upper,
            background,
            link: false,
            volumes: Vec::new(),
            isolation: glovebox_proto::api::Isolation::Process,
            // Warm sandboxes keep the kernel the agent starts (it is warm by then anyway).
            zygote: None,
        }
    }

    /// Boots a sandbox of `tpl` as `spec` says. Blocking.
    pub(super) fn boot(&self, spec: &Spec, tpl: &Template) -> crate::error::Result<Booted> {
        let host = self.backend.boot(spec)?;
        Ok(Booted {
            template: tpl.pool_key(),
            kernels: crate::kernels::Kernels::default(),
            host,
            limits: spec.limits.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_refills_wait_longer_each_time_up_to_a_minute() {
        let waits: Vec<u64> = (1..=12).map(|n| refill_backoff(n).as_millis() as u64).collect();
        assert_eq!(&waits[..4], &[250, 500, 1000, 2000]);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert_eq!(*waits.last().unwrap(), 60_000);
        assert_eq!(refill_backoff(u32::MAX), Duration::from_secs(60));
    }
}
