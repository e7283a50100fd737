//! Start-up reconciliation: every sandbox a previous daemon left is re-adopted (see `adopt`)
//! or cleaned up completely, with the reason recorded; nothing is leaked.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use glovebox_proto::api::EndReason;

use super::Manager;

impl Manager {
    /// Re-adopts the intact sandboxes a previous daemon on this data dir left (see `adopt`)
    /// and cleans up every other sandbox whose owner died (its uid slot is no longer locked):
    /// kills its processes, removes its cgroups and directory, records why. Sandboxes of
    /// other live processes sharing the run dir, and those another data dir's daemon will
    /// adopt, are left alone.
    pub(super) fn reconcile(self: &Arc<Self>) {
        let t0 = Instant::now();
        let mut adopted = 0usize;
        for o in self.backend.orphans() {
            let why = match self.adopt_orphan(&o.id, &o.dir, o.slot) {
                crate::manager::adopt::Disposition::Adopted => {
                    adopted += 1;
                    continue;
                }
                crate::manager::adopt::Disposition::NotOurs => continue,
                crate::manager::adopt::Disposition::Cleanup(why) => why,
            };
            tracing::warn!(sandbox = %o.id, "cleaning up sandbox left by a previous daemon: {why}");
            self.backend.clean(&o);
            let reason = match self.store.sandbox(&o.id) {
                // Ended before the crash (teardown interrupted): its reason stands.
                Ok(Some(r)) if r.end_reason.is_some() => r.end_reason.unwrap_or(EndReason::DaemonRestart),
                Ok(Some(_)) => {
                    self.record_end(&o.id, EndReason::DaemonRestart, Some(&why));
                    EndReason::DaemonRestart
                }
                // Never handed out (a warm sandbox) or not this data dir's: only remembered.
                _ => {
                    let _ = self.store.end_sandbox(&o.id, EndReason::DaemonRestart, SystemTime::now());
                    EndReason::DaemonRestart
                }
            };
            self.registry.remember(&o.id, reason);
        }
        self.forget_vanished();
        if adopted > 0 {
            tracing::info!("re-adopted {adopted} sandboxes in {} ms", t0.elapsed().as_millis());
        }
        self.backend.sweep();
        // Firewall tables of dead daemons (their sandboxes' links died with the sandboxes).
        crate::net::reap_stale_tables();
        self.backend.reap_stale_bases();
    }
}
