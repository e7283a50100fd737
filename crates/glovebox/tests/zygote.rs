//! Python kernels forked from a per-tenant, per-template zygote (`glovebox serve
//! --code-zygote`), end to end on a real daemon: a forked kernel is as confined as the kernel
//! the agent starts and as any command, each tenant gets a zygote of its own, a killed zygote
//! only costs the fallback (the agent's kernel) until it is started again, and cells give the
//! same results either way. Needs root and the code-interpreter template (scripts/test builds
//! it); without it the tests say so and stop.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// What a process is, read from inside: its status lines that confinement sets, its
/// namespaces, its mount table, the processes it sees, its fds' kinds, its environment's
/// names. The same program runs as a cell and as a command (`python3 -c`).
const INSPECT: &str = r#"
import json, os
st = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
             "Seccomp", "Seccomp_filters"):
        st[k] = " ".join(v.split())
ns = {n: os.readlink(f"/proc/self/ns/{n}") for n in sorted(os.listdir("/proc/self/ns"))}
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
cmdlines = []
for p in pids:
    if p == os.getpid():
        continue
    try:
        cmdlines.append(open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode())
    except OSError:
        pass
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        t = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    kind = t.split(":")[0] if ":" in t and not t.startswith("/") else t
    fds[kind] = fds.get(kind, 0) + 1
try:
    os.kill(1, 0)
    signal_pid1 = "ok"
except OSError as e:
    signal_pid1 = e.errno
print("INSPECT" + json.dumps({
    "status": st, "ns": ns, "mountinfo": open("/proc/self/mountinfo").read(), "cmdlines": cmdlines,
    "fds": fds, "env": sorted(os.environ), "environ": open("/proc/self/environ", "rb").read().decode(errors="replace"),
    "cgroup": open("/proc/self/cgroup").read(), "net": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]),
    "signal_pid1": signal_pid1, "limits": open("/proc/self/limits").read(),
}))
"#;

fn inspected(text: &str) -> Value {
    let line = text.lines().find_map(|l| l.strip_prefix("INSPECT")).unwrap_or_else(|| panic!("no report in {text:?}"));
    serde_json::from_str(line).expect("report")
}

fn inspect_cell(d: &Daemon, id: &str, context: Option<&str>) -> Value {
    let mut body = json!({ "code": INSPECT });
    if let Some(c) = context {
        body["context_id"] = json!(c);
    }
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/code"), &body);
    assert_eq!(st, 200, "{v}");
    assert!(v["error"].is_null(), "{v}");
    inspected(&stdout(&v))
}

#[test]
fn a_forked_kernel_is_confined_like_a_command_and_a_started_kernel() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start_with_code_zygote();
    let id = forked_sandbox(&d, None);
    let forked = inspect_cell(&d, &id, None);
    // The kernel the agent starts, in the same sandbox (a context of its own directory is
    // never the forked one), and a command.
    let (st, ctx) = d.post(&format!("/v1/sandboxes/{id}/contexts"), &json!({ "language": "python", "cwd": "/tmp" }));
    assert_eq!(st, 201, "{ctx}");
    let started = inspect_cell(&d, &id, ctx["id"].as_str());
    let r = d.exec(&id, json!({ "cmd": ["python3", "-c", INSPECT] }));
    assert_eq!(r["exit_code"], 0, "{r}");
    let command = inspected(r["stdout"].as_str().unwrap_or_default());

    for (what, other) in [("the started kernel", &started), ("a command", &command)] {
        assert_eq!(forked["status"], other["status"], "credentials, capabilities, no_new_privs, seccomp vs {what}");
        assert_eq!(forked["ns"], other["ns"], "every namespace vs {what}");
        assert_eq!(forked["mountinfo"], other["mountinfo"], "mount table vs {what}");
        assert_eq!(forked["net"], other["net"], "network interfaces vs {what}");
        assert_eq!(forked["limits"], other["limits"], "resource limits vs {what}");
    }
    // In the sandbox's cgroups, in a child of its own where a command has its `cmd-N` (the
    // hierarchy where the agent makes those), at the sandbox's own level in the others.
    let lines = |v: &Value| -> Vec<(String, String)> {
        let text = v["cgroup"].as_str().unwrap_or_default().to_string();
        text.lines().filter_map(|l| l.rsplit_once(':').map(|(h, p)| (h.to_string(), p.to_string()))).collect()
    };
    let (fk, cmd) = (lines(&forked), lines(&command));
    assert_eq!(fk.len(), cmd.len(), "{fk:?} vs {cmd:?}");
    for ((fh, fp), (ch, cp)) in fk.iter().zip(&cmd) {
        assert_eq!(fh, ch);
        let want = if cp.starts_with("/cmd-") { "/kernel-forked" } else { "/" };
        assert_eq!(fp, want, "the forked kernel's cgroup in {fh} (a command's: {cp}): {fk:?}");
    }
    assert!(cmd.iter().any(|(_, p)| p.starts_with("/cmd-")), "a command has a cgroup of its own: {cmd:?}");
    let s = &forked["status"];
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(s[k], "0000000000000000", "{k}: {s}");
    }
    assert_eq!(s["NoNewPrivs"], "1", "{s}");
    assert_eq!(s["Seccomp"], "2", "{s}");
    assert_eq!(s["Uid"], "0 0 0 0", "{s}");
    assert_eq!(forked["net"], json!(["lo"]), "a deny-all sandbox has loopback only");
    // The host's view: the kernel runs as the sandbox's uid 0, i.e. its range's base.
    let range = d.uid_range(&id).expect("uid range");
    let kernel_host = processes_of(&id).into_iter().filter(|p| p.comm.starts_with("python")).collect::<Vec<_>>();
    assert!(!kernel_host.is_empty(), "the kernels are the sandbox's processes");
    for p in &kernel_host {
        assert_eq!(p.uid, range.0, "a kernel runs as the sandbox's root, no other host uid: {p:?}");
    }
    // Nothing of the zygote's or the host's: no process of it in view, nothing of the daemon's
    // environment, only pipes, /dev/null and its own files as fds.
    let cmdlines = forked["cmdlines"].as_array().cloned().unwrap_or_default();
    for c in &cmdlines {
        let c = c.as_str().unwrap_or_default();
        assert!(
            c.starts_with("glovebox-agent ") || c.starts_with("python3 /opt/glovebox/kernels/python_kernel.py"),
            "the forked kernel sees {c:?}: {cmdlines:?}"
        );
        assert!(!c.contains("zygote"), "{cmdlines:?}");
    }
    assert!(!forked["environ"].as_str().unwrap_or_default().contains(&d.canary), "the daemon's environment leaked");
    assert_eq!(forked["env"], started["env"], "the same environment as the started kernel");
    for (kind, _) in forked["fds"].as_object().cloned().unwrap_or_default() {
        assert!(
            kind == "pipe" || kind == "/dev/null" || kind == "anon_inode" || kind.starts_with("/proc/"),
            "a forked kernel's fd is {kind:?}: {}",
            forked["fds"]
        );
    }
    // Landlock is in force: the agent's rules scope signals to their domain, and the forked
    // kernel's domain (the same rules, made for it) is not the agent's, so PID 1 is out of its
    // reach, where a command (in the agent's domain) may signal it.
    assert_eq!(command["signal_pid1"], "ok", "{command}");
    assert_eq!(forked["signal_pid1"], 1, "EPERM from the Landlock scope: {forked}");
    assert_eq!(zygotes(&d).len(), 1, "its zygote is in the leak check");
    d.shutdown_and_check_leaks();
}

#[test]
fn tenants_get_zygotes_of_their_own() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start_with_code_zygote();
    let (ka, kb) = (tenant_key(&d, "tenant-a"), tenant_key(&d, "tenant-b"));
    let a = forked_sandbox(&d, Some(&ka));
    let b = forked_sandbox(&d, Some(&kb));
    let zs = zygotes(&d);
    let (za, zb) = (zs.get("tenant-a").cloned().unwrap_or_default(), zs.get("tenant-b").cloned().unwrap_or_default());
    assert_eq!((za.len(), zb.len()), (1, 1), "one zygote each: {zs:?}");
    assert_ne!(za, zb);
    // Distinct host uids (each zygote holds a uid slot of its own), and neither a sandbox's.
    let uid_of = |z: &str| processes_of(z).first().map(|p| p.uid).unwrap_or_else(|| panic!("zygote {z} runs"));
    let (ua, ub) = (uid_of(&za[0]), uid_of(&zb[0]));
    assert_ne!(ua, ub);
    for id in [&a, &b] {
        let r = d.uid_range(id).expect("range");
        assert!(!(r.0..r.0 + r.1).contains(&ua) && !(r.0..r.0 + r.1).contains(&ub), "zygote uid in a sandbox's range");
    }
    for z in za.iter().chain(zb.iter()) {
        assert!(processes_of(z).iter().all(|p| p.uid == uid_of(z)), "a zygote's processes are its uid's only");
        // The template's code in a zygote runs under a seccomp filter (the commands' plus its
        // children's way in), without capabilities, with no_new_privs.
        for p in processes_of(z) {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", p.pid)) else { continue };
            let field = |k: &str| {
                status.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_string()).unwrap_or_default()
            };
            assert_eq!(field("Seccomp:"), "2", "zygote {z} pid {}: {status}", p.pid);
            assert_eq!(field("Seccomp_filters:"), "1", "zygote {z} pid {}", p.pid);
            assert_eq!(field("NoNewPrivs:"), "1", "zygote {z} pid {}", p.pid);
            assert_eq!(field("CapEff:"), "0000000000000000", "zygote {z} pid {}", p.pid);
        }
    }
    d.shutdown_and_check_leaks();
}

#[test]
fn a_killed_zygote_falls_back_to_the_started_kernel_and_comes_back() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start_with_code_zygote();
    let first = forked_sandbox(&d, None);
    let z = zygotes(&d).get("default").and_then(|v| v.first().cloned()).expect("a zygote");
    let procs = processes_of(&z);
    assert!(!procs.is_empty(), "zygote {z} runs");
    for p in &procs {
        let _ = std::process::Command::new("kill").args(["-9", &p.pid.to_string()]).status();
    }
    // The sandbox it seeded keeps working (its kernel is the sandbox's, not the zygote's).
    let ex = cell(&d, None, &first, "import pandas as pd; print(pd.DataFrame({'a': [1, 2]}).a.sum())");
    assert_eq!(stdout(&ex), "3\n", "{ex}");
    // The next create gets the agent's kernel (and says why), and works.
    let (st, v) = d.post("/v1/sandboxes", &sandbox_body(json!({ "template": "code-interpreter" })));
    assert_eq!(st, 201, "{v}");
    let next = v["id"].as_str().unwrap().to_string();
    d.register(&next);
    let ex = cell(&d, None, &next, "import numpy as np; print(int(np.arange(4).sum()))");
    assert_eq!(stdout(&ex), "6\n", "{ex}");
    // Found dead, or failing a fork while it died: replaced either way.
    assert!(d.log().contains("; starting another"), "{}", d.log());
    // And a zygote is back.
    let again = forked_sandbox(&d, None);
    assert_ne!(again, first);
    let all = zygotes(&d);
    assert_eq!(all.get("default").map(|v| v.len()), Some(2), "{all:?}");
    d.shutdown_and_check_leaks();
}

#[test]
fn cells_give_the_same_results_from_a_forked_and_a_started_kernel() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let cells = [
        "x = 41\nx + 1",
        "import numpy as np, pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [4.0, 5.5, 6.25]})\ndf",
        "print(df.describe().loc['mean'].to_dict())",
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()",
        "{'k': [1, 2], 'n': None}",
        "1/0",
        "import os\nos.getcwd(), os.getuid()",
        "!echo shell",
    ];
    let run = |d: &Daemon, id: &str| -> Vec<Value> {
        cells
            .iter()
            .map(|c| {
                let mut ex = cell(d, None, id, c);
                // PNG bytes are compared as present, not byte for byte (fonts' hinting cache).
                for r in ex["results"].as_array_mut().into_iter().flatten() {
                    if let Some(p) = r["data"].get_mut("image/png") {
                        *p = json!(!p.as_str().unwrap_or_default().is_empty());
                    }
                }
                ex
            })
            .collect()
    };
    let z = Daemon::start_with_code_zygote();
    let forked = forked_sandbox(&z, None);
    let with_zygote = run(&z, &forked);
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "template": "code-interpreter" })));
    let without = run(&d, &id);
    for ((c, a), b) in cells.iter().zip(&with_zygote).zip(&without) {
        assert_eq!(a, b, "cell {c:?}: forked {a} vs started {b}");
    }
    assert_eq!(zygotes(&z).len(), 1, "its zygote is in the leak check");
    z.shutdown_and_check_leaks();
    d.shutdown_and_check_leaks();
}

/// A kernel restart kills what the forked kernel started (it is in a cgroup of its own, as a
/// kernel the agent starts is), and the context serves again.
#[test]
fn restarting_a_forked_kernel_kills_what_it_started() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start_with_code_zygote();
    let id = forked_sandbox(&d, None);
    let ex = cell(&d, None, &id, "import subprocess\nsubprocess.Popen(['sleep', '1000'], start_new_session=True).pid");
    assert!(ex["error"].is_null(), "{ex}");
    let sleeps = || processes_of(&id).into_iter().filter(|p| p.comm == "sleep").count();
    assert_eq!(sleeps(), 1, "the cell's sleep runs: {:?}", processes_of(&id));
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/contexts/python/restart"), &json!({}));
    assert!(st == 200 || st == 204, "restart: {st} {v}");
    let gone = poll(Duration::from_secs(5), Duration::from_millis(50), || (sleeps() == 0).then_some(()));
    assert!(gone.is_some(), "the sleep the forked kernel started outlived its restart: {:?}", processes_of(&id));
    let ex = cell(&d, None, &id, "import numpy as np; print(int(np.arange(5).sum()))");
    assert_eq!(stdout(&ex), "10\n", "{ex}");
    assert_eq!(zygotes(&d).len(), 1, "its zygote is in the leak check");
    d.shutdown_and_check_leaks();
}

/// The zygote's child killed at each step of a hand-off, or stopped mid-way (a debug build's fault hook,
/// `GLOVEBOX_DEBUG_ZYGOTE_FAULT`, see `glovebox_jail::kzygote::Forked::fault`): the create
/// still succeeds with a kernel that serves (the agent's, said so in the log; or the forked
/// one when the child had already done its part), nothing of the child is left (no process
/// in the zygote's cgroup but the zygote, no zombie, no user namespace held by the daemon),
/// the next create gets a forked kernel again, and the leak check passes.
#[test]
fn the_zygotes_child_killed_mid_hand_off_leaves_nothing() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    if !cfg!(debug_assertions) {
        eprintln!("SKIPPED: the fault hook is in debug builds only");
        return;
    }
    // (step, the daemon's environment, whether the forked kernel may still have been made)
    let steps: [(&str, &'static str, bool); 5] = [
        ("booting", "export GLOVEBOX_CODE_ZYGOTE=1 GLOVEBOX_DEBUG_ZYGOTE_FAULT=booting;", false),
        ("joining", "export GLOVEBOX_CODE_ZYGOTE=1 GLOVEBOX_DEBUG_ZYGOTE_FAULT=joining;", false),
        // Stopped, not killed, where `joining` kills it: it never answers (the 2 s timeout).
        ("stalled", "export GLOVEBOX_CODE_ZYGOTE=1 GLOVEBOX_DEBUG_ZYGOTE_FAULT=stalled;", false),
        // The namespaces were sent: the child may have forked the kernel before it died.
        ("forking", "export GLOVEBOX_CODE_ZYGOTE=1 GLOVEBOX_DEBUG_ZYGOTE_FAULT=forking;", true),
        ("reaping", "export GLOVEBOX_CODE_ZYGOTE=1 GLOVEBOX_DEBUG_ZYGOTE_FAULT=reaping;", true),
    ];
    let mut seen = Vec::new();
    for (step, env, may_fork) in steps {
        let d = Daemon::start_after(env);
        let mark = format!("debug fault at {step}:");
        let body = sandbox_body(json!({ "template": "code-interpreter" }));
        // The first create starts the zygote (and gets the agent's kernel); a later one forks.
        let id = poll(Duration::from_secs(90), Duration::from_millis(200), || {
            let id = d.create(body.clone());
            if d.log().contains(&mark) {
                return Some(id);
            }
            d.delete(&format!("/v1/sandboxes/{id}"));
            std::thread::sleep(Duration::from_millis(300));
            None
        })
        .unwrap_or_else(|| panic!("no hand-off reached {step}:\n{}", d.log()));
        let line = |what: &str| {
            d.log().lines().find(|l| l.contains(what) && l.contains(&format!("sandbox={id}"))).map(str::to_string)
        };
        let ex = cell(&d, None, &id, "import numpy as np; print(int(np.arange(4).sum()))");
        assert_eq!(stdout(&ex), "6\n", "{step}: {ex}");
        let forked = line("python kernel forked from the zygote").is_some();
        let fallback = line("python kernel from the zygote:");
        assert!(may_fork || !forked, "{step}: a kernel was handed off from a dead child:\n{}", d.log());
        assert_eq!(forked, fallback.is_none(), "{step}: forked, or the fallback logged:\n{}", d.log());
        seen.push(format!("{step}: {}", fallback.as_deref().map_or("forked kernel".into(), |l| l.to_string())));
        // The forked kernel's own cgroup is there only while it is.
        let kernel_cgroups: Vec<_> =
            cgroup_dirs(&id).into_iter().map(|d| d.join("kernel-forked")).filter(|d| d.is_dir()).collect();
        assert_eq!(!kernel_cgroups.is_empty(), forked, "{step}: kernel cgroups {kernel_cgroups:?}");
        // Nothing of the child: its zygote's cgroup holds the zygote alone, and no zombie
        // anywhere of the sandbox's or the zygote's.
        let z = zygotes(&d).get("default").and_then(|v| v.first().cloned()).expect("a zygote");
        let settled = poll(Duration::from_secs(5), Duration::from_millis(50), || {
            let zs = processes_of(&z);
            let zombies: Vec<u32> = zs
                .iter()
                .chain(processes_of(&id).iter())
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
                        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
                })
                .map(|p| p.pid)
                .collect();
            (zs.len() == 1 && zombies.is_empty()).then_some(())
        });
        assert!(
            settled.is_some(),
            "{step}: left in the zygote {:?} / sandbox {:?}",
            processes_of(&z),
            processes_of(&id)
        );
        let held: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .map(|rd| rd.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()))
            .into_iter()
            .flatten()
            .map(|t| t.display().to_string())
            .filter(|t| t.starts_with("user:"))
            .collect();
        assert!(held.is_empty(), "{step}: the daemon holds user namespaces: {held:?}");
        // The next create gets a forked kernel again.
        let again = forked_sandbox(&d, None);
        assert_ne!(again, id);
        d.shutdown_and_check_leaks();
    }
    eprintln!("\n== the zygote's child killed (or stopped) mid-hand-off\n  {}", seen.join("\n  "));
}

/// E2B's SDKs ask for internet access unless told otherwise (`Sandbox.create`'s
/// `allow_internet_access` defaults to true): that sandbox needs a link, and a linked sandbox
/// never gets its kernel from the zygote (nor asks for one). With `allow_internet_access:
/// false` (deny-all, no link) it does.
#[test]
fn e2b_sandboxes_take_the_zygote_only_without_internet_access() {
    require_root!();
    if !have_ci_template() {
        return;
    }
    let d = Daemon::start_with_code_zygote();
    // The default tenant's zygote runs and forks (the E2B front-end's admin key is that tenant).
    forked_sandbox(&d, None);
    let e2b = |internet: bool| -> String {
        let body = json!({ "templateID": "code-interpreter", "timeout": 120, "allow_internet_access": internet });
        let (st, v) = d.send(d.req(reqwest::Method::POST, "/sandboxes").json(&body));
        assert_eq!(st, 201, "{v}");
        let id = v["sandboxID"].as_str().expect("sandboxID").to_string();
        d.register(&id);
        id
    };
    let zygote_lines =
        |id: &str| d.log().lines().filter(|l| l.contains(&format!("sandbox={id}")) && l.contains("zygote")).count();
    let linked = e2b(true);
    let (st, v) = d.get(&format!("/v1/sandboxes/{linked}"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["network"]["mode"], "allow-all", "the SDK's default: {v}");
    assert_eq!(zygote_lines(&linked), 0, "a linked sandbox never asks the zygote:\n{}", d.log());
    let ex = cell(&d, None, &linked, "import numpy as np; print(int(np.arange(3).sum()))");
    assert_eq!(stdout(&ex), "3\n", "{ex}");
    let unlinked = e2b(false);
    let forked = d
        .log()
        .lines()
        .any(|l| l.contains(&format!("sandbox={unlinked}")) && l.contains("python kernel forked from the zygote"));
    assert!(forked, "allow_internet_access: false gets a forked kernel:\n{}", d.log());
    d.shutdown_and_check_leaks();
}
