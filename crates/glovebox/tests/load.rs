//! A bounded load test: 50 clients create, exec in and destroy sandboxes for 60 s on
//! loopback. No errors other than quota refusals, nothing leaked, and the daemon's memory
//! and fds back to their level after warm-up.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

const CLIENTS: usize = 50;
/// The first phase warms the daemon up (allocator arenas, thread pools, SQLite's cache); the
/// second must not grow it further: a per-sandbox leak shows there.
const PHASES: [Duration; 2] = [Duration::from_secs(20), Duration::from_secs(40)];

#[derive(Default)]
struct Tally {
    cycles: AtomicU64,
    quota: AtomicU64,
    errors: Mutex<Vec<String>>,
    ids: Mutex<Vec<String>>,
    lat: Mutex<Vec<Duration>>,
}

fn send(d: &Daemon, key: &str, m: Method, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
    let mut rb = d.req_noauth(m, path).bearer_auth(key).timeout(Duration::from_secs(60));
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().map_err(|e| format!("{path}: {e}"))?;
    let st = r.status().as_u16();
    Ok((st, r.json().unwrap_or(Value::Null)))
}

/// One client's loop until `end`: create, exec `true`, destroy.
fn client(d: &Daemon, key: &str, end: Instant, t: &Tally) {
    let err = |e: String| t.errors.lock().unwrap().push(e);
    while Instant::now() < end {
        let start = Instant::now();
        let body = json!({ "timeout_s": 120, "resources": { "memory_mb": 64 } });
        let (st, v) = match send(d, key, Method::POST, "/v1/sandboxes", Some(body)) {
            Ok(x) => x,
            Err(e) => {
                err(e);
                continue;
            }
        };
        if st == 429 && v["error"]["code"] == "quota_exceeded" {
            t.quota.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let Some(id) = v["id"].as_str().map(str::to_string) else {
            err(format!("create: {st} {v}"));
            continue;
        };
        t.ids.lock().unwrap().push(id.clone());
        match send(d, key, Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(json!({ "cmd": ["true"] }))) {
            Ok((200, v)) if v["exit_code"] == 0 => {}
            Ok((st, v)) => err(format!("exec: {st} {v}")),
            Err(e) => err(e),
        }
        match send(d, key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None) {
            Ok((204, _)) => {
                t.cycles.fetch_add(1, Ordering::Relaxed);
                t.lat.lock().unwrap().push(start.elapsed());
            }
            Ok((st, v)) => err(format!("delete: {st} {v}")),
            Err(e) => err(e),
        }
    }
}

/// The daemon's open fds: (sockets, the others' targets sorted). Sockets include the
/// clients' idle keep-alive connections, which the test itself holds (one per client at most).
/// The daemon's open sockets, and its other fds by target. Its pool of network namespaces
/// made ahead of time (a few `net:[…]` fds, a new one for each taken) is left out: see
/// [`netns_fds`].
fn fds(pid: u32) -> (usize, Vec<String>) {
    let all = fd_targets(pid);
    let sockets = all.iter().filter(|f| f.starts_with("socket:")).count();
    // The shell made ahead for the next create holds one uid slot's lock, a new one each time.
    let mut other: Vec<String> =
        all.into_iter().filter(|f| !f.starts_with("socket:") && !f.starts_with("net:[")).map(slot_pattern).collect();
    other.sort();
    (sockets, other)
}

/// `<run>/slots/N.lock` as `<run>/slots/*.lock`: which slot a held lock is changes with
/// every create, how many are held does not.
fn slot_pattern(f: String) -> String {
    match f.rsplit_once("/slots/") {
        Some((dir, name)) if name.ends_with(".lock") => format!("{dir}/slots/*.lock"),
        _ => f,
    }
}

fn fd_targets(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|r| {
            r.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).map(|p| p.display().to_string()).collect()
        })
        .unwrap_or_default()
}

/// How many network namespaces the daemon holds fds of (its pool; bounded).
fn netns_fds(pid: u32) -> usize {
    fd_targets(pid).iter().filter(|f| f.starts_with("net:[")).count()
}

#[test]
fn fifty_clients_for_a_minute() {
    require_root!();
    let d = Arc::new(Daemon::start());
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "load" }));
    assert_eq!(st, 201, "{k}");
    let key = k["key"].as_str().unwrap().to_string();
    // Fewer sandboxes allowed than clients: some creates must meet the quota.
    let (st, _) = d.send(d.req(Method::PUT, "/v1/tenants/load/quota").json(&json!({ "max_sandboxes": 40 })));
    assert_eq!(st, 200);
    let start_kib = d.rss_kib();
    let start_fds = fds(d.pid());
    let tally = Arc::new(Tally::default());
    let mut after = Vec::new();
    for phase in PHASES {
        let end = Instant::now() + phase;
        let workers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (d, key, t) = (d.clone(), key.clone(), tally.clone());
                std::thread::spawn(move || client(&d, &key, end, &t))
            })
            .collect();
        for w in workers {
            w.join().expect("client thread");
        }
        // Idle blocking-pool threads exit after 10 s; the daemon trims its heap every 10 s.
        std::thread::sleep(Duration::from_secs(11));
        after.push((d.rss_kib(), fds(d.pid()), tally.cycles.load(Ordering::Relaxed)));
    }
    let d = Arc::try_unwrap(d).ok().expect("clients done");
    for id in tally.ids.lock().unwrap().iter() {
        d.register(id);
    }
    let errors = tally.errors.lock().unwrap().clone();
    let cycles = tally.cycles.load(Ordering::Relaxed);
    let mut lat = tally.lat.lock().unwrap().clone();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    let total: Duration = PHASES.iter().sum();
    eprintln!(
        "load: {cycles} create+exec+destroy cycles in {} s by {CLIENTS} clients ({:.1}/s), {} quota refusals, \
         {} errors; cycle p50 {:?} p99 {:?}; daemon RSS {start_kib} KiB at start, {} KiB after warm-up \
         ({} cycles), {} KiB at the end, peak {} KiB; fds (sockets+other) {}+{} at start, {}+{} at the end",
        total.as_secs(),
        cycles as f64 / total.as_secs_f64(),
        tally.quota.load(Ordering::Relaxed),
        errors.len(),
        pct(0.5),
        pct(0.99),
        after[0].0,
        after[0].2,
        after[1].0,
        d.peak_rss_kib(),
        start_fds.0,
        start_fds.1.len(),
        after[1].1 .0,
        after[1].1 .1.len(),
    );
    assert!(errors.is_empty(), "{} errors, first: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    assert!(cycles > 100, "only {cycles} cycles completed");
    assert!(tally.quota.load(Ordering::Relaxed) > 0, "50 clients against a quota of 40 never met it");
    let (_, l) = d.get("/v1/sandboxes");
    assert_eq!(l["sandboxes"].as_array().map(Vec::len), Some(0), "{l}");
    let end_fds = &after[1].1;
    assert_eq!(end_fds.1, start_fds.1, "the daemon's non-socket fds changed over the load");
    let ns = netns_fds(d.pid());
    assert!(ns <= 4, "the daemon holds {ns} network namespaces (its pool keeps 4)");
    assert!(end_fds.0 <= start_fds.0 + CLIENTS, "{} sockets at the end, {} at start", end_fds.0, start_fds.0);
    // Twice the sandboxes of the warm-up phase must not grow the daemon: 2 MiB of slack
    // is ~1 KiB per sandbox of the second phase, far below what any per-sandbox leak holds.
    assert!(
        after[1].0 <= after[0].0 + 2048,
        "daemon RSS grew from {} KiB after warm-up to {} KiB after the second phase",
        after[0].0,
        after[1].0
    );
    let t = Instant::now();
    d.shutdown_and_check_leaks();
    eprintln!("shutdown and leak check: {:?}", t.elapsed());
}
