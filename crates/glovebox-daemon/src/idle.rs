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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A spell this long with nothing in flight is a quiet moment (the daemon's background work
/// waits for one, see `backend::made_ahead`).
pub const QUIET: Duration = Duration::from_millis(5);

#[derive(Debug)]
pub struct Activity {
    busy: AtomicUsize,
    times: Mutex<Times>,
}

#[derive(Debug)]
struct Times {
    /// The last guard taken or dropped, or a touch.
    last: Instant,
    /// When the last quiet moment ([`QUIET`] or longer with no guard held) ended.
    quiet_ended: Instant,
}

impl Default for Activity {
    fn default() -> Self {
        let now = Instant::now();
        Activity { busy: AtomicUsize::new(0), times: Mutex::new(Times { last: now, quiet_ended: now }) }
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
    fn times(&self) -> MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn touch(&self) {
        self.times().last = Instant::now();
    }

    pub fn guard(self: &Arc<Self>) -> Guard {
        let was_idle = self.busy.fetch_add(1, Ordering::AcqRel) == 0;
        let now = Instant::now();
        let mut t = self.times();
        if was_idle && now.saturating_duration_since(t.last) >= QUIET {
            t.quiet_ended = now;
        }
        t.last = now;
        drop(t);
        Guard(self.clone())
    }

    /// How long since the last quiet moment: zero while one lasts.
    pub fn since_quiet(&self) -> Duration {
        let t = self.times();
        if !self.busy() && t.last.elapsed() >= QUIET {
            return Duration::ZERO;
        }
        t.quiet_ended.elapsed()
    }

    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    pub fn last(&self) -> Instant {
        self.times().last
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

    #[test]
    fn a_quiet_moment_is_a_spell_of_quiet_long_enough() {
        let a = Arc::new(Activity::default());
        std::thread::sleep(QUIET + Duration::from_millis(1));
        assert_eq!(a.since_quiet(), Duration::ZERO, "idle for longer than QUIET: quiet now");
        let g1 = a.guard();
        assert!(a.since_quiet() < QUIET, "the quiet moment just ended");
        // Guards that overlap leave no gap: no quiet moment however long they last.
        std::thread::sleep(QUIET);
        let g2 = a.guard();
        drop(g1);
        std::thread::sleep(QUIET);
        assert!(a.since_quiet() >= QUIET * 2, "{:?}", a.since_quiet());
        drop(g2);
        assert!(a.since_quiet() >= QUIET * 2, "just dropped: not quiet yet");
    }
}
