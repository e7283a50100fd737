//! What the process jail makes ahead of the sandboxes that will use it, off the requests'
//! path: network namespaces, the next create's shell (uid slot, run directory, cgroups), and
//! shells whose network namespace is already linked for creates whose policy needs a link.
//! Refills wait for a quiet moment, so they do not slow the requests they are made for.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glovebox_jail::cgroup::{self, Cgroup};

use crate::idle::{Activity, QUIET};
use crate::slots::Slot;
use crate::util::lock;

/// A refill waits for a quiet moment ([`QUIET`] with no sandbox work in flight), at most this
/// long (under sustained load there is no quiet moment).
const QUIET_BOUND: Duration = Duration::from_millis(50);

/// How much longer to wait, since `start`, for a moment with no sandbox work in flight for
/// [`QUIET`] (never past [`QUIET_BOUND`]); `None` once it has come.
pub(crate) fn quiet_wait(work: &Activity, start: Instant) -> Option<Duration> {
    let quiet_for = if work.busy() { Duration::ZERO } else { work.last().elapsed() };
    let waited = start.elapsed();
    if quiet_for >= QUIET || waited >= QUIET_BOUND {
        return None;
    }
    Some((QUIET - quiet_for).min(QUIET_BOUND - waited).max(Duration::from_millis(1)))
}

/// Blocks until a quiet moment (see [`quiet_wait`]).
pub(crate) fn quiet_moment(work: &Activity) {
    let start = Instant::now();
    while let Some(step) = quiet_wait(work, start) {
        std::thread::sleep(step);
    }
}

/// For the release of a destroyed sandbox: a quiet moment if one is likely near (one came
/// within the last [`QUIET_BOUND`]), else at once. With requests back to back none comes, and
/// waiting out the bound would drop the release on a later request at random; at once it
/// runs in the gap its destroy's answer leaves, as it did before releases waited.
pub(crate) fn release_moment(work: &Activity) {
    if work.since_quiet() <= QUIET_BOUND {
        quiet_moment(work);
    }
}

/// Blocks until no sandbox work is in flight (the create that took what is being replaced
/// has been answered), at most [`QUIET_BOUND`].
pub(crate) fn between_requests(work: &Activity) {
    let start = Instant::now();
    while work.busy() && start.elapsed() < QUIET_BOUND {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Network namespaces kept ready.
const NETNS_POOL: usize = 4;
/// Below this many ready, a refill makes the next one at once instead of waiting for a
/// quiet moment.
const NETNS_LOW: usize = 2;

/// Network namespaces made ahead of time (loopback up, nothing else). Making one costs about a
/// millisecond of kernel time (the loopback device, per-namespace sysctl tables) that a
/// sandbox's start then does not wait for; the pool is topped up on a thread of its own.
pub(super) struct NetnsPool {
    fds: Mutex<Vec<OwnedFd>>,
    filling: AtomicBool,
    /// Sandbox work in flight (the manager's): refills wait for a quiet moment while
    /// namespaces are still at hand (see [`NETNS_LOW`]).
    work: Arc<Activity>,
}

impl NetnsPool {
    pub(super) fn new(work: Arc<Activity>) -> NetnsPool {
        NetnsPool { fds: Mutex::default(), filling: AtomicBool::new(false), work }
    }

    /// One namespace, if one is ready; starts a refill either way.
    pub(super) fn take(self: &Arc<Self>) -> Option<OwnedFd> {
        let ns = lock(&self.fds).pop();
        self.refill();
        ns
    }

    /// One namespace, if one is ready; nothing is made to replace it.
    pub(super) fn take_last(&self) -> Option<OwnedFd> {
        lock(&self.fds).pop()
    }

    /// Makes one namespace now, on the caller's thread (no refill follows).
    pub(super) fn make_one(&self) {
        match glovebox_jail::sys::new_netns() {
            Ok(fd) => lock(&self.fds).push(fd),
            Err(e) => tracing::debug!("network namespace made ahead: {e}"),
        }
    }

    pub(super) fn refill(self: &Arc<Self>) {
        if self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("glovebox-netns-pool".into()).spawn(move || {
            while let Some(p) = this.upgrade() {
                let have = lock(&p.fds).len();
                if have >= NETNS_POOL {
                    p.filling.store(false, Ordering::Release);
                    return;
                }
                if have >= NETNS_LOW {
                    quiet_moment(&p.work);
                }
                match glovebox_jail::sys::new_netns() {
                    Ok(fd) => lock(&p.fds).push(fd),
                    Err(e) => {
                        // Left "filling" on purpose: no retries; sandboxes make their own.
                        tracing::warn!("pre-made network namespace: {e}; sandboxes make their own");
                        return;
                    }
                }
            }
        });
        if spawned.is_err() {
            self.filling.store(false, Ordering::Release);
        }
    }
}

/// The parts of a sandbox that need no process (see `Jail::make_shell`).
pub(super) struct Shell {
    pub id: String,
    pub slot: Slot,
    pub dir: PathBuf,
    pub cgroup: Box<dyn Cgroup>,
    pub limits: cgroup::Limits,
}

impl Shell {
    /// Removes a shell no sandbox was started in.
    pub(super) fn discard(self) {
        if let Err(e) = self.cgroup.destroy() {
            tracing::error!(sandbox = %self.id, "remove cgroup: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shell ready for the next create, and whether the jail is closing.
#[derive(Default)]
struct Ready {
    shell: Option<Shell>,
    closed: bool,
}

/// One shell made ahead with the default limits, so that a create without a warm sandbox
/// does not wait for its five cgroup `mkdir`s and its run directory. It is claimed like a
/// sandbox (the uid slot held, the run directory present), so no other daemon's
/// reconciliation removes it; its id is the next created sandbox's.
#[derive(Default)]
pub(super) struct Shells {
    ready: Mutex<Ready>,
    pub(super) filling: AtomicBool,
}

impl Shells {
    pub(super) fn take(&self) -> Option<Shell> {
        lock(&self.ready).shell.take()
    }

    pub(super) fn closed(&self) -> bool {
        lock(&self.ready).closed
    }

    /// Keeps `s` for the next create (discards it if the jail is closing).
    pub(super) fn put(&self, s: Shell) {
        let mut g = lock(&self.ready);
        let old = if g.closed { Some(s) } else { g.shell.replace(s) };
        drop(g);
        if let Some(old) = old {
            old.discard();
        }
    }

    /// No more shells: removes the one ready and waits (at most 2 s) for one being made,
    /// which then removes itself. Blocking.
    pub(super) fn close(&self) {
        let s = {
            let mut g = lock(&self.ready);
            g.closed = true;
            g.shell.take()
        };
        if let Some(s) = s {
            s.discard();
        }
        let t = Instant::now();
        while self.filling.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Below this many shells linked ahead, a refill makes the next one at once instead of
/// waiting for a quiet moment.
pub(super) const LINK_LOW: usize = 2;

/// A shell with a network namespace linked ahead for its slot (see `Net::link_ahead`): the
/// veth pair, addresses and route in place, the host end held shut until the sandbox started
/// in it is attached.
pub(super) struct Linked {
    pub shell: Shell,
    pub netns: OwnedFd,
}

impl Linked {
    /// Removes one no sandbox was started in: its hold, its namespace (the veth pair goes
    /// with it), then its shell.
    pub(super) fn discard(self, net: &crate::net::Net) {
        net.detach(self.shell.slot.index);
        drop(self.netns);
        self.shell.discard();
    }
}

#[derive(Default)]
struct LinkedReady {
    ready: Vec<Linked>,
    closed: bool,
}

/// Shells linked ahead (`Config::link_pool` of them), for creates whose policy needs a link:
/// such a create then only replaces its rules, instead of making a veth pair and configuring
/// both ends, which waits on the kernel's network configuration lock while other namespaces
/// are made or removed. Each holds its uid slot like the single shell made ahead (see
/// [`Shells`]), so the addresses it was linked with (its slot's) are the sandbox's.
pub(super) struct LinkedShells {
    ready: Mutex<LinkedReady>,
    pub(super) filling: AtomicBool,
    size: usize,
}

impl LinkedShells {
    pub(super) fn new(size: usize) -> LinkedShells {
        LinkedShells { ready: Mutex::default(), filling: AtomicBool::new(false), size }
    }

    pub(super) fn take(&self) -> Option<Linked> {
        lock(&self.ready).ready.pop()
    }

    /// How many are ready.
    pub(super) fn ready(&self) -> usize {
        lock(&self.ready).ready.len()
    }

    /// Whether one more is wanted (the pool below its size and not closing).
    pub(super) fn wanted(&self) -> bool {
        let g = lock(&self.ready);
        !g.closed && g.ready.len() < self.size
    }

    /// Keeps `l` for a create (discards it if the pool is closing).
    pub(super) fn put(&self, l: Linked, net: &crate::net::Net) {
        let mut g = lock(&self.ready);
        if g.closed {
            drop(g);
            l.discard(net);
        } else {
            g.ready.push(l);
        }
    }

    /// No more: removes those ready and waits (at most 2 s) for one being made, which then
    /// removes itself. Blocking.
    pub(super) fn close(&self, net: &crate::net::Net) {
        let ready = {
            let mut g = lock(&self.ready);
            g.closed = true;
            std::mem::take(&mut g.ready)
        };
        for l in ready {
            l.discard(net);
        }
        let t = Instant::now();
        while self.filling.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
