//! Pause and resume on the real jail: a paused sandbox's processes use no CPU (read from its
//! cgroup), keep their memory (a shell's variable answers the same after resume), a request
//! resumes it, a paused one is killed at once, the CLI pauses and resumes, and a daemon
//! restart keeps it paused and resumable. Prints pause and resume p50 over the HTTP API.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{cgroup_dirs, poll, sandbox_body, Daemon};
use serde_json::{json, Value};

/// The sandbox cgroup's CPU time in microseconds (v1 `cpuacct.usage`, v2 `cpu.stat`).
fn cpu_usec(id: &str) -> u64 {
    for d in cgroup_dirs(id) {
        if let Ok(ns) = std::fs::read_to_string(d.join("cpuacct.usage")) {
            return ns.trim().parse::<u64>().expect("cpuacct.usage") / 1000;
        }
        if let Ok(stat) = std::fs::read_to_string(d.join("cpu.stat")) {
            let line = stat.lines().find(|l| l.starts_with("usage_usec ")).expect("usage_usec");
            return line[11..].trim().parse().expect("usage_usec");
        }
    }
    panic!("no CPU counter for sandbox {id} in {:?}", cgroup_dirs(id));
}

/// Whether the kernel reports the sandbox's cgroup frozen (v1 freezer or v2 cgroup.events).
fn frozen(id: &str) -> bool {
    let dirs: Vec<PathBuf> = cgroup_dirs(id);
    dirs.iter().any(|d| {
        std::fs::read_to_string(d.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
            || std::fs::read_to_string(d.join("cgroup.events")).is_ok_and(|s| s.lines().any(|l| l == "frozen 1"))
    })
}

fn state(d: &Daemon, id: &str) -> String {
    let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 200, "{v}");
    v["state"].as_str().unwrap_or_default().to_string()
}

fn pause(d: &Daemon, id: &str) -> Value {
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/pause"), &json!({}));
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    v
}

fn resume(d: &Daemon, id: &str) -> Value {
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/resume"), &json!({}));
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");
    v
}

/// Starts a CPU-bound shell holding a random variable, which it writes to /tmp/v2 on
/// SIGUSR1; returns the variable as it first wrote it (/tmp/v).
fn start_spinner(d: &Daemon, id: &str) -> String {
    let script = "v=$$-$(od -An -N8 -tx8 /dev/urandom | tr -d ' '); echo \"$v\" > /tmp/v; echo $$ > /tmp/pid; \
                  trap 'echo \"$v\" > /tmp/v2' USR1; while :; do :; done";
    let (st, v) = d.post(
        &format!("/v1/sandboxes/{id}/exec"),
        &json!({ "cmd": ["bash", "-c", script], "background": true, "timeout_ms": 0 }),
    );
    assert_eq!(st, 202, "{v}");
    let var = poll(Duration::from_secs(5), Duration::from_millis(20), || {
        let out = d.sh(id, "cat /tmp/v 2>/dev/null")["stdout"].as_str().unwrap_or_default().trim().to_string();
        (!out.is_empty()).then_some(out)
    });
    var.expect("the spinner wrote its variable")
}

/// The spinner's variable as it answers SIGUSR1 now (from its own memory).
fn ask_spinner(d: &Daemon, id: &str) -> String {
    let out = d.sh_ok(id, "rm -f /tmp/v2; kill -USR1 $(cat /tmp/pid); for i in $(seq 100); do [ -s /tmp/v2 ] && break; sleep 0.05; done; cat /tmp/v2");
    out.trim().to_string()
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn a_paused_sandbox_uses_no_cpu_keeps_its_memory_and_a_request_resumes_it() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({ "timeout_s": 600 })));
    let var = start_spinner(&d, &id);
    // Running, the spinner burns CPU (so the check below can fail).
    let a = cpu_usec(&id);
    std::thread::sleep(Duration::from_millis(500));
    let b = cpu_usec(&id);
    assert!(b - a > 100_000, "the spinner does not run: {} µs in 500 ms", b - a);

    let before = pause(&d, &id);
    assert!(frozen(&id), "the cgroup is not frozen");
    let a = cpu_usec(&id);
    std::thread::sleep(Duration::from_millis(1500));
    let b = cpu_usec(&id);
    assert!(b - a < 5_000, "paused, the sandbox used {} µs of CPU in 1.5 s", b - a);
    // Its clock is stopped: `expires_at` (as if resumed now) moved with the wall clock.
    let later = pause(&d, &id);
    assert_ne!(before["expires_at"], later["expires_at"], "the paused clock's expiry should follow now");
    assert_eq!(state(&d, &id), "paused", "a view does not resume");
    let (st, _) = d.get(&format!("/v1/sandboxes/{id}/metrics"));
    assert_eq!(st, 200);
    assert_eq!(state(&d, &id), "paused", "metrics do not resume");

    resume(&d, &id);
    assert!(!frozen(&id));
    assert_eq!(ask_spinner(&d, &id), var, "the spinner's memory changed across the pause");

    // Auto-resume: a command on a paused sandbox runs (and leaves it running).
    pause(&d, &id);
    assert_eq!(d.sh_ok(&id, "echo hi"), "hi\n");
    assert_eq!(state(&d, &id), "running");
    assert!(!frozen(&id));

    // Pause and resume cost, over the API (the sandbox has a busy process).
    let (mut p, mut r) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        let t = Instant::now();
        pause(&d, &id);
        p.push(t.elapsed());
        let t = Instant::now();
        resume(&d, &id);
        r.push(t.elapsed());
    }
    eprintln!("pause p50 {:?}, resume p50 {:?} (n=50, over HTTP)", p50(p), p50(r));
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
}

#[test]
fn a_paused_sandbox_is_killed_at_once() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    start_spinner(&d, &id);
    // Through the CLI: `glovebox sandbox pause|resume ID` print the state.
    for (verb, want) in [("pause", "paused"), ("resume", "running"), ("pause", "paused")] {
        let out = common::run_bounded(d.cli().args(["sandbox", verb, &id]), None, Duration::from_secs(20));
        assert_eq!((out.code(), out.stdout_str().trim()), (Some(0), want), "{verb}: {}", out.stderr_str());
    }
    assert!(frozen(&id));
    let t = Instant::now();
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
    assert!(t.elapsed() < Duration::from_secs(3), "killing a paused sandbox took {:?}", t.elapsed());
    let gone = poll(Duration::from_secs(5), Duration::from_millis(20), || cgroup_dirs(&id).is_empty().then_some(()));
    assert!(gone.is_some(), "its cgroups remain: {:?}", cgroup_dirs(&id));
}

#[test]
fn a_restart_keeps_a_paused_sandbox_paused_and_resumable() {
    require_root!();
    let mut d = Daemon::start();
    // `auto_resume: false`: requests do not wake it; the choice survives the restart.
    let id = d.create(sandbox_body(json!({ "timeout_s": 600, "auto_resume": false })));
    let var = start_spinner(&d, &id);
    let paused = pause(&d, &id);
    assert_eq!(paused["auto_resume"], json!(false), "{paused}");
    d.crash();
    assert!(frozen(&id), "the sandbox thawed when its daemon died");
    let d = d.restart();
    // Adopted (its agent checked), then frozen again.
    let adopted = poll(Duration::from_secs(10), Duration::from_millis(50), || {
        let (_, v) = d.get(&format!("/v1/sandboxes/{id}/events"));
        let events = v["events"].as_array().cloned().unwrap_or_default();
        events.iter().any(|e| e["type"] == "adopted").then_some(())
    });
    assert!(adopted.is_some(), "not re-adopted:\n{}", d.log());
    assert_eq!(state(&d, &id), "paused");
    assert!(frozen(&id), "re-adopted, it runs again");
    let a = cpu_usec(&id);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(cpu_usec(&id) - a < 5_000, "re-adopted paused, it uses CPU");
    // The time left was kept across the restart (within the seconds the test took).
    let (_, v) = d.get(&format!("/v1/sandboxes/{id}"));
    let expires = |v: &Value| v["expires_at"].as_str().unwrap_or_default().to_string();
    assert!(expires(&v) >= expires(&paused), "{} before {}", expires(&v), expires(&paused));
    let (st, v) = d.post(&format!("/v1/sandboxes/{id}/exec"), &json!({ "cmd": ["true"] }));
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("sandbox_paused")), "{v}");
    assert_eq!(state(&d, &id), "paused", "a refused request woke it");
    assert!(frozen(&id));
    resume(&d, &id);
    assert_eq!(ask_spinner(&d, &id), var);
    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
}

#[test]
fn a_request_waiting_on_a_sandbox_that_is_paused_is_answered_at_once() {
    require_root!();
    let d = Daemon::start();
    let id = d.create(sandbox_body(json!({})));
    // A foreground command that writes a line, then waits; the pause comes while it waits.
    let waiting = std::thread::scope(|s| {
        let exec = s.spawn(|| {
            let body = json!({ "cmd": "echo started > /tmp/mark; sleep 2; echo done >> /tmp/mark" });
            let t = Instant::now();
            // Bounded: without an answer it would wait for the resume that never comes.
            let r = d
                .req(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&body)
                .timeout(Duration::from_secs(10))
                .send();
            match r {
                Ok(r) => (r.status().as_u16(), r.json::<Value>().unwrap_or_default(), t),
                Err(e) => (0, json!({ "client": e.to_string() }), t),
            }
        });
        let started = poll(Duration::from_secs(10), Duration::from_millis(20), || {
            let r = d.sh(&id, "cat /tmp/mark 2>/dev/null");
            r["stdout"].as_str().is_some_and(|o| o.contains("started")).then_some(())
        });
        assert!(started.is_some(), "the command did not start");
        let paused_at = Instant::now();
        pause(&d, &id);
        let (st, v, sent) = exec.join().expect("exec thread");
        (st, v, sent.elapsed(), paused_at.elapsed())
    });
    let (st, v, _, since_pause) = waiting;
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("sandbox_paused")), "{v}");
    assert!(since_pause < Duration::from_secs(2), "answered {since_pause:?} after the pause");
    assert_eq!(state(&d, &id), "paused", "the answer left it paused");
    // Resumed, the command goes on where it stood.
    resume(&d, &id);
    let done = poll(Duration::from_secs(10), Duration::from_millis(100), || {
        let r = d.sh(&id, "cat /tmp/mark");
        r["stdout"].as_str().is_some_and(|o| o.contains("done")).then_some(())
    });
    assert!(done.is_some(), "the frozen command did not go on after the resume");
}

#[test]
fn a_policy_change_and_a_pause_at_once_both_finish() {
    require_root!();
    // A first link writes the resolver's address into the sandbox: a pause in the middle of
    // it would freeze the agent under the change. The pause waits for the change instead
    // (and a change on a paused sandbox resumes it first, as any request reaching it).
    let d = Daemon::start();
    for round in 0..4u64 {
        let id = d.create(sandbox_body(json!({ "network": { "mode": "deny-all" } })));
        let bounded = |method: reqwest::Method, path: String, body: Value| {
            let r = d.req(method, &path).json(&body).timeout(Duration::from_secs(30)).send();
            r.map(|r| r.status().as_u16()).unwrap_or(0)
        };
        let (change, paused) = std::thread::scope(|s| {
            let change = s.spawn(|| {
                let policy = json!({ "mode": "allow-list", "allow": ["198.51.100.0/24"] });
                bounded(reqwest::Method::PUT, format!("/v1/sandboxes/{id}/network"), policy)
            });
            std::thread::sleep(Duration::from_millis(round * 3));
            let paused = bounded(reqwest::Method::POST, format!("/v1/sandboxes/{id}/pause"), json!({}));
            (change.join().expect("change"), paused)
        });
        assert_eq!((change, paused), (200, 200), "round {round} (0: no answer within 30 s)");
        let (st, v) = d.get(&format!("/v1/sandboxes/{id}"));
        assert_eq!((st, v["network"]["mode"].as_str()), (200, Some("allow-list")), "{v}");
        assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).0, 204);
    }
}
