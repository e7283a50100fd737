//! Harness for the end-to-end and privileged tests: a real `glovebox serve` on a loopback
//! port with its own data directory, an HTTP helper, CLI helpers, bounded child processes,
//! and a leak check that fails the test when a sandbox left anything behind on the host.
//!
//! Rules every test here follows (STYLE.md, "Tests, in layers"):
//! - nothing waits without a deadline: children are polled with `try_wait` and killed on
//!   expiry, HTTP calls carry timeouts, conditions are polled;
//! - every daemon ends with [`Daemon::shutdown_and_check_leaks`], which panics on a leak;
//!   `Drop` only cleans up (a panic in `Drop` during unwinding would abort);
//! - nothing touches the network beyond loopback and namespaces the test creates.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// First host uid handed to sandboxes and the size of each sandbox's range; all sandbox
/// uids are in `[1 << 30, 1 << 31)`.
pub const UID_BASE: u32 = glovebox_daemon::slots::BASE;
pub const UID_RANGE: u32 = glovebox_daemon::slots::RANGE;

/// The host-wide runtime dir every Glovebox process shares (sandbox dirs, uid slots, base
/// skeletons), as the daemon computes it.
pub fn run_dir() -> PathBuf {
    glovebox_daemon::manager::default_run_dir()
}

/// The uid range of live sandbox `id`, from the run dir's slot files.
pub fn uid_range_of(id: &str) -> Option<(u32, u32)> {
    let rd = fs::read_dir(run_dir().join("slots")).ok()?;
    for e in rd.flatten() {
        if fs::read_to_string(e.path()).is_ok_and(|c| c.trim() == id) {
            let n: u32 = e.file_name().to_str()?.strip_suffix(".lock")?.parse().ok()?;
            return Some((UID_BASE + n * UID_RANGE, UID_RANGE));
        }
    }
    None
}

/// The `glovebox` binary under test, with a `glovebox-agent` beside it that is not older
/// than its sources. (`cargo test -p glovebox` rebuilds `glovebox` but not the agent, and an
/// agent from before a protocol change makes every exec fail; `--workspace` builds both.)
pub fn glovebox_bin() -> PathBuf {
    static FRESH: std::sync::Once = std::sync::Once::new();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_glovebox"));
    let agent = bin.with_file_name("glovebox-agent");
    FRESH.call_once(|| {
        if agent_is_fresh(&agent) {
            return;
        }
        eprintln!("{} is missing or older than its sources: building it", agent.display());
        let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        c.args(["build", "-p", "glovebox-agent"]).current_dir(env!("CARGO_MANIFEST_DIR"));
        if bin.components().any(|c| c.as_os_str() == "release") {
            c.arg("--release");
        }
        let o = run_bounded(&mut c, None, Duration::from_secs(600));
        assert!(o.status.success(), "cargo build -p glovebox-agent failed:\n{}", o.stderr_str());
    });
    assert!(agent.is_file(), "{} is missing: run `cargo build --workspace`", agent.display());
    bin
}

fn newest_mtime(p: &Path) -> Option<std::time::SystemTime> {
    let md = fs::metadata(p).ok()?;
    let mut t = md.modified().ok()?;
    if md.is_dir() {
        for e in fs::read_dir(p).ok()?.flatten() {
            if let Some(m) = newest_mtime(&e.path()) {
                t = t.max(m);
            }
        }
    }
    Some(t)
}

fn agent_is_fresh(agent: &Path) -> bool {
    let Some(built) = fs::metadata(agent).and_then(|m| m.modified()).ok() else { return false };
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let sources = ["glovebox-agent", "glovebox-proto", "glovebox-jail"]
        .iter()
        .flat_map(|c| [crates.join(c).join("src"), crates.join(c).join("Cargo.toml")])
        .chain([crates.join("../Cargo.lock")]);
    sources.filter_map(|p| newest_mtime(&p)).all(|t| t <= built)
}

/// Whether we can run privileged tests. CI runs as root, so there they always run; a
/// non-root developer gets a loud skip instead of a confusing failure.
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Skips (returns from) a test when not root; never skips as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::common::is_root() {
            eprintln!("SKIPPED: needs root (CI runs these as root)");
            return;
        }
    };
}

/// `cmd` with nothing from the environment that could send its traffic elsewhere: no proxy
/// variables (loopback named as never proxied) and no kubeconfig of the user's.
pub fn loopback_only(cmd: &mut Command) -> &mut Command {
    cmd.env("KUBECONFIG", "/dev/null")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY")
}

/// The pinned `k8s-agent-sandbox` SDK's Python (`tests/sandboxd/setup.sh`, cached under
/// target/), for the tests that drive it.
pub fn sandboxd_sdk_python() -> PathBuf {
    let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sandboxd/setup.sh");
    let out = run_bounded(Command::new("bash").arg(setup).arg(&dest), None, Duration::from_secs(600));
    assert_eq!(out.code(), Some(0), "setup.sh failed:\n{}\n{}", out.stdout_str(), out.stderr_str());
    dest.join("sandboxd-venv/bin/python")
}

/// Runs check script `cmd` (Python printing one `ok: …` line a check and, at the end, a line
/// `{done} N checks ok`), reaching loopback only; on failure, panics with its output and the
/// daemon's log. Returns its stdout and the number of checks that passed.
pub fn run_checks(d: &Daemon, cmd: &mut Command, done: &str) -> (String, usize) {
    let out = run_bounded(loopback_only(cmd), None, Duration::from_secs(300));
    let stdout = out.stdout_str();
    assert_eq!(
        out.code(),
        Some(0),
        "{cmd:?} failed after {:?}:\n--- stdout\n{stdout}\n--- stderr\n{}\n--- daemon log\n{}",
        out.elapsed,
        out.stderr_str(),
        d.log()
    );
    assert!(stdout.lines().any(|l| l.starts_with(done) && l.ends_with("checks ok")), "did not finish:\n{stdout}");
    let oks = stdout.lines().filter(|l| l.starts_with("ok: ")).count();
    eprintln!("{stdout}{oks} checks in {:?}", out.elapsed);
    (stdout, oks)
}

/// The isolation tier of sandboxes whose create names none, in every daemon the harness
/// starts: `GLOVEBOX_TEST_ISOLATION` (`process`, the default, or `gvisor`). scripts/test runs
/// the contract tests (api, files, code, lifecycle, limits, ports) a second time with `gvisor`.
pub fn test_isolation() -> &'static str {
    static TIER: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    TIER.get_or_init(|| match std::env::var("GLOVEBOX_TEST_ISOLATION").as_deref() {
        Err(_) | Ok("" | "process") => "process",
        Ok("gvisor") => "gvisor",
        Ok(other) => panic!("GLOVEBOX_TEST_ISOLATION={other:?}: want process or gvisor"),
    })
}

/// Whether the harness's daemons default to the gVisor tier (see [`test_isolation`]).
pub fn under_gvisor() -> bool {
    test_isolation() == "gvisor"
}

/// Says what part of a test does not run under the gVisor tier and which section of
/// docs/gvisor.md says why: on the test's output, and appended to
/// `target/gvisor-skips.txt`, which `scripts/test` prints after the gVisor run (a passing
/// test's output is not shown).
pub fn skipped_under_gvisor(what: &str, section: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = format!("{}::{test}: SKIPPED {what} (docs/gvisor.md, \"{section}\")", env!("CARGO_CRATE_NAME"));
    eprintln!("{line}");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/gvisor-skips.txt");
    if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(file) {
        let _ = writeln!(f, "{line}");
    }
}

/// Skips (returns from) a test that cannot hold under the gVisor tier by design, when the
/// suite runs with `GLOVEBOX_TEST_ISOLATION=gvisor`; prints the reason and the section of
/// docs/gvisor.md that states it. Never skips under the process jail.
#[macro_export]
macro_rules! skip_under_gvisor {
    ($why:expr, $section:expr) => {
        if $crate::common::under_gvisor() {
            $crate::common::skipped_under_gvisor($why, $section);
            return;
        }
    };
}

/// A random lowercase token, from the kernel's randomness (no extra crates).
pub fn rand_token(len: usize) -> String {
    let mut buf = vec![0u8; len];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).expect("read /dev/urandom");
    buf.iter().map(|b| (b"abcdefghijklmnopqrstuvwxyz0123456789"[(*b % 36) as usize]) as char).collect()
}

/// `n` random bytes as lowercase hex.
pub fn rand_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh temp directory (for data dirs, logs, host canaries).
pub fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().expect("tempdir")
}

// ---------------------------------------------------------------------------------------
// Bounded child processes
// ---------------------------------------------------------------------------------------

/// What a finished child process left.
#[derive(Debug)]
pub struct Outcome {
    pub pid: u32,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

fn reader<R: Read + Send + 'static>(r: Option<R>) -> Option<JoinHandle<Vec<u8>>> {
    r.map(|mut r| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    })
}

/// Runs `cmd` with `stdin` (or /dev/null), capturing output; kills it and panics if it is
/// still running after `timeout`.
pub fn run_bounded(cmd: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> Outcome {
    let start = Instant::now();
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let writer = match (stdin, child.stdin.take()) {
        (Some(data), Some(mut w)) => {
            let data = data.to_vec();
            Some(std::thread::spawn(move || {
                let _ = w.write_all(&data);
            }))
        }
        _ => None,
    };
    let out = reader(child.stdout.take());
    let err = reader(child.stderr.take());
    let Some(status) = wait_bounded(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        let e = err.and_then(|h| h.join().ok()).unwrap_or_default();
        panic!("{cmd:?} still running after {timeout:?}; killed. stderr:\n{}", String::from_utf8_lossy(&e));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    Outcome {
        pid: child.id(),
        status,
        stdout: out.and_then(|h| h.join().ok()).unwrap_or_default(),
        stderr: err.and_then(|h| h.join().ok()).unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

/// Polls `child` until it exits or `timeout` passes (then `None`; the child keeps running).
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("wait: {e}"),
        }
    }
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn poll<T>(timeout: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

fn signal(pid: u32, sig: &str) {
    // `kill(1)`: the workspace forbids `unsafe`, so no libc::kill here.
    let _ = Command::new("kill").args([sig, &pid.to_string()]).stderr(Stdio::null()).status();
}

// ---------------------------------------------------------------------------------------
// Host-side facts about processes
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct ProcInfo {
    pub pid: u32,
    pub comm: String,
    pub uid: u32,
    pub ppid: u32,
}

pub fn processes() -> Vec<ProcInfo> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else { return v };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(status) = fs::read_to_string(e.path().join("status")) else { continue };
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).map(|r| r.trim().to_string()).unwrap_or_default()
        };
        let uid = field("Uid:").split_whitespace().next().and_then(|u| u.parse().ok()).unwrap_or(0);
        let ppid = field("PPid:").parse().unwrap_or(0);
        if field("State:").starts_with('Z') {
            continue; // a zombie holds nothing but its pid; its parent reaps it
        }
        v.push(ProcInfo { pid, comm: field("Name:"), uid, ppid });
    }
    v
}

/// Host processes running as a sandbox uid (any sandbox, any daemon).
pub fn sandbox_uid_processes() -> Vec<ProcInfo> {
    processes().into_iter().filter(|p| (UID_BASE..(1u32 << 31)).contains(&p.uid)).collect()
}

/// Processes that belong to sandbox `id`: their mount table names the sandbox's private
/// dir (every sandbox process lives in its mount namespace and cannot leave it) or they sit
/// in its cgroup.
pub fn processes_of(id: &str) -> Vec<ProcInfo> {
    processes_by_sandbox().remove(id).unwrap_or_default()
}

/// Every host process that belongs to some sandbox, by sandbox id (one pass over /proc, so
/// checking thousands of ids costs the same as checking one).
pub fn processes_by_sandbox() -> std::collections::HashMap<String, Vec<ProcInfo>> {
    fn ids_after(text: &str, marker: &str) -> Vec<String> {
        text.match_indices(marker)
            .filter_map(|(i, _)| {
                let rest = &text[i + marker.len()..];
                let end = rest.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(rest.len());
                (end > 0).then(|| rest[..end].to_string())
            })
            .collect()
    }
    let mut by: std::collections::HashMap<String, Vec<ProcInfo>> = std::collections::HashMap::new();
    for p in processes() {
        let mut ids: BTreeSet<String> = BTreeSet::new();
        if let Ok(m) = fs::read_to_string(format!("/proc/{}/mountinfo", p.pid)) {
            ids.extend(ids_after(&m, "/sandboxes/"));
        }
        if let Ok(c) = fs::read_to_string(format!("/proc/{}/cgroup", p.pid)) {
            ids.extend(ids_after(&c, "/glovebox/"));
        }
        for id in ids {
            by.entry(id).or_default().push(p.clone());
        }
    }
    by
}

/// The cgroup directories of sandbox `id` that exist (v1: one per hierarchy; v2: one).
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut found = Vec::new();
    let mut bases = vec![root.to_path_buf()];
    if let Ok(rd) = fs::read_dir(root) {
        bases.extend(rd.flatten().map(|e| e.path()));
    }
    for b in bases {
        let d = b.join("glovebox").join(id);
        if d.is_dir() {
            found.push(d);
        }
    }
    found
}

/// Host processes in `range` = (first uid, count).
pub fn processes_in_range(range: (u32, u32)) -> Vec<ProcInfo> {
    processes().into_iter().filter(|p| p.uid >= range.0 && p.uid < range.0 + range.1).collect()
}

/// Sandbox ids named in a daemon log (`sandbox=<id>`).
pub fn ids_in_log(log: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for (i, _) in log.match_indices("sandbox=") {
        let id: String = log[i + 8..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if !id.is_empty() {
            ids.insert(id);
        }
    }
    ids
}

/// Everything sandboxes `ids` may have left on the host; empty when clean. `owner_pids`:
/// Glovebox processes that have ended, whose base skeletons must be gone too.
pub fn leaks(ids: &BTreeSet<String>, owner_pids: &[u32]) -> Vec<String> {
    let mut problems = Vec::new();
    let run = run_dir();
    let host_mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut slots: Vec<(PathBuf, String)> = Vec::new();
    if let Ok(rd) = fs::read_dir(run.join("slots")) {
        slots = rd.flatten().map(|e| (e.path(), fs::read_to_string(e.path()).unwrap_or_default())).collect();
    }
    let mut procs = processes_by_sandbox();
    for id in ids {
        let dir = run.join("sandboxes").join(id);
        if dir.exists() {
            problems.push(format!("sandbox directory left: {}", dir.display()));
        }
        for (path, content) in &slots {
            if content.trim() == id {
                problems.push(format!("uid slot left: {}", path.display()));
            }
        }
        for d in cgroup_dirs(id) {
            problems.push(format!("cgroup left: {}", d.display()));
        }
        for p in procs.remove(id.as_str()).unwrap_or_default() {
            problems.push(format!("process of sandbox {id} left: {p:?}"));
        }
        if host_mounts.contains(&format!("/sandboxes/{id}/")) {
            problems.push(format!("host mount of sandbox {id} left"));
        }
    }
    // Skeletons are shared and kept for the next processes (`host-<fingerprint>`); what an
    // ended process must not leave is a tree of its own (an earlier version's `host-<pid>`, or
    // one it was writing, `*.tmp-<pid>`).
    let bases: Vec<String> = fs::read_dir(run.join("base"))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    for pid in owner_pids {
        for name in &bases {
            if *name == format!("host-{pid}") || name.ends_with(&format!(".tmp-{pid}")) {
                problems.push(format!("base skeleton left: {}", run.join("base").join(name).display()));
            }
        }
    }
    problems
}

/// Loop devices whose backing file is under `dir`, as `loopN -> file`.
pub fn loop_devices_under(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir("/sys/block") else { return Vec::new() };
    let dir = dir.to_string_lossy().into_owned();
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let file = fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            file.trim().starts_with(&dir).then(|| format!("{name} -> {}", file.trim()))
        })
        .collect()
}

/// The sandbox-link services `pid` still runs: its TCP listeners and UDP sockets bound on the
/// sandbox network (10.213.0.0/16), as `proto address:port`. With no sandbox live there must
/// be none (each linked sandbox's resolver and proxy stop with it).
pub fn link_services(pid: u32) -> Vec<String> {
    let inodes: BTreeSet<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
        .collect();
    let mut found = Vec::new();
    for proto in ["tcp", "udp"] {
        let table = fs::read_to_string(format!("/proc/{pid}/net/{proto}")).unwrap_or_default();
        for l in table.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else { continue };
            let Some((ip, port)) = local.split_once(':') else { continue };
            let Ok(ip) = u32::from_str_radix(ip, 16) else { continue };
            // The kernel prints the address as the u32 it stores (network order), in host order.
            let ip = std::net::Ipv4Addr::from(ip.to_le_bytes());
            let listening = proto == "udp" || *state == "0A";
            if listening && ip.octets()[..2] == [10, 213] && inodes.contains(*inode) {
                found.push(format!("{proto} {ip}:{}", u16::from_str_radix(port, 16).unwrap_or(0)));
            }
        }
    }
    found
}

/// Polls [`leaks`] for a few seconds (killed processes take a moment to disappear), then
/// panics with every leak found.
pub fn assert_no_leaks(ids: &BTreeSet<String>, owner_pids: &[u32]) {
    let mut last = Vec::new();
    let clean = poll(Duration::from_secs(5), Duration::from_millis(50), || {
        last = leaks(ids, owner_pids);
        last.is_empty().then_some(())
    });
    assert!(clean.is_some(), "leaks after the daemon ended (sandboxes {ids:?}):\n  {}", last.join("\n  "));
}

// ---------------------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------------------

/// A `glovebox serve` of our own.
pub struct Daemon {
    pub url: String,
    /// The router-facing listener's URL, for a daemon started with one.
    pub router_url: Option<String>,
    pub key: String,
    /// The value of `GLOVEBOX_TEST_CANARY` in the daemon's environment.
    pub canary: String,
    pub data_dir: PathBuf,
    child: Option<Child>,
    log_path: PathBuf,
    /// Holds the data directory; `logs` holds daemon logs (outside the data dir).
    dir: Option<tempfile::TempDir>,
    logs: tempfile::TempDir,
    http: reqwest::blocking::Client,
    ids: Mutex<BTreeSet<String>>,
    /// Logs and pids of earlier daemons on the same data dir (after a restart).
    old_logs: Vec<PathBuf>,
    old_pids: Vec<u32>,
    pid: u32,
    /// Started without `--destroy-on-exit`: SIGTERM leaves its sandboxes running.
    keep: bool,
    /// Whether the leak check also requires the store to record every sandbox as ended.
    pub check_store: bool,
}

pub const HTTP_TIMEOUT: Duration = Duration::from_secs(60);

thread_local! {
    static WARM_POOL: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static KEEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Start the daemon with an empty prebuilt-templates dir (as before any template build).
    static NO_TEMPLATES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Start the daemon with a router-facing listener (`--router-listen`) too.
    static ROUTER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Start the daemon with this many links to an nf_tables table (`GLOVEBOX_SHARD_LINKS`).
    static SHARD_LINKS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    /// Shell commands run before the daemon is exec'd (empty: it is started directly).
    static PRELUDE: std::cell::Cell<&'static str> = const { std::cell::Cell::new("") };
    /// The daemon's default isolation, if not [`test_isolation`].
    static ISOLATION: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
    /// Start the daemon with `--code-zygote`.
    static CODE_ZYGOTE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn warm_pool() -> usize {
    WARM_POOL.with(|w| w.get())
}

impl Daemon {
    /// A daemon with a warm pool of `n` sandboxes per template.
    pub fn start_with_pool(n: usize) -> Daemon {
        WARM_POOL.with(|w| w.set(n));
        let d = Daemon::start();
        WARM_POOL.with(|w| w.set(0));
        d
    }

    pub fn start() -> Daemon {
        let dir = tempdir("gbtest-data-");
        let logs = tempdir("gbtest-logs-");
        Daemon::spawn(dir, logs, Vec::new(), Vec::new(), BTreeSet::new())
    }

    /// A daemon started the way a shell starts a background job (`glovebox serve &` in a
    /// script): with SIGINT and SIGQUIT ignored, which every child inherits.
    pub fn start_ignoring_int_and_quit() -> Daemon {
        Daemon::start_after("trap '' INT QUIT;")
    }

    /// A daemon exec'd by `/bin/sh` after the shell commands `prelude` (e.g. a `ulimit`).
    pub fn start_after(prelude: &'static str) -> Daemon {
        PRELUDE.with(|k| k.set(prelude));
        let d = Daemon::start();
        PRELUDE.with(|k| k.set(""));
        d
    }

    /// A daemon as deployed: SIGTERM leaves its sandboxes running for the next start (the
    /// others run with `--destroy-on-exit`, so every test ends clean even when it fails).
    pub fn start_keeping() -> Daemon {
        KEEP.with(|k| k.set(true));
        let d = Daemon::start();
        KEEP.with(|k| k.set(false));
        d
    }

    /// A daemon with the router-facing listener for agent-sandbox's router on a loopback
    /// port of its own (`router_url`).
    pub fn start_with_router() -> Daemon {
        ROUTER.with(|k| k.set(true));
        let d = Daemon::start();
        ROUTER.with(|k| k.set(false));
        d
    }

    /// A daemon whose creates that name no isolation (and whose template names none) get
    /// `tier` (`--default-isolation`), whatever `GLOVEBOX_TEST_ISOLATION` says.
    pub fn start_with_isolation(tier: &'static str) -> Daemon {
        ISOLATION.with(|k| k.set(Some(tier)));
        let d = Daemon::start();
        ISOLATION.with(|k| k.set(None));
        d
    }

    /// A daemon whose code-interpreter sandboxes get their python kernel forked from a
    /// zygote of their tenant and template (`--code-zygote`).
    pub fn start_with_code_zygote() -> Daemon {
        CODE_ZYGOTE.with(|k| k.set(true));
        let d = Daemon::start();
        CODE_ZYGOTE.with(|k| k.set(false));
        d
    }

    /// A daemon that finds no prebuilt template (`GLOVEBOX_TEMPLATES_DIR` empty), whatever
    /// the environment of the test run has built.
    pub fn start_without_templates() -> Daemon {
        NO_TEMPLATES.with(|k| k.set(true));
        let d = Daemon::start();
        NO_TEMPLATES.with(|k| k.set(false));
        d
    }

    /// A daemon that makes a new nf_tables table (a shard) every `n` linked sandboxes,
    /// instead of every 64.
    pub fn start_with_shard_links(n: usize) -> Daemon {
        SHARD_LINKS.with(|k| k.set(Some(n)));
        let d = Daemon::start();
        SHARD_LINKS.with(|k| k.set(None));
        d
    }

    fn spawn(
        dir: tempfile::TempDir,
        logs: tempfile::TempDir,
        old_logs: Vec<PathBuf>,
        old_pids: Vec<u32>,
        ids: BTreeSet<String>,
    ) -> Daemon {
        let bin = glovebox_bin();
        // The shape E2B's SDKs accept (they check it before sending a request).
        let key = format!("e2b_{}", rand_hex(20));
        let canary = format!("canary-{}", rand_token(16));
        let data_dir = dir.path().to_path_buf();
        let http = reqwest::blocking::Client::builder().no_proxy().timeout(HTTP_TIMEOUT).build().expect("client");
        let keep = KEEP.with(|k| k.get());
        // A free port can be taken by someone else between our probe and the daemon's bind;
        // then the daemon exits with "cannot listen" and we try another.
        for attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
            let log_path = logs.path().join(format!("daemon-{}-{attempt}.log", old_logs.len()));
            let log = fs::File::create(&log_path).expect("daemon log");
            let prelude = PRELUDE.with(|k| k.get());
            let mut command = if !prelude.is_empty() {
                // `exec` keeps the pid: the child is still the daemon itself.
                let mut c = Command::new("/bin/sh");
                c.args(["-c", &format!("{prelude} exec \"$0\" \"$@\"")]).arg(&bin);
                c
            } else {
                Command::new(&bin)
            };
            if let Some(n) = SHARD_LINKS.with(|k| k.get()) {
                command.env("GLOVEBOX_SHARD_LINKS", n.to_string());
            }
            if NO_TEMPLATES.with(|k| k.get()) {
                command.env("GLOVEBOX_TEMPLATES_DIR", data_dir.join("no-prebuilt-templates"));
            }
            let router_port = ROUTER
                .with(|k| k.get())
                .then(|| TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port());
            let mut child = command
                .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
                .arg(&data_dir)
                .args(["--api-key", &key])
                // Tests start many daemons on 2 cores: no warm pool unless a test asks.
                .args(["--warm-pool", &warm_pool().to_string()])
                .args(if keep { &[][..] } else { &["--destroy-on-exit"][..] })
                .args(router_port.iter().flat_map(|p| ["--router-listen".to_string(), format!("127.0.0.1:{p}")]))
                .args(["--default-isolation", ISOLATION.with(|k| k.get()).unwrap_or_else(test_isolation)])
                .args(if CODE_ZYGOTE.with(|k| k.get()) { &["--code-zygote"][..] } else { &[][..] })
                .env_remove("GLOVEBOX_URL")
                .env_remove("GLOVEBOX_API_KEY")
                .env_remove("GLOVEBOX_DATA_DIR")
                .env("GLOVEBOX_TEST_CANARY", &canary)
                // Debian bases (debootstrap) are built once per target dir, not per test.
                .env(
                    "GLOVEBOX_BASE_CACHE",
                    std::env::var_os("GLOVEBOX_BASE_CACHE")
                        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("glovebox-base-cache").into()),
                )
                // A test asking for `code-interpreter` uses the one scripts/test built in the
                // shared store (GLOVEBOX_TEMPLATES_DIR), never a five-minute build of its own.
                .env("GLOVEBOX_AUTO_BUILD", "0")
                .env("GLOVEBOX_LOG", "info")
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log fd"))
                .stderr(log)
                .spawn()
                .expect("spawn glovebox serve");
            let url = format!("http://127.0.0.1:{port}");
            let up = poll(Duration::from_secs(15), Duration::from_millis(20), || {
                if let Ok(Some(_)) = child.try_wait() {
                    return Some(false);
                }
                let ok = http
                    .get(format!("{url}/healthz"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                ok.then_some(true)
            });
            let log_text = fs::read_to_string(&log_path).unwrap_or_default();
            match up {
                Some(true) => {
                    return Daemon {
                        pid: child.id(),
                        url,
                        router_url: router_port.map(|p| format!("http://127.0.0.1:{p}")),
                        key,
                        canary,
                        data_dir,
                        child: Some(child),
                        log_path,
                        dir: Some(dir),
                        logs,
                        http,
                        ids: Mutex::new(ids),
                        old_logs,
                        old_pids,
                        keep,
                        check_store: true,
                    };
                }
                Some(false) if log_text.contains("cannot listen") => continue,
                Some(false) => panic!("glovebox serve exited at start:\n{log_text}"),
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("glovebox serve did not answer /healthz within 15 s:\n{log_text}");
                }
            }
        }
        panic!("could not find a free port for glovebox serve");
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Peak resident memory of the daemon process, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        status_kib(self.pid(), "VmHWM:")
    }

    /// Current resident memory of the daemon process, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        status_kib(self.pid(), "VmRSS:")
    }

    // --- HTTP -----------------------------------------------------------------------------

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        self.http.request(method, format!("{}{}", self.url, path)).bearer_auth(&self.key)
    }

    /// A request without credentials.
    pub fn req_noauth(&self, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        self.http.request(method, format!("{}{}", self.url, path))
    }

    /// Sends and returns (status, JSON body); an empty body is `Null`, a non-JSON body a
    /// JSON string.
    pub fn send(&self, rb: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let resp = rb.send().expect("HTTP request to the daemon");
        let status = resp.status().as_u16();
        let text = resp.text().expect("read response body");
        let v = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        (status, v)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.req(reqwest::Method::GET, path))
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.req(reqwest::Method::POST, path).json(body))
    }

    pub fn delete(&self, path: &str) -> (u16, Value) {
        self.send(self.req(reqwest::Method::DELETE, path))
    }

    /// Creates a sandbox (asserting 201) and registers it for the leak check.
    pub fn create(&self, body: Value) -> String {
        let (st, v) = self.post("/v1/sandboxes", &body);
        assert_eq!(st, 201, "create sandbox {body}: {v}");
        let id = v["id"].as_str().expect("sandbox id").to_string();
        self.register(&id);
        id
    }

    /// Records `id` for the leak check.
    pub fn register(&self, id: &str) {
        self.ids.lock().unwrap().insert(id.to_string());
    }

    /// The uid range of a live sandbox.
    pub fn uid_range(&self, id: &str) -> Option<(u32, u32)> {
        uid_range_of(id)
    }

    /// Runs a command to completion (asserting 200) and returns the result.
    pub fn exec(&self, id: &str, body: Value) -> Value {
        let (st, v) = self.post(&format!("/v1/sandboxes/{id}/exec"), &body);
        assert_eq!(st, 200, "exec {body}: {v}");
        v
    }

    /// `sh -c script`; returns the result.
    pub fn sh(&self, id: &str, script: &str) -> Value {
        self.exec(id, json!({ "cmd": ["sh", "-c", script], "timeout_ms": 20_000 }))
    }

    /// `sh -c script` that must exit 0; returns its stdout.
    pub fn sh_ok(&self, id: &str, script: &str) -> String {
        let r = self.sh(id, script);
        assert_eq!(r["exit_code"], 0, "{script}: {r}");
        r["stdout"].as_str().unwrap_or_default().to_string()
    }

    // --- CLI ------------------------------------------------------------------------------

    /// The `glovebox` command, pointed at this daemon.
    pub fn cli(&self) -> Command {
        let mut c = Command::new(glovebox_bin());
        c.env("GLOVEBOX_URL", &self.url).env("GLOVEBOX_API_KEY", &self.key).env_remove("GLOVEBOX_DATA_DIR");
        c
    }

    // --- lifecycle ------------------------------------------------------------------------

    /// Every sandbox id this daemon (and earlier ones on the data dir) is known to have made.
    pub fn known_ids(&self) -> BTreeSet<String> {
        let mut ids = self.ids.lock().unwrap().clone();
        ids.extend(ids_in_log(&self.log()));
        for l in &self.old_logs {
            ids.extend(ids_in_log(&fs::read_to_string(l).unwrap_or_default()));
        }
        ids
    }

    /// SIGKILLs the daemon (a crash): its sandboxes are left running.
    pub fn crash(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops the daemon with SIGTERM and waits (bounded) for it to exit 0.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        signal(child.id(), "-TERM");
        let status = wait_bounded(&mut child, Duration::from_secs(20));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let log = self.log();
        let status = status.unwrap_or_else(|| panic!("daemon did not exit within 20 s of SIGTERM:\n{log}"));
        assert!(status.success(), "daemon exited with {status} on SIGTERM:\n{log}");
    }

    /// Starts a new daemon on the same data directory (after [`Daemon::crash`] or
    /// [`Daemon::stop`]).
    pub fn restart(mut self) -> Daemon {
        assert!(self.child.is_none(), "restart after crash() or stop() only");
        KEEP.with(|k| k.set(self.keep));
        let ids = self.known_ids();
        let mut old = std::mem::take(&mut self.old_logs);
        old.push(self.log_path.clone());
        let mut pids = std::mem::take(&mut self.old_pids);
        pids.push(self.pid);
        let dir = self.dir.take().expect("data dir");
        let logs = std::mem::replace(&mut self.logs, tempfile::tempdir().expect("tempdir"));
        let mut d = Daemon::spawn(dir, logs, old, pids, ids);
        KEEP.with(|k| k.set(false));
        d.check_store = self.check_store;
        d
    }

    /// Stops the daemon with SIGTERM (it must exit 0 within 20 s) and fails the test if any
    /// sandbox left a cgroup, directory, uid slot, process or mount behind.
    pub fn shutdown_and_check_leaks(mut self) {
        if self.child.is_some() {
            // Sandboxes still live go down with the daemon; make sure we know their ids.
            let (st, v) = self.get("/v1/sandboxes");
            if st == 200 && v["sandboxes"].as_array().is_some_and(|a| a.is_empty()) {
                let mut left = Vec::new();
                let stopped = poll(Duration::from_secs(3), Duration::from_millis(50), || {
                    left = link_services(self.pid);
                    left.is_empty().then_some(())
                });
                assert!(stopped.is_some(), "no sandbox is live, yet the daemon still serves sandbox links: {left:?}");
            }
            if st == 200 {
                for s in v["sandboxes"].as_array().into_iter().flatten() {
                    if let Some(id) = s["id"].as_str() {
                        self.register(id);
                        if self.keep {
                            // SIGTERM would leave it running.
                            let _ = self.delete(&format!("/v1/sandboxes/{id}"));
                        }
                    }
                }
            }
        }
        let ids = self.known_ids();
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-TERM");
            let status = wait_bounded(&mut child, Duration::from_secs(20));
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let log = self.log();
            let status = status.unwrap_or_else(|| panic!("daemon did not exit within 20 s of SIGTERM:\n{log}"));
            assert!(status.success(), "daemon exited with {status} on SIGTERM:\n{log}");
        }
        let mut pids = self.old_pids.clone();
        pids.push(self.pid);
        assert_no_leaks(&ids, &pids);
        if self.check_store {
            // The store must not remember as live any sandbox that is gone.
            let store = glovebox_daemon::store::Store::open(&self.data_dir).expect("open the daemon's store");
            let live: Vec<String> = store.live_sandboxes().expect("store").into_iter().map(|r| r.id).collect();
            assert!(live.is_empty(), "the store still lists sandboxes as live after shutdown: {live:?}");
        }
        let dd = self.data_dir.to_string_lossy().into_owned();
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        assert!(!mounts.contains(&dd), "a host mount under the data dir {dd} is left");
        // A volume's loop device is cleared once its filesystem's last user is gone.
        let mut left = Vec::new();
        let cleared = poll(Duration::from_secs(5), Duration::from_millis(50), || {
            left = loop_devices_under(&self.data_dir);
            left.is_empty().then_some(())
        });
        assert!(cleared.is_some(), "loop devices backed by files under {dd} are left: {left:?}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Cleanup only (a test that panicked already failed): stop the daemon, which
        // destroys its sandboxes (a keeping daemon is asked to first).
        if self.keep && self.child.is_some() {
            if let Ok(r) = self.req(reqwest::Method::GET, "/v1/sandboxes").send() {
                let v: Value = r.json().unwrap_or(Value::Null);
                for s in v["sandboxes"].as_array().into_iter().flatten() {
                    if let Some(id) = s["id"].as_str() {
                        let _ = self.req(reqwest::Method::DELETE, &format!("/v1/sandboxes/{id}")).send();
                    }
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "-TERM");
            if wait_bounded(&mut child, Duration::from_secs(20)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("--- daemon log ---\n{}", self.log());
        }
    }
}

pub fn status_kib(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix(field)).and_then(|r| r.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or_else(|| panic!("no {field} for pid {pid}"))
}

// ---------------------------------------------------------------------------------------
// Embedded mode
// ---------------------------------------------------------------------------------------

/// `glovebox` without `GLOVEBOX_URL`: `run` starts an in-process daemon on `data_dir`.
/// Logs sandbox ids at info level (on stderr) so the leak check knows them.
pub fn cli_embedded(data_dir: &Path) -> Command {
    let mut c = Command::new(glovebox_bin());
    c.env_remove("GLOVEBOX_URL")
        .env_remove("GLOVEBOX_API_KEY")
        .env("GLOVEBOX_DATA_DIR", data_dir)
        .env("GLOVEBOX_LOG", "glovebox_daemon=info")
        .env("NO_COLOR", "1");
    c
}

// ---------------------------------------------------------------------------------------
// Deterministic data
// ---------------------------------------------------------------------------------------

/// splitmix64 bytes: seeded, reproducible, no external data. Also a `Read` of `len` bytes.
pub struct Prng {
    state: u64,
    left: u64,
    buf: [u8; 8],
    pos: usize,
}

impl Prng {
    pub fn new(seed: u64, len: u64) -> Prng {
        Prng { state: seed, left: len, buf: [0; 8], pos: 8 }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn fill(&mut self, mut out: &mut [u8]) {
        // Drain the buffered word, then whole words, then buffer one for the tail.
        while self.pos < 8 && !out.is_empty() {
            out[0] = self.buf[self.pos];
            self.pos += 1;
            out = &mut out[1..];
        }
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            self.buf = self.next_u64().to_le_bytes();
            let n = tail.len();
            tail.copy_from_slice(&self.buf[..n]);
            self.pos = n;
        }
    }
}

impl Read for Prng {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = (out.len() as u64).min(self.left) as usize;
        self.fill(&mut out[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------
// Network namespaces the test owns
// ---------------------------------------------------------------------------------------

/// A network namespace created by the test (loopback up); deleted on drop, whatever happens.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Netns {
        let name = format!("gbtest-{}", rand_token(8));
        let o = run_bounded(Command::new("ip").args(["netns", "add", &name]), None, Duration::from_secs(10));
        assert!(o.status.success(), "ip netns add: {}", o.stderr_str());
        let ns = Netns { name };
        let o = run_bounded(
            Command::new("ip").args(["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"]),
            None,
            Duration::from_secs(10),
        );
        assert!(o.status.success(), "lo up: {}", o.stderr_str());
        ns
    }

    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Default for Netns {
    fn default() -> Self {
        Netns::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).stderr(Stdio::null()).status();
    }
}

/// A child that is killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn sandbox_body(extra: Value) -> Value {
    let mut b = json!({ "timeout_s": 120 });
    if let (Some(m), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    b
}

// ---------------------------------------------------------------------------------------
// Python kernels forked from a zygote (`glovebox serve --code-zygote`)
// ---------------------------------------------------------------------------------------

/// Whether the shared store has the code-interpreter template (scripts/test builds it);
/// says so when not.
pub fn have_ci_template() -> bool {
    let ok = std::env::var_os("GLOVEBOX_TEMPLATES_DIR")
        .map(|d| std::path::Path::new(&d).join("templates/code-interpreter.json").is_file())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED: no code-interpreter template (scripts/test builds it: scripts/build-code-interpreter)");
    }
    ok
}

/// A request as `key` (a tenant's API key), or as the daemon's own key when `None`.
pub fn as_key(d: &Daemon, key: Option<&str>, m: reqwest::Method, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut rb = match key {
        Some(k) => d.req_noauth(m, path).bearer_auth(k),
        None => d.req(m, path),
    };
    if let Some(b) = body {
        rb = rb.json(b);
    }
    d.send(rb)
}

/// Runs `code` in the default python context of sandbox `id`; the execution.
pub fn cell(d: &Daemon, key: Option<&str>, id: &str, code: &str) -> Value {
    let (st, v) =
        as_key(d, key, reqwest::Method::POST, &format!("/v1/sandboxes/{id}/code"), Some(&json!({ "code": code })));
    assert_eq!(st, 200, "run_code: {v}");
    v
}

/// An execution's stdout, joined.
pub fn stdout(ex: &Value) -> String {
    ex["logs"]["stdout"].as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect()).unwrap_or_default()
}

/// The ids of the zygotes the daemon started, by tenant (from its log), registered for the
/// leak check.
pub fn zygotes(d: &Daemon) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut by: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in d.log().lines().filter(|l| l.contains("python kernel zygote started")) {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .map(|v| v.trim_matches('"').to_string())
        };
        if let (Some(t), Some(z)) = (field("tenant"), field("zygote")) {
            d.register(&z);
            by.entry(t).or_default().push(z);
        }
    }
    by
}

/// Creates code-interpreter sandboxes (as `key`'s tenant) until one has its python kernel
/// forked from the zygote and serving (the first create starts the zygote and gets the
/// agent's kernel meanwhile); the others are destroyed. Bounded.
pub fn forked_sandbox(d: &Daemon, key: Option<&str>) -> String {
    let body = sandbox_body(json!({ "template": "code-interpreter" }));
    let got = poll(Duration::from_secs(90), Duration::from_millis(200), || {
        let (st, v) = as_key(d, key, reqwest::Method::POST, "/v1/sandboxes", Some(&body));
        assert_eq!(st, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_string();
        d.register(&id);
        // Whether it got a forked kernel is logged during its boot, before the create answers.
        let line = |what: &str| d.log().lines().any(|l| l.contains(what) && l.contains(&format!("sandbox={id}")));
        if line("python kernel forked from the zygote") {
            let ready = poll(Duration::from_secs(20), Duration::from_millis(50), || {
                if line("forked python kernel:") {
                    return Some(false);
                }
                line("python kernel from the zygote ready").then_some(true)
            });
            assert_eq!(ready, Some(true), "the forked kernel of {id} did not serve:\n{}", d.log());
            return Some(id);
        }
        let _ = as_key(d, key, reqwest::Method::DELETE, &format!("/v1/sandboxes/{id}"), None);
        std::thread::sleep(Duration::from_millis(500));
        None
    });
    got.unwrap_or_else(|| panic!("no sandbox got a kernel from the zygote within 90 s:\n{}", d.log()))
}

/// A new API key of `tenant`.
pub fn tenant_key(d: &Daemon, tenant: &str) -> String {
    let (st, v) = d.post("/v1/keys", &json!({ "tenant": tenant, "name": "test" }));
    assert_eq!(st, 201, "{v}");
    v["key"].as_str().expect("key").to_string()
}
