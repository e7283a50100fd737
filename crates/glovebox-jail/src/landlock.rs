//! The Landlock ruleset the agent (a sandbox's PID 1) restricts itself with before it forks
//! anything: the zygote, the spares and every user command inherit it.
//!
//! Invariants:
//! - Inherited and permanent: a Landlock domain passes to every child and across `execve`,
//!   and nothing can leave it. Every user command descends from the agent, so this ruleset
//!   may refuse only what no user command needs; it is not the agent's own least privilege
//!   (see docs/threat-model.md, "The agent's own confinement").
//! - What it refuses ([`Ruleset::for_abi`], a pure function of the kernel's ABI):
//!   - creating character or block device nodes anywhere (`MAKE_CHAR`, `MAKE_BLOCK`, from
//!     ABI 2): the commands' seccomp filter already refuses device `mknod`; this holds for the
//!     agent, which still has every capability of its user namespace, at a second layer. A
//!     domain that handles any file right refuses moving a file to another directory
//!     (`EXDEV`) unless `REFER` is granted, so `REFER` is handled and granted beneath `/`
//!     (ABI 2); ABI 1 has no `REFER`, and there no file right is handled at all;
//!   - sending a signal to a process outside the domain (`LANDLOCK_SCOPE_SIGNAL`, ABI 6) and
//!     connecting to an abstract unix socket made outside it (`ABSTRACT_UNIX_SOCKET`, ABI 6):
//!     every process a sandbox starts is inside, so these stop only a process that reaches
//!     something entered into the sandbox from outside (a host tool run with `nsenter`, an
//!     abstract socket in a network namespace the host shares with it).
//! - What it leaves alone, and why: reading, writing, executing and making files anywhere
//!   (the file API serves the whole root, and user commands run and write anything their
//!   permissions allow); TCP bind and connect (ABI 4; user servers and allowed egress need
//!   them, and the network namespace and host-side rules bound them); ioctl on devices (ABI 5;
//!   terminals need it).
//! - Best effort: an absent or disabled Landlock, or one older than the rules, never fails
//!   the sandbox. [`restrict_self`] enforces what the running kernel supports and says what
//!   that was; the caller logs it.
//! - Nothing here allocates after [`Ruleset::for_abi`]; [`restrict_self`] is for a
//!   single-threaded process (Landlock restricts the calling thread; threads made later
//!   inherit it).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of making a ruleset.
const CREATE_RULESET_VERSION: u32 = 1 << 0;

/// `LANDLOCK_ACCESS_FS_MAKE_CHAR` (ABI 1).
pub const ACCESS_FS_MAKE_CHAR: u64 = 1 << 6;
/// `LANDLOCK_ACCESS_FS_MAKE_BLOCK` (ABI 1).
pub const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
/// `LANDLOCK_ACCESS_FS_REFER` (ABI 2).
pub const ACCESS_FS_REFER: u64 = 1 << 13;
/// `LANDLOCK_RULE_PATH_BENEATH`.
const RULE_PATH_BENEATH: u32 = 1;
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6).
pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// `LANDLOCK_SCOPE_SIGNAL` (ABI 6).
pub const SCOPE_SIGNAL: u64 = 1 << 1;

/// The ABI that introduced `REFER` (before it, handling any file right forbids renames
/// across directories).
const ABI_REFER: u32 = 2;
/// The ABI that introduced scopes.
const ABI_SCOPES: u32 = 6;

/// `struct landlock_ruleset_attr` as of ABI 6 (fields an older kernel does not know must be
/// zero: it accepts a larger struct only when the tail it does not know is all zero).
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's header: 12 bytes).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// What the agent's domain refuses, for one ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ruleset {
    pub abi: u32,
    /// Filesystem rights handled and granted nowhere: refused everywhere.
    pub fs_denied: u64,
    /// Filesystem rights handled and granted beneath `/`: allowed everywhere (handled only
    /// because an unhandled `REFER` would refuse renames across directories).
    pub fs_root: u64,
    /// Scopes (ABI 6): signals and abstract unix sockets stay inside the domain.
    pub scoped: u64,
}

impl Ruleset {
    /// The agent's ruleset on a kernel with Landlock ABI `abi` (`None`: nothing to enforce).
    pub fn for_abi(abi: u32) -> Option<Ruleset> {
        if abi < ABI_REFER {
            return None;
        }
        let scoped = if abi >= ABI_SCOPES { SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET } else { 0 };
        Some(Ruleset { abi, fs_denied: ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK, fs_root: ACCESS_FS_REFER, scoped })
    }

    /// A short human description, for the agent's log.
    pub fn describe(&self) -> String {
        let scopes = if self.scoped != 0 { ", signals and abstract unix sockets scoped to the sandbox" } else { "" };
        format!("landlock ABI {}: no device nodes{scopes}", self.abi)
    }
}

/// What [`restrict_self`] did.
#[derive(Debug)]
pub enum Outcome {
    /// The ruleset is enforced on the calling thread (and everything it starts).
    Enforced(Ruleset),
    /// Nothing was enforced, and why (no Landlock in this kernel, disabled at boot).
    Unsupported(String),
}

/// The kernel's Landlock ABI version; 0 when Landlock is absent or disabled.
pub fn abi() -> io::Result<u32> {
    // SAFETY: with LANDLOCK_CREATE_RULESET_VERSION the kernel requires a null attribute and
    // a zero size, reads and writes no memory, and returns the version or an error.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if r >= 0 {
        return Ok(r as u32);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // ENOSYS: not built in; EOPNOTSUPP: built in but not enabled (`lsm=` at boot).
        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(0),
        _ => Err(e),
    }
}

/// Restricts the calling thread (and all it starts from now on) with the agent's ruleset for
/// the running kernel. Errors only when the kernel has Landlock and refuses this ruleset; no
/// Landlock, or an unknown one, is [`Outcome::Unsupported`].
///
/// The caller must be single-threaded (or accept that threads already running stay
/// unrestricted), and needs `no_new_privs` or `CAP_SYS_ADMIN` in its user namespace (PID 1 of
/// a sandbox has the latter).
pub fn restrict_self() -> io::Result<Outcome> {
    let abi = abi()?;
    let Some(rules) = Ruleset::for_abi(abi) else {
        let why = match abi {
            0 => "landlock is not enabled in this kernel".to_owned(),
            n => format!("landlock ABI {n} cannot refuse device nodes without refusing renames across directories"),
        };
        return Ok(Outcome::Unsupported(why));
    };
    enforce(&rules)?;
    Ok(Outcome::Enforced(rules))
}

/// Makes the ruleset and restricts the calling thread with it.
fn enforce(rules: &Ruleset) -> io::Result<()> {
    let ruleset = make(rules, Path::new("/"))?;
    // Every other handled right is refused everywhere (see the module docs).
    // SAFETY: integer-only call on an fd we own; flags 0 (log denials of this process, as
    // the kernel's default).
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The agent's ruleset as an fd, its path rule beneath `root` (a sandbox's root seen from the
/// host, `/proc/<PID 1>/root`): for a process that joins the sandbox from outside (a python
/// kernel forked from a zygote), which restricts itself with it after `no_new_privs`. `None`
/// where the agent runs without Landlock ([`restrict_self`]'s `Unsupported`).
pub fn ruleset_beneath(root: &Path) -> io::Result<Option<OwnedFd>> {
    match Ruleset::for_abi(abi()?) {
        Some(rules) => make(&rules, root).map(Some),
        None => Ok(None),
    }
}

fn make(rules: &Ruleset, root_dir: &Path) -> io::Result<OwnedFd> {
    let attr =
        RulesetAttr { handled_access_fs: rules.fs_denied | rules.fs_root, handled_access_net: 0, scoped: rules.scoped };
    // SAFETY: `attr` is a live, initialised struct laid out as the kernel's
    // `landlock_ruleset_attr` (three u64s), and its exact size is passed with it; the kernel
    // only reads it. The result is a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    let ruleset = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if rules.fs_root != 0 {
        let root = std::fs::File::open(root_dir)?;
        let rule = PathBeneathAttr { allowed_access: rules.fs_root, parent_fd: root.as_raw_fd() };
        // SAFETY: `rule` is a live, initialised struct laid out as the kernel's packed
        // `landlock_path_beneath_attr`; the kernel only reads it. Both fds are ours and open.
        let r = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset.as_raw_fd(),
                RULE_PATH_BENEATH,
                &rule as *const PathBeneathAttr,
                0u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(ruleset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ABI 1 cannot handle a file right without refusing every rename across directories.
    #[test]
    fn no_landlock_or_abi_1_means_nothing_to_enforce() {
        assert_eq!(Ruleset::for_abi(0), None);
        assert_eq!(Ruleset::for_abi(1), None);
    }

    #[test]
    fn device_nodes_from_abi_2_scopes_from_abi_6() {
        for abi in 2..=5 {
            let r = Ruleset::for_abi(abi).expect("enforced");
            assert_eq!(r.fs_denied, ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK, "abi {abi}");
            assert_eq!(r.fs_root, ACCESS_FS_REFER, "abi {abi}");
            assert_eq!(r.scoped, 0, "abi {abi} has no scopes");
        }
        for abi in [6, 7, 8] {
            let r = Ruleset::for_abi(abi).expect("enforced");
            assert_eq!(r.fs_denied, ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK, "abi {abi}");
            assert_eq!(r.fs_root, ACCESS_FS_REFER, "abi {abi}");
            assert_eq!(r.scoped, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET, "abi {abi}");
        }
    }

    /// What user commands need is never refused: file reads, writes, execution, regular
    /// files, directories, symlinks, fifos, sockets, truncation, device ioctls (bits 0–5,
    /// 7–10, 12, 14, 15 are not handled), renames across directories (13, `REFER`: handled
    /// but granted beneath `/`), nor any network right (nothing handled: see `enforce`).
    #[test]
    fn nothing_user_commands_need_is_refused() {
        for abi in 2..=8 {
            let r = Ruleset::for_abi(abi).expect("enforced");
            let devices = ACCESS_FS_MAKE_CHAR | ACCESS_FS_MAKE_BLOCK;
            for bit in (0..=15u32).map(|b| 1u64 << b).filter(|&b| b & devices == 0) {
                assert_eq!(r.fs_denied & bit, 0, "abi {abi}: fs right {bit:#x} is refused");
            }
            assert_eq!(r.fs_root, ACCESS_FS_REFER, "abi {abi}: only REFER is handled and granted");
        }
    }

    #[test]
    fn this_kernel_reports_an_abi() {
        // Any answer but an error: 0 on a kernel without Landlock.
        abi().expect("query the landlock abi");
    }

    // Behaviour: the ruleset enforced for real in a child (this test binary re-run with only
    // `probe_child` selected, single-threaded), with the same checks run without it first so
    // that a refusal is shown to be Landlock's.

    const PROBE_ENV: &str = "GLOVEBOX_LANDLOCK_PROBE";
    const DIR_ENV: &str = "GLOVEBOX_LANDLOCK_DIR";
    const SOCK_ENV: &str = "GLOVEBOX_LANDLOCK_SOCK";

    fn run_probe(enforce: bool, dir: &std::path::Path, sock: &str) -> (Option<i32>, String) {
        use std::time::{Duration, Instant};
        let out = dir.join(if enforce { "out-enforced" } else { "out-plain" });
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "landlock::tests::probe_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(PROBE_ENV, if enforce { "enforce" } else { "plain" })
            .env(DIR_ENV, dir)
            .env(SOCK_ENV, sock)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn probe");
        let deadline = Instant::now() + Duration::from_secs(60);
        let code = loop {
            if let Some(st) = child.try_wait().expect("wait probe") {
                break st.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("landlock probe did not finish in time");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        (code, std::fs::read_to_string(&out).expect("probe output"))
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no arguments and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// Without the ruleset every probe succeeds (as root: device nodes need CAP_MKNOD); with
    /// it, device nodes, signals to this (outside) process and its abstract socket are
    /// refused, while what commands do keeps working.
    #[test]
    fn the_agent_ruleset_refuses_devices_outside_signals_and_sockets_only() {
        if !is_root() || abi().expect("abi") < ABI_SCOPES {
            eprintln!("SKIPPED: needs root and landlock ABI 6 (CI runs as root on a 6.x kernel)");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let name = format!("glovebox-landlock-test-{}", std::process::id());
        let listener = abstract_listener(&name);
        let (code, out) = run_probe(false, dir.path(), &name);
        assert_eq!(code, Some(0), "{out}");
        for what in ["mknod-char", "mknod-block", "signal-outside", "abstract-outside"] {
            assert!(out.contains(&format!("{what}: ok")), "without landlock, {what} works:\n{out}");
        }
        let (code, out) = run_probe(true, dir.path(), &name);
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("enforced: landlock ABI"), "{out}");
        for (what, errno) in [
            ("mknod-char", libc::EACCES),
            ("mknod-block", libc::EACCES),
            ("signal-outside", libc::EPERM),
            ("abstract-outside", libc::EPERM),
        ] {
            assert!(out.contains(&format!("{what}: errno {errno}\n")), "with landlock, {what} is refused:\n{out}");
        }
        for what in [
            "file",
            "dir",
            "fifo",
            "symlink",
            "rename-across-dirs",
            "link-across-dirs",
            "exec",
            "signal-own-child",
            "abstract-own",
            "tcp-loopback",
        ] {
            assert!(out.contains(&format!("{what}: ok")), "with landlock, {what} still works:\n{out}");
        }
        drop(listener);
    }

    fn abstract_listener(name: &str) -> std::os::unix::net::UnixListener {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
        std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind abstract socket")
    }

    fn connect_abstract(name: &str) -> io::Result<()> {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        std::os::unix::net::UnixStream::connect_addr(&addr).map(drop)
    }

    /// The child side; does nothing unless started by the test above.
    #[test]
    #[ignore = "child side of the landlock behaviour test"]
    fn probe_child() {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let Ok(mode) = std::env::var(PROBE_ENV) else { return };
        let dir = std::path::PathBuf::from(std::env::var_os(DIR_ENV).expect("dir"));
        let sock = std::env::var(SOCK_ENV).expect("socket name");
        let sub = dir.join(&mode);
        std::fs::create_dir(&sub).expect("probe dir");
        if mode == "enforce" {
            match restrict_self().expect("restrict") {
                Outcome::Enforced(r) => println!("enforced: {}", r.describe()),
                Outcome::Unsupported(why) => panic!("not enforced: {why}"),
            }
        }
        let report = |what: &str, r: io::Result<()>| match r {
            Ok(()) => println!("{what}: ok"),
            Err(e) => println!("{what}: errno {}", e.raw_os_error().unwrap_or(-1)),
        };
        let mknod = |name: &str, kind: libc::mode_t| -> io::Result<()> {
            let p = CString::new(sub.join(name).as_os_str().as_bytes()).expect("no nul");
            // SAFETY: a live NUL-terminated path; mode and device are integers (1:3 is
            // /dev/null's number, harmless if it is made).
            let r = unsafe { libc::mknod(p.as_ptr(), kind | 0o600, libc::makedev(1, 3)) };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        report("mknod-char", mknod("c", libc::S_IFCHR));
        report("mknod-block", mknod("b", libc::S_IFBLK));
        report("fifo", mknod("p", libc::S_IFIFO));
        report("file", std::fs::write(sub.join("f"), b"x"));
        report("dir", std::fs::create_dir(sub.join("d")));
        report("symlink", std::os::unix::fs::symlink("f", sub.join("l")));
        report("rename-across-dirs", std::fs::rename(sub.join("f"), sub.join("d/f")));
        report("link-across-dirs", std::fs::hard_link(sub.join("d/f"), sub.join("f2")));
        report(
            "exec",
            std::process::Command::new("/bin/true").status().and_then(|s| {
                if s.success() {
                    Ok(())
                } else {
                    Err(io::Error::other("true failed"))
                }
            }),
        );
        report("signal-outside", {
            // SAFETY: getppid has no arguments; kill with signal 0 only checks permission.
            let r = unsafe { libc::kill(libc::getppid(), 0) };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
        report(
            "signal-own-child",
            std::process::Command::new("/bin/sleep").arg("10").spawn().and_then(|mut c| {
                let r = c.kill();
                let _ = c.wait();
                r
            }),
        );
        report("abstract-outside", connect_abstract(&sock));
        let own = format!("{sock}-{mode}");
        let l = abstract_listener(&own);
        report("abstract-own", connect_abstract(&own));
        drop(l);
        report(
            "tcp-loopback",
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| std::net::TcpStream::connect(l.local_addr()?).map(drop)),
        );
        std::process::exit(0);
    }
}
