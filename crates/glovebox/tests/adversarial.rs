//! Adversarial tests: escape and abuse attempts made from inside sandboxes through the real
//! API, attacks on the API itself, and a hostile agent. Every attempt asserts what the user
//! (or the host) would see; see docs/threat-model.md for what each layer is meant to stop.
//!
//! The escape probes (`tests/probes/escape.py`) run as a table: each prints one verdict, the
//! table is written to the test's stderr even when the test passes (so a CI log shows every
//! probe), and a last line says `N passed, N failed`. A probe that got through fails the
//! test. The same probes run unsandboxed on the host first report escapes there, which shows
//! they can see one.
//!
//! Host-side canaries (files, listeners) are made readable to everyone: an escaped process is
//! an unprivileged host uid, so a canary only root can read would hide an escape.
//! Network: only loopback and a namespace the test creates; never any other address.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{rand_token, run_bounded, sandbox_body, tempdir, Daemon, KillOnDrop, Netns, Prng};
use reqwest::Method;
use serde_json::{json, Value};

const PROBE: &str = include_str!("probes/escape.py");

/// The isolation tier a test's sandboxes run in: every sandbox-facing attack here runs
/// against both (`isolation` at create).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tier {
    Process,
    Gvisor,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::Process => "process",
            Tier::Gvisor => "gvisor",
        }
    }

    /// A create body for this tier.
    fn body(self, extra: Value) -> Value {
        let mut b = sandbox_body(extra);
        b["isolation"] = json!(self.name());
        b
    }

    /// Skips (like `require_root!`) where the tier cannot run; gVisor needs runsc, which
    /// scripts/deps installs, so its absence there is a failure, not a skip.
    fn available(self) -> bool {
        if !common::is_root() {
            eprintln!("SKIPPED: needs root (CI runs these as root)");
            return false;
        }
        if self == Tier::Gvisor {
            assert!(Path::new("/usr/bin/runsc").is_file(), "runsc is not installed: scripts/deps installs it");
        }
        true
    }
}

// ---------------------------------------------------------------------------------------
// The verdict table
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Table {
    rows: Mutex<Vec<(String, String, String)>>,
}

impl Table {
    fn add(&self, name: impl Into<String>, blocked: bool, detail: impl Into<String>) {
        let verdict = if blocked { "BLOCKED" } else { "ESCAPED" };
        self.rows.lock().unwrap().push((name.into(), verdict.into(), detail.into()));
    }

    fn add_raw(&self, name: &str, verdict: &str, detail: &str) {
        self.rows.lock().unwrap().push((name.into(), verdict.into(), detail.into()));
    }

    /// Writes every row and the summary straight to stderr (not through the test harness's
    /// capture, so they show for passing tests too); returns the failed rows.
    fn finish(&self, title: &str) -> Vec<String> {
        let rows = self.rows.lock().unwrap();
        let mut out = format!("\n== {title}\n");
        let (mut passed, mut failed, mut bad) = (0, 0, Vec::new());
        for (name, verdict, detail) in rows.iter() {
            match verdict.as_str() {
                "BLOCKED" => passed += 1,
                "INFO" => {}
                _ => {
                    failed += 1;
                    bad.push(format!("{name}: {verdict} {detail}"));
                }
            }
            let detail: String = detail.chars().take(160).collect();
            out.push_str(&format!("  {verdict:<8} {name:<58} {detail}\n"));
        }
        out.push_str(&format!("{passed} passed, {failed} failed\n"));
        let _ = std::io::stderr().write_all(out.as_bytes());
        bad
    }
}

/// Uploads the probe and its config (secrets go in the config file, never in argv), runs it
/// in sandbox `id` and returns its rows.
fn run_probe(d: &Daemon, id: &str, cfg: &Value, table: &Table) {
    put_file(d, id, "/opt/gbprobe/escape.py", PROBE.as_bytes());
    put_file(d, id, "/opt/gbprobe/config.json", cfg.to_string().as_bytes());
    let r = d.exec(
        id,
        json!({ "cmd": ["python3", "/opt/gbprobe/escape.py", "/opt/gbprobe/config.json"], "timeout_ms": 90_000 }),
    );
    let out = r["stdout"].as_str().unwrap_or_default();
    parse_probe_output(out, table);
    if !out.contains("DONE\t") {
        table.add_raw("probe program", "ERROR", &format!("did not finish: {r}"));
    }
}

/// As [`run_probe`], but the probe runs in the kernel of the sandbox's default python
/// context, in the kernel's own process (`runpy`), as a cell; its verdicts are the cell's stdout.
fn run_probe_in_kernel(d: &Daemon, id: &str, cfg: &Value, table: &Table) {
    put_file(d, id, "/opt/gbprobe/escape.py", PROBE.as_bytes());
    put_file(d, id, "/opt/gbprobe/config.json", cfg.to_string().as_bytes());
    let code = "import runpy, sys\nsys.argv = ['/opt/gbprobe/escape.py', '/opt/gbprobe/config.json']\n\
                runpy.run_path(sys.argv[0], run_name='__main__')";
    let (st, ex) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": code, "timeout_ms": 120_000 }));
    let out = common::stdout(&ex);
    parse_probe_output(&out, table);
    if st != 200 || !out.contains("DONE\t") || !ex["error"].is_null() {
        table.add_raw("probe program (a cell)", "ERROR", &format!("{st}: did not finish: {ex}"));
    }
}

/// The names in the environment of a python kernel the agent starts in sandbox `id` (a
/// context of its own directory never gets the forked kernel).
fn started_kernel_env(d: &Daemon, id: &str) -> Vec<String> {
    let (st, ctx) = d.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({ "language": "python", "cwd": "/tmp" }));
    assert_eq!(st, 201, "{ctx}");
    let code = "import json, os\nprint(json.dumps(sorted(os.environ)))";
    let (st, ex) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": code, "context_id": ctx["id"] }));
    assert_eq!(st, 200, "{ex}");
    serde_json::from_str(common::stdout(&ex).trim()).unwrap_or_else(|e| panic!("{e}: {ex}"))
}

fn parse_probe_output(out: &str, table: &Table) {
    for l in out.lines() {
        let mut f = l.splitn(4, '\t');
        if f.next() != Some("PROBE") {
            continue;
        }
        let (name, verdict, detail) = (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or(""));
        table.add_raw(name, verdict, detail);
    }
}

fn put_file(d: &Daemon, id: &str, path: &str, body: &[u8]) {
    let (st, v) = d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{id}/files?path={path}")).body(body.to_vec()));
    assert_eq!(st, 200, "upload {path}: {v}");
}

/// A directory on the host everyone may read, holding a canary with a secret.
struct HostCanary {
    dir: tempfile::TempDir,
    secret: String,
}

impl HostCanary {
    fn new() -> HostCanary {
        let dir = tempdir("gbtest-canary-");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let secret = format!("host-secret-{}", rand_token(16));
        let p = dir.path().join("canary.txt");
        fs::write(&p, &secret).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        // A host-only program: running it from inside would mean a host path is reachable.
        let t = dir.path().join("hosttrue");
        fs::copy("/usr/bin/true", &t).unwrap();
        fs::set_permissions(&t, fs::Permissions::from_mode(0o755)).unwrap();
        HostCanary { dir, secret }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn canary(&self) -> String {
        self.path().join("canary.txt").display().to_string()
    }

    fn entries(&self) -> BTreeSet<String> {
        fs::read_dir(self.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }
}

/// Enough `..` to climb from any directory to the root it is in.
const UPS: &str = "/../../../../../../../../../../../../../../../../../../../../../..";

// ---------------------------------------------------------------------------------------
// Network canaries
// ---------------------------------------------------------------------------------------

/// Listeners on the host's loopback (v4 and, when the host has it, v6), a "DNS" port, an
/// abstract unix socket and a unix socket path; all non-blocking, so checking is instant.
struct HostListeners {
    tcp4: TcpListener,
    udp4: UdpSocket,
    tcp6: Option<TcpListener>,
    udp6: Option<UdpSocket>,
    dns: UdpSocket,
    abstract_name: String,
    abs: UnixListener,
    path: PathBuf,
    unix: UnixListener,
}

impl HostListeners {
    fn new(dir: &Path) -> HostListeners {
        let tcp4 = TcpListener::bind("127.0.0.1:0").unwrap();
        let udp4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tcp6 = TcpListener::bind("[::1]:0").ok();
        let udp6 = UdpSocket::bind("[::1]:0").ok();
        let dns = UdpSocket::bind("127.0.0.1:0").unwrap();
        let abstract_name = format!("gbtest-{}", rand_token(12));
        let abs = UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap()).unwrap();
        let path = dir.join("host.sock");
        let unix = UnixListener::bind(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
        tcp4.set_nonblocking(true).unwrap();
        if let Some(l) = &tcp6 {
            l.set_nonblocking(true).unwrap();
        }
        for u in [Some(&udp4), udp6.as_ref(), Some(&dns)].into_iter().flatten() {
            u.set_nonblocking(true).unwrap();
        }
        abs.set_nonblocking(true).unwrap();
        unix.set_nonblocking(true).unwrap();
        HostListeners { tcp4, udp4, tcp6, udp6, dns, abstract_name, abs, path, unix }
    }

    fn config(&self) -> Value {
        let port = |a: std::io::Result<std::net::SocketAddr>| a.map(|a| a.port()).unwrap_or(0);
        json!({
            "tcp4": port(self.tcp4.local_addr()),
            "udp4": port(self.udp4.local_addr()),
            "tcp6": self.tcp6.as_ref().map(|l| port(l.local_addr())).unwrap_or(0),
            "udp6": self.udp6.as_ref().map(|l| port(l.local_addr())).unwrap_or(0),
            "dns_port": port(self.dns.local_addr()),
            "abstract_name": self.abstract_name,
            "unix_path": self.path.display().to_string(),
        })
    }

    /// What each canary received (name, what arrived or None).
    fn received(&self) -> Vec<(&'static str, Option<String>)> {
        let mut buf = [0u8; 512];
        let udp = |u: &UdpSocket, buf: &mut [u8]| u.recv_from(buf).ok().map(|(n, a)| format!("{n} bytes from {a}"));
        let mut v = vec![
            ("host TCP 127.0.0.1", self.tcp4.accept().ok().map(|(_, a)| format!("connection from {a}"))),
            ("host UDP 127.0.0.1", udp(&self.udp4, &mut buf)),
            ("host DNS 127.0.0.1", udp(&self.dns, &mut buf)),
            ("host abstract unix socket", self.abs.accept().ok().map(|_| "connection".to_string())),
            ("host unix socket path", self.unix.accept().ok().map(|_| "connection".to_string())),
        ];
        if let Some(l) = &self.tcp6 {
            v.push(("host TCP [::1]", l.accept().ok().map(|(_, a)| format!("connection from {a}"))));
        }
        if let Some(u) = &self.udp6 {
            v.push(("host UDP [::1]", udp(u, &mut buf)));
        }
        v
    }

    /// Positive control: traffic from the test itself reaches every canary.
    fn control(&self) -> Vec<&'static str> {
        let _t4 = TcpStream::connect(self.tcp4.local_addr().unwrap());
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let _ = s.send_to(b"c", self.udp4.local_addr().unwrap());
        let _ = s.send_to(b"c", self.dns.local_addr().unwrap());
        let _a = UnixStream::connect_addr(&SocketAddr::from_abstract_name(self.abstract_name.as_bytes()).unwrap());
        let _u = UnixStream::connect(&self.path);
        let _t6 = self.tcp6.as_ref().map(|l| TcpStream::connect(l.local_addr().unwrap()));
        if let Some(u) = &self.udp6 {
            let s6 = UdpSocket::bind("[::1]:0").unwrap();
            let _ = s6.send_to(b"c", u.local_addr().unwrap());
        }
        std::thread::sleep(Duration::from_millis(200));
        self.received().into_iter().filter(|(_, got)| got.is_none()).map(|(n, _)| n).collect()
    }
}

/// Listens on 127.0.0.1 (TCP and UDP) inside a namespace; reports connections and datagrams.
const NS_LISTENER: &str = r#"
import select, socket, sys
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("127.0.0.1", 0)); t.listen(16)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
print("ports", t.getsockname()[1], u.getsockname()[1], flush=True)
while True:
    r, _, _ = select.select([t, u, sys.stdin], [], [], 60)
    if not r or sys.stdin in r:
        break
    if t in r:
        c, a = t.accept(); print("tcp", a, flush=True); c.close()
    if u in r:
        d, a = u.recvfrom(65536); print("udp", a, flush=True)
"#;

struct NsCanary {
    _child: KillOnDrop,
    lines: mpsc::Receiver<String>,
    tcp: u16,
    udp: u16,
}

impl NsCanary {
    fn start(ns: &Netns) -> NsCanary {
        let mut cmd = ns.command("python3");
        cmd.args(["-c", NS_LISTENER]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = KillOnDrop(cmd.spawn().expect("netns listener"));
        let out = child.0.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(10)).expect("netns listener did not start");
        let p: Vec<u16> = first.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        NsCanary { _child: child, lines: rx, tcp: p[0], udp: p[1] }
    }

    fn events(&self) -> Vec<String> {
        let mut v = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            v.push(l);
        }
        v
    }
}

fn agent_fingerprint() -> (u64, std::time::SystemTime, u64) {
    use std::hash::{Hash, Hasher};
    let p = common::glovebox_bin().with_file_name("glovebox-agent");
    let bytes = fs::read(&p).unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    let md = fs::metadata(&p).unwrap();
    (md.len(), md.modified().unwrap(), h.finish())
}

fn host_hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

// ---------------------------------------------------------------------------------------
// Escape probes
// ---------------------------------------------------------------------------------------

#[test]
fn escape_probes_are_all_blocked() {
    escape_probes(Tier::Process, Seat::Command);
}

#[test]
fn escape_probes_are_all_blocked_under_gvisor() {
    escape_probes(Tier::Gvisor, Seat::Command);
}

/// The same probes as code cells of a python kernel forked from a zygote (`--code-zygote`),
/// in the kernel's own process, plus what only a zygote has: its host pids, its other
/// sandboxes, another tenant's.
#[test]
fn escape_probes_are_all_blocked_in_a_kernel_forked_from_a_zygote() {
    escape_probes(Tier::Process, Seat::ForkedKernel);
}

/// Where the probes run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Seat {
    /// A command of the agent's.
    Command,
    /// Code cells in the default python context of a sandbox whose kernel was forked from its
    /// tenant's zygote (only the process tier has zygotes).
    ForkedKernel,
}

/// A processes's start time (`/proc/PID/stat` field 22), to tell it from a reuse of its pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

fn escape_probes(tier: Tier, seat: Seat) {
    if !tier.available() || (seat == Seat::ForkedKernel && !common::have_ci_template()) {
        return;
    }
    let d = match seat {
        Seat::Command => Daemon::start(),
        Seat::ForkedKernel => Daemon::start_with_code_zygote(),
    };
    let table = Table::default();
    let host = HostCanary::new();
    let listeners = HostListeners::new(host.path());
    let ns = Netns::new();
    let nsc = NsCanary::start(&ns);
    let before_entries = host.entries();
    let agent_before = agent_fingerprint();
    let hostname_before = host_hostname();

    // Other sandboxes with a secret of their own: with zygotes, one of another tenant's (its
    // own zygote) and one of the same tenant's (seeded by the same zygote as the probed one).
    let others = match seat {
        Seat::Command => vec![("", d.create(tier.body(json!({}))))],
        Seat::ForkedKernel => {
            let ka = common::tenant_key(&d, "tenant-a");
            vec![
                ("another tenant's", common::forked_sandbox(&d, Some(&ka))),
                ("same tenant and zygote", common::forked_sandbox(&d, None)),
            ]
        }
    };
    let mut other_secrets = serde_json::Map::new();
    for (which, other) in &others {
        let secret = format!("other-secret-{}", rand_token(16));
        d.sh_ok(other, &format!("echo {secret} > /tmp/gbtest-other; cp /tmp/gbtest-other /home/user/"));
        other_secrets.insert(which.to_string(), json!(secret));
    }
    let id = match seat {
        Seat::Command => d.create(tier.body(json!({ "network": { "mode": "deny-all" } }))),
        Seat::ForkedKernel => common::forked_sandbox(&d, None),
    };

    let mut cfg = listeners.config();
    cfg["isolation"] = json!(tier.name());
    for (k, v) in [
        ("canary_path", json!(host.canary())),
        ("canary_secret", json!(host.secret)),
        ("host_dir", json!(host.path().display().to_string())),
        ("other_secrets", json!(other_secrets)),
        ("daemon_pid", json!(d.pid())),
        ("daemon_canary", json!(d.canary)),
        ("ns_tcp", json!(nsc.tcp)),
        ("ns_udp", json!(nsc.udp)),
    ] {
        cfg[k] = v;
    }
    // Every zygote's processes (the probed sandbox's tenant's and the other's), as the host
    // sees them, with their start times.
    let zygote_procs: Vec<(u32, Option<u64>)> = match seat {
        Seat::Command => Vec::new(),
        Seat::ForkedKernel => {
            let zs = common::zygotes(&d);
            assert_eq!(zs.len(), 2, "a zygote for each tenant: {zs:?}");
            zs.values().flatten().flat_map(|z| common::processes_of(z)).map(|p| (p.pid, start_time(p.pid))).collect()
        }
    };
    if seat == Seat::ForkedKernel {
        cfg["seat"] = json!("kernel");
        cfg["zygote_pids"] = json!(zygote_procs.iter().map(|p| p.0).collect::<Vec<_>>());
        cfg["allowed_env"] = json!(started_kernel_env(&d, &id));
    }
    let t = Instant::now();
    match seat {
        Seat::Command => run_probe(&d, &id, &cfg, &table),
        Seat::ForkedKernel => run_probe_in_kernel(&d, &id, &cfg, &table),
    }
    let probe_time = t.elapsed();
    if seat == Seat::ForkedKernel {
        let gone: Vec<u32> = zygote_procs.iter().filter(|(p, t)| start_time(*p) != *t).map(|p| p.0).collect();
        table.add(
            "host: every zygote process survived the cells' kill -9 of its pid",
            !zygote_procs.is_empty() && gone.is_empty(),
            format!("{} processes; gone: {gone:?}", zygote_procs.len()),
        );
        let kernel = common::processes_of(&id).into_iter().find(|p| p.comm.starts_with("python")).map(|p| p.pid);
        let pidns = |pid: u32| fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
        let sandbox_ns = kernel.and_then(pidns);
        let shared: Vec<u32> = zygote_procs.iter().map(|p| p.0).filter(|p| pidns(*p) == sandbox_ns).collect();
        table.add(
            "host: no zygote process is in the sandbox's PID namespace",
            sandbox_ns.is_some() && shared.is_empty(),
            format!("sandbox {sandbox_ns:?}; shared by {shared:?}"),
        );
        let fell_back =
            d.log().lines().any(|l| l.contains(&format!("sandbox={id}")) && l.contains("forked python kernel:"));
        table.add(
            "the probed kernel was the forked one throughout",
            !fell_back,
            "no fallback to a started kernel logged",
        );
    }

    // What only the host can judge.
    let after = host.entries();
    table.add(
        "write outside: the host dir is untouched",
        after == before_entries,
        format!("{after:?} (was {before_entries:?})"),
    );
    let agent_after = agent_fingerprint();
    table.add("the host's agent binary is unchanged (CVE-2019-5736)", agent_after == agent_before, "size, mtime, hash");
    for (name, got) in listeners.received() {
        table.add(format!("{name} canary got nothing"), got.is_none(), got.unwrap_or_else(|| "nothing".into()));
    }
    let ev = nsc.events();
    table.add("netns canary got nothing", ev.is_empty(), format!("{ev:?}"));

    if tier == Tier::Gvisor {
        // What the probe's uid-map row checks in the jail, seen from the host: the sentry and
        // its stubs are an unprivileged host uid in a user namespace of their own; the host-root
        // processes are the gofer, with file capabilities only (chown, DAC, fowner, fsetid,
        // chroot: 0x4001f), serving the sandbox's own root, and the reaper left by the start
        // helper, with none.
        let host_ns = fs::read_link("/proc/self/ns/user").unwrap();
        let mut rows = Vec::new();
        let mut roots = 0;
        for p in common::processes_of(&id) {
            let st = fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap_or_default();
            let field =
                |k: &str| st.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_string()).unwrap_or_default();
            let ns = fs::read_link(format!("/proc/{}/ns/user", p.pid)).ok();
            let uid = field("Uid:").split_whitespace().next().unwrap_or("").to_string();
            let cap = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(u64::MAX);
            if uid == "0" {
                roots += 1;
                rows.push((cap & !0x4001f == 0 && roots <= 2, format!("{} root caps {cap:#x}", p.pid)));
            } else {
                rows.push((uid == "65534" && ns.as_ref() != Some(&host_ns), format!("{} uid {uid}", p.pid)));
            }
        }
        table.add(
            "host: the guest is an unprivileged host uid in its own user namespace, but the gofer and reaper",
            !rows.is_empty() && rows.iter().all(|(ok, _)| *ok),
            rows.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>().join(", "),
        );
    }
    let fds = d.sh_ok(&id, "ls -l /proc/self/fd | tail -n +2");
    let nums: BTreeSet<u32> =
        fds.lines().filter_map(|l| l.split(" -> ").next()?.split_whitespace().last()?.parse().ok()).collect();
    let only_std = nums.iter().all(|n| *n <= 3)
        && fds.lines().filter(|l| l.contains(" 3 -> ")).all(|l| l.contains("/proc/") && l.ends_with("/fd"));
    table.add("ls -l /proc/self/fd shows 0-2 and its own", only_std, fds.replace('\n', " | "));

    let inside = d.sh_ok(&id, "hostname gbtest-pwned 2>/dev/null; echo rc=$?; hostname");
    table.add(
        "hostname x inside fails",
        inside.starts_with("rc=") && !inside.starts_with("rc=0") && inside.ends_with("glovebox\n"),
        inside.replace('\n', " "),
    );
    table.add(
        "the host's hostname is unchanged",
        host_hostname() == hostname_before,
        host_host_detail(&hostname_before),
    );

    let alive =
        d.req_noauth(Method::GET, "/healthz").timeout(Duration::from_secs(5)).send().is_ok_and(|r| r.status() == 200);
    table.add("the daemon survived kill -9 of its pid from inside", alive, format!("pid {}", d.pid()));
    let still = d.sh(&id, "echo still");
    table.add("the sandbox survived kill -9 1", still["stdout"] == "still\n", still.to_string());

    // CVE-2024-21626 class: a command's cwd or program path through a directory fd that
    // PID 1 holds. Concurrent commands use up the pre-started spares, so some are started
    // straight from a fork of PID 1, where those fds are still open.
    let canary = host.canary();
    let hostdir = host.path().display().to_string();
    let mut hits = Vec::new();
    let mut ran = 0;
    std::thread::scope(|s| {
        let mut jobs = Vec::new();
        for round in 0..3u32 {
            for fd in 3..=14u32 {
                let (d, canary, hostdir) = (&d, canary.clone(), hostdir.clone());
                let id = id.clone();
                jobs.push(s.spawn(move || {
                    let cwd = d.post(
                        &format!("/v1/sandboxes/{id}/exec"),
                        &json!({ "cmd": ["sh", "-c", format!("cat .{UPS}{canary}; ls .{UPS}{hostdir}")],
                                 "cwd": format!("/proc/self/fd/{fd}"), "timeout_ms": 10_000 }),
                    );
                    let prog = d.post(
                        &format!("/v1/sandboxes/{id}/exec"),
                        &json!({ "cmd": [format!("/proc/self/fd/{fd}{UPS}{hostdir}/hosttrue")], "timeout_ms": 10_000 }),
                    );
                    (round, fd, cwd, prog)
                }));
            }
        }
        for j in jobs {
            let (round, fd, (st1, cwd), (st2, prog)) = j.join().unwrap();
            ran += 1;
            let out = cwd["stdout"].as_str().unwrap_or_default();
            if out.contains(&host.secret) || out.contains("canary.txt") {
                hits.push(format!("round {round} cwd fd {fd}: {st1} {}", out.replace('\n', " ")));
            }
            if st2 == 200 && prog["exit_code"] == 0 {
                hits.push(format!("round {round} program via fd {fd}: ran the host's hosttrue"));
            }
        }
    });
    table.add(
        "exec cwd=/proc/self/fd/N reads the host (CVE-2024-21626)",
        !hits.iter().any(|h| h.contains("cwd")),
        format!("{ran} tries; {:?}", hits.iter().filter(|h| h.contains("cwd")).take(2).collect::<Vec<_>>()),
    );
    table.add(
        "exec of /proc/self/fd/N/../<host path> runs a host program",
        !hits.iter().any(|h| h.contains("program")),
        format!("{ran} tries; {:?}", hits.iter().filter(|h| h.contains("program")).take(2).collect::<Vec<_>>()),
    );
    let (st, v) =
        d.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({ "language": "python", "cwd": "/proc/self/fd/11" }));
    let ctx_escape = st == 201 && {
        let code = format!("print(open('.{UPS}{canary}').read())");
        let (_, ex) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": code, "context_id": v["id"] }));
        ex.to_string().contains(&host.secret)
    };
    table.add("code context cwd=/proc/self/fd/11 reads the host", !ctx_escape, format!("create context: {st}"));
    // The host files a probe could have changed are still as they were.
    assert_eq!(fs::read_to_string(host.canary()).unwrap(), host.secret);

    let missing = listeners.control();
    let ev = {
        let control = format!(
            "import socket; socket.create_connection(('127.0.0.1', {}), 2).close(); \
             socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'c', ('127.0.0.1', {}))",
            nsc.tcp, nsc.udp
        );
        let o = run_bounded(ns.command("python3").args(["-c", &control]), None, Duration::from_secs(10));
        assert!(o.status.success(), "netns control: {}", o.stderr_str());
        nsc.events()
    };
    let seat_name = match seat {
        Seat::Command => "as a command",
        Seat::ForkedKernel => "as code in a python kernel forked from a zygote",
    };
    let bad = table.finish(&format!(
        "escape probes, isolation {}, {seat_name} ({} s in the sandbox)",
        tier.name(),
        probe_time.as_secs()
    ));
    assert!(missing.is_empty(), "these canaries do not see traffic even from the host (control): {missing:?}");
    assert!(ev.len() >= 2, "the netns canary does not see traffic from inside its namespace (control): {ev:?}");
    assert!(bad.is_empty(), "{} probe(s) got through:\n  {}", bad.len(), bad.join("\n  "));
    drop(nsc);
    drop(ns);
    d.shutdown_and_check_leaks();
}

fn host_host_detail(before: &str) -> String {
    format!("{before} -> {}", host_hostname())
}

/// The probes must be able to fail: unsandboxed, as root, the safe subset reports escapes.
#[test]
fn probes_report_escapes_when_run_on_the_host() {
    require_root!();
    let host = HostCanary::new();
    let cfg_path = host.path().join("config.json");
    // A process of the test's own stands for a zygote: on the host its pid is within reach.
    let stand_in = common::KillOnDrop(Command::new("sleep").arg("60").spawn().unwrap());
    let cfg = json!({ "control": true, "canary_path": host.canary(), "canary_secret": host.secret,
                      "zygote_pids": [stand_in.0.id()] });
    fs::write(&cfg_path, cfg.to_string()).unwrap();
    let probe = host.path().join("escape.py");
    fs::write(&probe, PROBE).unwrap();
    let o = run_bounded(Command::new("/usr/bin/python3").arg(&probe).arg(&cfg_path), None, Duration::from_secs(60));
    assert!(o.status.success(), "probe on the host: {}", o.stderr_str());
    let table = Table::default();
    parse_probe_output(&o.stdout_str(), &table);
    let rows = table.rows.lock().unwrap().clone();
    let verdict = |name: &str| rows.iter().find(|r| r.0 == name).map(|r| r.1.clone()).unwrap_or_default();
    let must_escape = [
        "read a host file (canary)",
        "capabilities+no_new_privs+seccomp",
        "uid 0 is an unprivileged host uid",
        "unshare(CLONE_NEWUSER)",
        "unshare(CLONE_NEWNS)",
        "keyctl",
        "bpf",
        "perf_event_open",
        "io_uring_setup",
        "userfaultfd",
        "ptrace(PTRACE_TRACEME)",
        "open /proc/sys/kernel/core_pattern for writing",
        "reach the zygote's host pids (kill, pidfd, ptrace, /proc)",
    ];
    let mut out = String::from("\n== the same probes unsandboxed on the host (each must report ESCAPED)\n");
    let mut missed = Vec::new();
    for name in must_escape {
        let v = verdict(name);
        out.push_str(&format!("  {v:<8} {name}\n"));
        if v != "ESCAPED" {
            missed.push(format!("{name}: {v:?}"));
        }
    }
    out.push_str(&format!("{} passed, {} failed\n", must_escape.len() - missed.len(), missed.len()));
    let _ = std::io::stderr().write_all(out.as_bytes());
    assert!(missed.is_empty(), "probes that cannot see an escape: {missed:?}\n{}", o.stdout_str());
}

// ---------------------------------------------------------------------------------------
// Resource abuse
// ---------------------------------------------------------------------------------------

const INODE_FLOOD: &str = r#"
import os
os.mkdir("/tmp/f")
n, err = 0, None
for i in range(200000):
    try:
        open("/tmp/f/%d" % i, "w").close()
        n += 1
    except OSError as e:
        err = e.errno
        break
print(n, err)
"#;

const SPIN: &str = r#"
import os, time
kids = []
for _ in range(2):
    p = os.fork()
    if p == 0:
        t = time.time()
        while time.time() - t < 3:
            pass
        os._exit(0)
    kids.append(p)
for p in kids:
    os.waitpid(p, 0)
"#;

/// The host-side CPU usage counter of sandbox `id`, in microseconds (v1 `cpuacct.usage`, ns;
/// v2 `cpu.stat` `usage_usec`).
/// Lists, inside a sandbox, every agent process but PID 1: the zygote and its spares (forked,
/// so they keep the agent's command line), or a restarted zygote and the spares forked
/// without one.
const AGENT_HELPERS: &str = "ps -eo pid=,args= | awk '$1 != 1 && $2 == \"glovebox-agent\" { print $1 }'";

/// A command killing the agent's zygote and spares (same uid as it) only costs the next
/// commands their head start: the agent starts another zygote, and once a command has killed
/// too many of them, forks the spares itself. Every command still runs and answers.
#[test]
fn commands_that_kill_the_zygote_and_the_spares_do_not_break_later_commands() {
    zygote_and_spares_killed(Tier::Process);
}

#[test]
fn commands_that_kill_the_zygote_and_the_spares_do_not_break_later_commands_under_gvisor() {
    zygote_and_spares_killed(Tier::Gvisor);
}

fn zygote_and_spares_killed(tier: Tier) {
    if !tier.available() {
        return;
    }
    let d = Daemon::start();
    let id = d.create(tier.body(json!({})));
    let helpers = AGENT_HELPERS;
    let count = |d: &Daemon| d.sh_ok(&id, &format!("{helpers} | wc -l")).trim().parse::<u32>().unwrap();
    // The zygote and its spares (the one running the count is a spare no more).
    let up = common::poll(Duration::from_secs(5), Duration::from_millis(50), || (count(&d) >= 2).then_some(()));
    assert!(up.is_some(), "no zygote and spares: {}", d.sh_ok(&id, "ps -eo pid,args"));
    // More rounds than the agent restarts zygotes for, so both paths after a kill run.
    for round in 0..40 {
        let killed = d.sh(&id, &format!("for p in $({helpers}); do kill -9 $p; done; echo killed"));
        assert_eq!(killed["stdout"], "killed\n", "round {round}: {killed}");
        let r = d.sh(&id, &format!("echo after-{round}"));
        assert_eq!(r["stdout"], format!("after-{round}\n"), "round {round}: {r}");
        assert_eq!(r["exit_code"], 0, "round {round}: {r}");
    }
    // Spares are back (from a new zygote, or forked by the agent itself once a command has
    // killed enough zygotes), and a burst of commands runs. The spare running the `ps` is
    // one no more, so one other helper is what there is to see.
    let back = common::poll(Duration::from_secs(5), Duration::from_millis(50), || (count(&d) >= 1).then_some(()));
    assert!(back.is_some(), "no spares after the kills: {}", d.sh_ok(&id, "ps -eo pid,args"));
    for i in 0..10 {
        assert_eq!(d.sh_ok(&id, &format!("echo burst-{i}")), format!("burst-{i}\n"));
    }
    d.shutdown_and_check_leaks();
}

/// A spare killed by a command may not have died yet when the next command arrives (here it
/// is made slow to die on purpose: lowest priority, on a CPU a second command keeps busy). The
/// next command must not be handed to it and lost with it.
#[test]
fn a_command_is_never_handed_to_a_spare_that_was_killed_but_has_not_died_yet() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "resources": { "cpus": 2.0 } })));
    let helpers = AGENT_HELPERS;
    let up = common::poll(Duration::from_secs(5), Duration::from_millis(50), || {
        (d.sh_ok(&id, &format!("{helpers} | wc -l")).trim() != "0").then_some(())
    });
    assert!(up.is_some(), "no spares: {}", d.sh_ok(&id, "ps -eo pid,args"));
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["taskset", "-c", "0", "sh", "-c", "while :; do :; done"], "background": true, "timeout_ms": 60_000 }),
    );
    assert_eq!(st, 202, "{v}");
    // Rounds until killed spares were seen still there at the next command's start three
    // times (most rounds; the busy loop only delays them, by a slice or so).
    let (mut slow, mut rounds) = (0, 0);
    while slow < 3 && rounds < 40 {
        let round = rounds;
        rounds += 1;
        // Every helper to CPU 0 at SCHED_IDLE (best effort: one may be exiting or starting
        // and refuse), then killed: it dies when the busy loop lets it run.
        let killed = d.sh(
            &id,
            &format!(
                "for p in $({helpers}); do taskset -pc 0 $p >/dev/null 2>&1; chrt -i -p 0 $p 2>/dev/null; \
                 kill -9 $p 2>/dev/null && echo $p; done; true"
            ),
        );
        assert_eq!(killed["exit_code"], 0, "round {round}: {killed}");
        let victims: Vec<String> = killed["stdout"].as_str().unwrap().split_whitespace().map(String::from).collect();
        let r = d.sh(
            &id,
            &format!("echo after-{round}; for p in {}; do [ -e /proc/$p ] && echo slow; done; true", victims.join(" ")),
        );
        assert_eq!(r["exit_code"], 0, "round {round} (killed {victims:?}): {r}");
        let out = r["stdout"].as_str().unwrap();
        assert!(out.starts_with(&format!("after-{round}\n")), "round {round}: {r}");
        slow += usize::from(out.contains("slow"));
    }
    eprintln!("== killed spares still there at the next command: {slow} of {rounds} rounds");
    // The set-up did what it is for: killed spares outlived the next command's start.
    assert!(slow > 0, "no killed spare was still there when the next command ran, in {rounds} rounds");
    d.shutdown_and_check_leaks();
}

fn cpu_usage_usec(id: &str) -> u64 {
    for dir in common::cgroup_dirs(id) {
        if let Ok(ns) = fs::read_to_string(dir.join("cpuacct.usage")) {
            return ns.trim().parse::<u64>().unwrap() / 1000;
        }
        if let Ok(stat) = fs::read_to_string(dir.join("cpu.stat")) {
            if let Some(v) = stat.lines().find_map(|l| l.strip_prefix("usage_usec ")) {
                return v.trim().parse().unwrap();
            }
        }
    }
    panic!("no cpu usage file for sandbox {id} in {:?}", common::cgroup_dirs(id));
}

fn healthz_latency(client: &reqwest::blocking::Client, url: &str) -> Option<Duration> {
    let t = Instant::now();
    let ok = client.get(format!("{url}/healthz")).send().is_ok_and(|r| r.status() == 200);
    ok.then(|| t.elapsed())
}

#[test]
fn resource_abuse_leaves_the_host_and_the_daemon_responsive() {
    resource_abuse(Tier::Process);
}

#[test]
fn resource_abuse_leaves_the_host_and_the_daemon_responsive_under_gvisor() {
    resource_abuse(Tier::Gvisor);
}

fn resource_abuse(tier: Tier) {
    if !tier.available() {
        return;
    }
    let d = Daemon::start();
    let fork = d.create(tier.body(json!({ "resources": { "pids": 64 } })));
    let mem = d.create(tier.body(json!({ "resources": { "memory_mb": 64 } })));
    let inode = d.create(tier.body(json!({ "resources": { "disk_mb": 8, "memory_mb": 256 } })));
    let cpu = d.create(tier.body(json!({ "resources": { "cpus": 0.5 } })));
    let flood = d.create(tier.body(json!({ "resources": { "memory_mb": 64 } })));
    let rss_before = d.rss_kib();
    let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let mut latencies = Vec::new();
    let mut health_failures = 0;
    let mut host_forks = 0;
    let mut second: Option<(Duration, Value)> = None;
    let (fork_r, mem_r, inode_r, (cpu_r, cpu_used, cpu_wall), (shm_r, flood_r)) = std::thread::scope(|s| {
        let hs = [
            s.spawn(|| {
                // The bomb starts in a subshell: its first processes may already fill the
                // pids limit before the shell that started it forks again, and a shell that
                // cannot fork gives up (exit 2); the command's own shell must live on, in
                // `sleep`, until the timeout ends it.
                json!([exec_or_gone(&d, &fork, json!({ "cmd": ["sh", "-c", "b() { b | b & }; (b); exec sleep 30"], "timeout_ms": 6000 }))])
            }),
            s.spawn(|| {
                json!([exec_or_gone(
                    &d,
                    &mem,
                    json!({ "cmd": ["python3", "-c", "x = []\nwhile True: x.append(bytearray(10**6))"], "timeout_ms": 20_000 })
                )])
            }),
            s.spawn(|| json!([d.exec(&inode, json!({ "cmd": ["python3", "-c", INODE_FLOOD], "timeout_ms": 20_000 }))])),
            s.spawn(|| {
                let u0 = cpu_usage_usec(&cpu);
                let t = Instant::now();
                let r = d.exec(&cpu, json!({ "cmd": ["python3", "-c", SPIN], "timeout_ms": 20_000 }));
                json!([r, cpu_usage_usec(&cpu) - u0, t.elapsed().as_micros() as u64])
            }),
            s.spawn(|| {
                let shm = d.sh(&flood, "head -c 100000000 /dev/zero > /dev/shm/fill; echo rc=$?");
                let out = d.exec(&flood, json!({ "cmd": ["head", "-c", "300000000", "/dev/zero"], "timeout_ms": 20_000 }));
                json!([shm, out])
            }),
        ];
        // Meanwhile: the daemon answers, a new sandbox works, the host forks.
        let deadline = Instant::now() + Duration::from_secs(40);
        let started = Instant::now();
        while hs.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            match healthz_latency(&client, &d.url) {
                Some(l) => latencies.push(l),
                None => health_failures += 1,
            }
            if second.is_none() && started.elapsed() > Duration::from_millis(1500) {
                let t = Instant::now();
                let id = d.create(tier.body(json!({})));
                let r = d.exec(&id, json!({ "cmd": ["echo", "second"] }));
                second = Some((t.elapsed(), r));
            }
            let o = run_bounded(&mut Command::new("true"), None, Duration::from_secs(5));
            assert!(o.status.success(), "the host cannot fork");
            host_forks += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut v: Vec<Value> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let f = v.remove(4);
        let c = v.remove(3);
        (
            v[0][0].clone(),
            v[1][0].clone(),
            v[2][0].clone(),
            (c[0].clone(), c[1].as_u64().unwrap(), c[2].as_u64().unwrap()),
            (f[0].clone(), f[1].clone()),
        )
    });
    let table = Table::default();
    // Under gVisor a bomb may end its own sandbox instead (see docs/threat-model.md): the
    // host OOM killer picks the sentry, which holds the guest's memory; a fork bomb can need
    // more host threads for the sentry's stubs than the host cap, and the sentry stops.
    let gone_because = |r: &Value, reason: &str| tier == Tier::Gvisor && r["gone"] == reason;
    table.add(
        "fork bomb (pids 64) ends at its timeout (gvisor: or ends its own sandbox)",
        fork_r["timed_out"] == true || gone_because(&fork_r, "error"),
        summary(&fork_r),
    );
    table.add(
        "memory bomb (64 MiB) is OOM-killed (gvisor: with its sandbox, reason oom)",
        mem_r["oom_killed"] == true || gone_because(&mem_r, "oom"),
        summary(&mem_r),
    );
    let inode_out = inode_r["stdout"].as_str().unwrap_or_default().trim().to_string();
    let files: u64 = inode_out.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
    table.add(
        "inode flood stops at the inode cap with ENOSPC",
        inode_out.ends_with(" 28") && files <= 16 * 1024,
        format!("{inode_out} (files, errno)"),
    );
    let limit = cpu_wall as f64 * 0.5;
    table.add(
        "CPU spin with cpus 0.5 is held to half a core (host cgroup)",
        // Only the upper bound is the point; the lower one shows the spin ran at all (the
        // host's two cores are shared with the other abusers and other tests).
        (cpu_used as f64) <= limit * 1.25 + 150_000.0 && (cpu_used as f64) > cpu_wall as f64 * 0.03,
        format!("{} ms of CPU in {} ms wall; exit {}", cpu_used / 1000, cpu_wall / 1000, cpu_r["exit_code"]),
    );
    table.add(
        "/dev/shm fill (memory 64) fails with ENOSPC",
        shm_r["stdout"].as_str().is_some_and(|s| !s.contains("rc=0")),
        summary(&shm_r),
    );
    table.add(
        "300 MB output flood is capped and counted",
        flood_r["stdout_bytes"] == 300_000_000u64 && flood_r["stdout_truncated"] == true,
        summary(&flood_r),
    );
    let max = latencies.iter().max().copied().unwrap_or_default();
    table.add(
        // A liveness bound, not a latency target (those live in bench/): generous enough for
        // a loaded 2-core CI machine running other tests beside this one.
        "the daemon answers /healthz within 5 s throughout",
        health_failures == 0 && !latencies.is_empty() && max < Duration::from_secs(5),
        format!("{} checks, max {max:?}, {health_failures} failed", latencies.len()),
    );
    let (took, r) = second.clone().unwrap_or((Duration::ZERO, Value::Null));
    table.add(
        "a new sandbox works meanwhile",
        r["stdout"] == "second\n" && took < Duration::from_secs(15),
        format!("create + exec in {took:?}"),
    );
    table.add("the host keeps forking", host_forks > 0, format!("{host_forks} host processes run"));
    let rss = d.rss_kib();
    table.add(
        "the daemon's memory stays bounded",
        rss < rss_before + 100 * 1024,
        format!("RSS {} -> {} MiB", rss_before / 1024, rss / 1024),
    );
    // Every abused sandbox is still usable afterwards (the disk-full one once it frees space).
    for (name, id, r) in
        [("fork", &fork, &fork_r), ("memory", &mem, &mem_r), ("cpu", &cpu, &cpu_r), ("flood", &flood, &flood_r)]
    {
        if r["gone"].is_string() {
            table.add_raw(
                &format!("the {name} sandbox still works"),
                "INFO",
                &format!("it ended (reason {})", r["gone"]),
            );
            continue;
        }
        let r = d.sh(id, "echo alive");
        table.add(format!("the {name} sandbox still works"), r["stdout"] == "alive\n", summary(&r));
    }
    let (st, v) = d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{inode}/files?path=/tmp/up")).body("x"));
    table.add("upload into the inode-full sandbox is a clear 507", st == 507, format!("{st} {v}"));
    d.sh_ok(&inode, "rm -rf /tmp/f");
    let (st, _) = d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{inode}/files?path=/tmp/up")).body("x"));
    table.add("it works again once files are removed", st == 200, format!("{st}"));
    let bad = table.finish(&format!("resource abuse, isolation {}", tier.name()));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    d.shutdown_and_check_leaks();
}

/// Runs a command; a sandbox that ended under it gives `{"gone": reason}` instead of a result.
fn exec_or_gone(d: &Daemon, id: &str, body: Value) -> Value {
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &body);
    match st {
        200 => v,
        410 => json!({ "gone": v["error"]["reason"] }),
        _ => panic!("exec {body}: {st} {v}"),
    }
}

fn summary(r: &Value) -> String {
    let mut r = r.clone();
    for k in ["stdout", "stderr"] {
        if let Some(s) = r[k].as_str() {
            let s: String = s.chars().take(60).collect();
            r[k] = json!(s);
        }
    }
    r.to_string()
}

// ---------------------------------------------------------------------------------------
// The file API under symlink races
// ---------------------------------------------------------------------------------------

fn q(path: &str) -> String {
    let mut s = String::new();
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn download(d: &Daemon, id: &str, path: &str) -> (u16, Vec<u8>) {
    let resp = d
        .req(Method::GET, &format!("/v1/sandboxes/{id}/files?path={}", q(path)))
        .timeout(Duration::from_secs(20))
        .send()
        .unwrap();
    let st = resp.status().as_u16();
    (st, resp.bytes().map(|b| b.to_vec()).unwrap_or_default())
}

/// A background command flips `/home/user/flip` between a sandbox directory, `/` and the
/// agent's root magic link while the test downloads and uploads through it: every answer is
/// the sandbox's own content or a clean 4xx, never the host's.
#[test]
fn symlinks_flipped_during_file_api_calls_never_reach_the_host() {
    symlinks_flipped(Tier::Process);
}

#[test]
fn symlinks_flipped_during_file_api_calls_never_reach_the_host_under_gvisor() {
    symlinks_flipped(Tier::Gvisor);
}

fn symlinks_flipped(tier: Tier) {
    if !tier.available() {
        return;
    }
    let d = Daemon::start();
    let id = d.create(tier.body(json!({})));
    let host = HostCanary::new();
    let hp = host.path().display().to_string();
    let host_passwd = fs::read("/etc/passwd").unwrap();
    d.sh_ok(
        &id,
        "mkdir -p /tmp/flipdir/etc && echo sandbox-flipdir > /tmp/flipdir/etc/passwd \
         && head -c 200000 /dev/urandom | base64 > /etc/big && cp /etc/big /tmp/flipdir/etc/big",
    );
    let own_passwd = d.sh_ok(&id, "cat /etc/passwd").into_bytes();
    assert_ne!(own_passwd, host_passwd, "the test needs the sandbox's /etc/passwd to differ from the host's");
    let big = d.sh_ok(&id, "cat /etc/big").into_bytes();
    let flipper = "i=0; while [ $i -lt 100000 ]; do \
        ln -sfn /tmp/flipdir /home/user/f.tmp && mv -T /home/user/f.tmp /home/user/flip; \
        ln -sfn / /home/user/f.tmp && mv -T /home/user/f.tmp /home/user/flip; \
        ln -sfn /proc/1/root /home/user/f.tmp && mv -T /home/user/f.tmp /home/user/flip; i=$((i+1)); done";
    // Renames only, so `flip` always exists: an upload through a missing `flip` would make
    // it a real directory (parents are created) and end the race.
    d.sh_ok(&id, "ln -s /tmp/flipdir /home/user/flip");
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["sh", "-c", flipper], "background": true, "timeout_ms": 30_000 }),
    );
    assert_eq!(st, 202, "{v}");
    let cid = v["id"].as_u64().unwrap();
    let (mut own, mut flipdir, mut refused, mut host_hits) = (0, 0, 0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    while n < 300 && Instant::now() < deadline {
        n += 1;
        for p in [
            "/home/user/flip/etc/passwd".to_string(),
            "/home/user/flip/etc/big".into(),
            format!("/home/user/flip{hp}/canary.txt"),
        ] {
            let (st, body) = download(&d, &id, &p);
            if body == host_passwd || String::from_utf8_lossy(&body).contains(&host.secret) {
                host_hits.push(format!("{p}: {st}"));
            } else if st == 200 && (body == own_passwd || body == big) {
                own += 1;
            } else if st == 200 && body == b"sandbox-flipdir\n" {
                flipdir += 1;
            } else if (400..500).contains(&st) {
                refused += 1;
            } else {
                host_hits
                    .push(format!("{p}: unexpected {st} {:?}", String::from_utf8_lossy(&body[..body.len().min(80)])));
            }
        }
        let (st, _) = d.send(
            d.req(
                Method::PUT,
                &format!("/v1/sandboxes/{id}/files?path={}", q(&format!("/home/user/flip{hp}/evil-{n}"))),
            )
            .body("evil"),
        );
        assert!(st == 200 || (400..500).contains(&st), "upload through the flipping link: {st}");
    }
    let (st, _) = d.post(&format!("/v1/sandboxes/{id}/commands/{cid}/kill"), &json!({}));
    assert_eq!(st, 204);
    let entries = host.entries();
    let _ = std::io::stderr().write_all(
        format!(
            "\n== symlink flips: {n} rounds: {own} own files, {flipdir} via the sandbox dir, {refused} refused, {} host\n",
            host_hits.len()
        )
        .as_bytes(),
    );
    assert!(host_hits.is_empty(), "host content or odd answers through a flipping link: {host_hits:?}");
    assert_eq!(entries, ["canary.txt", "hosttrue"].map(String::from).into(), "an upload reached the host dir");
    assert!(own > 0 && flipdir > 0, "the flips did not race the downloads ({own} own, {flipdir} flipdir)");
    d.shutdown_and_check_leaks();
}

// ---------------------------------------------------------------------------------------
// Hostile requests
// ---------------------------------------------------------------------------------------

/// A request over a raw TCP connection; returns the status line (or what happened).
fn raw_http(url: &str, request: &[u8], close_write: bool) -> String {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if s.write_all(request).is_err() {
        return "write failed (closed by the daemon)".into();
    }
    if close_write {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut buf = Vec::new();
    let _ = s.take(4096).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).lines().next().unwrap_or("closed without an answer").to_string()
}

fn status_of_line(line: &str) -> Option<u16> {
    line.strip_prefix("HTTP/1.1 ")?.split_whitespace().next()?.parse().ok()
}

#[test]
fn hostile_bodies_headers_and_keys_get_clear_4xx() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let table = Table::default();
    let post = |path: &str, body: Vec<u8>| {
        d.send(d.req(Method::POST, path).header("content-type", "application/json").body(body))
    };
    let exec = format!("/v1/sandboxes/{id}/exec");
    let expect = |what: &str, (st, v): (u16, Value), want: &[u16]| {
        table.add(what, want.contains(&st) && v["error"]["code"].is_string(), format!("{st} {}", summary(&v)));
    };

    let huge = format!("{{\"cmd\":[\"true\"],\"stdin\":\"{}\"}}", "a".repeat(20 << 20));
    expect("20 MiB JSON body to exec", post(&exec, huge.into_bytes()), &[413]);
    let huge = format!("{{\"metadata\":{{\"k\":\"{}\"}}}}", "a".repeat(20 << 20));
    expect("20 MiB JSON body to create", post("/v1/sandboxes", huge.into_bytes()), &[413]);
    expect("JSON nested 100k deep", post(&exec, "[".repeat(100_000).into_bytes()), &[400]);
    let deep = format!("{{\"cmd\":[\"true\"],\"env\":{{\"a\":{}{}}}}}", "[".repeat(5000), "]".repeat(5000));
    expect("nested value inside a field", post(&exec, deep.into_bytes()), &[400]);
    expect("invalid UTF-8 in a string", post(&exec, b"{\"cmd\":[\"echo\",\"\xff\xfe\"]}".to_vec()), &[400]);
    expect("invalid UTF-8 as a key", post("/v1/sandboxes", b"{\"\xc3\x28\":1}".to_vec()), &[400]);
    expect("NUL in argv", post(&exec, br#"{"cmd":["echo","a\u0000b"]}"#.to_vec()), &[400]);
    expect("NUL in an env name", post(&exec, br#"{"cmd":["true"],"env":{"A\u0000":"b"}}"#.to_vec()), &[400]);
    expect("number out of range", post("/v1/sandboxes", br#"{"timeout_s":1e400}"#.to_vec()), &[400]);
    expect("duplicate field", post("/v1/sandboxes", br#"{"timeout_s":5,"timeout_s":6}"#.to_vec()), &[400]);
    expect("a JSON string, not an object", post(&exec, br#""cmd""#.to_vec()), &[400]);
    expect("empty body", post(&exec, Vec::new()), &[400]);
    let files = |p: &str| d.send(d.req(Method::GET, &format!("/v1/sandboxes/{id}/files?path={p}")));
    expect("file path with NUL", files("%00etc"), &[400]);
    expect("file path not UTF-8", files("%ff%fe"), &[400, 404]);
    expect("file path of 8 KiB", files(&"a".repeat(8192)), &[400]);
    expect("file path of 5000 `..`", files(&"../".repeat(5000)), &[400]);
    expect("empty file path", files(""), &[400]);
    let big_id = "x".repeat(60 * 1024);
    let (st, v) = d.get(&format!("/v1/sandboxes/{big_id}"));
    table.add("a 60 KiB sandbox id", (400..500).contains(&st), format!("{st} {}", summary(&v)));

    // Lying and truncated requests over raw TCP.
    let key = &d.key;
    for (what, req) in [
        (
            "Content-Length larger than the body, then EOF",
            format!("POST {exec} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"cmd\":"),
        ),
        (
            "Content-Length of 1 TiB",
            format!("POST {exec} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 1099511627776\r\n\r\n{{}}"),
        ),
        (
            "a chunked body with a bad chunk size",
            format!("POST {exec} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"),
        ),
        ("a request line of garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\x7c\x03\x03 not http\r\n\r\n".to_string()),
        (
            "a 200 KiB request line",
            format!("GET /v1/sandboxes/{} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n", "y".repeat(200 << 10)),
        ),
        (
            "a 1 MiB header",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Junk: {}\r\n\r\n", "a".repeat(1 << 20)),
        ),
    ] {
        let line = raw_http(&d.url, req.as_bytes(), true);
        let ok = status_of_line(&line).map_or(!line.starts_with("HTTP"), |s| (400..500).contains(&s));
        table.add(what, ok, line);
    }

    // Keys.
    for (what, rb) in [
        (
            "lower-case `bearer`",
            d.req_noauth(Method::GET, "/v1/sandboxes").header("authorization", format!("bearer {key}")),
        ),
        ("Basic auth", d.req_noauth(Method::GET, "/v1/sandboxes").basic_auth(key, Some(key))),
        ("key in the query string", d.req_noauth(Method::GET, &format!("/v1/sandboxes?api_key={key}"))),
        ("key plus one character", d.req_noauth(Method::GET, "/v1/sandboxes").bearer_auth(format!("{key}x"))),
        ("a 64 KiB key", d.req_noauth(Method::GET, "/v1/sandboxes").bearer_auth("k".repeat(64 << 10))),
        ("empty Bearer", d.req_noauth(Method::GET, "/v1/sandboxes").header("authorization", "Bearer ")),
        (
            "non-ASCII bytes in the key",
            d.req_noauth(Method::GET, "/v1/sandboxes")
                .header("authorization", reqwest::header::HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap()),
        ),
        ("wrong x-api-key", d.req_noauth(Method::GET, "/v1/sandboxes").header("x-api-key", "nope")),
    ] {
        let (st, v) = d.send(rb);
        table.add(format!("key: {what}"), st == 401 || st == 431, format!("{st} {}", summary(&v)));
    }
    let t = Instant::now();
    let (st, _) =
        d.send(d.req_noauth(Method::PUT, &format!("/v1/sandboxes/{id}/files?path=/tmp/x")).body(vec![0u8; 20 << 20]));
    table.add(
        "20 MiB upload without a key: 401, fast",
        st == 401 && t.elapsed() < Duration::from_secs(5),
        format!("{st} in {:?}", t.elapsed()),
    );
    let ls = d.sh_ok(&id, "ls /tmp/x 2>&1 || true");
    table.add("... and nothing was written", ls.contains("No such file"), ls);

    // Absurd but valid limits: the smallest and the largest the API accepts.
    for (what, res) in [
        ("smallest limits", json!({ "cpus": 0.01, "memory_mb": 16, "disk_mb": 1, "pids": 8 })),
        ("largest limits", json!({ "cpus": 64, "memory_mb": 262144, "disk_mb": 1048576, "pids": 65536 })),
    ] {
        let (st, v) = d.post("/v1/sandboxes", &json!({ "timeout_s": 60, "resources": res }));
        let works = st == 201 && {
            let sid = v["id"].as_str().unwrap().to_string();
            d.register(&sid);
            let (st, r) =
                d.post(&format!("/v1/sandboxes/{sid}/exec"), &json!({ "cmd": ["echo", "ok"], "timeout_ms": 20_000 }));
            st == 200 && r["stdout"] == "ok\n"
        };
        table.add(
            format!("{what}: a working sandbox or a clear 4xx"),
            works || (400..500).contains(&st),
            format!("{st} {}", summary(&v)),
        );
    }
    let r = d.exec(&id, json!({ "cmd": ["echo", "fine"] }));
    table.add("the daemon and the sandbox are fine afterwards", r["stdout"] == "fine\n", summary(&r));
    let bad = table.finish("hostile requests");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    d.shutdown_and_check_leaks();
}

/// Mutates a valid body: byte flips, truncation, structural tokens and odd values spliced in.
fn mutate(rng: &mut Prng, seed: &str) -> Vec<u8> {
    const SPLICE: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "null",
        "true",
        "-1",
        "1e309",
        "18446744073709551616",
        "0.0000001",
        "\"\\u0000\"",
        "\"\\ud800\"",
        "{\"a\":{}}",
        "[[[[[[[[]]]]]]]]",
        "\"../../../../etc/passwd\"",
        "\"/proc/1/root\"",
        "\"\u{202e}\"",
        "99999999999999999999",
        "\"background\":true",
        "\"timeout_ms\":0",
    ];
    let mut b = seed.as_bytes().to_vec();
    let mut r = [0u8; 8];
    let mut next = |n: usize| {
        rng.fill(&mut r);
        (u64::from_le_bytes(r) % n.max(1) as u64) as usize
    };
    for _ in 0..=next(4) {
        match next(5) {
            0 if !b.is_empty() => {
                let i = next(b.len());
                b[i] ^= 1 << next(8);
            }
            1 if !b.is_empty() => {
                let i = next(b.len());
                b.truncate(i);
            }
            2 => {
                let i = next(b.len() + 1);
                let s = SPLICE[next(SPLICE.len())];
                b.splice(i..i, s.bytes());
            }
            3 if !b.is_empty() => {
                let i = next(b.len());
                let j = (i + next(8)).min(b.len());
                b.drain(i..j);
            }
            _ => {
                let i = next(b.len() + 1);
                b.insert(i, (next(256)) as u8);
            }
        }
    }
    b
}

/// HTTP-level fuzzing against a live daemon: mutated bodies on every JSON route. Only 2xx
/// and 4xx may come back, always within the timeout.
#[test]
fn random_request_bodies_never_get_a_5xx() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let seeds: Vec<(Method, String, &str)> = vec![
        (
            Method::POST,
            "/v1/sandboxes".into(),
            r#"{"timeout_s":30,"resources":{"memory_mb":64,"pids":16},"metadata":{"a":"b"}}"#,
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            r#"{"cmd":["echo","x"],"timeout_ms":5000,"max_output_bytes":100}"#,
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            r#"{"cmd":"echo y","env":{"K":"V"},"cwd":"/tmp","encoding":"base64"}"#,
        ),
        (Method::POST, format!("/v1/sandboxes/{id}/timeout"), r#"{"timeout_s":120}"#),
        (Method::POST, format!("/v1/sandboxes/{id}/files/mkdir"), r#"{"path":"/tmp/fz/a"}"#),
        (Method::POST, format!("/v1/sandboxes/{id}/files/rename"), r#"{"from":"/tmp/fz/a","to":"/tmp/fz/b"}"#),
        (Method::POST, format!("/v1/sandboxes/{id}/code"), r#"{"code":"1+1","language":"python","timeout_ms":5000}"#),
        (Method::POST, format!("/v1/sandboxes/{id}/commands/1/kill"), r#"{"signal":15}"#),
        (Method::POST, format!("/v1/sandboxes/{id}/commands/1/stdin"), r#"hello"#),
        (Method::PUT, format!("/v1/sandboxes/{id}/files?path=/tmp/fz/upload"), r#"{"not":"json, just bytes"}"#),
    ];
    let mut rng = Prng::new(0x006c_6f76_6562_6f78, u64::MAX);
    let mut seen = std::collections::BTreeMap::<u16, u32>::new();
    let mut bad = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    while n < 400 && Instant::now() < deadline {
        let (m, path, seed) = &seeds[n % seeds.len()];
        n += 1;
        let body = mutate(&mut rng, seed);
        let resp = d
            .req(m.clone(), path)
            .header("content-type", "application/json")
            .body(body.clone())
            .timeout(Duration::from_secs(20))
            .send();
        let Ok(resp) = resp else {
            bad.push(format!("no answer to {m} {path} {:?}", String::from_utf8_lossy(&body)));
            continue;
        };
        let st = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        *seen.entry(st).or_default() += 1;
        if st >= 500 {
            bad.push(format!("{st} for {m} {path} {:?}: {text}", String::from_utf8_lossy(&body)));
        }
        if st == 201 && path == "/v1/sandboxes" {
            if let Some(sid) =
                serde_json::from_str::<Value>(&text).ok().and_then(|v| v["id"].as_str().map(String::from))
            {
                d.register(&sid);
                d.delete(&format!("/v1/sandboxes/{sid}"));
            }
        }
    }
    let _ = std::io::stderr().write_all(format!("\n== HTTP fuzz: {n} requests, statuses {seen:?}\n").as_bytes());
    assert!(bad.is_empty(), "{} bad answers:\n{}", bad.len(), bad.join("\n"));
    let (st, _) = d.get(&format!("/v1/sandboxes/{id}"));
    assert!(st == 200 || st == 410, "the sandbox after fuzzing: {st}");
    d.shutdown_and_check_leaks();
}

/// The daemon's open fds, less its pool of network namespaces made ahead of time (`net:[…]`,
/// refilled in the background, so their count moves by itself).
fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|r| {
            r.flatten()
                .filter(|e| fs::read_link(e.path()).map_or(true, |t| !t.to_string_lossy().starts_with("net:[")))
                .count()
        })
        .unwrap_or(0)
}

/// Slow clients hold connections open (trickled bodies, trickled headers) while many fast
/// requests run: the daemon keeps answering the others, and gives every fd back.
#[test]
fn slow_clients_and_request_floods_do_not_starve_the_daemon() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "echo data > /tmp/f");
    let fds_before = open_fds(d.pid());
    let stop = AtomicBool::new(false);
    let table = Table::default();
    let addr = d.url.trim_start_matches("http://").to_string();
    let statuses = Mutex::new(std::collections::BTreeMap::<u16, u32>::new());
    let failures = Mutex::new(Vec::new());
    let max_health = Mutex::new(Duration::ZERO);
    std::thread::scope(|s| {
        for i in 0..24 {
            let (stop, addr, key, id) = (&stop, addr.clone(), d.key.clone(), id.clone());
            s.spawn(move || {
                let Ok(mut c) = TcpStream::connect(&addr) else { return };
                let head = if i % 2 == 0 {
                    format!("POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                } else {
                    String::new()
                };
                let _ = c.write_all(head.as_bytes());
                let trickle = if i % 2 == 0 { b"{\"cmd\":[\"true\"],\"env\":{\"a\":\"".to_vec() } else { b"GET /healthz HTTP/1.1\r\nX: ".to_vec() };
                let end = Instant::now() + Duration::from_secs(8);
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    let b = trickle.get(k).copied().unwrap_or(b'a');
                    if c.write_all(&[b]).is_err() {
                        break;
                    }
                    k += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut workers = Vec::new();
        for w in 0..12 {
            let (d, id, statuses, failures) = (&d, id.clone(), &statuses, &failures);
            workers.push(s.spawn(move || {
                // Its own client, dropped at the end: pooled keep-alive connections would
                // otherwise hold daemon fds open past the fd check below.
                let c = reqwest::blocking::Client::builder().no_proxy().build().unwrap();
                let (url, key) = (d.url.clone(), d.key.clone());
                for j in 0..10 {
                    let rb = match (w + j) % 6 {
                        0 => c.get(format!("{url}/healthz")),
                        1 => c.get(format!("{url}/v1/sandboxes")).bearer_auth(&key),
                        2 => c
                            .post(format!("{url}/v1/sandboxes/{id}/exec"))
                            .bearer_auth(&key)
                            .json(&json!({ "cmd": ["echo", j.to_string()] })),
                        3 => c.get(format!("{url}/v1/sandboxes/{id}/files?path=/tmp/f")).bearer_auth(&key),
                        4 => c.get(format!("{url}/v1/sandboxes/{id}")).bearer_auth("wrong"),
                        _ => c
                            .post(format!("{url}/v1/sandboxes"))
                            .bearer_auth(&key)
                            .header("content-type", "application/json")
                            .body("{bad"),
                    };
                    match rb.timeout(Duration::from_secs(20)).send() {
                        Ok(r) => *statuses.lock().unwrap().entry(r.status().as_u16()).or_default() += 1,
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                }
            }));
        }
        let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
        while workers.iter().any(|w| !w.is_finished()) {
            match healthz_latency(&client, &d.url) {
                Some(l) => {
                    let mut m = max_health.lock().unwrap();
                    *m = (*m).max(l);
                }
                None => failures.lock().unwrap().push("healthz failed".into()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let statuses = statuses.into_inner().unwrap();
    let failures = failures.into_inner().unwrap();
    let answered: u32 = statuses.values().sum();
    table.add(
        "120 requests beside 24 slow clients: all answered",
        failures.is_empty() && answered == 120,
        format!("{statuses:?} {failures:?}"),
    );
    table.add("no 5xx", statuses.keys().all(|s| *s < 500), format!("{statuses:?}"));
    let max = *max_health.lock().unwrap();
    table.add("/healthz within 2 s meanwhile", max < Duration::from_secs(2), format!("max {max:?}"));
    let back = common::poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let n = open_fds(d.pid());
        (n <= fds_before + 4).then_some(n)
    });
    table.add(
        "the daemon's fds come back",
        back.is_some(),
        format!("{fds_before} before, {} after", open_fds(d.pid())),
    );

    // Concurrent creates, commands and deletes leave nothing behind (the leak check below).
    let ok = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    let sid = d.create(sandbox_body(json!({ "resources": { "memory_mb": 64 } })));
                    let r = d.exec(&sid, json!({ "cmd": ["echo", "c"] }));
                    let (st, _) = d.delete(&format!("/v1/sandboxes/{sid}"));
                    r["stdout"] == "c\n" && st == 204
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).filter(|ok| *ok).count()
    });
    table.add("6 concurrent create/exec/delete", ok == 6, format!("{ok} of 6"));
    let bad = table.finish("slow clients and floods");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    d.shutdown_and_check_leaks();
}

// ---------------------------------------------------------------------------------------
// A hostile agent
// ---------------------------------------------------------------------------------------

/// What the fake agent does with each connection.
#[derive(Clone, Copy, Debug)]
enum Agent {
    Garbage,
    HugeFrame,
    UnknownKind,
    CloseAtOnce,
    /// `Started`, then this many bytes of stdout, then `Exited` (an exec).
    Flood(usize),
    /// This many bytes of stdout, then `Exited` (an attach to a command).
    AttachFlood(usize),
    /// A `FileInfo` saying 5 bytes, then megabytes of data.
    LongFile,
    /// Reads the request and never answers.
    Hang,
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    v.push(kind);
    v.extend_from_slice(payload);
    v
}

const EXITED: &str = r#"{"event":"exited","id":1,"exit_code":0,"signal":null,"timed_out":false,"oom_killed":false,"stdout_truncated":false,"stderr_truncated":false,"stdout_bytes":0,"stderr_bytes":0,"duration_ms":1}"#;

/// Stands in for a sandbox's agent: the test (host root) replaces the agent's socket in the
/// runtime dir with its own listener, so the daemon talks to code that breaks the protocol
/// the way a compromised agent could.
struct FakeAgent {
    mode: Arc<Mutex<Agent>>,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAgent {
    fn install(id: &str, mode: Agent) -> FakeAgent {
        let path = common::run_dir().join("sandboxes").join(id).join("agent.sock");
        fs::remove_file(&path).unwrap();
        let l = UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        let mode = Arc::new(Mutex::new(mode));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let (m, st, sv) = (mode.clone(), stop.clone(), served.clone());
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(120);
            while !st.load(Ordering::Relaxed) && Instant::now() < end {
                match l.accept() {
                    Ok((c, _)) => {
                        sv.fetch_add(1, Ordering::Relaxed);
                        let (mode, stop) = (*m.lock().unwrap(), st.clone());
                        std::thread::spawn(move || serve_fake(c, mode, &stop));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeAgent { mode, stop, served, thread: Some(thread) }
    }

    fn set(&self, mode: Agent) {
        *self.mode.lock().unwrap() = mode;
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_fake(mut c: UnixStream, mode: Agent, stop: &AtomicBool) {
    c.set_nonblocking(false).ok();
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut h = [0u8; 5];
    if c.read_exact(&mut h).is_err() {
        return;
    }
    let n = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let mut req = vec![0u8; n.saturating_sub(1).min(1 << 20)];
    if c.read_exact(&mut req).is_err() {
        return;
    }
    let _ = match mode {
        Agent::Garbage => c.write_all(&frame(0, b"this is not json")),
        Agent::HugeFrame => c.write_all(&[0x7f, 0xff, 0xff, 0xff, 0]),
        Agent::UnknownKind => c.write_all(&frame(9, b"x")),
        Agent::CloseAtOnce => Ok(()),
        Agent::Flood(bytes) | Agent::AttachFlood(bytes) => (|| {
            if matches!(mode, Agent::Flood(_)) {
                c.write_all(&frame(0, br#"{"event":"started","id":1,"pid":42}"#))?;
            }
            let chunk = vec![b'a'; 1 << 20];
            for _ in 0..bytes >> 20 {
                c.write_all(&frame(1, &chunk))?;
            }
            c.write_all(&frame(0, EXITED.as_bytes()))
        })(),
        Agent::LongFile => (|| {
            c.write_all(&frame(
                0,
                br#"{"reply":"file_info","path":"/x","name":"x","type":"file","size":5,"mode":420,"uid":0,"gid":0,"mtime":0}"#,
            ))?;
            let chunk = vec![b'z'; 1 << 20];
            for _ in 0..4 {
                c.write_all(&frame(4, &chunk))?;
            }
            c.write_all(&frame(0, br#"{"reply":"ok"}"#))
        })(),
        Agent::Hang => {
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        }
    };
}

#[test]
fn a_hostile_agent_gets_clear_errors_and_bounded_output() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let fake = FakeAgent::install(&id, Agent::Garbage);
    let table = Table::default();
    let exec = format!("/v1/sandboxes/{id}/exec");
    for mode in [Agent::Garbage, Agent::HugeFrame, Agent::UnknownKind, Agent::CloseAtOnce] {
        fake.set(mode);
        let t = Instant::now();
        let (st, v) = d.post(&exec, &json!({ "cmd": ["true"], "timeout_ms": 5000 }));
        table.add(
            format!("{mode:?} answer to exec: 502 agent_error"),
            st == 502 && v["error"]["code"] == "agent_error" && t.elapsed() < Duration::from_secs(5),
            format!("{st} {} in {:?}", summary(&v), t.elapsed()),
        );
    }
    fake.set(Agent::Flood(32 << 20));
    let (st, v) = d.post(&exec, &json!({ "cmd": ["true"], "max_output_bytes": 1024, "timeout_ms": 20_000 }));
    table.add(
        "32 MiB of output past a 1 KiB cap: the daemon keeps 1 KiB",
        st == 200 && v["stdout"].as_str().map(str::len) == Some(1024),
        format!("{st} stdout {} bytes", v["stdout"].as_str().map(str::len).unwrap_or(0)),
    );
    fake.set(Agent::LongFile);
    let (st, body) = download(&d, &id, "/x");
    table.add(
        "a file that says 5 bytes and sends 4 MiB: 5 bytes served",
        st == 200 && body.len() == 5,
        format!("{st}, {} bytes", body.len()),
    );
    fake.set(Agent::Garbage);
    for (what, (st, v)) in [
        ("list commands", d.get(&format!("/v1/sandboxes/{id}/commands"))),
        ("stat", d.get(&format!("/v1/sandboxes/{id}/files/stat?path=/x"))),
        ("mkdir", d.post(&format!("/v1/sandboxes/{id}/files/mkdir"), &json!({ "path": "/x" }))),
    ] {
        table.add(format!("garbage answer to {what}: 502"), st == 502, format!("{st} {}", summary(&v)));
    }
    let alive = d.req_noauth(Method::GET, "/healthz").send().is_ok_and(|r| r.status() == 200);
    table.add("the daemon is fine", alive && fake.served.load(Ordering::Relaxed) >= 9, "healthz");
    let other = d.create(sandbox_body(json!({})));
    table.add("other sandboxes are fine", d.sh(&other, "echo ok")["stdout"] == "ok\n", "");
    drop(fake);
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    table.add("the sandbox can still be deleted", st == 204, format!("{st}"));
    let bad = table.finish("hostile agent");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    d.shutdown_and_check_leaks();
}

/// `GET …/commands/{cid}?wait=true` must bound what it keeps of an agent's output too (the
/// API never returns more than 64 MiB per stream, the most `max_output_bytes` allows).
#[test]
fn a_hostile_agent_cannot_flood_the_daemon_through_a_command_result() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let fake = FakeAgent::install(&id, Agent::AttachFlood(96 << 20));
    let resp = d
        .req(Method::GET, &format!("/v1/sandboxes/{id}/commands/1?wait=true"))
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap();
    let st = resp.status().as_u16();
    let v: Value = resp.json().unwrap_or(Value::Null);
    let kept = v["stdout"].as_str().map(str::len).unwrap_or(0);
    drop(fake);
    assert!(st == 200 || st == 502, "fetching a flooded command: {st} {}", summary(&v));
    d.delete(&format!("/v1/sandboxes/{id}"));
    let peak = d.peak_rss_kib();
    assert!(
        kept <= 64 << 20,
        "the daemon kept and returned {kept} bytes of one stream ({st}); peak RSS {} MiB",
        peak / 1024
    );
    d.shutdown_and_check_leaks();
}

/// An agent that stops answering must not hang API requests forever.
#[test]
fn a_hung_agent_does_not_hang_api_requests() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let fake = FakeAgent::install(&id, Agent::Hang);
    let t = Instant::now();
    let r = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .json(&json!({ "cmd": ["true"], "timeout_ms": 1000 }))
        .timeout(Duration::from_secs(20))
        .send();
    let took = t.elapsed();
    let alive = d.req_noauth(Method::GET, "/healthz").send().is_ok_and(|r| r.status() == 200);
    drop(fake);
    d.delete(&format!("/v1/sandboxes/{id}"));
    let answer = r.map(|r| r.status().as_u16());
    assert!(alive, "the daemon stopped answering");
    assert!(
        answer.as_ref().is_ok_and(|st| *st >= 400),
        "exec with timeout_ms 1000 against a hung agent: no answer after {took:?} ({answer:?})"
    );
    d.shutdown_and_check_leaks();
}

// ---------------------------------------------------------------------------------------
// The code interpreter's output
// ---------------------------------------------------------------------------------------

/// A cell that prints 160 MiB: the daemon must not keep it all (exec caps at 1 MiB per
/// stream by default; run_code has to bound what it collects as well).
#[test]
fn code_interpreter_output_flood_is_bounded_in_the_daemon() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": "1 + 1" }));
    assert_eq!(st, 200, "{v}");
    let before = d.rss_kib();
    let code = "import sys\nb = 'a' * 65535 + '\\n'\nfor i in range(2560):\n    sys.stdout.write(b)\n";
    let resp = d
        .req(Method::POST, &format!("/v1/sandboxes/{id}/code"))
        .json(&json!({ "code": code, "timeout_ms": 25_000 }))
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap();
    let st = resp.status().as_u16();
    let body = resp.bytes().map(|b| b.len()).unwrap_or(0);
    let peak = d.peak_rss_kib();
    assert!(
        peak < before + 150 * 1024,
        "daemon RSS went from {} to a peak of {} MiB for one cell's output ({st}, {} MiB response)",
        before / 1024,
        peak / 1024,
        body >> 20
    );
    d.shutdown_and_check_leaks();
}
