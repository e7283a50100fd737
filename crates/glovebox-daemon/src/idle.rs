//! Activity of a sandbox, for the idle clock.
//!
//! A sandbox is active while any of these holds: an API request on it is being handled, a
//! response of it is still streaming (exec and code streams, downloads), a command runs in
//! it (foreground or background; language kernels waiting for cells do not count), or it
//! got a request or a keep-alive within its `idle_timeout_s`. Only a sandbox idle by every
//! one of these measures for the whole period is stopped (reason `idle`).
//!
//! Invariant: every guard handed out is dropped exactly once (it is an RAII value), so the
//! busy count cannot stay raised by a request that ended. The HTTP layer holds a guard for
//! each request on a sandbox (`http::activity`); the manager's idle clock asks the agent
//! whether commands run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug)]
pub struct Activity {
    busy: AtomicUsize,
    last: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { busy: AtomicUsize::new(0), last: Mutex::new(Instant::now()) }
    }
}

/// Held while something is using the sandbox.
pub struct Guard(Arc<Activity>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    pub fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    pub fn guard(self: &Arc<Self>) -> Guard {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.touch();
        Guard(self.clone())
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    pub fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_keep_busy_until_dropped() {
        let a = Arc::new(Activity::default());
        assert!(!a.busy());
        let t0 = a.last();
        let g1 = a.guard();
        let g2 = a.guard();
        assert!(a.busy());
        drop(g1);
        assert!(a.busy());
        drop(g2);
        assert!(!a.busy());
        assert!(a.last() >= t0);
    }
}
