//! Scale-out on one machine (issue 28, docs/scale-out.md): three `glovebox serve`, each in a
//! network namespace of its own (a veth to the host, its own data dir and key), behind the
//! claims controller's reconcile core run without an API server (`glovebox_k8s::sim`: the
//! same passes, placement, node refresh and orphan sweep as the Kubernetes controller).
//! Agents submit claims at a steady rate, hold each ready sandbox a while and delete the
//! claim. One node's daemon is SIGKILLed mid-run: the claims it held must end with
//! `NodeLost` (or be released once it is declared lost, if their agent was done with them),
//! claims being placed on it go to another node, and every other claim must see nothing
//! but `SandboxReady`. The node then comes back (its daemon re-adopts the sandboxes it left
//! running) and the sweep must destroy all of them, as no claim holds them. Last, every
//! daemon stops and nothing may be left: no sandbox process, cgroup, mount, directory, uid
//! slot, network namespace or veth.
//!
//! In CI: 30 claims, one node killed, well under two minutes. `bench/scale-out` runs the
//! ignored `scale_out_bench` (300 claims twice: without and with a kill) and writes
//! `bench/results/scale-out.json`.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use glovebox_k8s::cluster::NodeTarget;
use glovebox_k8s::daemon::HttpDaemons;
use glovebox_k8s::reconcile::{NODE_LOST, READY};
use glovebox_k8s::settings::Settings;
use glovebox_k8s::sim::{self, Hooks, KillPlan, SimConfig, SimReport, Workload};
use serde_json::json;

const PORT: u16 = 7171;

/// A node: a network namespace with a veth to the host, and a daemon inside it.
struct SimNode {
    name: String,
    netns: String,
    host_if: String,
    ip: String,
    key: String,
    data: tempfile::TempDir,
    logs: tempfile::TempDir,
    child: Option<Child>,
    /// Every daemon started here (pid, log), for the leak check.
    runs: Vec<(u32, PathBuf)>,
}

fn ip(args: &[&str]) {
    let o = run_bounded(Command::new("ip").args(args), None, Duration::from_secs(10));
    assert!(o.status.success(), "ip {}: {}", args.join(" "), o.stderr_str());
}

/// A /24 under 10.252.0.0/16 that no address or route of the host is in.
fn free_subnet() -> u8 {
    let o = run_bounded(Command::new("ip").args(["-o", "addr"]), None, Duration::from_secs(10));
    let r = run_bounded(Command::new("ip").args(["route"]), None, Duration::from_secs(10));
    let taken = format!("{}{}", o.stdout_str(), r.stdout_str());
    let start = u8::from_str_radix(&rand_hex(1), 16).expect("hex");
    (0..=255u8)
        .map(|i| start.wrapping_add(i))
        .find(|x| !taken.contains(&format!("10.252.{x}.")))
        .expect("a free 10.252.x.0/24")
}

impl SimNode {
    fn new(i: usize, tag: &str, subnet: u8, key: &str) -> SimNode {
        let netns = format!("gbso-{tag}-{i}");
        let (host_if, ns_if) = (format!("gbso{tag}h{i}"), format!("gbso{tag}n{i}"));
        let (host_ip, ns_ip) = (format!("10.252.{subnet}.{}", 4 * i + 1), format!("10.252.{subnet}.{}", 4 * i + 2));
        ip(&["netns", "add", &netns]);
        let node = SimNode {
            name: format!("node-{i}"),
            netns: netns.clone(),
            host_if: host_if.clone(),
            ip: ns_ip.clone(),
            key: key.to_string(),
            data: tempdir("gbso-data-"),
            logs: tempdir("gbso-logs-"),
            child: None,
            runs: Vec::new(),
        };
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if]);
        ip(&["link", "set", &ns_if, "netns", &netns]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&["-n", &netns, "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if]);
        ip(&["-n", &netns, "link", "set", &ns_if, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        node
    }

    fn url(&self) -> String {
        format!("http://{}:{PORT}", self.ip)
    }

    fn target(&self) -> NodeTarget {
        NodeTarget { name: self.name.clone(), url: self.url(), address: self.ip.clone(), schedulable: true }
    }

    /// Starts the daemon (inside the namespace: `nsenter --net` only, so it shares the host's
    /// mounts and cgroups as a DaemonSet pod with the host's /sys/fs/cgroup does).
    fn start(&mut self, warm_pool: usize) {
        let log_path = self.logs.path().join(format!("daemon-{}.log", self.runs.len()));
        let log = fs::File::create(&log_path).expect("log");
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(glovebox_bin())
            .args(["serve", "--listen", &format!("{}:{PORT}", self.ip), "--data-dir"])
            .arg(self.data.path())
            .args(["--api-key", &self.key, "--warm-pool", &warm_pool.to_string(), "--destroy-on-exit"])
            .env_remove("GLOVEBOX_URL")
            .env_remove("GLOVEBOX_API_KEY")
            .env_remove("GLOVEBOX_DATA_DIR")
            .env("GLOVEBOX_AUTO_BUILD", "0")
            .env("GLOVEBOX_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn nsenter glovebox serve");
        self.runs.push((child.id(), log_path.clone()));
        self.child = Some(child);
        let http = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
        let url = format!("{}/healthz", self.url());
        let up = poll(Duration::from_secs(20), Duration::from_millis(25), || {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Some(false);
            }
            http.get(&url).send().is_ok_and(|r| r.status().is_success()).then_some(true)
        });
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        assert_eq!(up, Some(true), "{} did not come up:\n{log}", self.name);
    }

    /// SIGKILL: the node's daemon dies, its sandboxes keep running (as a crash or a
    /// partitioned node would leave them).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and it must exit 0 within 20 s (`--destroy-on-exit`: its sandboxes go too).
    fn stop(&mut self) {
        let Some(mut c) = self.child.take() else { return };
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        let st = wait_bounded(&mut c, Duration::from_secs(20));
        if st.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(st.is_some_and(|s| s.success()), "{} did not stop cleanly: {st:?}\n{}", self.name, self.log());
    }

    fn log(&self) -> String {
        self.runs.iter().map(|(_, p)| fs::read_to_string(p).unwrap_or_default()).collect::<Vec<_>>().join("\n")
    }

    fn ids(&self) -> BTreeSet<String> {
        ids_in_log(&self.log())
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            if wait_bounded(&mut c, Duration::from_secs(20)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // The veth pair goes with the namespace.
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).stderr(Stdio::null()).status();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.log());
        }
    }
}

struct Cluster {
    nodes: Vec<Arc<Mutex<SimNode>>>,
    key: String,
    tag: String,
}

impl Cluster {
    fn start(n: usize, warm_pool: usize) -> Cluster {
        let key = format!("e2b_{}", rand_hex(20));
        let tag = rand_token(4);
        let subnet = free_subnet();
        let nodes: Vec<_> = (0..n)
            .map(|i| {
                let mut node = SimNode::new(i, &tag, subnet, &key);
                node.start(warm_pool);
                Arc::new(Mutex::new(node))
            })
            .collect();
        Cluster { nodes, key, tag }
    }

    fn targets(&self) -> Vec<NodeTarget> {
        self.nodes.iter().map(|n| n.lock().unwrap().target()).collect()
    }

    /// Stops every daemon, removes the namespaces, and fails on anything left behind.
    fn shutdown_and_check_leaks(self) {
        let mut ids = BTreeSet::new();
        let mut pids = Vec::new();
        for n in &self.nodes {
            let mut n = n.lock().unwrap();
            n.stop();
            ids.extend(n.ids());
            pids.extend(n.runs.iter().map(|(p, _)| *p));
        }
        let names: Vec<String> = self.nodes.iter().map(|n| n.lock().unwrap().netns.clone()).collect();
        let ifs: Vec<String> = self.nodes.iter().map(|n| n.lock().unwrap().host_if.clone()).collect();
        drop(self.nodes);
        assert!(!ids.is_empty(), "no sandbox ids in the daemons' logs: is the log format still `sandbox=<id>`?");
        assert_no_leaks(&ids, &pids);
        let netns = run_bounded(Command::new("ip").args(["netns", "list"]), None, Duration::from_secs(10)).stdout_str();
        for n in names {
            assert!(!netns.contains(&n), "network namespace {n} left:\n{netns}");
        }
        // The kernel frees a veth whose peer's namespace is gone a moment later: poll.
        let prefix = format!("gbso{}", self.tag);
        let mut links = String::new();
        let gone = poll(Duration::from_secs(10), Duration::from_millis(50), || {
            links = run_bounded(Command::new("ip").args(["-o", "link"]), None, Duration::from_secs(10)).stdout_str();
            (!links.contains(&prefix)).then_some(())
        });
        assert!(gone.is_some(), "veths of this run ({ifs:?}) left:\n{links}");
    }
}

fn config(c: &Cluster, w: Workload, kill: Option<KillPlan>, refresh: Duration, grace: Duration) -> SimConfig {
    SimConfig {
        workload: w,
        nodes: c.targets(),
        settings: Settings { timeout_s: Some(300), ..Settings::default() },
        refresh,
        grace,
        workers: 8,
        orphan_age: Duration::from_secs(2),
        kill,
        deadline: Duration::from_secs(60),
    }
}

fn hooks(c: &Cluster, kill: Option<usize>) -> Hooks {
    let Some(k) = kill else { return Hooks { kill: Box::new(|| {}), rejoin: Box::new(|| None) } };
    let (a, b) = (c.nodes[k].clone(), c.nodes[k].clone());
    Hooks {
        kill: Box::new(move || a.lock().unwrap().kill()),
        rejoin: Box::new(move || {
            let mut n = b.lock().unwrap();
            n.start(0);
            Some(n.target())
        }),
    }
}

fn simulate(c: &Cluster, cfg: SimConfig, kill: Option<usize>) -> SimReport {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let api = HttpDaemons::new(c.key.clone(), Duration::from_secs(15)).expect("http client");
    let h = hooks(c, kill);
    rt.block_on(sim::run(cfg, api, h))
}

fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| (d.as_secs_f64() * 1e5).round() / 100.0)
}

/// Checks what issue 28 asks of a run with a killed node, and returns a summary.
fn judge_kill_run(r: &SimReport, killed: &str, grace: Duration, refresh: Duration) -> serde_json::Value {
    let dump = || r.outcomes.iter().map(|o| format!("{o:?}")).collect::<Vec<_>>().join("\n");
    assert!(r.outcomes.iter().all(|o| o.gone), "claims not released:\n{}", dump());
    let lost_after = r.lost_after_kill.unwrap_or_else(|| panic!("{killed} was never declared lost:\n{}", dump()));
    // Refused connections are seen at once; the slack is for a loaded CI machine.
    assert!(lost_after <= grace + refresh * 3 + Duration::from_secs(5), "declared lost {lost_after:?} after the kill");
    let (mut lost, mut released, mut before, mut failed_over, mut others) = (0, 0, 0, 0, 0);
    for o in &r.outcomes {
        if o.bound.as_deref() == Some(killed) {
            assert!(o.reasons.iter().all(|x| x == READY || x == NODE_LOST), "{o:?}");
            if o.reasons.last().map(String::as_str) == Some(NODE_LOST) {
                // It held a sandbox on the node when it died, and was told.
                let m = o.last_message.as_deref().unwrap_or_default();
                assert!(m.contains(&format!("Glovebox node {killed} stopped answering")), "{m}");
                lost += 1;
            } else if o.on_killed_node {
                // Its agent deleted it while the node was silent; released once it was lost.
                released += 1;
            } else {
                // Done with before the kill.
                before += 1;
            }
        } else {
            // Placed elsewhere, at once or after the killed node refused: one Ready, nothing else.
            assert_eq!(o.reasons, [READY], "{} ({:?} tried) saw more than Ready: {o:?}", o.name, o.tried);
            assert!(o.ready_after.is_some());
            if o.tried.iter().any(|n| n == killed) {
                failed_over += 1;
            } else {
                others += 1;
            }
        }
    }
    assert!(lost + released > 0, "the killed node held no claim: the test proves nothing\n{}", dump());
    assert!(r.leftover.is_empty(), "sandboxes left on up nodes after the sweep: {:?}", r.leftover);
    assert!(r.swept.iter().any(|(n, _)| n == killed), "nothing swept from the rejoined node: {:?}", r.swept);
    let example = r.outcomes.iter().find(|o| o.reasons.last().map(String::as_str) == Some(NODE_LOST));
    json!({
        "node_lost_message": example.and_then(|o| o.last_message.clone()),
        "killed": killed,
        "killed_at_s": r.killed_at.map(|d| d.as_secs_f64()),
        "declared_lost_after_ms": ms(Some(lost_after)),
        "claims_on_killed_node_at_kill": lost + released,
        "ended_NodeLost": lost,
        "released_after_agent_done": released,
        "done_on_killed_node_before_kill": before,
        "failed_over_to_other_nodes": failed_over,
        "unaffected_ready": others,
        "swept_after_rejoin": r.swept.iter().filter(|(n, _)| n == killed).count(),
        "swept_total": r.swept.len(),
    })
}

fn latency_summary(r: &SimReport) -> serde_json::Value {
    let l = r.ready_latencies();
    json!({
        "n": l.len(),
        "p50_ms": ms(sim::quantile(&l, 0.5)),
        "p90_ms": ms(sim::quantile(&l, 0.9)),
        "p99_ms": ms(sim::quantile(&l, 0.99)),
        "max_ms": ms(l.last().copied()),
    })
}

#[test]
fn scale_out_30_claims_one_node_killed() {
    require_root!();
    let started = Instant::now();
    let cluster = Cluster::start(3, 1);
    let (refresh, grace) = (Duration::from_millis(200), Duration::from_secs(1));
    let w = Workload { claims: 30, rate_per_s: 15.0, hold: Duration::from_secs(3), seed: 28 };
    let kill = KillPlan { node: "node-1".into(), after_claims: 15 };
    let cfg = config(&cluster, w, Some(kill), refresh, grace);
    let r = simulate(&cluster, cfg, Some(1));
    let spread = r.spread(0..15);
    eprintln!("spread before the kill: {spread:?}; latency {}", latency_summary(&r));
    assert!(sim::within_even(&spread, 3, 0.2), "15 claims over 3 nodes, 5 each ±1: {spread:?}");
    let after = r.spread(15..30);
    assert!(after.get("node-1").copied().unwrap_or(0) <= 3, "claims kept going to the dead node: {after:?}");
    let summary = judge_kill_run(&r, "node-1", grace, refresh);
    eprintln!("{summary}");
    cluster.shutdown_and_check_leaks();
    assert!(started.elapsed() < Duration::from_secs(100), "took {:?}", started.elapsed());
}

fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `bench/scale-out`: 300 claims over three nodes, then 300 more with one node killed
/// halfway; the numbers go to `GLOVEBOX_SCALE_OUT` (JSON).
#[test]
#[ignore = "a benchmark: bench/scale-out runs it"]
fn scale_out_bench() {
    require_root!();
    let claims = env_num("GLOVEBOX_SCALE_CLAIMS", 300.0) as usize;
    let rate = env_num("GLOVEBOX_SCALE_RATE", 50.0);
    let hold = Duration::from_secs_f64(env_num("GLOVEBOX_SCALE_HOLD_S", 3.0));
    let warm = env_num("GLOVEBOX_SCALE_WARM_POOL", 2.0) as usize;
    let (refresh, grace) = (Duration::from_millis(250), Duration::from_secs(1));
    let cluster = Cluster::start(3, warm);

    let w = Workload { claims, rate_per_s: rate, hold, seed: 28 };
    let even = simulate(&cluster, config(&cluster, w.clone(), None, refresh, grace), None);
    assert!(even.outcomes.iter().all(|o| o.reasons == [READY] && o.gone), "a claim failed without a kill");
    let spread = even.spread(0..claims);
    let balanced = sim::within_even(&spread, 3, 0.10);

    let plan = KillPlan { node: "node-2".into(), after_claims: claims / 2 };
    let killed = simulate(&cluster, config(&cluster, w, Some(plan), refresh, grace), Some(2));
    let summary = judge_kill_run(&killed, "node-2", grace, refresh);
    let result = json!({
        "claims": claims, "rate_per_s": rate, "hold_mean_s": hold.as_secs_f64(), "warm_pool": warm,
        "refresh_ms": refresh.as_millis() as u64, "grace_ms": grace.as_millis() as u64, "workers": 8,
        "spread": {"per_node": spread, "within_10_percent": balanced},
        "claim_to_ready": latency_summary(&even),
        "claims_phase_s": even.claims_phase.as_secs_f64(),
        "kill_run": {
            "summary": summary,
            "spread_before_kill": killed.spread(0..claims / 2),
            "spread_after_kill": killed.spread(claims / 2..claims),
            "claim_to_ready": latency_summary(&killed),
            "claims_phase_s": killed.claims_phase.as_secs_f64(),
        },
    });
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
    if let Ok(path) = std::env::var("GLOVEBOX_SCALE_OUT") {
        fs::write(path, serde_json::to_string_pretty(&result).unwrap()).expect("write results");
    }
    cluster.shutdown_and_check_leaks();
    assert!(balanced, "placement beyond ±10 % of even: {spread:?}");
}
