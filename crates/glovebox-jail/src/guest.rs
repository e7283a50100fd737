//! The agent as PID 1 of a guest kernel: gVisor's sentry today (`runsc`, started by
//! [`crate::gvisor`]), a microVM's kernel later. There the isolation boundary is the guest
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

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

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

/// Sets up PID 1 of a guest and returns what the agent serves with. The command cgroup is
/// absent (the host's cgroup holds the whole guest; commands are killed by process group),
/// and so are precompiled filters (the agent compiles its own).
pub fn init(args: &InitArgs) -> Result<Booted> {
    sys::default_signals().ctx("reset signal dispositions")?;
    sys::ignore_sigpipe().ctx("ignore SIGPIPE")?;
    let dir = Path::new(SOCKET_DIR);
    let path = dir.join(SOCKET_NAME);
    let listener = UnixListener::bind(&path).ctx_at("bind agent socket", &path)?;
    // Covered, not unmounted: under gVisor a detached gofer mount takes its bound socket
    // with it (accept fails with EIO). An empty, read-only tmpfs on top leaves the path
    // leading nowhere and nothing to bind in; only a process with CAP_SYS_ADMIN could lift
    // it, and no command has any capability.
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    sys::mount(Some("none"), dir, Some("tmpfs"), flags, Some("size=4k,mode=0"))
        .ctx_at("cover the socket directory", dir)?;
    sys::lower_rlimit(libc::RLIMIT_CORE, 0, 0).ctx("rlimit core")?;
    sys::lower_rlimit(libc::RLIMIT_NOFILE, 1 << 16, 1 << 16).ctx("rlimit nofile")?;
    sys::lower_rlimit(libc::RLIMIT_NPROC, args.pids, args.pids).ctx("rlimit nproc")?;
    sys::prctl(libc::PR_SET_DUMPABLE, 0).ctx("prctl dumpable")?;
    crate::child::probe_securebits();
    // stdin and stdout go nowhere (stderr is the agent log the runtime gave); every other
    // inherited fd is closed, the listener moved above them.
    let devnull = File::open("/dev/null").ctx("open /dev/null")?;
    sys::dup2(devnull.as_raw_fd(), 0).ctx("stdin")?;
    sys::dup2(devnull.as_raw_fd(), 1).ctx("stdout")?;
    drop(devnull);
    let lfd = OwnedFd::from(listener);
    sys::dup2(lfd.as_raw_fd(), LISTENER_FD).ctx("dup listener")?;
    drop(lfd);
    sys::close_range(3, LISTENER_FD as u32 - 1).ctx("close inherited fds")?;
    sys::close_range(LISTENER_FD as u32 + 1, u32::MAX).ctx("close inherited fds")?;
    sys::set_cloexec(LISTENER_FD, true).ctx("cloexec listener")?;
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    // SAFETY: LISTENER_FD was dup2'ed from the listener above (whose original is closed) and
    // nothing else in this process refers to it.
    let listener = unsafe { std::os::fd::FromRawFd::from_raw_fd(LISTENER_FD) };
    Ok(Booted { listener, command_cgroup: None, pids: args.pids, seccomp: None, agent_seccomp: None })
}

/// The listener's fd number (the jailer's too).
const LISTENER_FD: i32 = 10;

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
