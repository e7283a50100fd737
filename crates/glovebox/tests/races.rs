//! Requests on one sandbox at once, in pairs: pause, resume, destroy, exec, snapshot, fork,
//! timeout and network changes against each other on fresh sandboxes, a few rounds each.
//! Every answer is a 2xx or a 4xx (never a 5xx, never no answer within 30 s), the sandbox ends
//! in a state one of them names, and nothing is left after the daemon (see docs/design.md,
//! *Requests that race*).

mod common;

use std::time::Duration;

use common::{sandbox_body, Daemon};
use reqwest::Method;
use serde_json::{json, Value};

/// One call on sandbox `id`: its status (0: no answer within 30 s) and body.
type Call = fn(&Daemon, &str) -> (u16, Value);

fn call(d: &Daemon, method: Method, path: String, body: Value) -> (u16, Value) {
    let r = d.req(method, &path).json(&body).timeout(Duration::from_secs(30)).send();
    match r {
        Ok(r) => (r.status().as_u16(), r.json::<Value>().unwrap_or_default()),
        Err(e) => (0, json!({ "client": e.to_string() })),
    }
}

fn pause(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::POST, format!("/v1/sandboxes/{id}/pause"), json!({}))
}
fn resume(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::POST, format!("/v1/sandboxes/{id}/resume"), json!({}))
}
fn paused_then_resume(d: &Daemon, id: &str) -> (u16, Value) {
    pause(d, id);
    resume(d, id)
}
fn destroy(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::DELETE, format!("/v1/sandboxes/{id}"), Value::Null)
}
fn exec(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::POST, format!("/v1/sandboxes/{id}/exec"), json!({ "cmd": "sleep 0.2; echo ok" }))
}
fn snapshot(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::POST, format!("/v1/sandboxes/{id}/snapshots"), json!({}))
}
fn fork(d: &Daemon, id: &str) -> (u16, Value) {
    let r = call(d, Method::POST, format!("/v1/sandboxes/{id}/fork"), json!({}));
    if let Some(child) = r.1["id"].as_str() {
        d.register(child);
    }
    r
}
fn timeout(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::POST, format!("/v1/sandboxes/{id}/timeout"), json!({ "timeout_s": 100 }))
}
fn allow_list(d: &Daemon, id: &str) -> (u16, Value) {
    let policy = json!({ "mode": "allow-list", "allow": ["198.51.100.0/24"] });
    call(d, Method::PUT, format!("/v1/sandboxes/{id}/network"), policy)
}
fn allow_all(d: &Daemon, id: &str) -> (u16, Value) {
    call(d, Method::PUT, format!("/v1/sandboxes/{id}/network"), json!({ "mode": "allow-all" }))
}

#[test]
fn pairs_of_requests_at_once_answer_cleanly_and_leave_nothing() {
    require_root!();
    let d = Daemon::start();
    let pairs: [(&str, Call, Call, u32); 20] = [
        ("pause + pause", pause, pause, 4),
        ("resume + resume", paused_then_resume, resume, 4),
        ("pause + resume", pause, resume, 4),
        ("pause + destroy", pause, destroy, 4),
        ("destroy + destroy", destroy, destroy, 4),
        ("exec + destroy", exec, destroy, 4),
        ("exec + pause", exec, pause, 4),
        ("exec + snapshot", exec, snapshot, 3),
        ("network + destroy", allow_list, destroy, 4),
        ("network + pause", allow_list, pause, 4),
        ("network + network", allow_list, allow_all, 4),
        ("timeout + destroy", timeout, destroy, 4),
        ("timeout + pause", timeout, pause, 4),
        ("snapshot + destroy", snapshot, destroy, 3),
        ("snapshot + snapshot", snapshot, snapshot, 3),
        ("snapshot + pause", snapshot, pause, 3),
        ("fork + destroy", fork, destroy, 3),
        ("fork + pause", fork, pause, 3),
        ("resume + destroy", paused_then_resume, destroy, 4),
        ("exec + resume", exec, paused_then_resume, 4),
    ];
    let mut bad = Vec::new();
    for (name, a, b, rounds) in pairs {
        for round in 0..rounds {
            let id = d.create(sandbox_body(json!({ "network": { "mode": "deny-all" } })));
            let (ra, rb) = std::thread::scope(|s| {
                let ta = s.spawn(|| a(&d, &id));
                let tb = s.spawn(|| b(&d, &id));
                (ta.join().expect("a"), tb.join().expect("b"))
            });
            for (side, (st, v)) in [("first", ra), ("second", rb)] {
                if st == 0 || st >= 500 {
                    bad.push(format!("{name}, round {round}, {side}: {st} {v}"));
                }
            }
            let (st, v) = destroy(&d, &id);
            if !matches!(st, 204 | 404 | 410) {
                bad.push(format!("{name}, round {round}: the final destroy answered {st} {v}"));
            }
        }
    }
    assert!(bad.is_empty(), "answers out of contract:\n{}\n{}", bad.join("\n"), d.log());
    d.shutdown_and_check_leaks();
}
