//! One jailed sandbox as the jail backend holds it: its agent's pidfd, its cgroups, its run
//! directory and its uid slot; killing it and releasing what it leaves.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glovebox_jail::cgroup::{Cgroup, Stats};
use glovebox_proto::api::Limits;

use super::jail::cgroup_limits;
use super::Instance;
use crate::error::{Error, Result};
use crate::net::Net;
use crate::slots::Slot;

/// One jailed sandbox.
pub(super) struct Jailed {
    pub(super) id: String,
    pub(super) pid: i32,
    /// A pidfd of the agent (PID 1): signals and waits cannot hit a recycled pid.
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) socket: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) cgroup: Box<dyn Cgroup>,
    /// Held while the sandbox lives; dropping it frees the uid range.
    pub(super) slot: Slot,
    /// Started in a network namespace linked ahead: the rules it was linked with are this
    /// backend's to remove (see [`Instance::linked_ahead`]).
    pub(super) ahead: Option<Arc<Net>>,
    /// Its python kernel forked from its template's zygote, until a kernel takes it.
    pub(super) kernel: std::sync::Mutex<Option<crate::kernels::Forked>>,
    /// Its mount namespace, held until [`Instance::release`]: the last of its processes to
    /// exit would otherwise unmount its whole tree (the root's tmpfs, the overlays, `/proc`,
    /// `/dev`) inside the exit the kill waits for — a third of that wait.
    pub(super) mounts: std::sync::Mutex<Option<OwnedFd>>,
}

/// Opens PID 1's mount namespace, checked through its pidfd to be that very process's (a
/// recycled pid would be another process's namespace: then none is held).
pub(super) fn hold_mounts(pid: i32, pidfd: Option<&OwnedFd>) -> std::sync::Mutex<Option<OwnedFd>> {
    let fd = fs::File::open(format!("/proc/{pid}/ns/mnt")).ok().map(OwnedFd::from);
    std::sync::Mutex::new(fd.filter(|_| pidfd_alive(pidfd)))
}

impl Instance for Jailed {
    fn id(&self) -> &str {
        &self.id
    }

    fn pid(&self) -> i32 {
        self.pid
    }

    fn slot(&self) -> u32 {
        self.slot.index
    }

    fn linked_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn agent_socket(&self) -> &Path {
        &self.socket
    }

    fn alive(&self) -> bool {
        pidfd_alive(self.pidfd.as_ref())
    }

    fn exit_fd(&self) -> Option<OwnedFd> {
        self.pidfd.as_ref().and_then(|fd| fd.try_clone().ok())
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

    fn forked_kernel(&self) -> Option<&std::sync::Mutex<Option<crate::kernels::Forked>>> {
        Some(&self.kernel)
    }

    fn set_limits(&self, limits: &Limits) -> Result<()> {
        self.cgroup.set_limits(&cgroup_limits(limits)).map_err(|e| Error::Start(format!("cgroup: {e}")))
    }

    fn set_background(&self, background: bool) -> Result<()> {
        self.cgroup.set_background(background).map_err(|e| Error::Start(format!("cgroup: {e}")))
    }

    fn freeze(&self) -> Result<()> {
        self.cgroup.freeze().map_err(|e| Error::Internal(format!("freeze sandbox {}: {e}", self.id)))
    }

    fn writable_layer(&self) -> Option<super::WritableLayer> {
        // PID 1 holds it open (`glovebox_jail::jailer::UPPER_FD`); the pidfd check after the
        // open (see `snapshots::capture`) makes sure the pid was not recycled meanwhile.
        Some(super::WritableLayer {
            path: PathBuf::from(format!("/proc/{}/fd/{}", self.pid, glovebox_jail::jailer::UPPER_FD)),
            uid_base: self.slot.uid_base(),
        })
    }

    fn thaw(&self) -> Result<()> {
        self.cgroup.thaw().map_err(|e| Error::Internal(format!("thaw sandbox {}: {e}", self.id)))
    }

    /// Killing PID 1 of its pid namespace makes the kernel kill every other process in it,
    /// and PID 1's exit completes only once they are all gone, so its exit is the proof:
    /// reaped when it is our child, its pidfd readable when it is not (adopted after a
    /// restart). False: no pidfd, or still there after 5 s.
    fn kill(&self) -> bool {
        use rustix::process::{pidfd_send_signal, waitid, Signal, WaitId, WaitIdOptions};
        let Some(fd) = &self.pidfd else { return false };
        let _ = pidfd_send_signal(fd, Signal::KILL);
        // A frozen (paused) sandbox dies only once it runs again (v1 freezer): thawed after
        // the signal, no process runs another instruction of its own.
        let _ = self.cgroup.thaw();
        if waitid(WaitId::PidFd(fd.as_fd()), WaitIdOptions::EXITED).is_ok() {
            return true;
        }
        // Not our child: wait, bounded, for it to exit.
        let t = Instant::now();
        while pidfd_alive(Some(fd)) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        !pidfd_alive(Some(fd))
    }

    /// Removes its cgroups (killing through them whatever is still there, the fallback for
    /// anything odd), its run directory, and the rules of a link made ahead.
    fn release(&self, gone: bool) -> std::result::Result<(), String> {
        // First: its mounts go now (this thread unmounts them), so the pages of its tmpfs
        // are freed before its memory cgroup is removed.
        drop(crate::util::lock(&self.mounts).take());
        let cg = &self.cgroup;
        let destroyed = match cg.destroy() {
            Ok(()) => Ok(()),
            Err(_) => {
                if !gone {
                    tracing::debug!(sandbox = %self.id, "agent not seen gone; killing the cgroup");
                }
                // Processes of a killed pid namespace take a moment to leave their cgroups.
                let mut last = Err(String::new());
                for _ in 0..50 {
                    let killed = cg.kill_all().map(drop).map_err(|e| format!("kill: {e}"));
                    last = killed.and(cg.destroy().map_err(|e| format!("cgroup: {e}")));
                    if last.is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                last
            }
        };
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(net) = &self.ahead {
            net.detach(self.slot.index);
        }
        destroyed
    }
}

/// Whether a process still runs (a pidfd becomes readable when it exits).
pub(super) fn pidfd_alive(fd: Option<&OwnedFd>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    match fd {
        Some(fd) => {
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            matches!(poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })), Ok(0))
        }
        None => false,
    }
}
