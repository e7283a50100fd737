//! The zygote: one process, set up once exactly like a user command (new session, no
//! capabilities, no_new_privs, seccomp), that forks the spares (see `spare`).
//!
//! Without it every spare is a fork of the multi-threaded agent (its page tables copied, its
//! heap made copy-on-write so the agent then faults on its own writes, the other CPU
//! interrupted to flush TLBs), then an exec of the agent binary, then a seccomp install —
//! and the kernel converts, JIT-compiles and pre-evaluates the filter again for each one.
//! Measured on a 2-core machine that was about half of all CPU an exec round trip cost. A
//! spare forked from the zygote inherits its filter, which the kernel shares, and is a copy
//! of a small single-threaded process.
//!
//! The zygote holds nothing but its end of a socket pair with the agent. It is exactly as
//! unprivileged as the code that will run in its spares, so hijacking it gains nothing; a
//! command can kill it (same uid), and the agent then starts another or falls back to forking
//! spares itself. What it reports is checked: the pid must hold the job pipe the agent got.
//!
//! Protocol, one datagram each way on a `SOCK_SEQPACKET` pair: the agent sends `S`; the
//! zygote answers with the spare's pid (4 bytes, little-endian) and, as `SCM_RIGHTS`, the
//! agent's ends of the spare's job, stdin, stdout and stderr pipes — or with `E` and an errno
//! (4 bytes) and no fds.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// The longest the agent waits for the zygote's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Entry point of `glovebox-agent zygote` (its socket is fd 3).
pub fn main() -> ! {
    let Some(sock) = glovebox_jail::child::take_fd3() else {
        eprintln!("glovebox: zygote started without its socket");
        std::process::exit(125);
    };
    let mut req = [0u8; 1];
    loop {
        let n = match rustix::net::recv(&sock, &mut req, RecvFlags::empty()) {
            Ok((n, _)) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => std::process::exit(0),
        };
        // End of the pair: the agent is gone or dropped us.
        if n == 0 {
            std::process::exit(0);
        }
        if req[0] != b'S' {
            continue;
        }
        let sent = match fork_one() {
            Ok((pid, ends)) => {
                let fds: Vec<BorrowedFd<'_>> = ends.iter().map(|f| f.as_fd()).collect();
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
                let mut cmsg = SendAncillaryBuffer::new(&mut space);
                cmsg.push(SendAncillaryMessage::ScmRights(&fds));
                let body = pid.to_le_bytes();
                rustix::net::sendmsg(&sock, &[IoSlice::new(&body)], &mut cmsg, SendFlags::empty())
            }
            Err(e) => {
                let mut body = [b'E', 0, 0, 0, 0];
                body[1..].copy_from_slice(&e.raw_os_error().unwrap_or(libc::EIO).to_le_bytes());
                rustix::net::send(&sock, &body, SendFlags::empty())
            }
        };
        if sent.is_err() {
            std::process::exit(0);
        }
    }
}

/// Makes the pipes and forks one spare; returns its pid and the agent's ends (job, stdin,
/// stdout, stderr).
fn fork_one() -> std::io::Result<(i32, [OwnedFd; 4])> {
    let (job_r, job_w) = glovebox_jail::sys::pipe()?;
    let (in_r, in_w) = glovebox_jail::sys::pipe()?;
    let (out_r, out_w) = glovebox_jail::sys::pipe()?;
    let (err_r, err_w) = glovebox_jail::sys::pipe()?;
    let pid = glovebox_jail::child::fork_spare([&in_r, &out_w, &err_w], &job_r, crate::spare::main)?;
    Ok((pid, [job_w, in_w, out_r, err_r]))
}

/// The socket pair between the agent and a zygote: the agent's end (with its answer
/// timeouts) and the zygote's.
fn pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Recv, Some(ANSWER_TIMEOUT))?;
    rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Send, Some(ANSWER_TIMEOUT))?;
    Ok((ours, theirs))
}

/// `glovebox-agent ROLE` (this binary again, as a helper: `zygote` or `spare`), with an empty
/// environment, in `/`.
pub fn self_command(role: &str) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new("/proc/self/exe");
    c.arg0("glovebox-agent").arg(role).env_clear().current_dir("/");
    c
}

/// The agent's handle on its zygote.
pub struct Zygote {
    sock: OwnedFd,
    pub pid: i32,
}

/// A spare as the zygote made it.
pub struct Forked {
    pub pid: i32,
    pub job: OwnedFd,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl Zygote {
    /// Forks the zygote off the agent before the agent starts its runtime: the agent is
    /// single-threaded then, so the child may run on without an exec, and the zygote costs a
    /// fork of a small process instead of a fork of the runtime plus a start of the binary.
    /// The child keeps only its socket (as fd 3) and stderr.
    pub fn fork_at_boot(setup: &glovebox_jail::child::ChildSetup) -> std::io::Result<Zygote> {
        let (ours, theirs) = pair()?;
        match glovebox_jail::sys::fork_with(0)? {
            glovebox_jail::sys::Forked::Child => {
                use std::os::fd::AsRawFd;
                // Dumpable again, as an exec would have left it (the agent is not): the agent
                // checks each spare's fds through /proc, which a non-dumpable process whose
                // memory map was made outside the sandbox's user namespace would refuse.
                let ready = glovebox_jail::sys::dup2(theirs.as_raw_fd(), 3)
                    .and_then(|()| glovebox_jail::sys::set_cloexec(3, false))
                    .and_then(|()| glovebox_jail::sys::close_range(4, u32::MAX))
                    .and_then(|()| glovebox_jail::sys::prctl(libc::PR_SET_DUMPABLE, 1).map(drop))
                    .and_then(|()| glovebox_jail::child::become_unprivileged(setup));
                if let Err(e) = ready {
                    eprintln!("agent: zygote set-up: {e}");
                    glovebox_jail::sys::exit_now(125);
                }
                main()
            }
            glovebox_jail::sys::Forked::Parent { child } => Ok(Zygote { sock: ours, pid: child }),
        }
    }

    /// Starts the zygote with the command set-up `setup` (it joins no cgroup of its own).
    pub fn start(
        setup: std::sync::Arc<glovebox_jail::child::ChildSetup>,
    ) -> std::io::Result<(Zygote, std::process::Child)> {
        use std::process::Stdio;
        let (ours, theirs) = pair()?;
        let mut c = self_command("zygote");
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        let child = glovebox_jail::child::spawn(&mut c, setup, Some(&theirs))?;
        let pid = child.id() as i32;
        Ok((Zygote { sock: ours, pid }, child))
    }

    /// Asks for one spare. Blocking (bounded by [`ANSWER_TIMEOUT`]); an error means this
    /// zygote is unusable and should be dropped.
    pub fn fork(&self) -> std::io::Result<Forked> {
        rustix::net::send(&self.sock, b"S", SendFlags::empty())?;
        let mut body = [0u8; 8];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let got =
            rustix::net::recvmsg(&self.sock, &mut [IoSliceMut::new(&mut body)], &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
        let mut fds: Vec<OwnedFd> = Vec::with_capacity(4);
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        let bad = |what: &str| std::io::Error::other(format!("zygote: {what}"));
        match (got.bytes, body[0]) {
            (0, _) => return Err(bad("gone")),
            (5, b'E') => {
                let errno = i32::from_le_bytes([body[1], body[2], body[3], body[4]]);
                return Err(std::io::Error::from_raw_os_error(errno));
            }
            (4, _) => {}
            _ => return Err(bad("malformed answer")),
        }
        let pid = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
        let Ok::<[OwnedFd; 4], _>([job, stdin, stdout, stderr]) = fds.try_into() else {
            return Err(bad("answer without its four pipes"));
        };
        // The pid must be the process holding the job pipe's other end (its fd 3): what the
        // zygote says is checked, never just believed.
        let theirs = rustix::fs::stat(format!("/proc/{pid}/fd/3")).map_err(|_| bad("no such spare"))?;
        let ours = rustix::fs::fstat(&job)?;
        if pid <= 1 || theirs.st_ino != ours.st_ino || theirs.st_dev != ours.st_dev {
            return Err(bad("answer names another process"));
        }
        Ok(Forked { pid, job, stdin, stdout, stderr })
    }
}
