//! The jailer: turns a freshly exec'd, single-threaded host-root process into a sandbox's
//! PID 1. Runs inside the agent binary (`glovebox-agent jail`) so the agent needs no second
//! exec after `pivot_root`: nothing of the host is reachable from inside once this returns.
//!
//! ```text
//! jailer (host root)              A (new userns)              G (PID 1, all new namespaces)
//!  join cgroups, bind socket
//!  [setns(pre-made net ns)]
//!  unshare(mount ns), rslave /
//!  clone(NEWUSER) ─────────────▶  wait for "go"
//!  write uid/gid maps
//!  build rootfs (id-mapped)
//!  "go" ──────────────────────▶  setresuid(0) (= range base)
//!                                 unshare(mnt,pid,net,uts,ipc,
//!                                         cgroup,time)
//!                                 fork ─────────────────────▶ pivot_root, /proc, lo up,
//!                                 report pid, exit              rlimits, close fds,
//!  reap A, exit                                                 non-dumpable → agent
//! ```
//!
//! The time namespace keeps the kernel's zero offsets (nothing is written to
//! `timens_offsets`): the sandbox's `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` read as the host's,
//! so timestamps in logs and the daemon's timeouts agree, while a sandbox cannot change any
//! clock offset of another (a time namespace's offsets are fixed once a process is in it, and
//! PID 1 enters it at its fork, before any sandbox code runs). `CLOCK_REALTIME` is never
//! namespaced.
//!
//! Status lines go to fd 1 (a pipe the daemon reads): `pid N`, then `ready` or `error: …`.
//! Any failure ends every process of the sandbox: A and G exit, the jailer kills A, and the
//! daemon (which owns the cgroup) kills whatever is left.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use crate::cgroup::KillMethod;
use crate::config::JailConfig;
use crate::error::{Ctx, JailError, Result};
use crate::{rootfs, sys};

/// What the agent inherits from the jailer, at fixed fd numbers.
pub struct Booted {
    /// The listening socket the daemon connects to (one connection per request).
    pub listener: OwnedFd,
    /// The delegated cgroup directory for per-command children, and how to kill one.
    pub command_cgroup: Option<(OwnedFd, KillMethod)>,
    pub pids: u64,
    /// The commands' seccomp filter as the daemon compiled it, if it sent one.
    pub seccomp: Option<seccompiler::BpfProgram>,
    /// The agent's own seccomp filter as the daemon compiled it, if it sent one.
    pub agent_seccomp: Option<seccompiler::BpfProgram>,
}

pub const STATUS_FD: RawFd = 3;
// Above anything the jailer opens before `pid1`, so the dup2s below cannot clobber a source.
const LISTENER_FD: RawFd = 10;
const CGROUP_FD: RawFd = 11;
/// PID 1 keeps its writable layer (`upper/` on the sandbox's private tmpfs) open here, a
/// detached clone of its mount that nothing in the sandbox uses: the tmpfs is in no mount namespace any
/// host process can enter once the jailer exits, and this is how the daemon reads it for a
/// snapshot (`/proc/<pid 1>/fd/12`, as host root). Commands never inherit it (close-on-exec),
/// and nothing inside can reach PID 1's fds (it is non-dumpable; commands have no
/// capabilities). Absent for template builds (their upper is a host directory).
pub const UPPER_FD: RawFd = 12;

/// Writes one status line for the daemon (fd 3, the status pipe).
fn report(line: &str) {
    // SAFETY: STATUS_FD is the status pipe for the whole life of the jailer processes (set
    // up first thing in `main_from_stdin`); a failed write is ignored on purpose: the
    // daemon treats a missing `ready` as failure.
    let _ = unsafe { libc::write(STATUS_FD, line.as_ptr() as *const libc::c_void, line.len()) };
}

/// Runs the jail the daemon asks for on stdin. Returns only in the sandbox's PID 1; every
/// other process of the jailer exits inside.
///
/// stdin is either a pipe carrying one JSON config (one jail, then this process becomes
/// it), or one end of a `SOCK_SEQPACKET` socket pair: then this process is the daemon's
/// fork server ([`serve_forks`]) and each message is one jail to fork.
pub fn main_from_stdin() -> Booted {
    if sys::socket_type(0) == Some(libc::SOCK_SEQPACKET) {
        return serve_forks();
    }
    if sys::dup2(1, STATUS_FD).is_err() {
        sys::exit_now(1);
    }
    let mut buf = Vec::new();
    match std::io::stdin().read_to_end(&mut buf) {
        Ok(_) => run_config(&buf),
        Err(e) => fail(&JailError::sys("read config", e)),
    }
}

fn fail(e: &JailError) -> ! {
    report(&format!("error: {e}\n"));
    sys::exit_now(1)
}

/// Parses a config and runs the jail; the status pipe is already at [`STATUS_FD`].
fn run_config(body: &[u8]) -> Booted {
    let cfg = serde_json::from_slice::<JailConfig>(body).map_err(|e| JailError::Config(e.to_string()));
    match cfg.and_then(|cfg| run(&cfg)) {
        Ok(b) => {
            report("ready\n");
            // SAFETY: the status pipe is done; closing our copy lets the daemon see EOF.
            unsafe { libc::close(STATUS_FD) };
            b
        }
        Err(e) => fail(&e),
    }
}

/// The fork server's first message: it runs and speaks this protocol.
pub const SERVER_READY: &[u8] = b"glovebox fork server 1";

/// Largest config a fork request may carry (a config is a few KiB). Above glibc's mmap
/// threshold on purpose: the receive buffer is its own mapping, untouched until a request
/// lands in it and unmapped once the request is copied out, so none of it is inherited by
/// the sandbox's PID 1 and the processes it forks.
const MAX_REQUEST: usize = 256 * 1024;

/// Jailers the fork server keeps forked and waiting for a request.
const WAITING: usize = 2;

/// The fork server: one single-threaded process, started once per daemon, that keeps
/// [`WAITING`] children forked ahead, each blocked receiving on the request socket (stdin).
/// A request is one message: the JSON config, with the status pipe's write end and the
/// agent log attached (SCM_RIGHTS). The kernel hands each message to one waiting child,
/// which becomes the jailer exactly as a freshly exec'd one would be (fds 0–2 /dev/null,
/// status pipe, log, nothing else open; no environment); the server is told through a pipe
/// and forks a replacement. So a create pays neither the daemon's spawn and the kernel's
/// exec of the agent binary (0.6 ms here) nor a fork (0.2 ms), only a wake-up.
///
/// Neither the server nor a waiting child holds any sandbox's config before it is received
/// (the buffer a child receives into is its own). Waiting children die with the server
/// (`PR_SET_PDEATHSIG`); the server exits when the daemon closes its end, and reaps finished
/// jailers as it goes. Returns only in a forked jailer's PID 1.
pub fn serve_forks() -> Booted {
    // SAFETY: fd 0 is the request socket for the whole life of the server.
    let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let Ok((taken_r, taken_w)) = sys::pipe() else { sys::exit_now(1) };
    if sys::send_with_fds(sock, SERVER_READY, &[]).is_err() {
        sys::exit_now(1);
    }
    let server = sys::getpid();
    // The waiting children by pid: one that takes a request says so (its pid on the pipe);
    // one that dies without taking one (killed) is seen when reaped. Either way it is
    // replaced, so two always wait.
    let mut waiting: Vec<libc::pid_t> = Vec::new();
    loop {
        while let Ok((pid, _)) = sys::waitpid(-1, libc::WNOHANG) {
            if pid <= 0 {
                break;
            }
            waiting.retain(|p| *p != pid);
        }
        while waiting.len() < WAITING {
            match sys::fork_with(0) {
                Ok(sys::Forked::Child) => {
                    drop(taken_r);
                    return wait_for_request(server, taken_w);
                }
                Ok(sys::Forked::Parent { child }) => waiting.push(child),
                // Retried at the next wake-up; meanwhile requests queue on the socket.
                Err(_) => break,
            }
        }
        let mut fds = [
            libc::pollfd { fd: taken_r.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            // Only hang-ups: the requests themselves are for the waiting children.
            libc::pollfd { fd: 0, events: libc::POLLRDHUP, revents: 0 },
        ];
        match sys::poll(&mut fds, 200) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => sys::exit_now(1),
        }
        if fds[1].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            sys::exit_now(0); // the daemon is gone; the waiting children die with us
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // Whole pids only: each is one 4-byte write, which a pipe never splits.
            let mut b = [0u8; 64];
            // SAFETY: reads into a local buffer of the given size.
            let n = unsafe { libc::read(taken_r.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
            for c in b[..n.max(0) as usize].chunks_exact(4) {
                let pid = libc::pid_t::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                waiting.retain(|p| *p != pid);
            }
        }
    }
}

/// A waiting child of the fork server: receives one request, tells the server, becomes its
/// jailer.
fn wait_for_request(server: libc::pid_t, taken: OwnedFd) -> Booted {
    // Checked after the prctl: a server gone before it would never send the signal.
    if sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).is_err() || sys::getppid() != server {
        sys::exit_now(1);
    }
    let devnull = match File::options().read(true).write(true).open("/dev/null") {
        Ok(f) => OwnedFd::from(f),
        Err(_) => sys::exit_now(1),
    };
    let mut buf = vec![0u8; MAX_REQUEST];
    let got = loop {
        match sys::recv_with_fds(0, &mut buf) {
            Ok(g) => break g,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => sys::exit_now(1),
        }
    };
    // One fewer waiting, whatever the message was: the server forks the next.
    let me = sys::getpid().to_ne_bytes();
    // SAFETY: writes four bytes from a local to a pipe we own.
    let _ = unsafe { libc::write(taken.as_raw_fd(), me.as_ptr().cast(), me.len()) };
    drop(taken);
    if got.len == 0 && got.fds.is_empty() {
        sys::exit_now(0); // the daemon is gone
    }
    // A jailer outlives the server if it must (the daemon still waits for its status).
    if sys::prctl(libc::PR_SET_PDEATHSIG, 0).is_err() {
        sys::exit_now(1);
    }
    let mut fds = got.fds.into_iter();
    let (Some(status), Some(log), None) = (fds.next(), fds.next(), fds.next()) else {
        sys::exit_now(1); // not a request of ours: the fds it carried close with us
    };
    if got.truncated {
        let _ = File::from(status).write_all(b"error: jail config too large\n");
        sys::exit_now(1);
    }
    // The three sources are all above 2 (0–2 are taken in the server), so filling 0–2 first
    // cannot clobber one; STATUS_FD last (it may be one of them).
    let set_up = sys::dup2(status.as_raw_fd(), 1)
        .and_then(|_| sys::dup2(log.as_raw_fd(), 2))
        .and_then(|_| sys::dup2(devnull.as_raw_fd(), 0))
        .and_then(|_| sys::dup2(1, STATUS_FD));
    if set_up.is_err() {
        sys::exit_now(1);
    }
    // Everything else goes (the originals, /dev/null; fd 0 was the request socket).
    let _ = (status.into_raw_fd(), log.into_raw_fd(), devnull.into_raw_fd());
    if sys::close_range(STATUS_FD as u32 + 1, u32::MAX).is_err() {
        sys::exit_now(1);
    }
    let body = buf[..got.len].to_vec();
    drop(buf);
    run_config(&body)
}

fn write_file(path: &str, body: &str) -> Result<()> {
    fs::write(path, body).ctx_at("write", path)
}

fn run(cfg: &JailConfig) -> Result<Booted> {
    if cfg.uid_base == 0 || cfg.uid_count < 1 {
        return Err(JailError::Config("uid range must not include host root".into()));
    }
    // Nothing of the daemon's own signal set-up reaches the sandbox; the agent keeps what
    // Rust's runtime gives every program (SIGPIPE ignored), and each command gets the
    // defaults back before its exec.
    sys::default_signals().ctx("reset signal dispositions")?;
    sys::ignore_sigpipe().ctx("ignore SIGPIPE")?;
    // A jailer stuck past the daemon's deadline ends itself (SIGALRM's default action); on a
    // v2 host it is not in the sandbox's cgroup, which the daemon kills on a timeout. A and
    // PID 1 do not inherit the alarm.
    sys::alarm(crate::config::START_DEADLINE.as_secs() as u32 + 5);
    // On a cgroup v2 host A is born in the sandbox's cgroup (clone3 `CLONE_INTO_CGROUP`,
    // below) and the jailer never joins it: a migration takes the writer side of the kernel's
    // thread-group lock, which waits for an RCU grace period (5–18 ms measured, see
    // docs/benchmarks.md) unless another migration had it moments before. Elsewhere (v1, a
    // fake tree, an older kernel) the jailer joins first, and A inherits its cgroups.
    let into = match cgroup2_dir(cfg)? {
        Some(dir) => Some(dir),
        None => {
            join_cgroups(cfg)?;
            None
        }
    };
    let cg = match &cfg.command_cgroup {
        // A detached clone of the cgroup dir's mount, not a plain fd of it: `..` cannot climb
        // above a mount without a parent, so `/proc/self/fd/N/..` in a child of PID 1 (as a
        // command's cwd or program path) never reaches the host (CVE-2024-21626).
        Some((dir, kill)) => Some((sys::open_tree_clone(dir, false).ctx_at("open command cgroup", dir)?, *kill)),
        None => None,
    };
    let _ = fs::remove_file(&cfg.socket_path);
    let listener = UnixListener::bind(&cfg.socket_path).ctx_at("bind agent socket", &cfg.socket_path)?;
    fs::set_permissions(&cfg.socket_path, fs::Permissions::from_mode(0o600))
        .ctx_at("chmod agent socket", &cfg.socket_path)?;

    if let Some(ns) = &cfg.netns {
        // Before the user namespace: joining a namespace the host owns needs host root.
        let f = File::open(ns).ctx_at("open network namespace", ns)?;
        sys::setns(f.as_fd(), libc::CLONE_NEWNET).ctx("join network namespace")?;
    }
    sys::unshare(libc::CLONE_NEWNS).ctx("unshare mount namespace")?;
    sys::mount(None, std::path::Path::new("/"), None, libc::MS_REC | libc::MS_SLAVE, None)
        .ctx("make / a slave mount")?;

    // A user namespace made ahead (its maps written by host root): A joins it rather than
    // cloning one. Opened here, as host root, before anything else of the sandbox exists.
    let given = match &cfg.userns {
        Some(p) => Some(File::open(p).ctx_at("open given user namespace", p)?),
        None => None,
    };
    let (go_r, go_w) = sys::pipe().ctx("pipe")?;
    let flags = if given.is_some() { 0 } else { libc::CLONE_NEWUSER };
    let forked = match &into {
        Some(dir) => match sys::fork_into_cgroup(flags, dir.as_fd()) {
            Err(e) if sys::clone_into_cgroup_unsupported(&e) => {
                join_cgroups(cfg)?;
                sys::fork_with(flags)
            }
            r => r,
        },
        None => sys::fork_with(flags),
    };
    drop(into);
    match forked.ctx("clone user namespace")? {
        sys::Forked::Child => {
            drop(go_w);
            child_a(cfg, go_r, listener, cg, given)
        }
        sys::Forked::Parent { child } => {
            drop(go_r);
            drop(listener);
            let r = parent(cfg, child, go_w, given);
            if r.is_err() {
                let _ = sys::kill(child, libc::SIGKILL);
            }
            let reaped = sys::waitpid(child, 0);
            r?;
            match reaped {
                Ok((_, st)) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => sys::exit_now(0),
                // A already reported its own error on the status pipe.
                _ => sys::exit_now(1),
            }
        }
    }
}

/// Writes the jailer's pid into every `cgroup.procs` of the config (a migration).
fn join_cgroups(cfg: &JailConfig) -> Result<()> {
    let me = sys::getpid().to_string();
    for procs in &cfg.cgroup_procs {
        fs::write(procs, &me).ctx_at("join cgroup", procs)?;
    }
    Ok(())
}

/// The sandbox's cgroup directory, opened, when A can be born in it: one `cgroup.procs`
/// whose directory is on a cgroup v2 filesystem (not on v1 or under a fake tree), and the
/// daemon did not ask for the migration (`JailConfig::cgroup_migrate`).
fn cgroup2_dir(cfg: &JailConfig) -> Result<Option<OwnedFd>> {
    let [procs] = cfg.cgroup_procs.as_slice() else { return Ok(None) };
    if cfg.cgroup_migrate {
        return Ok(None);
    }
    let Some(dir) = procs.parent() else { return Ok(None) };
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .ctx_at("open cgroup", dir)?;
    let fd = OwnedFd::from(f);
    Ok(sys::is_cgroup2(fd.as_fd()).ctx_at("statfs cgroup", dir)?.then_some(fd))
}

fn parent(cfg: &JailConfig, child: libc::pid_t, go: OwnedFd, given: Option<File>) -> Result<()> {
    let userns = match given {
        // Its maps are checked by A once inside it (`child_a`).
        Some(ns) => ns,
        None => {
            let map = format!("0 {} {}\n", cfg.uid_base, cfg.uid_count);
            write_file(&format!("/proc/{child}/uid_map"), &map)?;
            write_file(&format!("/proc/{child}/gid_map"), &map)?;
            let ns_path = format!("/proc/{child}/ns/user");
            File::open(&ns_path).ctx_at("open user namespace", &ns_path)?
        }
    };
    rootfs::build(cfg, userns.as_fd())?;
    File::from(go).write_all(b"g").ctx("signal child")
}

/// In the new user namespace: becomes its uid 0, creates the other namespaces and forks the
/// sandbox's PID 1. Returns only in PID 1.
fn child_a(
    cfg: &JailConfig,
    go: OwnedFd,
    listener: UnixListener,
    cg: Option<(OwnedFd, KillMethod)>,
    given: Option<File>,
) -> Result<Booted> {
    let mut b = [0u8; 1];
    let n = File::from(go).read(&mut b).ctx("wait for parent")?;
    if n != 1 {
        // The parent failed and reported why; nothing more to say.
        sys::exit_now(1);
    }
    if let Some(ns) = given {
        // Host root may join any user namespace; A then holds every capability in it, as a
        // clone into a new one would.
        sys::setns(ns.as_fd(), libc::CLONE_NEWUSER).ctx("join given user namespace")?;
        // Its maps must be exactly the sandbox's slot, one line each (checked, not trusted:
        // whoever made the namespace runs unprivileged code). Read from inside, the ids are
        // the host's.
        for f in ["/proc/self/uid_map", "/proc/self/gid_map"] {
            let got = fs::read_to_string(f).ctx_at("read map", f)?;
            let fields: Vec<&str> = got.split_whitespace().collect();
            if fields != [String::from("0"), cfg.uid_base.to_string(), cfg.uid_count.to_string()] {
                return Err(JailError::Config(format!("given user namespace has the wrong map: {got:?}")));
            }
        }
    }
    sys::setresgid(0).ctx("setresgid")?;
    sys::setgroups_empty().ctx("setgroups")?;
    sys::setresuid(0).ctx("setresuid")?;
    let net = if cfg.netns.is_some() { 0 } else { libc::CLONE_NEWNET };
    sys::unshare(
        libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | net
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWCGROUP
            | libc::CLONE_NEWTIME,
    )
    .ctx("unshare namespaces")?;
    match sys::fork_with(0).ctx("fork pid 1")? {
        sys::Forked::Child => pid1(cfg, listener, cg),
        sys::Forked::Parent { child } => {
            report(&format!("pid {child}\n"));
            sys::exit_now(0)
        }
    }
}

fn pid1(cfg: &JailConfig, listener: UnixListener, cg: Option<(OwnedFd, KillMethod)>) -> Result<Booted> {
    let root: PathBuf = rootfs::root_dir(cfg);
    // Taken before the old root (and the tmpfs's path with it) is detached. A detached clone
    // of the layer's mount, not a plain fd of the directory: the old root's mounts stay
    // connected after the lazy unmount below (they are locked in this namespace), so `..` from
    // a plain fd could climb to the host's root; a clone has no parent to climb to (as the
    // command cgroup's fd, CVE-2024-21626). Recursive: a flat root's own mounts sit under it
    // (a non-recursive clone of a tree with locked mounts is refused).
    let upper = match &cfg.upper_dir {
        Some(_) => None,
        None => {
            let p = cfg.mount_dir.join("upper");
            Some(sys::open_tree_clone(&p, true).ctx_at("open the writable layer", &p)?)
        }
    };
    rootfs::enter(&root)?;
    sys::sethostname(&cfg.hostname).ctx("sethostname")?;
    if let Some(body) = &cfg.resolv_conf {
        // Inside the new root, as the sandbox's root: nothing of the host is reachable.
        write_file("/etc/resolv.conf", body)?;
    }
    if cfg.netns.is_none() {
        sys::loopback_up().ctx("bring up lo")?;
    }

    // Lower only (root here lacks CAP_SYS_RESOURCE, and the sandbox must never get more).
    sys::lower_rlimit(libc::RLIMIT_CORE, 0, 0).ctx("rlimit core")?;
    sys::lower_rlimit(libc::RLIMIT_NOFILE, 1 << 16, 1 << 16).ctx("rlimit nofile")?;
    sys::lower_rlimit(libc::RLIMIT_NPROC, cfg.pids, cfg.pids).ctx("rlimit nproc")?;
    // Nothing inside may ptrace or read the agent's memory, nor its fds through /proc.
    sys::prctl(libc::PR_SET_DUMPABLE, 0).ctx("prctl dumpable")?;

    // Fixed fd numbers, then close everything else inherited.
    let lfd = listener.into_raw_fd();
    sys::dup2(lfd, LISTENER_FD).ctx("dup listener")?;
    let cg = match cg {
        Some((fd, kill)) => {
            sys::dup2(fd.into_raw_fd(), CGROUP_FD).ctx("dup cgroup")?;
            Some(kill)
        }
        None => None,
    };
    // Opened after the listener and cgroup fds, so below 10 (the first free numbers): its
    // original goes with the close_range below.
    let has_upper = match upper {
        Some(fd) => {
            sys::dup2(fd.into_raw_fd(), UPPER_FD).ctx("dup upper")?;
            true
        }
        None => false,
    };
    let devnull = File::open("/dev/null").ctx("open /dev/null")?;
    sys::dup2(devnull.as_raw_fd(), 0).ctx("stdin")?;
    sys::dup2(devnull.as_raw_fd(), 1).ctx("stdout")?;
    drop(devnull);
    sys::close_range(STATUS_FD as u32 + 1, LISTENER_FD as u32 - 1).ctx("close inherited fds")?;
    sys::close_range(UPPER_FD as u32 + 1, u32::MAX).ctx("close inherited fds")?;
    for fd in [STATUS_FD, LISTENER_FD, CGROUP_FD, UPPER_FD] {
        let _ = sys::set_cloexec(fd, true);
    }
    if !has_upper {
        // SAFETY: UPPER_FD holds nothing of ours without an upper to keep (a template
        // build); closing a closed fd is harmless (EBADF).
        unsafe { libc::close(UPPER_FD) };
    }
    if cg.is_none() {
        // SAFETY: CGROUP_FD holds nothing of ours when there is no command cgroup; closing a
        // closed fd is harmless (EBADF).
        unsafe { libc::close(CGROUP_FD) };
    }
    for (k, _) in std::env::vars_os() {
        std::env::remove_var(k);
    }
    // SAFETY: LISTENER_FD was dup2'ed from the listener above and is owned by nothing else.
    let listener = unsafe { OwnedFd::from_raw_fd(LISTENER_FD) };
    // SAFETY: CGROUP_FD was dup2'ed from the cgroup dir fd above when `cg` is Some.
    let command_cgroup = cg.map(|k| (unsafe { OwnedFd::from_raw_fd(CGROUP_FD) }, k));
    let seccomp = cfg.seccomp.as_ref().map(|p| crate::seccomp::from_tuples(p));
    let agent_seccomp = cfg.agent_seccomp.as_ref().map(|p| crate::seccomp::from_tuples(p));
    Ok(Booted { listener, command_cgroup, pids: cfg.pids, seccomp, agent_seccomp })
}
