//! One small safe wrapper per raw syscall the jail needs (those `libc` exposes without a
//! safe interface). Every wrapper turns `-1` into `std::io::Error` and owns nothing it is not
//! given. Callers add the context (which path, which step) in their own error types.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn cstr(p: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a nul byte"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// mount(2). `data` is the comma-separated option string of the filesystem.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = source.map(CString::new).transpose()?;
    let fst = fstype.map(CString::new).transpose()?;
    let dat = data.map(CString::new).transpose()?;
    let tgt = cstr(target)?;
    // SAFETY: every pointer is either null or points at a NUL-terminated CString that lives
    // until the call returns; mount(2) does not keep them.
    let r = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            fst.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            dat.as_ref().map_or(std::ptr::null(), |s| s.as_ptr() as *const libc::c_void),
        )
    };
    check(r).map(drop)
}

/// Whether the directory `path` (not followed if a symlink) is an overlayfs opaque directory
/// of a layer (`trusted.overlay.opaque` = `y`): it hides what the layers below it hold there.
pub fn is_opaque_dir(path: &Path) -> io::Result<bool> {
    let p = cstr(path)?;
    let mut v = [0u8; 2];
    // SAFETY: `p` and the attribute name are NUL-terminated and live across the call; `v` is a
    // writable buffer of the length passed, which the kernel does not keep.
    let n = unsafe {
        libc::lgetxattr(p.as_ptr(), c"trusted.overlay.opaque".as_ptr(), v.as_mut_ptr() as *mut libc::c_void, v.len())
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(n == 1 && v[0] == b'y')
}

pub fn umount2(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let t = cstr(target)?;
    // SAFETY: `t` is a valid NUL-terminated string for the duration of the call.
    check(unsafe { libc::umount2(t.as_ptr(), flags) }).map(drop)
}

pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let n = cstr(new_root)?;
    let o = cstr(put_old)?;
    // SAFETY: both arguments are valid NUL-terminated strings alive across the call.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) }).map(drop)
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes only an integer; it changes this process's namespaces, which the
    // caller intends (the jailer is single-threaded, so no other thread is affected).
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// What `fork_with` returned in this process.
pub enum Forked {
    Parent { child: libc::pid_t },
    Child,
}

/// clone(2) with fork semantics (no new stack) and extra namespace `flags`.
///
/// Only for single-threaded processes (the jailer): the child continues on a copy of the
/// caller's stack, as after fork(2).
pub fn fork_with(flags: libc::c_int) -> io::Result<Forked> {
    let f = (flags as libc::c_ulong) | (libc::SIGCHLD as libc::c_ulong);
    // SAFETY: with a null stack pointer clone behaves like fork: the child gets a copy of the
    // address space and resumes here. The jailer calls this while single-threaded, so no lock
    // can be held by a thread that does not exist in the child. The tid pointers are null and
    // unused (no CLONE_*TID flags).
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            f,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match check_long(r)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent { child: pid as libc::pid_t }),
    }
}

/// clone3(2)'s argument block up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// clone3's flag: the child starts in the cgroup v2 directory `CloneArgs::cgroup`.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// As [`fork_with`], the child born in the cgroup v2 directory `cgroup` (clone3 with
/// `CLONE_INTO_CGROUP`): no migration, so none of the writer side of the kernel's
/// thread-group lock, which waits for an RCU grace period unless another migration had it
/// moments before. Fails with `ENOSYS` before Linux 5.3 and `E2BIG`/`EINVAL` before 5.7
/// (see [`clone_into_cgroup_unsupported`]); `cgroup` must be opened for reading (not
/// `O_PATH`).
pub fn fork_into_cgroup(flags: libc::c_int, cgroup: BorrowedFd<'_>) -> io::Result<Forked> {
    let args = CloneArgs {
        flags: flags as u32 as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: with no stack given clone3 behaves like fork (the child resumes here on a copy
    // of the address space); single-threaded callers only, as `fork_with`. `args` is a valid
    // block of the size passed, alive across the call; no pointer fields are set.
    let r = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    match check_long(r)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent { child: pid as libc::pid_t }),
    }
}

/// Whether [`fork_into_cgroup`] failed only because this kernel lacks clone3 or its
/// `CLONE_INTO_CGROUP` (the caller then migrates the old way).
pub fn clone_into_cgroup_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL))
}

/// Whether `dir` is a directory on a cgroup v2 (unified) filesystem.
pub fn is_cgroup2(dir: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: a plain C struct, for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the call; the fd is borrowed for its duration.
    check(unsafe { libc::fstatfs(dir.as_raw_fd(), &mut st) })?;
    Ok(st.f_type == libc::CGROUP2_SUPER_MAGIC)
}

/// alarm(2): SIGALRM (default action: the process ends) after `secs` seconds; not inherited
/// by children.
pub fn alarm(secs: u32) {
    // SAFETY: integer-only call; it replaces this process's pending alarm, if any.
    unsafe { libc::alarm(secs) };
}

/// waitpid(2) for one child; returns the raw status.
pub fn waitpid(pid: libc::pid_t, flags: libc::c_int) -> io::Result<(libc::pid_t, libc::c_int)> {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a valid out-pointer for the duration of the call.
    let r = unsafe { libc::waitpid(pid, &mut status, flags) };
    check(r).map(|p| (p, status))
}

pub fn setresuid(uid: u32) -> io::Result<()> {
    // SAFETY: integer-only syscall changing this process's credentials, as intended.
    check_long(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) }).map(drop)
}

pub fn setresgid(gid: u32) -> io::Result<()> {
    // SAFETY: integer-only syscall changing this process's credentials, as intended.
    check_long(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) }).map(drop)
}

/// setresuid(2) with the three ids given apart.
pub fn setresuid3(real: u32, effective: u32, saved: u32) -> io::Result<()> {
    // SAFETY: integer-only syscall changing this process's credentials, as intended.
    check_long(unsafe { libc::syscall(libc::SYS_setresuid, real, effective, saved) }).map(drop)
}

/// setfsuid(2); checked by asking again (the call reports the old id, never an error).
pub fn setfsuid(uid: u32) -> io::Result<()> {
    // SAFETY: integer-only syscalls changing this thread's filesystem uid, as intended.
    let now = unsafe {
        libc::setfsuid(uid);
        libc::setfsuid(u32::MAX)
    };
    match now as u32 == uid {
        true => Ok(()),
        false => Err(io::Error::from_raw_os_error(libc::EPERM)),
    }
}

/// Makes the effective capability set the permitted one (after a uid change that cleared it
/// with `PR_SET_KEEPCAPS` set).
pub fn raise_effective_caps() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut hdr = Header { version: 0x2008_0522, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: header and two data structs laid out as the kernel's v3 capget ABI expects,
    // alive across the call.
    check_long(unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) })?;
    for d in &mut data {
        d.effective = d.permitted;
    }
    // SAFETY: as above, for capset.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) }).map(drop)
}

/// Drops every capability (bounding set, then effective, permitted and inheritable) and sets
/// `no_new_privs`: the process keeps its uid and nothing else.
pub fn drop_all_caps() -> io::Result<()> {
    for cap in 0..=63 {
        // SAFETY: integer-only prctl; EINVAL past the last capability ends the loop.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } < 0 {
            break;
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    let hdr = Header { version: 0x2008_0522, pid: 0 };
    let data = [0u32; 6];
    // SAFETY: a v3 capset header and two zeroed data structs (three u32 each), alive across
    // the call.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) })?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map(drop)
}

pub fn setgroups_empty() -> io::Result<()> {
    // SAFETY: a zero-length list with a null pointer is valid for setgroups(2).
    check_long(unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) }).map(drop)
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes, alive across the call.
    check(unsafe { libc::sethostname(name.as_ptr() as *const libc::c_char, name.len()) }).map(drop)
}

pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: only integer-argument prctl options are passed through this wrapper (no
    // pointer arguments), so the kernel reads no memory of ours.
    check(unsafe { libc::prctl(option, arg2, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) })
}

pub fn chdir(path: &Path) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: `p` is a valid NUL-terminated string for the duration of the call.
    check(unsafe { libc::chdir(p.as_ptr()) }).map(drop)
}

/// open_tree(2): a detached copy of the mount tree at `path` (OPEN_TREE_CLONE).
pub fn open_tree_clone(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `p` is valid for the call; the returned fd is new and owned by nobody else.
    let fd = check_long(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this fd to us; we are its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// mount_setattr(2) on a detached tree: set `attrs`, and an id-mapping from `userns`.
pub fn mount_setattr(tree: BorrowedFd<'_>, attrs: u64, userns: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut a = MountAttr { attr_set: attrs, attr_clr: 0, propagation: 0, userns_fd: 0 };
    if let Some(u) = userns {
        a.attr_set |= MOUNT_ATTR_IDMAP;
        a.userns_fd = u.as_raw_fd() as u64;
    }
    let empty = c"";
    // SAFETY: `a` is a correctly laid out `struct mount_attr` (MOUNT_ATTR_SIZE_VER0 = 32
    // bytes) alive across the call; `empty` is a valid empty string for AT_EMPTY_PATH.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &mut a as *mut MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// move_mount(2) of a detached tree onto `target`.
pub fn move_mount_to(tree: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let t = cstr(target)?;
    let empty: &CStr = c"";
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    // SAFETY: both strings are valid for the call; the fd is borrowed and stays open.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// close_range(2): closes every fd in `first..=last`.
/// gVisor's (2022) reads `last` as a signed int and refuses `u32::MAX` with EINVAL: there the
/// highest fd number it can hold stands in for it.
pub fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: closing fds in the range; the caller guarantees nothing it still uses lives
    // there (Rust-owned fds in it must have been given up with into_raw_fd beforehand).
    let r = check_long(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) }).map(drop);
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && last == u32::MAX => {
            // SAFETY: as above, over a smaller range.
            check_long(unsafe { libc::syscall(libc::SYS_close_range, first, i32::MAX as u32, 0u32) }).map(drop)
        }
        r => r,
    }
}

/// dup2(2): makes `fd` also available as `target` (without CLOEXEC).
pub fn dup2(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: integer-only; the caller owns both fd numbers' fate.
    check(unsafe { libc::dup2(fd, target) }).map(drop)
}

/// Sets or clears FD_CLOEXEC.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: integer-only fcntl on an fd the caller owns.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let new = if on { flags | libc::FD_CLOEXEC } else { flags & !libc::FD_CLOEXEC };
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, new) }).map(drop)
}

/// setrlimit(2), lowering only: never raises either value above what is in force.
pub fn lower_rlimit(resource: u32, soft: u64, hard: u64) -> io::Result<()> {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `cur` is a valid out-pointer.
    check(unsafe { libc::getrlimit(resource, &mut cur) })?;
    let max = cur.rlim_max.min(hard);
    let new = libc::rlimit { rlim_cur: cur.rlim_cur.min(soft).min(max), rlim_max: max };
    // SAFETY: `new` is a valid in-pointer.
    check(unsafe { libc::setrlimit(resource, &new) }).map(drop)
}

/// Raises the soft limit of `resource` to its hard limit (never the hard limit itself).
pub fn raise_soft_rlimit(resource: u32) -> io::Result<()> {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `cur` is a valid out-pointer.
    check(unsafe { libc::getrlimit(resource, &mut cur) })?;
    if cur.rlim_cur < cur.rlim_max {
        let new = libc::rlimit { rlim_cur: cur.rlim_max, rlim_max: cur.rlim_max };
        // SAFETY: `new` is a valid in-pointer.
        check(unsafe { libc::setrlimit(resource, &new) })?;
    }
    Ok(())
}

/// Brings the loopback interface up (SIOCSIFFLAGS on `lo`).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2); the fd is wrapped in OwnedFd right after.
    let s = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `s` is a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS, alive across both calls.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: reading/writing the flags member of the union that SIOCGIFFLAGS filled in.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) }).map(drop)
}

/// setns(2) into the namespace `fd` refers to, of kind `nstype` (e.g. `CLONE_NEWNET`).
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: integer-only syscall on an fd the caller keeps open across the call.
    check(unsafe { libc::setns(fd.as_raw_fd(), nstype) }).map(drop)
}

/// A fresh network namespace with only loopback, up, for a sandbox to be started in (see
/// [`crate::config::JailConfig::netns`]): made on a short-lived thread of its own, so the
/// caller's namespaces never change. The namespace lives as long as the returned fd or a
/// process in it.
pub fn new_netns() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("glovebox-netns".into())
        .spawn(|| -> io::Result<OwnedFd> {
            // SAFETY: unshare takes only an integer; a network namespace is per thread, so
            // only this thread, which exits right after, moves into the new one.
            check(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
            loopback_up()?;
            let f = std::fs::File::open("/proc/thread-self/ns/net")?;
            Ok(OwnedFd::from(f))
        })?
        .join()
        .map_err(|_| io::Error::other("netns thread panicked"))?
}

/// A pipe with both ends CLOEXEC.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel returned two fresh fds that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// _exit(2): leaves at once, without running destructors or atexit handlers (for forked
/// children that must not flush state copied from the parent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions and does not return.
    unsafe { libc::_exit(code) }
}

/// Starts `exe` with `argv` (its `argv[0]` first), no environment, `stdin` as its fd 0,
/// `/dev/null` as its fds 1 and 2, `/` as its working directory, SIGPIPE at its default (Rust
/// ignores it, and an ignored signal stays ignored across an exec) and no signal blocked,
/// as `std::process::Command` starts a program; returns its pid (a child of this process, to reap). posix_spawn(3):
/// glibc starts it with `CLONE_VM | CLONE_VFORK`, so nothing of this process's address space
/// is copied (a fork of the daemon copies its page tables and leaves every page it then
/// writes to a copy-on-write fault), and an exec that fails is reported here.
pub fn spawn(exe: &Path, argv: &[&str], stdin: BorrowedFd<'_>) -> io::Result<libc::pid_t> {
    let c = |s: &[u8]| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let exe_c = cstr(exe)?;
    let args = argv.iter().map(|a| c(a.as_bytes())).collect::<io::Result<Vec<_>>>()?;
    let mut arg_ptrs: Vec<*mut libc::c_char> = args.iter().map(|a| a.as_ptr() as *mut libc::c_char).collect();
    arg_ptrs.push(std::ptr::null_mut());
    let mut env_ptrs: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    let (root, null) = (c(b"/")?, c(b"/dev/null")?);
    let err = |e: libc::c_int| if e == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(e)) };
    // SAFETY: zeroed storage is what the *_init calls below expect to initialise.
    let mut fa: libc::posix_spawn_file_actions_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: libc::posix_spawnattr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `fa` and `attr` are valid, exclusively borrowed storage; each is destroyed below
    // once initialised, whatever happens in between.
    err(unsafe { libc::posix_spawn_file_actions_init(&mut fa) })?;
    // SAFETY: as above.
    if let Err(e) = err(unsafe { libc::posix_spawnattr_init(&mut attr) }) {
        // SAFETY: `fa` was initialised above and is not used after this.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut fa) };
        return Err(e);
    }
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer passed is valid for the call: `fa`/`attr` initialised above, the
    // C strings and the null-terminated pointer arrays (`args`, `exe_c`, `root`, `null`) live
    // until after `posix_spawn` returns; the fds are ours (`stdin` is borrowed for the call).
    let spawned = unsafe {
        let mut sigs: libc::sigset_t = std::mem::zeroed();
        let mut none: libc::sigset_t = std::mem::zeroed();
        check(libc::sigemptyset(&mut sigs))
            .and_then(|_| check(libc::sigaddset(&mut sigs, libc::SIGPIPE)))
            .and_then(|_| check(libc::sigemptyset(&mut none)))
            .and_then(|_| err(libc::posix_spawnattr_setsigdefault(&mut attr, &sigs)))
            .and_then(|()| err(libc::posix_spawnattr_setsigmask(&mut attr, &none)))
            .and_then(|()| {
                err(libc::posix_spawnattr_setflags(
                    &mut attr,
                    (libc::POSIX_SPAWN_SETSIGDEF | libc::POSIX_SPAWN_SETSIGMASK) as libc::c_short,
                ))
            })
            .and_then(|()| err(libc::posix_spawn_file_actions_adddup2(&mut fa, stdin.as_raw_fd(), 0)))
            .and_then(|()| err(libc::posix_spawn_file_actions_addopen(&mut fa, 1, null.as_ptr(), libc::O_WRONLY, 0)))
            .and_then(|()| err(libc::posix_spawn_file_actions_addopen(&mut fa, 2, null.as_ptr(), libc::O_WRONLY, 0)))
            .and_then(|()| err(libc::posix_spawn_file_actions_addchdir_np(&mut fa, root.as_ptr())))
            .and_then(|()| {
                err(libc::posix_spawn(&mut pid, exe_c.as_ptr(), &fa, &attr, arg_ptrs.as_ptr(), env_ptrs.as_mut_ptr()))
            })
    };
    // SAFETY: both were initialised above and are not used after this.
    unsafe {
        libc::posix_spawn_file_actions_destroy(&mut fa);
        libc::posix_spawnattr_destroy(&mut attr);
    }
    spawned.map(|()| pid)
}

/// kill(2).
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: integer-only syscall.
    check(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// Caps glibc's malloc arenas at `n` (`M_ARENA_MAX`; by default up to 8 per core, one per
/// thread that first allocates while the others are busy); a no-op elsewhere. Call before
/// any thread starts.
pub fn limit_malloc_arenas(n: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; called before other threads
    // exist, so no arena is being created concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n);
    }
}

/// Returns free heap pages to the kernel (glibc `malloc_trim`); a no-op elsewhere.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only walks glibc's own arenas under their
    // locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A connected pair of `SOCK_SEQPACKET` unix sockets (message boundaries kept), both ends
/// CLOEXEC.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    check(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    // SAFETY: the kernel returned two fresh fds that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The socket type (`SOCK_STREAM`, `SOCK_SEQPACKET`, …) of `fd`, or None if it is no socket.
pub fn socket_type(fd: RawFd) -> Option<libc::c_int> {
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `ty` and `len` are valid out-pointers of the sizes given.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, (&mut ty as *mut libc::c_int).cast(), &mut len)
    };
    (r == 0).then_some(ty)
}

/// Most fds one message carries (a jail request carries two, a kernel zygote's hand-off
/// eleven).
pub const MAX_PASSED_FDS: usize = 16;

/// sendmsg(2) of one message with `fds` attached (SCM_RIGHTS); never raises SIGPIPE.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_PASSED_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds for one message"));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let payload = std::mem::size_of_val(raw.as_slice()) as u32;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 12];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: an all-zero msghdr is valid (no name, no control); fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer (96 bytes) holds CMSG_SPACE of up to MAX_PASSED_FDS
        // ints, so the first header and its data lie inside it; CMSG_FIRSTHDR is non-null
        // because msg_controllen >= sizeof(cmsghdr).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), raw.len());
        }
    }
    loop {
        // SAFETY: `msg` points at `iov` and `control`, which outlive the call; `data` is
        // only read.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return if r as usize == data.len() {
                Ok(())
            } else {
                Err(io::Error::new(io::ErrorKind::WriteZero, "message sent in part"))
            };
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One received message: its length, whether it was cut to fit `buf`, and the fds that came
/// with it (CLOEXEC).
pub struct Received {
    pub len: usize,
    pub truncated: bool,
    pub fds: Vec<OwnedFd>,
    /// The sender's pid in this process's PID namespace, when it sent its credentials
    /// (`SCM_CREDENTIALS`; the kernel checked and translated them) and the socket has
    /// `SO_PASSCRED` ([`set_passcred`]).
    pub pid: Option<libc::pid_t>,
}

/// Sets `SO_PASSCRED`: messages received on `sock` carry their sender's checked credentials.
pub fn set_passcred(sock: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid pointer to an int and its size.
    check(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// recvmsg(2) of one message into `buf`, taking ownership of any fds attached to it.
/// `len == 0` with no fds means the peer closed its end.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut control = [0u64; 24];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is valid; fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, both valid and writable for
    // the duration of the call.
    let r = check_long(unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) } as libc::c_long)?;
    let mut fds = Vec::new();
    let mut pid = None;
    // SAFETY: the kernel filled `control` up to msg_controllen; CMSG_FIRSTHDR/NXTHDR only
    // return headers inside it, and each SCM_RIGHTS header's data holds
    // (cmsg_len - CMSG_LEN(0)) / sizeof(int) fds that are now ours; an SCM_CREDENTIALS
    // header's data is one `ucred`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>());
                pid = Some(cred.pid);
            }
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received { len: r as usize, truncated: msg.msg_flags & libc::MSG_TRUNC != 0, fds, pid })
}

/// poll(2) for input on one fd; Ok(false) on timeout.
pub fn poll_in(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    poll(&mut [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }], timeout_ms).map(|n| n > 0)
}

/// Puts every signal a process may handle back to its default action and unblocks them all:
/// a process inherits ignored signals and its signal mask across fork and exec, so without
/// this a sandbox would start with whatever the daemon's own parent left (a shell's `&`
/// ignores SIGQUIT, a service manager may ignore others). glibc's two internal signals (32,
/// 33: thread cancellation, set*id across threads), which its `sigaction` refuses, are reset
/// by the raw syscall only when ignored: a handler glibc installed there stays.
pub fn default_signals() -> io::Result<()> {
    for sig in [32, 33] {
        unignore_raw(sig)?;
    }
    let sigs =
        (1..32).chain(libc::SIGRTMIN()..=libc::SIGRTMAX()).filter(|s| ![libc::SIGKILL, libc::SIGSTOP].contains(s));
    for sig in sigs {
        // SAFETY: SIG_DFL installs no handler; the sigaction is fully initialized (empty
        // mask, no flags) and only read by the call.
        let r = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        check(r)?;
    }
    // SAFETY: an emptied set, only read by the call.
    let r = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut())
    };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// The kernel's `struct sigaction` for rt_sigaction(2) on x86-64.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Sets `sig` back to SIG_DFL if it is ignored, through rt_sigaction(2) itself.
fn unignore_raw(sig: libc::c_int) -> io::Result<()> {
    let mut old = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: a null new action only reads the current one into `old`, whose layout and
    // size (8-byte mask) are the kernel's.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            std::ptr::null::<KernelSigaction>(),
            &mut old as *mut KernelSigaction,
            8usize,
        )
    })?;
    if old.handler != libc::SIG_IGN {
        return Ok(());
    }
    let dfl = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: SIG_DFL needs no handler or restorer; the struct is only read.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &dfl as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        )
    })
    .map(drop)
}

/// Ignores SIGPIPE (a write to a closed pipe then fails with EPIPE instead of killing the
/// writer), as Rust's runtime sets it up at the start of every program.
pub fn ignore_sigpipe() -> io::Result<()> {
    // SAFETY: SIG_IGN installs no handler.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// poll(2) over `fds`; returns how many have events (0 on timeout).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfds for the call.
    check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }).map(|n| n as usize)
}

pub fn getppid() -> libc::pid_t {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::path::PathBuf;

    /// The host's cgroup2 mount point (`/sys/fs/cgroup` on a v2 host, often
    /// `/sys/fs/cgroup/unified` on a v1 hybrid).
    fn cgroup2_mount() -> PathBuf {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines()
            .find_map(|l| {
                let (pre, post) = l.split_once(" - ")?;
                let point = pre.split(' ').nth(4)?;
                (post.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(point))
            })
            .expect("no cgroup2 mount on this host (clone3's CLONE_INTO_CGROUP needs one)")
    }

    fn v2_line(pid: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        s.lines().find(|l| l.starts_with("0::")).unwrap_or_default().to_string()
    }

    #[test]
    fn fork_into_cgroup_starts_the_child_in_the_cgroup_and_leaves_the_parent_where_it_was() {
        if not_root() {
            eprintln!("skipped: needs root (a cgroup directory)");
            return;
        }
        let mount = cgroup2_mount();
        let dir = mount.join(format!("glovebox-test-clone3-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let fd = OwnedFd::from(std::fs::File::open(&dir).unwrap());
        assert!(is_cgroup2(fd.as_fd()).unwrap());
        let before = v2_line("self");
        let forked = fork_into_cgroup(0, fd.as_fd());
        if forked.is_err() {
            let _ = std::fs::remove_dir(&dir);
        }
        let child = match forked.expect("clone3 into a cgroup (Linux 5.7+)") {
            // Only async-signal-safe calls in the child of this multi-threaded test process.
            Forked::Child => loop {
                // SAFETY: pause has no preconditions; the parent kills this process.
                unsafe { libc::pause() };
            },
            Forked::Parent { child } => child,
        };
        let in_child = v2_line(&child.to_string());
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        let after = v2_line("self");
        kill(child, libc::SIGKILL).unwrap();
        waitpid(child, 0).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        let rel = dir.strip_prefix(&mount).unwrap().display().to_string();
        assert_eq!(in_child, format!("0::/{rel}"), "the child's cgroup");
        assert_eq!(procs.trim(), child.to_string(), "the cgroup's processes");
        assert_eq!(after, before, "the parent moved");
        assert!(!is_cgroup2(OwnedFd::from(std::fs::File::open("/proc").unwrap()).as_fd()).unwrap());
    }

    fn not_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() != 0 }
    }
}
