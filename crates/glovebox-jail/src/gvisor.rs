//! The gVisor tier's host side: a sandbox whose processes run on gVisor's sentry (`runsc`)
//! rather than on the host kernel, with the same agent as its PID 1 (see [`crate::guest`]).
//!
//! ```text
//! daemon ── glovebox-agent gvisor (config on stdin, status on stdout) ──┐
//!   join the sandbox's cgroups                                          │ this module's
//!   unshare(mount ns), / rslave                                         │ helper; exits
//!   build the root (rootfs::build_guest: layers, capped tmpfs upper)    │ once the agent
//!   write /etc/resolv.conf into it (never through a symlink)            │ answers
//!   [setns(sandbox netns), cover /proc/sys/net/core]                    │
//!   write the OCI bundle, run `runsc run --detach`                      │
//!   wait for the agent's socket to accept, report `pid`, `gofer`        ┘
//!        runsc ──▶ gofer (host root, serves the root) + sentry (the guest kernel)
//!                            └── glovebox-agent init (PID 1 inside)
//! ```
//!
//! Invariants:
//! - Every mount is made in the helper's private mount namespace; runsc's gofer and sentry
//!   inherit copies of it, so the root lives exactly as long as they do and nothing is ever
//!   mounted in the host's namespace.
//! - Everything the sandbox runs is in the sandbox's host cgroups (joined before runsc
//!   starts; runsc is told to leave cgroups alone), so the host's limits and kills cover
//!   the sentry, the gofer and every stub process.
//! - Fails closed: a helper that reports an error has killed and reaped what runsc started
//!   (it is their reaper until it exits); the daemon then kills the cgroup for the rest.
//! - Only the gVisor sandbox's own paths are shared with it: its root (a private tree), the
//!   agent binary (read-only) and one empty directory for the agent's socket.
//!
//! runsc 20221219 on Linux ≥ 6.x refuses every network namespace as "the root network
//! namespace": it recognised the root one by `/proc/sys/net/core/rmem_default`, which newer
//! kernels show in every namespace. The helper covers `/proc/sys/net/core` with an empty
//! tmpfs in its own mount namespace, joined to the sandbox's network namespace (procfs
//! resolves `/proc/sys/net` per network namespace), so runsc's check reads the namespace as
//! what it is: a fresh one of the daemon's. Nothing else reads that directory there.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::JailConfig;
use crate::error::{Ctx, JailError, Result};
use crate::{guest, rootfs, sys};

/// How long runsc may take to start the sandbox, and then the agent to answer.
pub const START_DEADLINE: Duration = Duration::from_secs(20);

/// What the daemon tells the helper about one gVisor sandbox (JSON on its stdin).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GvisorConfig {
    /// The sandbox's root and host resources as for the jail: layers, disk cap, cgroups,
    /// network namespace, resolv.conf, volumes, pids. `uid_base` is 0 (the guest's ids are
    /// its own; files the gofer writes for its uid 0 are root's, inside the private tree).
    pub jail: JailConfig,
    /// The sandbox's host directory: `bundle/` (the OCI spec), `runsc/` (runsc's state),
    /// `agent/` (the socket directory, shared with the guest).
    pub dir: PathBuf,
    pub runsc: PathBuf,
    /// `ptrace` (works everywhere) or `kvm` (needs hardware virtualization).
    pub platform: String,
    /// The agent binary, bound read-only into the guest to be its PID 1.
    pub agent_exe: PathBuf,
    /// runsc's debug logs go here when set (`--debug --debug-log`).
    #[serde(default)]
    pub debug_log: Option<PathBuf>,
}

impl GvisorConfig {
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.join("agent")
    }

    /// Where the daemon connects to the agent.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_dir().join(guest::SOCKET_NAME)
    }

    fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }

    fn state(&self) -> PathBuf {
        self.dir.join("runsc")
    }
}

/// Where the agent binary is inside the guest.
pub const AGENT_IN_GUEST: &str = "/run/glovebox/glovebox-agent";

/// The guest kernel's processes on the host, as the helper reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The sentry (the guest kernel; its exit is the sandbox's end).
    pub sentry: libc::pid_t,
    /// The gofer (serves the root; exits after the sentry).
    pub gofer: libc::pid_t,
}

/// A started sandbox as the daemon holds it: the guest's processes and its reaper.
#[derive(Debug)]
pub struct Launched {
    pub started: Started,
    /// The helper, which stays as the sandbox's reaper (see [`main_from_stdin`]): the
    /// daemon's child, to be reaped once the sandbox is gone.
    pub helper: libc::pid_t,
}

/// Daemon side: starts the helper for `cfg` and waits until the agent answers. The helper
/// gets an empty environment and only stdin (config), stdout (status) and stderr (`log`, the
/// sandbox's agent log, which runsc and the agent write to as well).
pub fn launch(agent_exe: &Path, cfg: &GvisorConfig, log: File) -> Result<Launched> {
    let body = serde_json::to_vec(cfg).map_err(|e| JailError::Config(e.to_string()))?;
    let mut child = Command::new(agent_exe)
        .arg0("glovebox-agent")
        .arg("gvisor")
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .ctx_at("spawn gvisor helper", agent_exe)?;
    let mut stdin = child.stdin.take().ok_or_else(|| JailError::Reported("no stdin pipe".into()))?;
    let written = stdin.write_all(&body);
    drop(stdin);
    let mut out = child.stdout.take().ok_or_else(|| JailError::Reported("no stdout pipe".into()))?;
    // The helper closes its stdout once it has reported (and then stays, as the reaper).
    let status = crate::launch::read_until_eof(&mut out, START_DEADLINE + Duration::from_secs(5));
    let started = written.ctx("send gvisor config").and_then(|()| parse_status(&status?));
    match started {
        Ok(started) => Ok(Launched { started, helper: child.id() as libc::pid_t }),
        Err(e) => {
            // It has killed and reaped what runsc started, or is to be killed now.
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

fn parse_status(text: &str) -> Result<Started> {
    let (mut sentry, mut gofer, mut ready) = (None, None, false);
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("error: ") {
            return Err(JailError::Reported(e.to_string()));
        } else if let Some(p) = line.strip_prefix("pid ") {
            sentry = p.trim().parse::<libc::pid_t>().ok();
        } else if let Some(p) = line.strip_prefix("gofer ") {
            gofer = p.trim().parse::<libc::pid_t>().ok();
        } else if line == "ready" {
            ready = true;
        }
    }
    match (sentry, gofer, ready) {
        (Some(s), Some(g), true) if s > 1 && g > 1 => Ok(Started { sentry: s, gofer: g }),
        _ => Err(JailError::Reported(format!("incomplete start: {:?}", text.trim()))),
    }
}

/// Helper side (`glovebox-agent gvisor`): reads the config, starts the sandbox, reports.
/// Never returns.
pub fn main_from_stdin() -> ! {
    // The host's mount namespace, to go back to once the sandbox runs (see reap_until_alone).
    let host_mnt = File::open("/proc/self/ns/mnt").ok();
    let mut buf = Vec::new();
    let started = std::io::stdin()
        .read_to_end(&mut buf)
        .ctx("read config")
        .and_then(|_| serde_json::from_slice::<GvisorConfig>(&buf).map_err(|e| JailError::Config(e.to_string())))
        .and_then(|cfg| run(&cfg));
    let line = match &started {
        Ok(s) => format!("pid {}\ngofer {}\nready\n", s.sentry, s.gofer),
        Err(e) => format!("error: {e}\n"),
    };
    let _ = std::io::stdout().write_all(line.as_bytes());
    if started.is_err() {
        sys::exit_now(1);
    }
    reap_until_alone(host_mnt)
}

/// After the start: the helper stays as the sandbox's reaper. The sentry's stub processes
/// (the ptrace platform's, one per guest address space) are the sentry's children; when the
/// sentry dies they pass to the nearest subreaper, which this process is (the daemon would
/// otherwise collect them as zombies it never waits for). It reaps every descendant it
/// inherits and exits once none is left, so its own exit (the daemon reaps it) marks the end
/// of the sandbox's last host process. Its stdout is closed first: the daemon reads the
/// status until EOF. It keeps nothing else: back in the host's mount namespace (the sandbox's
/// root lives on in the gofer's), every capability dropped and `no_new_privs` set, so what
/// waits beside each sandbox is a root process that can do no more than wait.
fn reap_until_alone(host_mnt: Option<File>) -> ! {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        let _ = sys::dup2(null.as_raw_fd(), 1);
    }
    if let Some(ns) = host_mnt {
        let _ = sys::setns(ns.as_fd(), libc::CLONE_NEWNS);
    }
    if sys::drop_all_caps().is_err() {
        // Not fatal to the sandbox: it only waits. Said in the agent log.
        eprintln!("glovebox-agent gvisor: could not drop the reaper's capabilities");
    }
    loop {
        match sys::waitpid(-1, 0) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => sys::exit_now(0), // ECHILD: nothing of the sandbox is left
        }
    }
}

fn run(cfg: &GvisorConfig) -> Result<Started> {
    let jc = &cfg.jail;
    if jc.uid_base != 0 {
        return Err(JailError::Config("a gVisor sandbox's ids are not shifted (uid_base 0)".into()));
    }
    // runsc's gofer and sentry are reparented here when runsc exits, so a failure below can
    // kill and reap them; they pass to the daemon (a subreaper too) when this process exits.
    sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1).ctx("become a subreaper")?;
    let me = sys::getpid().to_string();
    for procs in &jc.cgroup_procs {
        fs::write(procs, &me).ctx_at("join cgroup", procs)?;
    }
    sys::unshare(libc::CLONE_NEWNS).ctx("unshare mount namespace")?;
    sys::mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_SLAVE, None).ctx("make / a slave mount")?;
    let root = rootfs::build_guest(jc)?;
    if let Some(body) = &jc.resolv_conf {
        write_resolv_conf(&root, body)?;
    }
    if !COMPAT_SHIM.is_empty() {
        let shim = cfg.dir.join("compat.so");
        fs::write(&shim, COMPAT_SHIM).ctx_at("write", &shim)?;
        fs::set_permissions(&shim, fs::Permissions::from_mode(0o644)).ctx_at("chmod", &shim)?;
        preload_compat_shim(&root)?;
    }
    if let Some(ns) = &jc.netns {
        let f = File::open(ns).ctx_at("open network namespace", ns)?;
        sys::setns(f.as_fd(), libc::CLONE_NEWNET).ctx("join network namespace")?;
        let core = Path::new("/proc/sys/net/core");
        let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        sys::mount(Some("none"), core, Some("tmpfs"), flags, Some("size=4k,mode=0555"))
            .ctx_at("cover (runsc's root-namespace check)", core)?;
    }
    make_private_dir(&cfg.bundle())?;
    make_private_dir(&cfg.state())?;
    // The guest's uid 0 binds the socket here, through the gofer (host root).
    make_private_dir(&cfg.socket_dir())?;
    let spec = oci_spec(cfg, &root);
    let body = serde_json::to_vec_pretty(&spec).map_err(|e| JailError::Config(e.to_string()))?;
    fs::write(cfg.bundle().join("config.json"), body).ctx_at("write OCI spec", cfg.bundle())?;
    let started = start_runsc(cfg).and_then(|s| wait_for_agent(cfg, s).map(|()| s));
    if started.is_err() {
        // Our children now (see above): end them before the error goes out.
        if let Ok(s) = read_state(cfg) {
            for pid in [s.sentry, s.gofer] {
                let _ = sys::kill(pid, libc::SIGKILL);
            }
        }
        while sys::waitpid(-1, 0).is_ok() {}
    }
    started
}

fn make_private_dir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).ctx_at("mkdir", p)?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o700)).ctx_at("chmod", p)
}

/// The compatibility shim preloaded into the guest's programs (`gvisor/compat.c`: clears
/// the `AT_NO_AUTOMOUNT` that runsc 20221219 refuses); empty where none is built.
const COMPAT_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gvisor-compat.so"));
/// Where the shim is inside the guest.
pub const COMPAT_IN_GUEST: &str = "/run/glovebox/compat.so";

/// Writes `/etc/resolv.conf` of the root being built, as the jail's PID 1 writes it inside.
fn write_resolv_conf(root: &Path, body: &str) -> Result<()> {
    write_etc(root, c"resolv.conf", body.as_bytes())
}

/// Adds the shim to `/etc/ld.so.preload` of the root being built (keeping what a template
/// preloads itself).
fn preload_compat_shim(root: &Path) -> Result<()> {
    let mut body = format!("{COMPAT_IN_GUEST}\n").into_bytes();
    if let Ok(old) = read_etc(root, c"ld.so.preload") {
        let keep = String::from_utf8_lossy(&old)
            .lines()
            .filter(|l| l.trim() != COMPAT_IN_GUEST)
            .map(|l| format!("{l}\n"))
            .collect::<String>();
        body.extend_from_slice(keep.as_bytes());
    }
    write_etc(root, c"ld.so.preload", &body)
}

/// `root/etc`, opened without following a symlink: a layer's `/etc` may be one, leading
/// anywhere on the host (this runs as host root, before the guest exists).
fn open_etc(root: &Path) -> Result<File> {
    let etc = root.join("etc");
    fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(&etc).ctx_at("open", &etc)
}

/// Reads `root/etc/<name>` if it is a regular file (never through a symlink).
fn read_etc(root: &Path, name: &std::ffi::CStr) -> Result<Vec<u8>> {
    let dir = open_etc(root)?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: openat on our own directory fd and a NUL-terminated name; the fd is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    if fd < 0 {
        return Err(JailError::sys("open /etc file", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if !f.metadata().ctx("stat /etc file")?.is_file() {
        return Err(JailError::Config("not a regular file".into()));
    }
    let mut v = Vec::new();
    Read::by_ref(&mut f).take(1 << 20).read_to_end(&mut v).ctx("read /etc file")?;
    Ok(v)
}

/// Writes `root/etc/<name>` afresh, through no symlink: a symlinked file is replaced by the
/// file, in the sandbox's own writable layer; a symlinked `/etc` is refused.
fn write_etc(root: &Path, name: &std::ffi::CStr, body: &[u8]) -> Result<()> {
    let dir = open_etc(root)?;
    let shown = root.join("etc").join(name.to_string_lossy().as_ref());
    // SAFETY: unlinkat on our own directory fd and a NUL-terminated name; ENOENT is fine.
    unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat on our own directory fd and a NUL-terminated name; the fd is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return Err(JailError::at("create", shown, std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let mut f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.write_all(body).ctx_at("write", shown)
}

/// The capabilities the agent keeps inside the guest, each for what it does with it
/// (commands get none: `child` drops them all before exec).
const AGENT_CAPS: &[(&str, &str)] = &[
    ("CAP_CHOWN", "files: an upload's or mkdir's owner"),
    ("CAP_DAC_OVERRIDE", "files: any file of the sandbox, whatever its mode"),
    ("CAP_DAC_READ_SEARCH", "files: reading and listing whatever the mode"),
    ("CAP_FOWNER", "files: modes and times of files of other uids"),
    ("CAP_FSETID", "files: keeping set-gid directories' bits"),
    ("CAP_KILL", "signals and timeouts of commands run as other uids"),
    ("CAP_SETUID", "commands run as the uid asked for"),
    ("CAP_SETGID", "commands run as the gid asked for"),
    ("CAP_SETPCAP", "emptying each command's bounding set"),
    ("CAP_SYS_ADMIN", "covering the socket directory once bound (`guest::init`)"),
];

/// The OCI runtime spec of the sandbox: the agent as PID 1 in the root built at `root`.
fn oci_spec(cfg: &GvisorConfig, root: &Path) -> Value {
    let caps: Vec<&str> = AGENT_CAPS.iter().map(|(c, _)| *c).collect();
    let mut args = vec![AGENT_IN_GUEST.to_string(), "init".to_string()];
    args.extend(guest::InitArgs { pids: cfg.jail.pids }.to_args());
    let mut namespaces =
        vec![json!({"type": "pid"}), json!({"type": "ipc"}), json!({"type": "uts"}), json!({"type": "mount"})];
    namespaces.push(match &cfg.jail.netns {
        Some(ns) => json!({"type": "network", "path": ns}),
        None => json!({"type": "network"}),
    });
    let shm = format!("size={}", cfg.jail.shm_bytes);
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "nodev", "mode=1777", shm]}),
        json!({"destination": guest::SOCKET_DIR, "type": "bind", "source": cfg.socket_dir(),
               "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]}),
        json!({"destination": AGENT_IN_GUEST, "type": "bind", "source": cfg.agent_exe, "options": ["bind", "ro", "nosuid", "nodev"]}),
    ];
    // runsc mounts a tmpfs of the sentry's own on /tmp when the spec has no /tmp: unbounded
    // but by memory, outside the disk cap. The root's own /tmp, bound again, keeps it on the
    // capped writable layer, as in the jail.
    mounts.push(json!({"destination": "/tmp", "type": "bind", "source": root.join("tmp"),
                       "options": ["rbind", "rw", "nosuid", "nodev"]}));
    if !COMPAT_SHIM.is_empty() {
        mounts.push(json!({"destination": COMPAT_IN_GUEST, "type": "bind", "source": cfg.dir.join("compat.so"),
                           "options": ["bind", "ro", "nosuid", "nodev"]}));
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": [],
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
        },
        "root": {"path": root, "readonly": false},
        "hostname": cfg.jail.hostname,
        "mounts": mounts,
        "linux": {"namespaces": namespaces},
    })
}

/// runsc's argv for starting the sandbox.
fn runsc_args(cfg: &GvisorConfig) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut flag = |k: &str, v: &Path| {
        let mut s = OsString::from(format!("--{k}="));
        s.push(v.as_os_str());
        a.push(s);
    };
    flag("root", &cfg.state());
    if let Some(d) = &cfg.debug_log {
        flag("debug-log", d);
    }
    a.push("--ignore-cgroups".into());
    a.push(if cfg.jail.netns.is_some() { "--network=sandbox" } else { "--network=none" }.into());
    a.push("--host-uds=create".into());
    a.push(format!("--platform={}", cfg.platform).into());
    if cfg.debug_log.is_some() {
        a.push("--debug".into());
    }
    a.push("run".into());
    a.push("--detach".into());
    a.push("--bundle".into());
    a.push(cfg.bundle().into());
    a.push(cfg.jail.id.clone().into());
    a
}

fn start_runsc(cfg: &GvisorConfig) -> Result<Started> {
    // runsc's own messages and the guest's stdio (the agent's stderr) go to our stderr: the
    // agent log. stdout is our status pipe, which must not stay open in the guest.
    let mut child = Command::new(&cfg.runsc)
        .args(runsc_args(cfg))
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .ctx_at("spawn runsc", &cfg.runsc)?;
    let end = Instant::now() + START_DEADLINE;
    let status = loop {
        match child.try_wait().ctx("wait for runsc")? {
            Some(st) => break st,
            None if Instant::now() >= end => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(JailError::Timeout(START_DEADLINE.as_millis() as u64));
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    if !status.success() {
        return Err(JailError::Reported(format!("runsc run: {status} ({})", last_log_line())));
    }
    read_state(cfg)
}

/// The last line runsc wrote to the agent log (our stderr), for the error.
fn last_log_line() -> String {
    let text = fs::read("/proc/self/fd/2").unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned();
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string()
}

/// The sentry's and gofer's pids from runsc's state file of the sandbox.
fn read_state(cfg: &GvisorConfig) -> Result<Started> {
    let id = &cfg.jail.id;
    let path = cfg.state().join(format!("{id}_sandbox:{id}.state"));
    let body = fs::read(&path).ctx_at("read runsc state", &path)?;
    let v: Value = serde_json::from_slice(&body).map_err(|e| JailError::Reported(format!("runsc state: {e}")))?;
    let pid = |x: &Value| x.as_i64().filter(|p| *p > 1 && *p <= i32::MAX as i64).map(|p| p as libc::pid_t);
    match (pid(&v["sandbox"]["pid"]), pid(&v["goferPid"])) {
        (Some(sentry), Some(gofer)) => Ok(Started { sentry, gofer }),
        _ => Err(JailError::Reported("runsc state names no sandbox or gofer pid".into())),
    }
}

/// Waits (bounded) until the agent accepts a connection on its socket; fails at once if the
/// sentry is gone.
fn wait_for_agent(cfg: &GvisorConfig, s: Started) -> Result<()> {
    let path = cfg.socket_path();
    let end = Instant::now() + START_DEADLINE;
    loop {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Ok(());
        }
        if sys::kill(s.sentry, 0).is_err() || reaped(s.sentry) {
            return Err(JailError::Reported(format!(
                "the sandbox ended before its agent answered ({})",
                last_log_line()
            )));
        }
        if Instant::now() >= end {
            return Err(JailError::Timeout(START_DEADLINE.as_millis() as u64));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `pid` (our child since runsc exited) has exited; reaps it if so.
fn reaped(pid: libc::pid_t) -> bool {
    matches!(sys::waitpid(pid, libc::WNOHANG), Ok((p, _)) if p == pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> GvisorConfig {
        GvisorConfig {
            jail: JailConfig {
                id: "sb1".into(),
                uid_base: 0,
                uid_count: 0,
                hostname: "glovebox".into(),
                mount_dir: "/run/g/sandboxes/sb1/mnt".into(),
                socket_path: "/run/g/sandboxes/sb1/agent/agent.sock".into(),
                layers: vec!["/base".into()],
                host_usr: true,
                disk_bytes: 1 << 30,
                disk_image: None,
                upper_dir: None,
                flat_root: true,
                shm_bytes: 64 << 20,
                cgroup_procs: vec![],
                cgroup_migrate: false,
                command_cgroup: None,
                pids: 512,
                seccomp: None,
                agent_seccomp: None,
                netns: Some("/proc/7/fd/9".into()),
                resolv_conf: None,
                volumes: vec![],
                userns: None,
            },
            dir: "/run/g/sandboxes/sb1".into(),
            runsc: "/usr/bin/runsc".into(),
            platform: "ptrace".into(),
            agent_exe: "/usr/lib/glovebox/glovebox-agent".into(),
            debug_log: None,
        }
    }

    #[test]
    fn status_lines() {
        assert_eq!(parse_status("pid 10\ngofer 11\nready\n").unwrap(), Started { sentry: 10, gofer: 11 });
        assert!(parse_status("pid 10\nready\n").is_err());
        assert!(parse_status("pid 10\ngofer 11\n").is_err());
        assert!(parse_status("pid 10\ngofer 11\nerror: runsc run: exit status: 128\nready\n").is_err());
        assert!(parse_status("pid 1\ngofer 11\nready\n").is_err());
    }

    #[test]
    fn the_spec_shares_only_the_socket_dir_the_agent_and_its_own_tmp() {
        let c = cfg();
        let s = oci_spec(&c, Path::new("/run/g/sandboxes/sb1/mnt/upper/root"));
        assert_eq!(s["process"]["args"], json!(["/run/glovebox/glovebox-agent", "init", "--pids", "512"]));
        assert_eq!(s["process"]["noNewPrivileges"], json!(true));
        assert_eq!(s["process"]["env"], json!([]));
        let binds: Vec<(&str, &str, bool)> = s["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "bind")
            .map(|m| {
                let ro = m["options"].as_array().unwrap().iter().any(|o| o == "ro");
                (m["source"].as_str().unwrap(), m["destination"].as_str().unwrap(), ro)
            })
            .collect();
        assert_eq!(
            binds,
            vec![
                ("/run/g/sandboxes/sb1/agent", "/run/glovebox-agent", false),
                ("/usr/lib/glovebox/glovebox-agent", "/run/glovebox/glovebox-agent", true),
                ("/run/g/sandboxes/sb1/mnt/upper/root/tmp", "/tmp", false),
                ("/run/g/sandboxes/sb1/compat.so", "/run/glovebox/compat.so", true),
            ]
        );
        let caps = s["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert_eq!(caps.len(), AGENT_CAPS.len());
        assert!(!caps.iter().any(|c| c == "CAP_NET_RAW" || c == "CAP_SYS_PTRACE" || c == "CAP_NET_ADMIN"));
        assert_eq!(s["linux"]["namespaces"][4], json!({"type": "network", "path": "/proc/7/fd/9"}));
        assert!(s["linux"].get("resources").is_none(), "limits are the host cgroup's");
    }

    #[test]
    fn runsc_is_told_to_leave_cgroups_and_to_share_no_host_socket() {
        let mut c = cfg();
        let a: Vec<String> = runsc_args(&c).iter().map(|s| s.to_string_lossy().into_owned()).collect();
        for want in ["--root=/run/g/sandboxes/sb1/runsc", "--ignore-cgroups", "--network=sandbox", "--host-uds=create"]
        {
            assert!(a.contains(&want.to_string()), "{want} in {a:?}");
        }
        assert!(!a.iter().any(|x| x.starts_with("--host-uds=open") || x.starts_with("--host-uds=all")));
        assert_eq!(&a[a.len() - 5..], ["run", "--detach", "--bundle", "/run/g/sandboxes/sb1/bundle", "sb1"]);
        c.jail.netns = None;
        assert!(runsc_args(&c).contains(&OsString::from("--network=none")));
    }

    #[test]
    fn the_shim_is_preloaded_first_and_a_template_s_preloads_kept() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        preload_compat_shim(&root).unwrap();
        assert_eq!(fs::read_to_string(root.join("etc/ld.so.preload")).unwrap(), format!("{COMPAT_IN_GUEST}\n"));
        fs::write(root.join("etc/ld.so.preload"), format!("/usr/lib/libtpl.so\n{COMPAT_IN_GUEST}\n")).unwrap();
        preload_compat_shim(&root).unwrap();
        assert_eq!(
            fs::read_to_string(root.join("etc/ld.so.preload")).unwrap(),
            format!("{COMPAT_IN_GUEST}\n/usr/lib/libtpl.so\n")
        );
        // A symlinked preload file is replaced in the root, its target left alone.
        let outside = t.path().join("outside");
        fs::write(&outside, "host\n").unwrap();
        fs::remove_file(root.join("etc/ld.so.preload")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/ld.so.preload")).unwrap();
        preload_compat_shim(&root).unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "host\n");
        assert!(!fs::symlink_metadata(root.join("etc/ld.so.preload")).unwrap().file_type().is_symlink());
    }

    #[test]
    fn resolv_conf_never_goes_through_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::write(&outside, "host file").unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/resolv.conf")).unwrap();
        write_resolv_conf(&root, "nameserver 10.0.0.1\n").unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "host file");
        assert_eq!(fs::read_to_string(root.join("etc/resolv.conf")).unwrap(), "nameserver 10.0.0.1\n");
        // A symlinked /etc is refused outright.
        let root2 = t.path().join("root2");
        fs::create_dir_all(&root2).unwrap();
        std::os::unix::fs::symlink(t.path(), root2.join("etc")).unwrap();
        assert!(write_resolv_conf(&root2, "x").is_err());
        assert!(!t.path().join("resolv.conf").exists());
    }
}
