//! Observability: the Prometheus exposition and per-sandbox metrics move with real work.

mod common;

use common::{sandbox_body, Daemon};
use reqwest::Method;
use serde_json::json;

fn scrape(d: &Daemon) -> String {
    let resp = d.req(Method::GET, "/metrics").send().expect("scrape");
    assert_eq!(resp.status().as_u16(), 200);
    resp.text().expect("text")
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

#[test]
fn prometheus_counters_move_and_sandbox_metrics_measure() {
    require_root!();
    let d = Daemon::start();
    let unauth = d.req_noauth(Method::GET, "/metrics").send().expect("scrape");
    assert_eq!(unauth.status().as_u16(), 401, "metrics need the key");

    let before = scrape(&d);
    for line in before.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let v = line.rsplit(' ').next().unwrap_or_default();
        assert!(v.parse::<f64>().is_ok(), "not a valid sample line: {line}");
    }
    let id = d.create(sandbox_body(json!({ "resources": { "cpus": 1.0 } })));
    let r = d.exec(&id, json!({ "cmd": ["python3", "-c", "import time\nwhile time.process_time() < 1.0: pass"] }));
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = d.exec(&id, json!({ "cmd": ["sleep", "5"], "timeout_ms": 200 }));
    assert_eq!(r["timed_out"], true, "{r}");

    let (st, m) = d.get(&format!("/v1/sandboxes/{id}/metrics"));
    assert_eq!(st, 200, "{m}");
    let cpu_ms = m["cpu_usage_ms"].as_u64().unwrap_or(0);
    assert!((900..3000).contains(&cpu_ms), "1 s of CPU time shows as ~1000 ms: {m}");
    assert!(m["memory_used_bytes"].as_u64().unwrap_or(0) > 0, "{m}");
    assert_eq!(m["memory_limit_bytes"].as_u64(), Some(512 << 20), "{m}");
    assert!(m["disk_limit_bytes"].as_u64().unwrap_or(0) > 0, "{m}");
    assert!(m["pids"].as_u64().unwrap_or(0) >= 1, "the agent at least: {m}");

    let (st, _) = d.delete(&format!("/v1/sandboxes/{id}"));
    assert_eq!(st, 204);
    // Two client errors: a gone sandbox (410) and a quota refusal (429).
    assert_eq!(d.get(&format!("/v1/sandboxes/{id}")).0, 410);
    let (st, k) = d.post("/v1/keys", &json!({ "tenant": "metered" }));
    assert_eq!(st, 201);
    let (st, _) = d.send(d.req(reqwest::Method::PUT, "/v1/tenants/metered/quota").json(&json!({ "max_sandboxes": 0 })));
    assert_eq!(st, 200);
    let rb = d.req_noauth(reqwest::Method::POST, "/v1/sandboxes").bearer_auth(k["key"].as_str().unwrap());
    assert_eq!(d.send(rb.json(&sandbox_body(json!({})))).0, 429);
    let after = scrape(&d);
    assert_eq!(sample(&after, "glovebox_quota_refusals_total") - sample(&before, "glovebox_quota_refusals_total"), 1.0);
    assert!(
        sample(&after, "glovebox_http_responses_total{class=\"4xx\"}")
            - sample(&before, "glovebox_http_responses_total{class=\"4xx\"}")
            >= 2.0
    );
    assert!(sample(&after, "glovebox_http_responses_total{class=\"2xx\"}") >= 5.0);
    assert!(after.contains("glovebox_egress_denied_total "), "{after}");
    assert_eq!(
        sample(&after, "glovebox_sandboxes_created_total") - sample(&before, "glovebox_sandboxes_created_total"),
        1.0
    );
    assert_eq!(sample(&after, "glovebox_commands_total") - sample(&before, "glovebox_commands_total"), 2.0);
    assert_eq!(
        sample(&after, "glovebox_command_timeouts_total") - sample(&before, "glovebox_command_timeouts_total"),
        1.0
    );
    assert_eq!(
        sample(&after, "glovebox_sandboxes_ended_total{reason=\"killed\"}")
            - sample(&before, "glovebox_sandboxes_ended_total{reason=\"killed\"}"),
        1.0
    );
    assert!(sample(&after, "glovebox_exec_seconds_count") >= 2.0);
    d.shutdown_and_check_leaks();
}
