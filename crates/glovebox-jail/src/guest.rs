//! The agent as PID 1 of a guest kernel: gVisor's sentry today (`runsc`, started by
//! the `gvisor` module), a microVM's kernel later. There the isolation boundary is the guest
//! kernel itself, so nothing here makes namespaces or mounts a root: the runtime already
//! started this process as the guest's first, in its root. What is left is the part of the
//! jailer's PID 1 set-up that still applies (rlimits, non-dumpable, fds, environment) and
//! the agent's channel.
//!
//! The channel: a listening unix socket bound at `socket` (argv), in a directory the runtime
//! shares with the host and nothing else. Under gVisor its gofer creates the socket on the host
//! side (`--host-uds=create`), where the daemon connects; the sandbox end stays a socket of
//! the sentry's own. Right after binding, PID 1 covers that directory with an empty read-only tmpfs: no path
//! inside leads to the socket or to the host directory, for user code or anyone else; the
//! bound listener keeps working.
//!
//! Invariant: returns only with the listener bound and the shared directory detached; any
//! failure before that is fatal (the daemon then sees no socket and fails the boot closed).

use std::fs::{self, File};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

use crate::cgroup::KillMethod;
use crate::error::{Ctx, JailError, Result};
use crate::jailer::Booted;
use crate::sys;

/// Where the socket directory is mounted inside the guest (the runtime's config names it).
pub const SOCKET_DIR: &str = "/run/glovebox-agent";
/// The socket's name in it.
pub const SOCKET_NAME: &str = "agent.sock";

/// What the runtime passes on PID 1's command line (nothing secret: a sandbox can read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitArgs {
    /// Process cap, applied as RLIMIT_NPROC (as the jail does).
    pub pids: u64,
}

impl InitArgs {
    /// Parses `--pids N` (the only argument).
    pub fn parse(args: &[String]) -> Result<InitArgs> {
        match args {
            [flag, n] if flag == "--pids" => {
                let pids = n.parse::<u64>().map_err(|_| JailError::Config(format!("bad --pids {n:?}")))?;
                Ok(InitArgs { pids })
            }
            _ => Err(JailError::Config("usage: glovebox-agent init --pids N".into())),
        }
    }

    pub fn to_args(&self) -> Vec<String> {
        vec!["--pids".into(), self.pids.to_string()]
    }
}

/// Sets up PID 1 of a guest and returns what the agent serves with: the listener, the
/// guest's own command cgroup (when its kernel has a pids controller), and the commands'
/// filter for a guest kernel (the agent compiles its own filter as usual).
pub fn init(args: &InitArgs) -> Result<Booted> {
    sys::default_signals().ctx("reset signal dispositions")?;
    sys::ignore_sigpipe().ctx("ignore SIGPIPE")?;
    let dir = Path::new(SOCKET_DIR);
    let path = dir.join(SOCKET_NAME);
    let listener = UnixListener::bind(&path).ctx_at("bind agent socket", &path)?;
    // Covered, not unmounted: under gVisor a detached gofer mount takes its bound socket
    // with it (accept fails with EIO). First a private tmpfs holding the guest's own pids
    // cgroup hierarchy, then an empty, read-only tmpfs on top of both: the path leads
    // nowhere and there is nothing to bind in; only a process with CAP_SYS_ADMIN could lift
    // it, and no command has any capability.
    let quiet = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    sys::mount(Some("none"), dir, Some("tmpfs"), quiet, Some("size=64k,mode=0700"))
        .ctx_at("mount the agent's private directory", dir)?;
    let command_cgroup = match pids_cgroup(&dir.join("pids"), args.pids) {
        Ok(fd) => Some((fd, KillMethod::V1Pids)),
        Err(e) => {
            // The host's cgroup still caps the whole guest; commands are then ended by
            // process group only.
            eprintln!("agent: no pids cgroup in the guest: {e}");
            None
        }
    };
    sys::mount(Some("none"), dir, Some("tmpfs"), libc::MS_RDONLY | quiet, Some("size=4k,mode=0"))
        .ctx_at("cover the socket directory", dir)?;
    sys::lower_rlimit(libc::RLIMIT_CORE, 0, 0).ctx("rlimit core")?;
    sys::lower_rlimit(libc::RLIMIT_NOFILE, 1 << 16, 1 << 16).ctx("rlimit nofile")?;
    sys::lower_rlimit(libc::RLIMIT_NPROC, args.pids, args.pids).ctx("rlimit nproc")?;
    sys::prctl(libc::PR_SET_DUMPABLE, 0).ctx("prctl dumpable")?;
    crate::child::probe_securebits();
    // gVisor (2022) does not shield a PID 1 from its own namespace's signals, as Linux does:
    // any command of the same uid could kill the agent, and with it the sandbox. PID 1 keeps
    // euid 0 (and so its capabilities) but takes a real and saved uid no command has, so
    // kill(2) and its kin from a command without CAP_KILL are refused (EPERM).
    sys::setresuid3(AGENT_UID, 0, AGENT_UID).ctx("set the agent's real uid")?;
    // stdin and stdout go nowhere; stderr, the host's agent log until here (so a failed
    // start says why there), becomes a log inside the guest: gVisor lets any process of the
    // guest open PID 1's fds through /proc, and an open host file would let a command write
    // without bound into the host's run directory. The listener and the command cgroup go to
    // fixed numbers (as the jailer's), every other fd is closed.
    let devnull = File::open("/dev/null").ctx("open /dev/null")?;
    sys::dup2(devnull.as_raw_fd(), 0).ctx("stdin")?;
    sys::dup2(devnull.as_raw_fd(), 1).ctx("stdout")?;
    drop(devnull);
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(GUEST_LOG)
        .ctx_at("open the agent log", GUEST_LOG)?;
    sys::dup2(log.as_raw_fd(), 2).ctx("stderr")?;
    drop(log);
    // Both originals are below LISTENER_FD (a fresh process's first free numbers), so the
    // dup2s cannot clobber a source, and the close_range below takes the originals.
    let lfd = OwnedFd::from(listener).into_raw_fd();
    sys::dup2(lfd, LISTENER_FD).ctx("dup listener")?;
    let kill = match command_cgroup {
        Some((fd, kill)) => {
            sys::dup2(fd.into_raw_fd(), CGROUP_FD).ctx("dup command cgroup")?;
            Some(kill)
        }
        None => None,
    };
    sys::close_range(3, LISTENER_FD as u32 - 1).ctx("close inherited fds")?;
    let last_kept = if kill.is_some() { CGROUP_FD } else { LISTENER_FD };
    sys::close_range(last_kept as u32 + 1, u32::MAX).ctx("close inherited fds")?;
    for fd in [LISTENER_FD, CGROUP_FD] {
        let _ = sys::set_cloexec(fd, true);
    }
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    // SAFETY: LISTENER_FD was dup2'ed from the listener above (whose original is closed) and
    // nothing else in this process refers to it.
    let listener = unsafe { OwnedFd::from_raw_fd(LISTENER_FD) };
    // SAFETY: CGROUP_FD was dup2'ed from the cgroup directory above when `kill` is Some, and
    // nothing else refers to it.
    let command_cgroup = kill.map(|k| (unsafe { OwnedFd::from_raw_fd(CGROUP_FD) }, k));
    // The commands' filter narrowed for a guest kernel (`seccomp/guest.json`: no signal
    // owners); the agent's own filter is compiled by the agent as usual.
    let seccomp = crate::seccomp::compile_guest().map_err(|e| JailError::Seccomp(e.to_string()))?;
    Ok(Booted { listener, command_cgroup, pids: args.pids, seccomp: Some(seccomp), agent_seccomp: None })
}

/// The guest kernel's own pids controller (gVisor has one; its RLIMIT_NPROC is not
/// enforced), mounted at `at`: a `sandbox` cgroup capped at `pids` tasks that PID 1 joins
/// (so everything it starts is counted), and `sandbox/commands` for the agent's per-command
/// cgroups, returned as a directory fd (the path is covered right after). The hierarchy
/// lives as long as its mount, which stays under the cover.
fn pids_cgroup(at: &Path, pids: u64) -> Result<OwnedFd> {
    fs::create_dir(at).ctx_at("mkdir", at)?;
    let quiet = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    sys::mount(Some("none"), at, Some("cgroup"), quiet, Some("pids")).ctx_at("mount the pids cgroup", at)?;
    let sb = at.join("sandbox");
    fs::create_dir(&sb).ctx_at("mkdir", &sb)?;
    fs::write(sb.join("pids.max"), pids.to_string()).ctx_at("write pids.max", &sb)?;
    fs::write(sb.join("cgroup.procs"), sys::getpid().to_string()).ctx_at("join", &sb)?;
    let cmds = sb.join("commands");
    fs::create_dir(&cmds).ctx_at("mkdir", &cmds)?;
    // gVisor lets any process of the guest reach PID 1's fds through /proc (this one is
    // PID 1's fd 11): the cap and the parent of the commands' cgroups are made the agent's
    // uid's, so a command (uid 0 without capabilities) can neither raise the cap nor move
    // itself out; the per-command cgroups the agent makes below stay root's, as in the jail.
    for p in [sb.clone(), sb.join("pids.max"), sb.join("cgroup.procs"), sb.join("tasks"), cmds.clone()] {
        std::os::unix::fs::chown(&p, Some(AGENT_UID), Some(AGENT_UID)).ctx_at("chown", &p)?;
    }
    let d = File::open(&cmds).ctx_at("open", &cmds)?;
    Ok(OwnedFd::from(d))
}

/// The real and saved uid of a guest's PID 1: in no passwd, and refused to every command
/// (the agent's `exec` answers `invalid_argument` for it).
pub const AGENT_UID: u32 = 0x7fff_fffe;

/// The agent's log inside a guest, after its start (see `init`).
pub const GUEST_LOG: &str = "/run/glovebox/agent.log";

/// The listener's and the command cgroup's fd numbers (the jailer's too).
const LISTENER_FD: i32 = 10;
const CGROUP_FD: i32 = 11;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_args_round_trip() {
        let a = InitArgs { pids: 256 };
        assert_eq!(InitArgs::parse(&a.to_args()).unwrap(), a);
        assert!(InitArgs::parse(&["--pids".into(), "x".into()]).is_err());
        assert!(InitArgs::parse(&[]).is_err());
    }
}
