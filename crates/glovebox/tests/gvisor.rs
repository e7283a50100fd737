//! The gVisor tier end to end: `isolation: "gvisor"` at create runs the sandbox's processes
//! on gVisor's sentry behind the same API — commands, files, code, the network policy
//! enforced on the host side of its veth, limits — and a destroy leaves nothing.
//! (The escape probes run against this tier in `adversarial.rs`.)
//!
//! Network: only namespaces this test creates; the canary is a listener in one of them,
//! reached through a veth pair of the test's own.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{rand_token, run_bounded, sandbox_body, Daemon, KillOnDrop, Netns};
use reqwest::Method;
use serde_json::{json, Value};

macro_rules! require_gvisor {
    () => {
        require_root!();
        assert!(
            std::path::Path::new("/usr/bin/runsc").is_file() || std::env::var_os("GLOVEBOX_RUNSC").is_some(),
            "runsc is not installed: scripts/deps installs it (Debian's runsc package)"
        );
    };
}

fn gvisor(extra: Value) -> Value {
    let mut b = sandbox_body(extra);
    b["isolation"] = json!("gvisor");
    b
}

fn py(d: &Daemon, id: &str, code: &str) -> Value {
    d.exec(id, json!({ "cmd": ["python3", "-c", code], "timeout_ms": 30_000 }))
}

fn out(r: &Value) -> String {
    r["stdout"].as_str().unwrap_or_default().trim().to_string()
}

#[test]
fn a_gvisor_sandbox_runs_commands_files_and_code_behind_the_same_api() {
    require_gvisor!();
    let d = Daemon::start();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string();
    let id = d.create(gvisor(json!({})));
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!((st, v["isolation"].as_str()), (200, Some("gvisor")), "{v}");
    let jailed = d.create(sandbox_body(json!({})));
    let (_, v) = d.get(&format!("/v1/sandboxes/{jailed}"));
    assert_eq!(v["isolation"], "process", "the default tier is the process jail: {v}");

    // It runs on gVisor's kernel, not the host's: a different kernel release (gVisor's), and
    // the agent (PID 1) and every command under their seccomp filters.
    let uname = d.sh_ok(&id, "uname -r");
    assert_ne!(uname.trim(), host_release, "the command ran on the host kernel");
    assert_eq!(d.sh_ok(&jailed, "uname -r").trim(), host_release, "control: the jail runs on the host kernel");
    // The host sees no process of the sandbox's commands: only gVisor's sentry, gofer and
    // stubs, none of them running the command.
    let marker = format!("gbmarker{}", rand_token(8));
    let (st, bg) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["python3", "-c", "import time; time.sleep(30)", &marker], "background": true }),
    );
    assert_eq!(st, 202, "{bg}");
    let seen = d.sh_ok(&id, &format!("ps -eo args | grep -F -- {marker} | grep -vc grep || true"));
    assert_eq!(seen.trim(), "1", "the marker command runs inside");
    let on_host: Vec<_> = common::processes()
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
        })
        .collect();
    assert!(on_host.is_empty(), "a sandbox command is a host process: {on_host:?}");
    let status = d.sh_ok(&id, "grep -E '^(Seccomp|CapEff|CapBnd):' /proc/self/status /proc/1/status");
    for want in [
        "/proc/self/status:Seccomp:\t2",
        "/proc/self/status:CapEff:\t0000000000000000",
        "/proc/self/status:CapBnd:\t0000000000000000",
        "/proc/1/status:Seccomp:\t2",
    ] {
        assert!(status.contains(want), "{want} in {status}");
    }

    // Commands: output, exit codes, stdin, a timeout that leaves the sandbox usable.
    let r = d.exec(&id, json!({ "cmd": "echo out; echo err >&2; exit 3" }));
    assert_eq!(
        (r["stdout"].as_str(), r["stderr"].as_str(), r["exit_code"].as_i64()),
        (Some("out\n"), Some("err\n"), Some(3))
    );
    let r = d.exec(&id, json!({ "cmd": ["cat"], "stdin": "fed through stdin" }));
    assert_eq!(r["stdout"], "fed through stdin", "{r}");
    let t = Instant::now();
    let r = d.exec(&id, json!({ "cmd": "sleep 30 & sleep 30; echo never", "timeout_ms": 1000 }));
    assert_eq!(r["timed_out"], true, "{r}");
    assert!(t.elapsed() < Duration::from_secs(10), "the timeout was kept: {:?}", t.elapsed());
    let left = d.sh_ok(&id, "ps -eo args | grep -c '^sleep 30' || true");
    assert_eq!(left.trim(), "0", "the timed-out command's process group is gone");
    let big = d.exec(
        &id,
        json!({ "cmd": "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo last-line", "max_output_bytes": 100000 }),
    );
    assert_eq!(big["stdout_truncated"], true, "{}", big["stdout_bytes"]);
    assert!(out(&big).ends_with("last-line"), "head and tail kept");

    // Files, resolved inside: a symlink planted to climb out reads the sandbox's own files.
    let body = format!("gvisor file {}", rand_token(12));
    let (st, info) =
        d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{id}/files?path=/home/user/a/b.txt")).body(body.clone()));
    assert_eq!(st, 200, "{info}");
    assert_eq!(d.sh_ok(&id, "cat /home/user/a/b.txt"), body);
    let got = d.req(Method::GET, &format!("/v1/sandboxes/{id}/files?path=a/b.txt")).send().unwrap().text().unwrap();
    assert_eq!(got, body);
    let (st, list) = d.get(&format!("/v1/sandboxes/{id}/files/list?path=/home/user/a"));
    assert_eq!(st, 200, "{list}");
    assert_eq!(list["entries"][0]["name"], "b.txt");
    d.sh_ok(&id, "echo sandbox-hostname-file > /tmp/mine; ln -s /../../../../../../../tmp/mine /tmp/up; ln -s /proc/self/root/etc/hostname /tmp/magic");
    let via = d.req(Method::GET, &format!("/v1/sandboxes/{id}/files?path=/tmp/up")).send().unwrap();
    assert_eq!(via.text().unwrap(), "sandbox-hostname-file\n", "a climbing symlink stays inside");
    let (st, e) = d.send(d.req(Method::GET, &format!("/v1/sandboxes/{id}/files?path=/tmp/magic")));
    assert_ne!(st, 200, "a /proc magic link is refused: {e}");
    let (st, _) = d.send(d.req(Method::DELETE, &format!("/v1/sandboxes/{id}/files?path=/home/user/a&recursive=true")));
    assert_eq!(st, 204);

    // The code interpreter: a stateful python context.
    let (st, ex) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": "x = 41\nx + 1" }));
    assert_eq!(st, 200, "{ex}");
    assert_eq!(ex["results"][0]["data"]["text/plain"], "42", "{ex}");
    let (_, ex) = d.post(&format!("/v1/sandboxes/{id}/code"), &json!({ "code": "print(x * 2)" }));
    assert_eq!(ex["logs"]["stdout"][0], "82\n", "state persists between cells: {ex}");

    // Destroy: the sentry and everything of the sandbox go (the leak check below too), and
    // the sentry's stub processes, which pass to the daemon when the sentry dies, are reaped:
    // no zombie is left to the daemon.
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
    let (st, _) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 410);
    let zombies = || {
        let me = d.pid().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|st| {
                let f: Vec<&str> = st.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
                f.first() == Some(&"Z") && f.get(1) == Some(&me.as_str())
            })
            .count()
    };
    let none = common::poll(Duration::from_secs(5), Duration::from_millis(50), || (zombies() == 0).then_some(()));
    assert!(none.is_some(), "{} zombie children of the daemon", zombies());
    d.shutdown_and_check_leaks();
}

/// A listener in a namespace of the test's own, reached from the host (and so from a
/// sandbox whose policy allows it) through a veth pair: TCP and UDP on one port.
struct Canary {
    _listener: KillOnDrop,
    lines: mpsc::Receiver<String>,
    ip: String,
    port: u16,
    _ns: Netns,
}

const LISTENER: &str = r#"
import select, socket, sys
ip = sys.argv[1]
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((ip, 0)); t.listen(16)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((ip, t.getsockname()[1]))
print("port", t.getsockname()[1], flush=True)
while True:
    r, _, _ = select.select([t, u, sys.stdin], [], [], 120)
    if not r or sys.stdin in r:
        break
    if t in r:
        c, a = t.accept(); print("tcp", a[0], flush=True); c.sendall(b"canary\n"); c.close()
    if u in r:
        d, a = u.recvfrom(65536); print("udp", a[0], flush=True)
"#;

impl Canary {
    fn start() -> Canary {
        let ns = Netns::new();
        // A /30 of 10.252.0.0/16 of the test's own (never routed off the machine).
        let n: u32 = u32::from_str_radix(&common::rand_hex(2), 16).unwrap() % 16384;
        let (host_ip, ip) =
            (format!("10.252.{}.{}", n / 64, (n % 64) * 4 + 1), format!("10.252.{}.{}", n / 64, (n % 64) * 4 + 2));
        let hostif = format!("gbtc{}", rand_token(6));
        let ip_cmd = |args: &[&str]| {
            let o = run_bounded(Command::new("ip").args(args), None, Duration::from_secs(10));
            assert!(o.status.success(), "ip {args:?}: {}", o.stderr_str());
        };
        ip_cmd(&["link", "add", &hostif, "type", "veth", "peer", "name", "eth0", "netns", &ns.name]);
        ip_cmd(&["addr", "add", &format!("{host_ip}/30"), "dev", &hostif]);
        ip_cmd(&["link", "set", &hostif, "up"]);
        ip_cmd(&["-n", &ns.name, "addr", "add", &format!("{ip}/30"), "dev", "eth0"]);
        ip_cmd(&["-n", &ns.name, "link", "set", "eth0", "up"]);
        ip_cmd(&["-n", &ns.name, "route", "add", "default", "via", &host_ip]);
        let mut cmd = ns.command("python3");
        cmd.args(["-c", LISTENER, &ip]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = KillOnDrop(cmd.spawn().expect("canary listener"));
        let stdout = child.0.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(10)).expect("canary did not start");
        let port = first.split_whitespace().nth(1).unwrap().parse().unwrap();
        Canary { _listener: child, lines: rx, ip, port, _ns: ns }
    }

    fn events(&self) -> Vec<String> {
        let mut v = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(300)) {
            v.push(l);
        }
        v
    }
}

/// Tries TCP and UDP to the canary from inside; returns what the sandbox saw.
fn reach(d: &Daemon, id: &str, c: &Canary) -> String {
    let code = format!(
        "import socket\ntry:\n s=socket.create_connection(({ip:?},{port}),timeout=3); print('tcp', s.recv(20).decode().strip())\nexcept Exception as e:\n print('tcp blocked', type(e).__name__)\ntry:\n socket.socket(socket.AF_INET,socket.SOCK_DGRAM).sendto(b'x',({ip:?},{port})); print('udp sent')\nexcept Exception as e:\n print('udp blocked', type(e).__name__)",
        ip = c.ip,
        port = c.port
    );
    out(&py(d, id, &code)).replace('\n', "; ")
}

#[test]
fn the_network_policy_holds_on_the_host_side_of_a_gvisor_sandbox() {
    require_gvisor!();
    let d = Daemon::start();
    let c = Canary::start();
    let allow = json!({ "mode": "allow-list", "allow": [format!("{}/32", c.ip)] });

    // Control: a sandbox allowed the canary reaches it, through gVisor's netstack and the veth.
    let open = d.create(gvisor(json!({ "network": allow })));
    let saw = reach(&d, &open, &c);
    assert!(saw.starts_with("tcp canary"), "the allowed canary answers: {saw}");
    let ev = c.events();
    assert!(ev.iter().any(|e| e.starts_with("tcp ")), "the canary saw the connection: {ev:?}");

    // deny-all: nothing reaches it, and the host's packet audit lists the attempts.
    let shut = d.create(gvisor(json!({})));
    let saw = reach(&d, &shut, &c);
    assert!(saw.starts_with("tcp blocked"), "deny-all: {saw}");
    let ev = c.events();
    assert!(ev.is_empty(), "deny-all reached the canary: {ev:?}");
    let denied = common::poll(Duration::from_secs(3), Duration::from_millis(100), || {
        let (_, log) = d.get(&format!("/v1/sandboxes/{shut}/egress"));
        let entries = log["entries"].as_array().cloned().unwrap_or_default();
        entries.iter().any(|e| e["ip"] == c.ip.as_str() && e["allowed"] == false).then_some(log)
    });
    assert!(denied.is_some(), "the denied attempt is in the egress audit");

    // A live update lets it through, and the next takes it away again: host rules only.
    let (st, v) = d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{shut}/network")).json(&allow));
    assert_eq!(st, 200, "{v}");
    let saw = reach(&d, &shut, &c);
    assert!(saw.starts_with("tcp canary"), "after the update to allow-list: {saw}");
    assert!(!c.events().is_empty());
    let (st, v) =
        d.send(d.req(Method::PUT, &format!("/v1/sandboxes/{shut}/network")).json(&json!({ "mode": "deny-all" })));
    assert_eq!(st, 200, "{v}");
    let saw = reach(&d, &shut, &c);
    assert!(saw.starts_with("tcp blocked"), "back to deny-all: {saw}");
    assert!(c.events().is_empty(), "deny-all again");
    // The sandbox cannot change its own network: gVisor's netstack is its only one.
    let r = d.sh(&shut, "ip addr add 10.0.0.9/8 dev eth0 2>&1; ip route add default dev eth0 2>&1; echo done");
    let saw = reach(&d, &shut, &c);
    assert!(saw.starts_with("tcp blocked"), "after trying to change its own routes ({r}): {saw}");
    drop(c);
    d.shutdown_and_check_leaks();
}

#[test]
fn limits_hold_under_gvisor() {
    require_gvisor!();
    let d = Daemon::start();
    // Memory: a command past the budget does not get it. Under gVisor the guest's memory is
    // the sentry's (a memory file no process maps whole), so the host's OOM killer ends the
    // sentry, and with it the sandbox: reason `oom` (the jail kills only the command).
    let id = d.create(gvisor(json!({ "resources": { "memory_mb": 256, "cpus": 0.25 } })));
    let code = "b = bytearray(600 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated')";
    let (st, r) =
        d.post(&format!("/v1/sandboxes/{id}/exec"), &json!({ "cmd": ["python3", "-c", code], "timeout_ms": 30_000 }));
    if st == 200 {
        assert!(!out(&r).contains("allocated") && r["exit_code"] != 0, "600 MiB under a 256 MiB budget: {r}");
    } else {
        assert_eq!((st, r["error"]["reason"].as_str()), (410, Some("oom")), "{r}");
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("oom")), "{v}");
    }
    let id = d.create(gvisor(json!({ "resources": { "memory_mb": 256, "cpus": 0.25 } })));
    // Processes: a fork bomb stops at the guest's own pids cap; the host's cap holds the
    // sentry's threads and stubs. A bomb can outgrow the host cap (many stubs per guest
    // process on the ptrace platform): then the sentry cannot start a stub and the sandbox
    // ends (reason `error`). Either way the daemon answers and the host keeps its pids.
    let id2 = d.create(gvisor(json!({ "resources": { "memory_mb": 512, "pids": 64 } })));
    let cap = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/glovebox/{id2}/pids.max"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/glovebox/{id2}/pids.max")))
        .unwrap_or_default();
    assert_eq!(cap.trim(), "768", "the host caps the sandbox's pids (64 x 8 + 256)");
    let inside = d.sh_ok(&id2, "python3 -c \"import os\nn=0\ntry:\n  while n < 200:\n    if os.fork()==0:\n      import time; time.sleep(5); os._exit(0)\n    n+=1\nexcept OSError as e: print(n, e.errno)\"");
    let forked: u64 = inside.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
    assert!(forked < 64 && inside.trim().ends_with(" 11"), "forks stop at the guest's cap with EAGAIN: {inside}");
    let t = Instant::now();
    let (st, r) = d.post(
        &format!("/v1/sandboxes/{id2}/exec"),
        &json!({ "cmd": ["sh", "-c", "(b() { b | b & }; b) 2>/dev/null; sleep 2; echo survived"], "timeout_ms": 15_000 }),
    );
    assert!(st == 200 || (st == 410 && r["error"]["reason"] == "error"), "{st} {r}");
    let (st, _) = d.get("/healthz");
    assert_eq!(st, 200, "the daemon answers after the bomb");
    assert!(t.elapsed() < Duration::from_secs(30), "{r}");
    // CPU: a quarter of a core; a spin for 2 s of wall time gets about 0.5 s.
    let cpu = |id: &str| {
        let (_, m) = d.get(&format!("/v1/sandboxes/{id}/metrics"));
        m["cpu_usage_ms"].as_u64().unwrap_or(0)
    };
    let before = cpu(&id);
    let r = py(&d, &id, "import time\nt=time.time()\nwhile time.time()-t < 2: pass\nprint('spun')");
    assert_eq!(out(&r), "spun", "{r}");
    let used = cpu(&id).saturating_sub(before);
    assert!(used < 1500, "0.25 cpus for 2 s used {used} ms of CPU");
    d.shutdown_and_check_leaks();
}

#[test]
fn gvisor_is_refused_clearly_where_it_cannot_apply() {
    require_gvisor!();
    let d = Daemon::start();
    let (st, e) = d.post("/v1/sandboxes", &json!({ "isolation": "firecracker" }));
    assert_eq!(st, 400, "{e}");
    // Snapshots need the writable layer, which the host cannot read under gVisor.
    let id = d.create(gvisor(json!({})));
    let (st, e) = d.post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({ "name": format!("s{}", rand_token(6)) }));
    assert!((400..500).contains(&st), "{st} {e}");
    assert!(e["error"]["message"].as_str().unwrap_or_default().contains("gvisor"), "{e}");
    d.shutdown_and_check_leaks();
}

/// `glovebox serve --default-isolation gvisor`: creates that name no isolation run on gVisor,
/// through the native API and the CLI alike; one that names `process` is jailed. Without
/// runsc such a daemon does not start, and says why.
#[test]
fn a_daemon_s_default_isolation_applies_to_creates_that_name_none() {
    require_gvisor!();
    let d = Daemon::start_with_isolation("gvisor");
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string();
    let id = d.create(sandbox_body(json!({})));
    let (_, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(v["isolation"], "gvisor", "{v}");
    assert_ne!(d.sh_ok(&id, "uname -r").trim(), host_release, "a gVisor sandbox runs on gVisor's kernel");
    let jailed = d.create(sandbox_body(json!({ "isolation": "process" })));
    let (_, v) = d.get(&format!("/v1/sandboxes/{jailed}"));
    assert_eq!(v["isolation"], "process", "{v}");
    assert_eq!(d.sh_ok(&jailed, "uname -r").trim(), host_release);
    // The CLI's create names none either, unless told.
    for (args, want) in [(&[][..], "gvisor"), (&["--isolation", "process"][..], "process")] {
        let o = run_bounded(d.cli().args(["sandbox", "create"]).args(args), None, Duration::from_secs(60));
        assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
        let id = o.stdout_str().trim().to_string();
        d.register(&id);
        let (_, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!(v["isolation"], want, "{args:?}: {v}");
    }
    d.shutdown_and_check_leaks();

    let data = common::tempdir("gbtest-data-");
    let o = run_bounded(
        Command::new(common::glovebox_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--api-key", "k", "--default-isolation", "gvisor", "--data-dir"])
            .arg(data.path())
            .env("GLOVEBOX_RUNSC", "/nonexistent/runsc"),
        None,
        Duration::from_secs(30),
    );
    assert_ne!(o.code(), Some(0), "started without runsc: {}", o.stderr_str());
    assert!(
        o.stderr_str().contains("default isolation gvisor: runsc not found at /nonexistent/runsc"),
        "{}",
        o.stderr_str()
    );
}

/// A daemon stopped with its sandboxes left running re-adopts its gVisor sandboxes: the agent
/// answers, and the link gVisor's netstack owns is held shut until its rules are back (it
/// cannot be made again, as a jailed sandbox's is): never unfiltered, still working after.
#[test]
fn a_gvisor_sandbox_is_readopted_with_its_link_and_policy() {
    require_gvisor!();
    let mut d = Daemon::start_keeping();
    let c = Canary::start();
    let allow = json!({ "mode": "allow-list", "allow": [format!("{}/32", c.ip)] });
    let open = d.create(gvisor(json!({ "network": allow })));
    let shut = d.create(gvisor(json!({})));
    assert!(reach(&d, &open, &c).starts_with("tcp canary"));
    c.events();
    d.stop();
    let d = d.restart();
    assert_eq!(d.sh_ok(&open, "echo back"), "back\n");
    let saw = common::poll(Duration::from_secs(10), Duration::from_millis(200), || {
        let s = reach(&d, &open, &c);
        s.starts_with("tcp canary").then_some(s)
    });
    assert!(saw.is_some(), "the allow-list works again after the restart");
    c.events();
    let saw = reach(&d, &shut, &c);
    assert!(saw.starts_with("tcp blocked"), "deny-all after the restart: {saw}");
    let ev = c.events();
    assert!(ev.is_empty(), "deny-all reached the canary after the restart: {ev:?}");
    drop(c);
    d.shutdown_and_check_leaks();
}

/// The daemon's zombie children (it is a subreaper: orphans of its sandboxes pass to it).
fn zombie_children(daemon: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else { continue };
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|r| r.trim().to_string());
        let zombie = field("State:").is_some_and(|s| s.starts_with('Z'));
        if zombie && field("PPid:").and_then(|p| p.parse::<u32>().ok()) == Some(daemon) {
            v.push(pid);
        }
    }
    v
}

/// The start helper stays as the reaper of the sentry's stub processes. Killed from outside
/// (a host admin, the OOM killer), it passes them to the daemon, which must reap them when the
/// sandbox is destroyed instead of keeping them as zombies (seven per sandbox, before).
#[test]
fn a_helper_killed_from_outside_leaves_no_zombies_in_the_daemon() {
    require_gvisor!();
    let d = Daemon::start();
    let id = d.create(gvisor(json!({})));
    // A few guest processes, so the sentry has stub processes on the host.
    assert_eq!(d.sh_ok(&id, "sleep 60 & sleep 60 & echo up"), "up\n");
    let rec = std::fs::read_to_string(common::run_dir().join("sandboxes").join(&id).join("helper")).unwrap();
    let helper: u32 = rec.split_whitespace().next().unwrap().parse().unwrap();
    let killed = Command::new("kill").args(["-9", &helper.to_string()]).status().unwrap();
    assert!(killed.success(), "kill the helper {helper}");
    // Until it is gone (a zombie of the daemon's, which the destroy reaps), its children
    // could still pass to it.
    let dead = common::poll(Duration::from_secs(5), Duration::from_millis(20), || {
        let st = std::fs::read_to_string(format!("/proc/{helper}/status")).unwrap_or_default();
        (st.is_empty() || st.lines().any(|l| l.starts_with("State:") && l.contains('Z'))).then_some(())
    });
    assert!(dead.is_some(), "the helper {helper} outlived SIGKILL");
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204, "destroy after the helper was killed");
    let left = common::poll(Duration::from_secs(5), Duration::from_millis(100), || {
        let z = zombie_children(d.pid());
        z.is_empty().then_some(())
    });
    assert!(left.is_some(), "zombies left in the daemon: {:?}", zombie_children(d.pid()));
    d.shutdown_and_check_leaks();
}
