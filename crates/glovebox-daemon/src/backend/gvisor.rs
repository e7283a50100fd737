//! The gVisor tier (`isolation: "gvisor"`): the sandbox's processes run on gVisor's sentry
//! (`runsc`), a kernel in user space, instead of on the host kernel. Everything around them
//! is the jail's: the same uid slot and run directory, the same host cgroups (which hold the
//! sentry, the gofer and every stub process), the same namespace linked ahead with the same
//! host-side rules on its veth, the same root layers and disk cap, the same agent as PID 1
//! speaking the same protocol. `glovebox_jail::gvisor` builds and starts it.
//!
//! Invariants:
//! - Every gVisor sandbox boots in a network namespace linked ahead: runsc's netstack takes
//!   over the links it finds at start, so a live policy update may only change host rules.
//!   A `deny-all` sandbox's link is held shut on the host side.
//! - Its run directory says `gvisor` in `tier`, so a restart re-adopts it as one.
//! - Signals and waits go through pidfds of the sentry and the gofer (the daemon's children
//!   once the helper exits: it is their subreaper).

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glovebox_jail::cgroup::{Cgroup, Stats};
use glovebox_proto::api::Limits;

use super::jail::cgroup_limits;
use super::jailed::pidfd_alive;
use super::{Instance, WritableLayer};
use crate::error::{Error, Result};
use crate::net::Net;
use crate::slots::Slot;

/// The file in a sandbox's run directory naming its tier (absent: the process jail).
pub(super) const TIER_FILE: &str = "tier";
pub(super) const TIER: &str = "gvisor";

/// How the daemon runs runsc.
#[derive(Debug, Clone)]
pub struct Runsc {
    pub path: PathBuf,
    /// `ptrace` (default) or `kvm`.
    pub platform: String,
    /// Where runsc's debug logs go (`GLOVEBOX_GVISOR_DEBUG_LOG`), if anywhere.
    pub debug_log: Option<PathBuf>,
}

impl Runsc {
    /// `runsc` as the environment names it (`GLOVEBOX_RUNSC`, `GLOVEBOX_GVISOR_PLATFORM`), else
    /// Debian's. The error says why the tier is unavailable.
    pub fn detect() -> std::result::Result<Runsc, String> {
        let path = match std::env::var_os("GLOVEBOX_RUNSC") {
            Some(p) => PathBuf::from(p),
            None => ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .ok_or("runsc is not installed (Debian: apt-get install runsc)")?,
        };
        if !path.is_file() {
            return Err(format!("runsc not found at {}", path.display()));
        }
        let platform = std::env::var("GLOVEBOX_GVISOR_PLATFORM").unwrap_or_else(|_| "ptrace".into());
        if !matches!(platform.as_str(), "ptrace" | "kvm" | "systrap") {
            return Err(format!("unknown gVisor platform {platform:?} (ptrace, kvm or systrap)"));
        }
        let debug_log = std::env::var_os("GLOVEBOX_GVISOR_DEBUG_LOG").map(PathBuf::from);
        Ok(Runsc { path, platform, debug_log })
    }
}

/// Host pids a gVisor sandbox with a cap of `pids` processes may use. Inside, the guest's own
/// pids cgroup holds it to `pids` tasks (`glovebox_jail::guest`); on the host, gVisor's
/// ptrace platform needs a stub process per guest address space and, in it, a stub thread
/// per sentry thread that ran there, besides the sentry's and the gofer's own threads:
/// 70-110 for an idle or ordinary sandbox (measured), over 2,000 for a fork bomb at a cap of
/// 64 (every task forking at once from many sentry threads). This cap protects the host's pid
/// space (32,768 on many hosts); a guest that outgrows it makes the sentry fail to start a
/// stub, and the sandbox ends (reason `error`).
pub(super) fn host_pids(pids: u64) -> u64 {
    pids.saturating_mul(8).saturating_add(256)
}

/// The host cgroup limits of a gVisor sandbox with `l`.
pub(super) fn gvisor_cgroup_limits(l: &Limits) -> glovebox_jail::cgroup::Limits {
    glovebox_jail::cgroup::Limits { pids: host_pids(l.pids), ..cgroup_limits(l) }
}

/// One gVisor sandbox.
pub(super) struct Gvisored {
    pub(super) id: String,
    /// The sentry's pid and pidfd: the sandbox lives as long as it does.
    pub(super) sentry: i32,
    pub(super) sentry_fd: Option<OwnedFd>,
    /// The gofer's pidfd (absent after a restart when it is gone already).
    pub(super) gofer_fd: Option<OwnedFd>,
    /// The helper's pidfd: it stays as the reaper of the sandbox's host processes and exits
    /// after the last (`glovebox_jail::gvisor`).
    pub(super) helper_fd: Option<OwnedFd>,
    pub(super) socket: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) cgroup: Box<dyn Cgroup>,
    pub(super) slot: Slot,
    /// The rules of its link made ahead are this backend's to remove (absent when re-adopted:
    /// then the manager's teardown removes them).
    pub(super) ahead: Option<Arc<Net>>,
    /// Its host processes as `kill` found them, for `release` to reap what ends as ours.
    pub(super) members: std::sync::Mutex<Vec<i32>>,
}

pub(super) fn pidfd(pid: i32) -> Option<OwnedFd> {
    rustix::process::Pid::from_raw(pid)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
}

impl Instance for Gvisored {
    fn id(&self) -> &str {
        &self.id
    }

    fn pid(&self) -> i32 {
        self.sentry
    }

    fn slot(&self) -> u32 {
        self.slot.index
    }

    fn linked_ahead(&self) -> bool {
        true
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn agent_socket(&self) -> &Path {
        &self.socket
    }

    /// The sentry runs and is not on its way out: an OOM kill reaches the sentry (it holds
    /// the guest's memory), whose many threads take a while to exit, and a request that lost
    /// its agent connection meanwhile must hear the sandbox is gone, not that the agent failed.
    fn alive(&self) -> bool {
        pidfd_alive(self.sentry_fd.as_ref()) && !doomed(self.sentry)
    }

    fn exit_fd(&self) -> Option<OwnedFd> {
        self.sentry_fd.as_ref().and_then(|fd| fd.try_clone().ok())
    }

    fn stats(&self) -> Option<Stats> {
        self.cgroup.stats().ok()
    }

    fn cpu_usage_usec(&self) -> Option<u64> {
        self.cgroup.cpu_usage_usec().ok()
    }

    fn oom_kills(&self) -> u64 {
        self.cgroup.oom_kills().unwrap_or(0)
    }

    fn set_limits(&self, limits: &Limits) -> Result<()> {
        self.cgroup.set_limits(&gvisor_cgroup_limits(limits)).map_err(|e| Error::Start(format!("cgroup: {e}")))
    }

    fn set_background(&self, background: bool) -> Result<()> {
        self.cgroup.set_background(background).map_err(|e| Error::Start(format!("cgroup: {e}")))
    }

    /// The host freezer stops the sentry and every stub where they stand.
    fn freeze(&self) -> Result<()> {
        self.cgroup.freeze().map_err(|e| Error::Internal(format!("freeze sandbox {}: {e}", self.id)))
    }

    fn thaw(&self) -> Result<()> {
        self.cgroup.thaw().map_err(|e| Error::Internal(format!("thaw sandbox {}: {e}", self.id)))
    }

    /// The writable layer lives in a mount namespace only the gofer holds, and its files are
    /// owned as the guest sees them: snapshots are the process jail's for now.
    fn writable_layer(&self) -> Option<WritableLayer> {
        None
    }

    /// Killing the sentry ends every process of the guest (they are its tasks; their stub
    /// processes die with it); the gofer is killed beside it. Both are reaped when they are
    /// our children, else waited for (bounded, 5 s). False: not seen gone.
    fn kill(&self) -> bool {
        use rustix::process::{pidfd_send_signal, Signal};
        let Some(sentry) = &self.sentry_fd else { return false };
        // Every host process of the sandbox, read before any of them dies (a dead one leaves
        // its cgroup): see `reap_orphans`.
        *self.members.lock().unwrap_or_else(|p| p.into_inner()) = cgroup_members(&*self.cgroup);
        let _ = pidfd_send_signal(sentry, Signal::KILL);
        if let Some(g) = &self.gofer_fd {
            let _ = pidfd_send_signal(g, Signal::KILL);
        }
        // A frozen (paused) sandbox dies only once it runs again (v1 freezer).
        let _ = self.cgroup.thaw();
        let gone = |fd: Option<&OwnedFd>| {
            use rustix::process::{waitid, WaitId, WaitIdOptions};
            let Some(fd) = fd else { return true };
            if waitid(WaitId::PidFd(fd.as_fd()), WaitIdOptions::EXITED).is_ok() {
                return true;
            }
            let t = Instant::now();
            while pidfd_alive(Some(fd)) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            !pidfd_alive(Some(fd))
        };
        let s = gone(Some(sentry));
        let g = gone(self.gofer_fd.as_ref());
        // The helper reaps the stubs the sentry leaves, then exits; one still there after
        // that is ended (its orphans then pass to this daemon, which the leak check shows).
        let h = gone(self.helper_fd.as_ref()) || {
            if let Some(fd) = &self.helper_fd {
                let _ = pidfd_send_signal(fd, Signal::KILL);
            }
            gone(self.helper_fd.as_ref())
        };
        s && g && h
    }

    /// Removes its cgroups (killing through them whatever is left: stubs take a moment to
    /// follow their sentry), its run directory and runsc's state in it, and its link's rules.
    fn release(&self, _gone: bool) -> std::result::Result<(), String> {
        let cg = &self.cgroup;
        // Those `kill` saw, and any left for the cgroup to kill below (stubs whose helper
        // was gone before them are this daemon's children then).
        let mut members = std::mem::take(&mut *self.members.lock().unwrap_or_else(|p| p.into_inner()));
        members.extend(cgroup_members(&**cg));
        let mut last = Err(String::new());
        for _ in 0..100 {
            last = match cg.destroy() {
                Ok(()) => Ok(()),
                Err(e) => {
                    let _ = cg.kill_all();
                    std::thread::sleep(Duration::from_millis(20));
                    Err(format!("cgroup: {e}"))
                }
            };
            if last.is_ok() {
                break;
            }
        }
        reap_orphans(&members, Duration::from_secs(1));
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(net) = &self.ahead {
            net.detach(self.slot.index);
        }
        last
    }
}

/// The pids in the sandbox's cgroups (one `cgroup.procs` per v1 hierarchy: a process is in
/// each; duplicates are dropped).
fn cgroup_members(cg: &dyn Cgroup) -> Vec<i32> {
    let mut pids: Vec<i32> = cg
        .procs_files()
        .iter()
        .filter_map(|f| fs::read_to_string(f).ok())
        .flat_map(|body| body.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<i32>>())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Reaps those of `members` (a sandbox's host processes, read before it was killed) that
/// ended as this daemon's children. The helper reaps the sentry's stub processes; one killed
/// from outside first (a host admin, the OOM killer) passes them to the nearest subreaper,
/// this daemon, which otherwise never waits for them: measured, seven zombies per such
/// sandbox. Only a pid still our child and a zombie is waited for, so no other waiter's
/// process is taken (ours are alive until reaped, and a pid is not reused before). Waits up
/// to `bound` for members still exiting.
fn reap_orphans(members: &[i32], bound: Duration) {
    let me = std::process::id() as i32;
    let mut left: Vec<i32> = members.iter().copied().filter(|p| *p != me).collect();
    let t = Instant::now();
    loop {
        left.retain(|&pid| match parent_and_state(pid) {
            Some((ppid, state)) if ppid == me => {
                if state != 'Z' {
                    return true; // ours, still exiting
                }
                let _ = glovebox_jail::sys::waitpid(pid, libc::WNOHANG);
                false
            }
            _ => false, // gone, or someone else's (the helper's, as it should be)
        });
        if left.is_empty() || t.elapsed() >= bound {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process's parent pid and state letter (`/proc/PID/stat`).
fn parent_and_state(pid: i32) -> Option<(i32, char)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((f.next()?.parse().ok()?, state))
}

/// Records the helper's pid and start time in the sandbox's directory.
pub(super) fn record_helper(dir: &Path, pid: i32) {
    let start = crate::store::proc_start_time(pid).unwrap_or(0);
    if let Err(e) = fs::write(dir.join("helper"), format!("{pid} {start}")) {
        tracing::warn!("record the gVisor helper: {e}");
    }
}

/// A pidfd of the helper recorded in `dir`, if that very process still runs.
pub(super) fn recorded_helper(dir: &Path) -> Option<OwnedFd> {
    let body = fs::read_to_string(dir.join("helper")).ok()?;
    let (pid, start) = body.trim().split_once(' ')?;
    let (pid, start) = (pid.parse::<i32>().ok()?, start.parse::<u64>().ok()?);
    let fd = pidfd(pid)?;
    (crate::store::proc_start_time(pid) == Some(start)).then_some(fd)
}

/// Whether process `pid` is exiting or has a SIGKILL pending (`/proc/PID/stat`: a zombie or
/// dead state, the `PF_EXITING` flag, or bit 9 of its pending signals).
fn doomed(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    let Some((_, rest)) = stat.rsplit_once(')') else { return false };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command name: state (0), ..., flags (6), ..., signal (28: pending, as decimal).
    let state = f.first().copied().unwrap_or("");
    let flags = f.get(6).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let pending = f.get(28).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0 || pending & (1 << (libc::SIGKILL - 1)) != 0
}

/// The sentry's and gofer's pids runsc recorded for sandbox `id` in its run directory.
pub(super) fn recorded_pids(dir: &Path, id: &str) -> Option<(i32, i32)> {
    let body = fs::read(dir.join("runsc").join(format!("{id}_sandbox:{id}.state"))).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let pid = |x: &serde_json::Value| x.as_i64().filter(|p| *p > 1 && *p <= i32::MAX as i64).map(|p| p as i32);
    Some((pid(&v["sandbox"]["pid"])?, pid(&v["goferPid"])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_pids_cap_leaves_room_for_the_sentry() {
        assert_eq!(host_pids(100), 1056);
        assert_eq!(host_pids(u64::MAX), u64::MAX);
        let l = Limits { cpus: 1.0, memory_mb: 512, disk_mb: 1024, pids: 64 };
        let c = gvisor_cgroup_limits(&l);
        assert_eq!((c.pids, c.memory_bytes), (768, 512 << 20));
    }

    #[test]
    fn a_running_process_is_not_doomed_and_a_reaped_one_is() {
        assert!(!doomed(std::process::id() as i32));
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id() as i32;
        c.wait().unwrap();
        assert!(doomed(pid) || std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    /// A zombie child of ours among the members is reaped; a live child is waited for only
    /// up to the bound and left to its own waiter.
    #[test]
    fn orphans_that_ended_as_our_zombies_are_reaped() {
        // Reaped by `reap_orphans`: what is tested.
        #[allow(clippy::zombie_processes)]
        let dead = std::process::Command::new("true").spawn().unwrap();
        let mut live = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let (d, l) = (dead.id() as i32, live.id() as i32);
        let t = Instant::now();
        while parent_and_state(d).map(|(_, s)| s) != Some('Z') {
            assert!(t.elapsed() < Duration::from_secs(5), "true did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
        reap_orphans(&[d, l, std::process::id() as i32], Duration::from_millis(50));
        assert_eq!(parent_and_state(d), None, "the zombie was not reaped");
        assert_eq!(parent_and_state(l).map(|(_, s)| s == 'Z'), Some(false), "the live child was touched");
        live.kill().unwrap();
        live.wait().unwrap();
    }

    #[test]
    fn recorded_pids_come_from_runsc_state() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("runsc")).unwrap();
        fs::write(
            t.path().join("runsc/sb_sandbox:sb.state"),
            r#"{"id":"sb","goferPid":41,"sandbox":{"id":"sb","pid":42}}"#,
        )
        .unwrap();
        assert_eq!(recorded_pids(t.path(), "sb"), Some((42, 41)));
        assert_eq!(recorded_pids(t.path(), "other"), None);
    }
}
