//! Pause and resume. A paused sandbox's processes are frozen where they stand (the cgroup
//! freezer: its memory stays, charged to it), its lifetime clock is stopped with the time it
//! had left kept, and its idle clock is off; resume thaws it and restarts the lifetime clock
//! with what was left. A request that reaches a paused sandbox's processes resumes it first
//! (the HTTP front-ends call [`Manager::resume`]). The pause is stored with the sandbox's configuration, so a restarted
//! daemon adopts it paused.
//!
//! Invariant: `Lifetime::paused` is `Some` exactly while the backend holds the sandbox frozen
//! (but for the moments a re-adoption or a teardown thaws it to speak to its agent); both
//! change under that lock (taken before the deadline's).

use std::sync::Arc;
use std::time::Instant;

use super::record::Deadline;
use super::{Manager, Sb};
use crate::error::{Error, Result};
use crate::util::lock;

/// The answer to `hibernate` on this host: processes are not checkpointed to disk here; the
/// message says why, from the CRIU probe run on the first ask ([`crate::hibernate`]), off the
/// async workers.
pub(crate) async fn hibernate_unavailable() -> Error {
    let reason = tokio::task::spawn_blocking(crate::hibernate::unavailable_reason)
        .await
        .unwrap_or_else(|e| format!("the CRIU probe failed: {e}"));
    Error::HibernateUnavailable(reason)
}

/// How long a pause waits for a network policy change under way (one bounded by the agent's
/// answers and the firewall's commit).
const CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

impl Manager {
    /// Pauses the sandbox `id`; one already paused stays as it is.
    pub fn pause(&self, id: &str) -> Result<Arc<Sb>> {
        let sb = self.get(id)?;
        // Destroyed under the freeze (its cgroups removed): gone, not what the freeze hit.
        self.pause_sb(&sb).map_err(|e| self.unless_gone(id, e))?;
        Ok(sb)
    }

    /// Resumes the sandbox `id`; one running stays as it is.
    pub fn resume(&self, id: &str) -> Result<Arc<Sb>> {
        let sb = self.get(id)?;
        self.resume_sb(&sb).map_err(|e| self.unless_gone(id, e))?;
        Ok(sb)
    }

    /// Freezes `sb` and stops its clocks; false if it was paused already. Blocking: a
    /// network policy change under way, which may be writing into the sandbox (its agent
    /// frozen mid-write would hold the change until a resume), finishes first.
    pub(crate) fn pause_sb(&self, sb: &Sb) -> Result<bool> {
        let t = Instant::now();
        let no_change = loop {
            match sb.net.changing.try_lock() {
                Ok(g) => break g,
                Err(_) if t.elapsed() < CHANGE_WAIT => std::thread::sleep(std::time::Duration::from_millis(2)),
                Err(_) => {
                    return Err(Error::Conflict(format!(
                        "sandbox {}: a network policy change is still under way; pause it again later",
                        sb.id
                    )))
                }
            }
        };
        let mut paused = lock(&sb.clock.paused);
        if paused.is_some() {
            return Ok(false);
        }
        sb.host.freeze().map_err(|e| Error::Conflict(format!("sandbox {} cannot be paused: {e}", sb.id)))?;
        let left = lock(&sb.clock.deadline).at.saturating_duration_since(Instant::now());
        *paused = Some(left);
        sb.clock.pauses.send_replace(true);
        drop(paused);
        drop(no_change);
        sb.clock.wake.notify_one();
        self.store_clock(sb);
        tracing::debug!(sandbox = %sb.id, left_ms = left.as_millis() as u64, "paused");
        Ok(true)
    }

    /// Thaws `sb` and restarts its clocks with the lifetime it had left (its idle period
    /// starts anew); false if it was running.
    pub(crate) fn resume_sb(&self, sb: &Sb) -> Result<bool> {
        let mut paused = lock(&sb.clock.paused);
        let Some(left) = *paused else { return Ok(false) };
        sb.host.thaw()?;
        *lock(&sb.clock.deadline) = Deadline::after(left);
        *paused = None;
        sb.clock.pauses.send_replace(false);
        drop(paused);
        sb.activity.touch();
        sb.clock.wake.notify_one();
        self.store_clock(sb);
        tracing::debug!(sandbox = %sb.id, "resumed");
        Ok(true)
    }

    /// Before a request reaches a sandbox's processes: resumes it if paused, unless it was
    /// created with `auto_resume: false` (then `Error::Paused`, and it stays paused).
    pub(crate) fn wake_for_request(&self, sb: &Sb) -> Result<()> {
        if !sb.auto_resume && sb.clock.paused().is_some() {
            return Err(Error::Paused(sb.id.clone()));
        }
        self.resume_sb(sb).map(drop)
    }

    /// Freezes again a paused sandbox thawed for its re-adoption's checks, unless a resume
    /// came in meanwhile.
    pub(super) fn refreeze(&self, sb: &Sb) {
        let paused = lock(&sb.clock.paused);
        if paused.is_some() {
            if let Err(e) = sb.host.freeze() {
                tracing::warn!(sandbox = %sb.id, "refreeze after re-adoption: {e}");
            }
        }
    }

    /// Stores the sandbox's pause state and deadline (what a restart adopts it with).
    pub(super) fn store_clock(&self, sb: &Sb) {
        if let Err(e) = self.store.set_config(&sb.id, &sb.config()) {
            tracing::error!(sandbox = %sb.id, "store pause state: {e}");
        }
        if let Err(e) = self.store.set_deadline(&sb.id, sb.deadline().wall) {
            tracing::error!(sandbox = %sb.id, "store deadline: {e}");
        }
    }
}
