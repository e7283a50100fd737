//! The last steps before a user command's `execve`, run by the agent in the forked child:
//! join the command's cgroup, new session, oom preference, credentials, securebits, drop
//! every capability (bounding, ambient, effective, permitted, inheritable), no_new_privs,
//! then the seccomp filter — which must be last, as it forbids some of the calls before it.
//!
//! Only async-signal-safe work happens in the child: raw syscalls on values prepared
//! beforehand (the agent runs a multi-threaded runtime, so the child may not allocate or
//! take locks).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a command's child does before exec. Built once per command in the parent.
pub struct ChildSetup {
    /// `cgroup.procs` of the command's own child cgroup, opened for writing.
    pub cgroup_procs: Option<OwnedFd>,
    pub uid: u32,
    pub gid: u32,
    /// The compiled seccomp filter (shared by every command).
    pub seccomp: Option<Arc<seccompiler::BpfProgram>>,
    /// Make the terminal on fd 0 (a pseudo-terminal's slave, set as stdin by the caller) the
    /// controlling terminal of the child's new session.
    pub ctty: bool,
}

impl ChildSetup {
    /// What spares and the zygote get: root of the sandbox, no cgroup of its own to join
    /// (the agent moves them), the filter.
    pub fn root(seccomp: Arc<seccompiler::BpfProgram>) -> ChildSetup {
        ChildSetup { cgroup_procs: None, uid: 0, gid: 0, seccomp: Some(seccomp), ctty: false }
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
/// Higher than anything the kernel defines today (CAP_LAST_CAP is 40 on 6.x); dropping an
/// unknown one fails with EINVAL, which ends the loop.
const CAP_MAX: libc::c_ulong = 63;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn err() -> io::Error {
    io::Error::last_os_error()
}

/// Runs in the forked child. Every call is a raw syscall on prepared data.
fn in_child(s: &ChildSetup) -> io::Result<()> {
    // The working directory must be reachable from the root: one entered through an
    // inherited directory fd (`/proc/self/fd/N`) is not, and getcwd(2) then starts the path
    // with "(unreachable)" (CVE-2024-21626). Refuse to start there.
    let mut cwd = [0u8; 4096];
    // SAFETY: the buffer is on this stack frame and its length is passed with it.
    if unsafe { libc::syscall(libc::SYS_getcwd, cwd.as_mut_ptr(), cwd.len()) } < 0 {
        return Err(err());
    }
    if cwd[0] != b'/' {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if let Some(fd) = &s.cgroup_procs {
        // "0" moves the writing process (both cgroup versions).
        // SAFETY: writing a static one-byte buffer to an fd we own.
        if unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr() as *const libc::c_void, 1) } != 1 {
            return Err(err());
        }
    }
    // SAFETY: setsid has no memory arguments; a fresh child is never a group leader.
    if unsafe { libc::setsid() } < 0 {
        return Err(err());
    }
    // A session leader without a controlling terminal acquires the one it asks for; the
    // agent opened the slave with O_NOCTTY, so no other session holds it.
    // SAFETY: integer-only ioctl on fd 0, which the caller set to the slave before this runs
    // (std dups stdio before the pre-exec hook); argument 0 never steals a terminal.
    if s.ctty && unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
        return Err(err());
    }
    // User code is always the OOM killer's first choice, never the agent (raising the score
    // needs no privilege; lowering the agent's would need CAP_SYS_RESOURCE).
    // SAFETY: static NUL-terminated path; the fd is closed right after.
    let fd = unsafe { libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: static buffer, our own fd.
        unsafe {
            libc::write(fd, b"1000".as_ptr() as *const libc::c_void, 4);
            libc::close(fd);
        }
    }
    // SAFETY: integer-only credential calls; the zero-length group list needs no pointer.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0 {
            return Err(err());
        }
        if libc::syscall(libc::SYS_setresgid, s.gid, s.gid, s.gid) < 0 {
            return Err(err());
        }
    }
    // Lock root out of privilege: uid 0 gains nothing on exec, and nothing can be
    // re-raised later. Needs CAP_SETPCAP, which the agent still has here. A guest kernel
    // without securebits (gVisor's) skips it: there the empty bounding set below is what
    // keeps uid 0 from regaining any capability at exec (exec grants at most the bounding set).
    if NO_SECUREBITS.load(Ordering::Relaxed) {
        return drop_the_rest(s);
    }
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: integer-only prctl.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) } < 0 {
        return Err(err());
    }
    drop_the_rest(s)
}

/// After the securebits: uid, capabilities, no_new_privs, the filter.
fn drop_the_rest(s: &ChildSetup) -> io::Result<()> {
    // SAFETY: integer-only setresuid.
    if unsafe { libc::syscall(libc::SYS_setresuid, s.uid, s.uid, s.uid) } < 0 {
        return Err(err());
    }
    for cap in 0..=CAP_MAX {
        // SAFETY: integer-only prctl; EINVAL past the last capability ends the loop.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } < 0 {
            break;
        }
    }
    // SAFETY: integer-only prctl.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
    let hdr = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: header and two data structs laid out as the kernel's v3 capset ABI expects,
    // alive across the call.
    if unsafe { libc::syscall(libc::SYS_capset, &hdr as *const CapHeader, data.as_ptr()) } < 0 {
        return Err(err());
    }
    // SAFETY: integer-only prctl.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(err());
    }
    if let Some(prog) = &s.seccomp {
        crate::seccomp::install(prog).map_err(|e| io::Error::other(e.to_string()))?;
    }
    Ok(())
}

/// Set once, by a guest's PID 1 (`guest::init`), when the kernel under it refuses
/// `PR_SET_SECUREBITS`; read in forked children (an atomic load is async-signal-safe).
static NO_SECUREBITS: AtomicBool = AtomicBool::new(false);

/// Whether the kernel takes `PR_SET_SECUREBITS` (a guest kernel may not: gVisor's does not).
/// Probed by setting the bits the process already has.
pub(crate) fn probe_securebits() {
    // SAFETY: integer-only prctls; setting the current bits again changes nothing.
    let ok = unsafe {
        let cur = libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0);
        cur >= 0 && libc::prctl(libc::PR_SET_SECUREBITS, cur as libc::c_ulong, 0, 0, 0) == 0
    };
    NO_SECUREBITS.store(!ok, Ordering::Relaxed);
}

/// Applies the per-command set-up to the calling process itself, for a child forked without
/// exec (the agent's zygote, forked while the agent is still single-threaded). The same
/// steps, in the same order, as before a command's exec.
pub fn become_unprivileged(s: &ChildSetup) -> io::Result<()> {
    in_child(s)
}

/// Spawns `cmd` with the jail's per-command setup applied in the child before exec.
/// The caller sets argv, env (cleared), cwd and stdio on `cmd` beforehand. `extra`, if
/// given, is made available to the child as fd 3 (without CLOEXEC).
pub fn spawn(cmd: &mut Command, setup: Arc<ChildSetup>, extra: Option<&OwnedFd>) -> io::Result<Child> {
    let s = setup.clone();
    let extra = extra.map(|f| f.as_raw_fd());
    // SAFETY: the closure runs between fork and exec in the child and only performs raw
    // syscalls on data prepared before the fork (see `in_child`); it allocates only in the
    // seccomp error path, which ends the child. `extra` is an fd the parent keeps open until
    // spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = extra {
                // dup2 onto 3 (clears CLOEXEC on the copy); if it already is 3, clear it.
                if fd == 3 {
                    let fl = libc::fcntl(3, libc::F_GETFD);
                    if fl < 0 || libc::fcntl(3, libc::F_SETFD, fl & !libc::FD_CLOEXEC) < 0 {
                        return Err(err());
                    }
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(err());
                }
            }
            in_child(&s)
        });
    }
    let child = cmd.spawn();
    drop(setup);
    child
}

/// Takes ownership of fd 3 as passed by [`spawn`]'s `extra` (the agent's spare process
/// reads its job from it). Returns `None` if fd 3 is not open.
pub fn take_fd3() -> Option<OwnedFd> {
    // SAFETY: F_GETFD only inspects the fd table.
    if unsafe { libc::fcntl(3, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: fd 3 is open (checked above) and was handed to this process for it to own;
    // nothing else in this process refers to it.
    Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(3) })
}

/// For the agent's zygote, a single-threaded process already set up like a user command
/// (new session, no capabilities, no_new_privs, seccomp): forks a spare whose parent is the
/// zygote's own parent (`CLONE_PARENT`, so the agent reaps it and gets its exit status), in a
/// session of its own, with `stdio` as fds 0–2, `job` as fd 3 and no other fd open, and runs
/// `then` in it. The spare inherits the zygote's filter instead of compiling and installing
/// its own, and is a copy of a small process rather than of the multi-threaded agent: that
/// is the point of the zygote.
///
/// Returns the spare's pid (in the zygote; `then` never returns in the spare, so nothing of
/// the caller's frame is dropped there). Every given fd must be above 3 (the zygote's 0–3
/// are taken, so fresh pipes always are).
pub fn fork_spare(stdio: [&OwnedFd; 3], job: &OwnedFd, then: fn() -> !) -> io::Result<libc::pid_t> {
    let src = [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd(), job.as_raw_fd()];
    if src.iter().any(|&fd| fd <= 3) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // The spare closes its end of `ready` last in its set-up (with every other fd), so EOF
    // here means it is done — or dead: either way the answer the zygote then gives is true.
    let (ready_r, ready_w) = crate::sys::pipe()?;
    match crate::sys::fork_with(libc::CLONE_PARENT)? {
        crate::sys::Forked::Parent { child } => {
            drop(ready_w);
            let mut b = [0u8; 1];
            loop {
                // SAFETY: reading into a one-byte buffer on this stack frame from our own fd.
                let n = unsafe { libc::read(ready_r.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 1) };
                if n == 0 || (n < 0 && err().raw_os_error() != Some(libc::EINTR)) {
                    break;
                }
            }
            Ok(child)
        }
        crate::sys::Forked::Child => {
            let setup = || -> io::Result<()> {
                for (target, fd) in src.iter().enumerate() {
                    crate::sys::dup2(*fd, target as i32)?;
                }
                // SAFETY: setsid has no memory arguments; a fresh child is never a group leader.
                if unsafe { libc::setsid() } < 0 {
                    return Err(err());
                }
                // Everything else the zygote had open: the copies of `src`, `ready`'s ends.
                crate::sys::close_range(4, u32::MAX)
            };
            match setup() {
                Ok(()) => then(),
                // Nothing of the zygote may run on in a half-made spare.
                Err(_) => crate::sys::exit_now(125),
            }
        }
    }
}
