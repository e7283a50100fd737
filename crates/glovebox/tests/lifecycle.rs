//! Sandbox lifetimes: the lifetime clock, deletion, extension, agent death, and what later
//! calls say about a sandbox that is gone.

mod common;

use std::time::{Duration, Instant};

use common::{processes_of, sandbox_body, Daemon};
use serde_json::{json, Value};

/// Polls GET until the sandbox is gone; returns (elapsed, body).
fn wait_gone(d: &Daemon, id: &str, within: Duration) -> (Duration, Value) {
    let t = Instant::now();
    common::poll(within, Duration::from_millis(50), || {
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        (st == 410).then_some((t.elapsed(), v))
    })
    .unwrap_or_else(|| panic!("sandbox {id} still there after {within:?}: {:?}", d.get(&format!("/v1/sandboxes/{id}"))))
}

fn assert_gone(v: &Value, reason: &str) {
    assert_eq!(v["error"]["code"], "sandbox_gone", "{v}");
    assert_eq!(v["error"]["reason"], reason, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(reason)), "{v}");
}

fn assert_nothing_left(id: &str) {
    let left = common::poll(Duration::from_secs(3), Duration::from_millis(50), || {
        (processes_of(id).is_empty() && common::cgroup_dirs(id).is_empty()).then_some(())
    });
    assert!(left.is_some(), "after its end, sandbox {id} left {:?} {:?}", processes_of(id), common::cgroup_dirs(id));
}

#[test]
fn lifetime_runs_out() {
    require_root!();
    let d = Daemon::start();
    let t = Instant::now();
    let id = d.create(json!({ "timeout_s": 2 }));
    // A command running at the deadline ends with the sandbox, and says why.
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &json!({ "cmd": ["sleep", "300"], "timeout_ms": 0 }));
    let took = t.elapsed();
    assert_eq!(st, 410, "{v}");
    assert_gone(&v, "timeout");
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(5), "ended after {took:?}");
    let (_, v) = wait_gone(&d, &id, Duration::from_secs(5));
    assert_gone(&v, "timeout");
    assert_nothing_left(&id);
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &json!({ "cmd": ["true"] }));
    assert_eq!(st, 410, "{v}");
    assert_gone(&v, "timeout");
    let (_, list) = d.get("/v1/sandboxes");
    assert!(!list.to_string().contains(&id), "a gone sandbox is not listed: {list}");

    // An idle one goes too, on time.
    let t = Instant::now();
    let id = d.create(json!({ "timeout_s": 2 }));
    let (_, v) = wait_gone(&d, &id, Duration::from_secs(5));
    assert_gone(&v, "timeout");
    assert!(t.elapsed() >= Duration::from_millis(1900), "gone early: {:?}", t.elapsed());
    assert_nothing_left(&id);
    d.shutdown_and_check_leaks();
}

#[test]
fn delete_then_gone_with_reason_killed() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "echo hi");
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &json!({ "cmd": ["sleep", "300"], "background": true }));
    assert_eq!(st, 202, "{v}");
    assert!(!processes_of(&id).is_empty(), "the sandbox runs on the host");
    let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204, "{v}");
    // The answer waits for the kill (cgroups and directory may still be on their way out):
    // no process of the sandbox is left once it is there, without polling.
    let left = processes_of(&id);
    assert!(left.is_empty(), "processes of {id} right after its DELETE returned: {left:?}");
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 410, "{v}");
    assert_gone(&v, "killed");
    let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 410, "deleting twice: {v}");
    assert_gone(&v, "killed");
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}/files/list?path=/"));
    assert_eq!(st, 410, "{v}");
    assert_nothing_left(&id);
    d.shutdown_and_check_leaks();
}

/// The daemon's open files that are the namespace `ns` (as `readlink` names it).
fn daemon_fds_on(d: &Daemon, ns: &str) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid())).expect("the daemon's fds");
    fds.flatten().filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == ns)).count()
}

#[test]
fn the_daemon_holds_a_sandboxs_mount_namespace_only_until_its_release() {
    require_root!();
    skip_under_gvisor!(
        "the daemon's hold on a jailed sandbox's mount namespace (a gVisor sandbox's root lives in the helper's and runsc's)",
        "The root filesystem"
    );
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    d.sh_ok(&id, "echo hi");
    // Its processes' mount namespace (a host process in its cgroup, if any, is in the host's).
    let host = std::fs::read_link("/proc/self/ns/mnt").expect("our mount namespace");
    let procs = processes_of(&id);
    let ns: std::collections::BTreeSet<_> = procs
        .iter()
        .filter_map(|p| std::fs::read_link(format!("/proc/{}/ns/mnt", p.pid)).ok())
        .filter(|ns| *ns != host)
        .map(|ns| ns.to_string_lossy().into_owned())
        .collect();
    assert_eq!(ns.len(), 1, "the processes of {id} are not in one mount namespace of their own: {ns:?} {procs:?}");
    let ns = ns.into_iter().next().unwrap_or_default();
    // Held while it lives (its unmounting is then not part of the kill a DELETE waits for) ...
    assert_eq!(daemon_fds_on(&d, &ns), 1, "the daemon does not hold {id}'s mount namespace {ns}");
    let (st, v) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204, "{v}");
    assert!(processes_of(&id).is_empty(), "processes of {id} right after its DELETE returned");
    // ... and let go with the rest of its release, so its mounts (and their memory) go too.
    let released =
        common::poll(Duration::from_secs(5), Duration::from_millis(20), || (daemon_fds_on(&d, &ns) == 0).then_some(()));
    assert!(released.is_some(), "the daemon still holds {id}'s mount namespace {ns} 5 s after its DELETE");
    assert_nothing_left(&id);
    d.shutdown_and_check_leaks();
}

#[test]
fn set_timeout_extends_and_shortens() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(json!({ "timeout_s": 3 }));
    let (_, before) = d.get(&format!("/v1/sandboxes/{id}"));
    let (st, after) = d.post(&format!("/v1/sandboxes/{id}/timeout"), &json!({ "timeout_s": 600 }));
    assert_eq!(st, 200, "{after}");
    let (b, a) = (before["expires_at"].as_str().unwrap(), after["expires_at"].as_str().unwrap());
    assert!(a > b, "expires_at did not move: {b} -> {a}");
    let (_, now) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(now["expires_at"], after["expires_at"]);
    // Past the original deadline it is still alive.
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(d.sh_ok(&id, "echo alive"), "alive\n");
    // Shortened, it ends at the new deadline.
    let t = Instant::now();
    let (st, _) = d.post(&format!("/v1/sandboxes/{id}/timeout"), &json!({ "timeout_s": 1 }));
    assert_eq!(st, 200);
    let (_, v) = wait_gone(&d, &id, Duration::from_secs(4));
    assert_gone(&v, "timeout");
    assert!(t.elapsed() >= Duration::from_millis(900), "{:?}", t.elapsed());
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/timeout"), &json!({ "timeout_s": 100 }));
    assert_eq!(st, 410, "cannot revive: {v}");
    d.shutdown_and_check_leaks();
}

#[test]
fn agent_death_is_reported() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    // The jail's agent is the daemon's child; a gVisor sandbox's agent lives and dies with
    // the sentry (`runsc-sandbox`, which the daemon watches in its place).
    let agent = processes_of(&id)
        .into_iter()
        .find(|p| match common::under_gvisor() {
            false => p.ppid == d.pid(),
            true => std::fs::read(format!("/proc/{}/cmdline", p.pid)).is_ok_and(|c| c.starts_with(b"runsc-sandbox\0")),
        })
        .unwrap_or_else(|| panic!("no agent (or sentry) among {:?}", processes_of(&id)));
    let o = common::run_bounded(
        std::process::Command::new("kill").args(["-KILL", &agent.pid.to_string()]),
        None,
        Duration::from_secs(5),
    );
    assert!(o.status.success());
    let (_, v) = wait_gone(&d, &id, Duration::from_secs(5));
    assert_gone(&v, "error");
    assert_nothing_left(&id);
    d.shutdown_and_check_leaks();
}

#[test]
fn list_filters_by_metadata() {
    require_root!();
    let d = Daemon::start();
    let a = d.create(sandbox_body(json!({ "metadata": { "team": "a", "run": "1" } })));
    let b = d.create(sandbox_body(json!({ "metadata": { "team": "b" } })));
    let ids = |q: &str| -> Vec<String> {
        let (st, v) = d.get(&format!("/v1/sandboxes{q}"));
        assert_eq!(st, 200, "{v}");
        v["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
    };
    let mut all = ids("");
    all.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(all, want);
    assert_eq!(ids("?metadata=team=a"), std::slice::from_ref(&a));
    assert_eq!(ids("?metadata=team=a,run=1"), std::slice::from_ref(&a));
    assert_eq!(ids("?metadata=team=c"), Vec::<String>::new());
    let (_, v) = d.get(&format!("/v1/sandboxes/{a}"));
    assert_eq!(v["metadata"], json!({ "team": "a", "run": "1" }));
    assert_eq!(v["state"], "running");
    assert_eq!(v["limits"]["memory_mb"], 512, "defaults are explicit: {v}");
    d.shutdown_and_check_leaks();
}

/// The shells (uid slot, run directory, cgroups, no processes) the daemon `pid` holds ready
/// for its next creates: run directories without the `skel` file every started sandbox has,
/// whose uid slot is locked by that daemon's process.
fn shells_of(pid: u32) -> std::collections::BTreeSet<String> {
    use std::os::unix::fs::MetadataExt;
    let run = common::run_dir();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let held_by = |ino: u64| {
        locks.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 5
                && f[1] == "FLOCK"
                && f[4] == pid.to_string()
                && f[5].rsplit(':').next() == Some(&ino.to_string())
        })
    };
    let mut out = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(run.join("sandboxes")).into_iter().flatten().flatten() {
        if e.path().join("skel").exists() {
            continue;
        }
        let Some(n) = std::fs::read_to_string(e.path().join("slot")).ok().and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let slot = run.join("slots").join(format!("{n}.lock"));
        if std::fs::metadata(&slot).is_ok_and(|m| held_by(m.ino())) {
            out.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// The memory limit of sandbox `id`'s cgroup, in MiB (v1 or v2).
fn memory_limit_mib(id: &str) -> Option<u64> {
    common::cgroup_dirs(id).iter().find_map(|d| {
        ["memory.limit_in_bytes", "memory.max"]
            .iter()
            .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|b| b >> 20)
    })
}

#[test]
fn the_next_sandbox_is_prepared_ahead_and_nothing_of_it_outlives_the_daemon() {
    require_root!();
    let d = Daemon::start();
    let pid = d.pid();
    // A daemon whose creates default to gVisor also links shells ahead from its start (its
    // `link_pool`, 2): every gVisor create takes one of those, none the jail's unlinked one.
    let ready_shells = if common::under_gvisor() { 3 } else { 1 };
    let wait_one = |not: &str| {
        common::poll(Duration::from_secs(5), Duration::from_millis(20), || {
            let s = shells_of(pid);
            (s.len() == ready_shells && !s.contains(not)).then_some(s)
        })
        .unwrap_or_else(|| panic!("no shell made ahead by daemon {pid}: {:?}\n{}", shells_of(pid), d.log()))
    };
    let ready = wait_one("");
    // A create with other limits than the defaults takes it, with its own limits.
    let id = d.create(json!({ "resources": { "memory_mb": 200 } }));
    assert!(ready.contains(&id), "the create did not take the shell made ahead: {id} vs {ready:?}");
    assert_eq!(memory_limit_mib(&id), Some(200), "the request's memory limit");
    assert_eq!(d.sh_ok(&id, "echo ok").trim(), "ok");
    // The next one is made once the create is done, with the defaults.
    let next = wait_one(&id);
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
    let other = d.create(json!({}));
    assert!(next.contains(&other), "{other} vs {next:?}");
    assert_eq!(memory_limit_mib(&other), Some(512), "the default memory limit");
    let last = wait_one(&other);
    d.shutdown_and_check_leaks();
    // Shells are not sandboxes the harness knows of: check them by name.
    common::assert_no_leaks(&last, &[]);
    assert!(shells_of(pid).is_empty());
}
