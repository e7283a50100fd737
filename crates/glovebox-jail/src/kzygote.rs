//! The launcher of a python kernel zygote (`glovebox-agent kernel-zygote`, config on stdin,
//! the zygote's control socket at fd 3): one process per tenant and template that has
//! imported the template's libraries, and whose forked children become the python kernels
//! of that template's sandboxes (docs/benchmarks.md, "A per-template python kernel zygote").
//!
//! It runs the template's library code, so it is as unprivileged as a process on the host
//! can be: a host uid of its own (no sandbox's, not root), no capability, `no_new_privs`, in
//! new mount, PID, network (loopback only, down), IPC, UTS and cgroup namespaces (its PID namespace the host's: see `launch`), with the
//! template's root (the same layers a sandbox of it gets, not id-mapped: on-disk root is
//! host root, so nothing of it is the zygote's to write) as its `/` and nothing of the host
//! reachable. What it can do that a sandbox's command cannot is make a user namespace
//! (`unshare(CLONE_NEWUSER)`), which its forked children need: host root writes the new
//! namespace's maps and builds the sandbox inside it.
//!
//! Steps, in one process: join its own cgroups; unshare mount, network, IPC, UTS and cgroup
//! namespaces (not PID: see `launch`); build the root, pivot_root, a /proc showing only its
//! own processes; rlimits; close every fd but 0-3; drop every capability (bounding set
//! too), setuid to its uid, no_new_privs, its seccomp filter (`seccomp/zygote.json`); exec
//! `python3 python_kernel.py` (in zygote mode, by its environment).

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::JailConfig;
use crate::error::{Ctx, JailError, Result};
use crate::{rootfs, sys};

/// What the daemon sends on the launcher's stdin.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ZygoteConfig {
    /// The root (layers, skeleton, host `/usr`, private tmpfs on `mount_dir`) and the
    /// cgroups the zygote joins (its own, never a sandbox's). `uid_base` is unused (0).
    pub root: JailConfig,
    /// The zygote's host uid and gid: one of its own, used by nothing else.
    pub uid: u32,
    /// The program (inside its root) and its argv.
    pub exe: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// The control socket's fd in the zygote.
pub const CONTROL_FD: i32 = 3;

/// Entry point of `glovebox-agent kernel-zygote`. Never returns.
pub fn main_from_stdin() -> ! {
    let mut buf = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut buf) {
        eprintln!("glovebox: kernel zygote: read config: {e}");
        sys::exit_now(1);
    }
    let cfg = match serde_json::from_slice::<ZygoteConfig>(&buf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("glovebox: kernel zygote: config: {e}");
            sys::exit_now(1);
        }
    };
    match launch(&cfg) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("glovebox: kernel zygote: {e}");
            sys::exit_now(1)
        }
    }
}

fn launch(cfg: &ZygoteConfig) -> Result<std::convert::Infallible> {
    if cfg.uid == 0 || cfg.argv.is_empty() {
        return Err(JailError::Config("a zygote runs as a host uid of its own, never root".into()));
    }
    sys::default_signals().ctx("reset signal dispositions")?;
    let me = sys::getpid().to_string();
    for procs in &cfg.root.cgroup_procs {
        std::fs::write(procs, &me).ctx_at("join cgroup", procs)?;
    }
    // No PID namespace of its own: a process may only enter a PID namespace below its own,
    // and the zygote's children enter their sandboxes'. It sees no other process through
    // its /proc (`hidepid`, below) and can signal only its own (its uid is its alone).
    sys::unshare(
        libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWCGROUP,
    )
    .ctx("unshare namespaces")?;
    sys::mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE, None).ctx("make / private")?;
    let root = rootfs::build_guest(&cfg.root)?;
    rootfs::build_dev_for(&root, cfg.root.shm_bytes)?;
    rootfs::enter(&root)?;
    // A /proc that shows the zygote its own processes only.
    sys::umount2(Path::new("/proc"), libc::MNT_DETACH).ctx("detach /proc")?;
    sys::mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("hidepid=invisible,subset=pid"),
    )
    .ctx("mount /proc")?;
    // Its root read-only: nothing there is the zygote's to change; a small /tmp of its own
    // for the libraries' caches (matplotlib's font list).
    sys::mount(None, Path::new("/"), None, libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY, None)
        .ctx("remount / read-only")?;
    sys::mount(
        Some("tmp"),
        Path::new("/tmp"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("size=16m,mode=1777,nr_inodes=4096"),
    )
    .ctx("mount /tmp")?;
    sys::lower_rlimit(libc::RLIMIT_CORE, 0, 0).ctx("rlimit core")?;
    // A sandbox's (`jailer::pid1`): its forked kernels may only lower what they inherit.
    sys::lower_rlimit(libc::RLIMIT_NOFILE, 1 << 16, 1 << 16).ctx("rlimit nofile")?;
    let devnull = std::fs::File::open("/dev/null").ctx("open /dev/null")?;
    sys::dup2(std::os::fd::AsRawFd::as_raw_fd(&devnull), 0).ctx("stdin")?;
    drop(devnull);
    sys::close_range(CONTROL_FD as u32 + 1, u32::MAX).ctx("close inherited fds")?;
    sys::chdir(Path::new(&cfg.cwd)).ctx_at("chdir", &cfg.cwd)?;
    let cstr = |s: &str| CString::new(s).map_err(|_| JailError::Config(format!("NUL in {s:?}")));
    let exe = cstr(&cfg.exe)?;
    let argv = cfg.argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>>>()?;
    let envp = cfg.env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect::<Result<Vec<_>>>()?;
    sys::setgroups_empty().ctx("setgroups")?;
    sys::setresgid(cfg.uid).ctx("setresgid")?;
    // The bounding set first (it needs CAP_SETPCAP), then the uid change (CAP_SETUID) clears
    // the permitted and effective sets; then what is left goes, and no_new_privs.
    for cap in 0..=63 {
        if sys::prctl(libc::PR_CAPBSET_DROP, cap).is_err() {
            break;
        }
    }
    sys::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong).ctx("clear ambient")?;
    sys::setresuid(cfg.uid).ctx("setresuid")?;
    sys::drop_all_caps().ctx("drop capabilities")?;
    // The commands' filter plus its children's way into a sandbox (`seccomp/zygote.json`):
    // the template's code it runs meets what the same code in a sandbox would, and every
    // kernel forked from it keeps this filter under the commands' own.
    let filter = crate::seccomp::compile_zygote().map_err(|e| JailError::Config(format!("zygote seccomp: {e}")))?;
    crate::seccomp::install(&filter).map_err(|e| JailError::Config(format!("zygote seccomp: {e}")))?;
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = envp.iter().map(|c| c.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: NUL-terminated arrays of pointers into CStrings alive across the call.
    unsafe { libc::execve(exe.as_ptr(), a.as_ptr(), e.as_ptr()) };
    Err(JailError::sys("exec the zygote", std::io::Error::last_os_error()))
}

// ---- the daemon's side -----------------------------------------------------------------

/// How long the daemon waits for each answer of a zygote's child.
const ANSWER_MS: i32 = 2000;

/// The namespaces of a sandbox's PID 1 a forked kernel joins, in the order it joins them
/// (its user namespace it made itself; the mount namespace last, as it changes the root).
pub const JOINED: [&str; 7] = ["cgroup", "ipc", "uts", "net", "pid", "time", "mnt"];

/// A zygote the daemon started: the launcher's process (the zygote itself after its exec)
/// and the daemon's end of its control socket.
pub struct Running {
    pub child: std::process::Child,
    ctl: OwnedFd,
    ready: bool,
    /// The zygote's host uid (its children's too).
    uid: u32,
}

/// Starts a zygote: `agent` is the agent binary; `log` takes its stdout and stderr.
pub fn spawn(agent: &Path, cfg: &ZygoteConfig, log: std::fs::File) -> std::io::Result<Running> {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = sys::seqpacket_pair()?;
    let raw = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(agent);
    cmd.arg("kernel-zygote").env_clear().stdin(std::process::Stdio::piped()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: only async-signal-safe calls on fds of this process (the forked child's): the
    // socket becomes fd 3 without close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = if raw == CONTROL_FD { libc::fcntl(raw, libc::F_SETFD, 0) } else { libc::dup2(raw, CONTROL_FD) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = cmd.spawn()?;
    drop(theirs);
    let body = serde_json::to_vec(cfg).map_err(std::io::Error::other)?;
    let sent = child.stdin.take().map(|mut s| s.write_all(&body));
    if !matches!(sent, Some(Ok(()))) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other("could not send the zygote its config"));
    }
    Ok(Running { child, ctl: ours, ready: false, uid: cfg.uid })
}

impl Running {
    /// Whether it has made its kernel and waits for requests (its `R`); never blocks.
    pub fn ready(&mut self) -> bool {
        if !self.ready && sys::poll_in(self.ctl.as_raw_fd(), 0).unwrap_or(false) {
            let mut b = [0u8; 4];
            if let Ok(r) = sys::recv_with_fds(self.ctl.as_raw_fd(), &mut b) {
                self.ready = r.len == 1 && b[0] == b'R';
            }
        }
        self.ready
    }

    /// Whether its process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Has the zygote fork a child that makes a user namespace, and maps it to the host
    /// range `base .. base + count` (sandbox uid 0 = `base`), as host root.
    pub fn fork(&self, base: u32, count: u32) -> std::io::Result<Forked> {
        let (ours, theirs) = sys::seqpacket_pair()?;
        sys::set_passcred(ours.as_fd())?;
        sys::send_with_fds(self.ctl.as_fd(), b"F", &[theirs.as_fd()])?;
        drop(theirs);
        let pid = expect(&ours, b"c")?.pid.ok_or_else(|| std::io::Error::other("the child sent no credentials"))?;
        let pidfd = pidfd_open(pid)?;
        // The process's /proc directory, held open: every file below is read through it, so
        // all of them are that one process's even if it dies and its pid is reused meanwhile
        // (opening through a dead process's directory fails). A pid the zygote's code sent
        // could name another process by the time it is opened; what is opened must be a child
        // of this zygote and run as its uid, or nothing is written.
        let dir = std::fs::File::open(format!("/proc/{pid}"))?;
        if !is_child_of(&std::fs::read_to_string(proc_path(&dir, "status"))?, self.child.id(), self.uid) {
            return Err(std::io::Error::other("the pid the zygote's child sent is not a child of that zygote"));
        }
        let mut f = Forked { pid, pidfd, chan: ours, userns: None, proc_dir: dir };
        expect(&f.chan, b"u")?;
        // Opened before the maps are written: the maps go to the namespace held here.
        let at = |name: &str| proc_path(&f.proc_dir, name);
        let userns = std::fs::File::open(at("ns/user"))?;
        let map = format!("0 {base} {count}\n");
        // Either write fails if the child (or anyone) wrote a map first: one write each.
        std::fs::write(at("uid_map"), &map)?;
        std::fs::write(at("gid_map"), &map)?;
        f.userns = Some(userns.into());
        Ok(f)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a forked kernel becomes inside its sandbox.
#[derive(Debug, Clone, Serialize)]
pub struct KernelSpec {
    pub cwd: String,
    pub env: std::collections::BTreeMap<String, String>,
    pub uid: u32,
    pub gid: u32,
    /// Seccomp filters to install, in order (the agent's, then the commands'), each as
    /// `(code, jt, jf, k)`.
    pub seccomp: Vec<Vec<(u16, u8, u8, u32)>>,
    /// Resource limits to set (soft = hard), as the sandbox's PID 1 has them.
    pub rlimits: Vec<(u32, u64)>,
}

/// A zygote's child that made its user namespace (maps written). Killed when dropped unless
/// it was handed off.
pub struct Forked {
    pub pid: libc::pid_t,
    pidfd: OwnedFd,
    chan: OwnedFd,
    userns: Option<OwnedFd>,
    /// Its `/proc` directory (see [`Running::fork`]).
    proc_dir: std::fs::File,
}

impl Forked {
    /// Its user namespace, for the jailer (`JailConfig::userns`).
    pub fn userns(&self) -> Option<BorrowedFd<'_>> {
        self.userns.as_ref().map(|f| f.as_fd())
    }

    /// Moves the child into the sandbox's cgroups (`procs`), gives it the namespaces of the
    /// sandbox's PID 1 (`pid1`, a host pid), the kernel's stdio and the Landlock ruleset, and
    /// waits for the kernel it forks into them. Returns the kernel's host pid; the child
    /// exits by itself.
    pub fn hand_off(
        self,
        procs: &[std::path::PathBuf],
        pid1: libc::pid_t,
        spec: &KernelSpec,
        stdio: [BorrowedFd<'_>; 3],
        landlock: Option<BorrowedFd<'_>>,
    ) -> std::io::Result<libc::pid_t> {
        // A cgroup takes a pid number: the child is checked alive through its held /proc
        // directory first (it is blocked on us; gone, its pid could name another process).
        std::fs::read_to_string(proc_path(&self.proc_dir, "status")).map_err(ctx("the zygote's child is gone"))?;
        for p in procs {
            std::fs::write(p, self.pid.to_string())
                .map_err(ctx("move the zygote's child into the sandbox's cgroups"))?;
        }
        self.fault("joining");
        self.fault("stalled");
        let ns: Vec<OwnedFd> = JOINED
            .iter()
            .map(|n| std::fs::File::open(format!("/proc/{pid1}/ns/{n}")).map(OwnedFd::from))
            .collect::<std::io::Result<_>>()?;
        let mut body = serde_json::to_value(spec).map_err(std::io::Error::other)?;
        body["ns"] = serde_json::json!(JOINED);
        body["landlock"] = serde_json::json!(landlock.is_some());
        let body = serde_json::to_vec(&body).map_err(std::io::Error::other)?;
        let mut fds: Vec<BorrowedFd<'_>> = ns.iter().map(|f| f.as_fd()).collect();
        fds.extend(stdio);
        fds.extend(landlock);
        sys::send_with_fds(self.chan.as_fd(), &body, &fds).map_err(ctx("send the zygote's child the sandbox"))?;
        self.fault("forking");
        let k = expect(&self.chan, b"k").map_err(ctx("the kernel forked into the sandbox"))?;
        self.fault("reaping");
        // The child exits once it has reaped the process between it and the kernel; killed
        // before that (on drop), it would leave that process to the zygote to reap.
        let _ = sys::poll_in(self.pidfd.as_raw_fd(), ANSWER_MS);
        k.pid.ok_or_else(|| std::io::Error::other("the kernel sent no credentials"))
    }
}

impl Forked {
    /// Debug builds only (tests/zygote.rs): with `GLOVEBOX_DEBUG_ZYGOTE_FAULT=STEP` in the
    /// daemon's environment, the first hand-off to reach `step` SIGKILLs the child there and
    /// waits for its death, as if it had died at that point: `booting` (its user namespace
    /// made, the sandbox not yet booted in it), `joining` (moved into the sandbox's cgroups,
    /// nothing sent), `forking` (the namespaces sent, its kernel not yet reported), `reaping`
    /// (its kernel reported, its middle process perhaps not yet reaped); or SIGSTOPs it,
    /// alive but never answering: `stalled` (where `joining` kills it). Release builds never
    /// read the variable.
    pub fn fault(&self, step: &str) {
        #[cfg(debug_assertions)]
        {
            use std::sync::atomic::{AtomicBool, Ordering};
            static FIRED: AtomicBool = AtomicBool::new(false);
            if std::env::var("GLOVEBOX_DEBUG_ZYGOTE_FAULT").is_ok_and(|s| s == step)
                && !FIRED.swap(true, Ordering::SeqCst)
            {
                let (sig, what) =
                    if step == "stalled" { (libc::SIGSTOP, "stopped") } else { (libc::SIGKILL, "killed") };
                // SAFETY: integer-only syscall on a pidfd we own (never a recycled pid).
                unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), sig, 0usize, 0u32) };
                if sig == libc::SIGKILL {
                    let _ = sys::poll_in(self.pidfd.as_raw_fd(), ANSWER_MS);
                }
                eprintln!("glovebox: debug fault at {step}: the zygote's child {what}");
            }
        }
        let _ = step;
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        // Done or not, the child has no more to do: a handed-off one is exiting anyway.
        // SAFETY: integer-only syscall on a pidfd we own (never a recycled pid).
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), libc::SIGKILL, 0usize, 0u32) };
    }
}

/// Prefixes an error with what was being done (its kind kept).
fn ctx(what: &'static str) -> impl Fn(std::io::Error) -> std::io::Error {
    move |e| std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: integer-only syscall; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just returned by the kernel, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits (at most [`ANSWER_MS`]) for one message that must be `want`.
fn expect(sock: &OwnedFd, want: &[u8]) -> std::io::Result<sys::Received> {
    if !sys::poll_in(sock.as_raw_fd(), ANSWER_MS)? {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the zygote's child did not answer"));
    }
    let mut b = [0u8; 16];
    let r = sys::recv_with_fds(sock.as_raw_fd(), &mut b)?;
    if &b[..r.len] != want || !r.fds.is_empty() {
        return Err(std::io::Error::other(format!(
            "the zygote's child answered {:?}, not {:?}",
            String::from_utf8_lossy(&b[..r.len]),
            String::from_utf8_lossy(want)
        )));
    }
    Ok(r)
}

/// A file of the process whose `/proc/PID` directory `dir` is: opened through it, it is that
/// process's or fails (`ESRCH`) once it is gone, whatever the pid names by then.
fn proc_path(dir: &std::fs::File, name: &str) -> String {
    format!("/proc/self/fd/{}/{name}", dir.as_raw_fd())
}

/// Whether `status` (a `/proc/PID/status`) is that of a child of `parent` whose real,
/// effective, saved and filesystem uids are all `uid`.
fn is_child_of(status: &str, parent: u32, uid: u32) -> bool {
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
    let ppid = field("PPid:").and_then(|mut f| f.next()).and_then(|p| p.parse::<u32>().ok());
    let uids: Vec<Option<u32>> = field("Uid:").map(|f| f.map(|u| u.parse().ok()).collect()).unwrap_or_default();
    ppid == Some(parent) && uids.len() == 4 && uids.iter().all(|u| *u == Some(uid))
}

#[cfg(test)]
mod child_check_tests {
    use super::is_child_of;

    const STATUS: &str = "Name:\tpython3\nPid:\t900\nPPid:\t812\nUid:\t200000\t200000\t200000\t200000\nGid:\t200000\t200000\t200000\t200000\n";

    #[test]
    fn only_a_child_of_the_zygote_running_as_its_uid_passes() {
        assert!(is_child_of(STATUS, 812, 200000));
        assert!(!is_child_of(STATUS, 813, 200000), "another parent");
        assert!(!is_child_of(STATUS, 812, 0), "another uid");
        let mixed = STATUS.replace("Uid:\t200000\t200000\t200000\t200000", "Uid:\t200000\t0\t200000\t200000");
        assert!(!is_child_of(&mixed, 812, 200000), "one uid differs");
        assert!(!is_child_of("Name:\tx\n", 812, 200000), "no fields");
    }
}
