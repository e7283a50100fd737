//! Tenants, API keys, quotas and usage metering, end to end against a real daemon.

mod common;

use std::time::Duration;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

/// A key for `tenant`, made with the admin key.
fn key_for(d: &Daemon, tenant: &str) -> (String, String) {
    let (st, v) = d.post("/v1/keys", &json!({ "tenant": tenant, "name": "test" }));
    assert_eq!(st, 201, "{v}");
    (v["key"].as_str().unwrap().to_string(), v["id"].as_str().unwrap().to_string())
}

fn as_key(d: &Daemon, key: &str, m: Method, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut rb = d.req_noauth(m, path).bearer_auth(key);
    if let Some(b) = body {
        rb = rb.json(b);
    }
    d.send(rb)
}

/// Burns `seconds` of CPU in sandbox `id` (process time, so the CPU quota does not change
/// the amount).
fn burn_cpu(d: &Daemon, key: &str, id: &str, seconds: f64) {
    let burn = format!("import time\nwhile time.process_time() < {seconds}:\n    pass\n");
    let body = json!({ "cmd": ["python3", "-c", burn], "timeout_ms": 30_000 });
    let (st, r) = as_key(d, key, Method::POST, &format!("/v1/sandboxes/{id}/exec"), Some(&body));
    assert_eq!((st, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
}

fn create_as(d: &Daemon, key: &str, body: Value) -> (u16, Value) {
    let (st, v) = as_key(d, key, Method::POST, "/v1/sandboxes", Some(&body));
    if let Some(id) = v["id"].as_str() {
        d.register(id);
    }
    (st, v)
}

#[test]
fn tenants_see_and_touch_only_their_own_sandboxes() {
    require_root!();
    let d = Daemon::start();
    let (ka, _) = key_for(&d, "tenant-a");
    let (kb, kb_id) = key_for(&d, "tenant-b");
    let (st, a) = create_as(&d, &ka, sandbox_body(json!({ "metadata": { "owner": "a" } })));
    assert_eq!(st, 201, "{a}");
    let ida = a["id"].as_str().unwrap().to_string();
    // A can use it.
    let (st, r) =
        as_key(&d, &ka, Method::POST, &format!("/v1/sandboxes/{ida}/exec"), Some(&json!({"cmd": ["echo", "mine"]})));
    assert_eq!((st, r["stdout"].as_str()), (200, Some("mine\n")), "{r}");

    // B: not in its list, and every way of addressing it is a 404 (indistinguishable from
    // a sandbox that does not exist).
    let (st, l) = as_key(&d, &kb, Method::GET, "/v1/sandboxes", None);
    assert_eq!(st, 200);
    assert_eq!(l["sandboxes"].as_array().unwrap().len(), 0, "{l}");
    let probes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/v1/sandboxes/{ida}"), None),
        (Method::POST, format!("/v1/sandboxes/{ida}/exec"), Some(json!({"cmd": ["true"]}))),
        (Method::GET, format!("/v1/sandboxes/{ida}/files?path=/etc/hostname"), None),
        (Method::GET, format!("/v1/sandboxes/{ida}/files/list?path=/"), None),
        (Method::POST, format!("/v1/sandboxes/{ida}/code"), Some(json!({"code": "1+1"}))),
        (Method::POST, format!("/v1/sandboxes/{ida}/timeout"), Some(json!({"timeout_s": 5}))),
        (Method::PUT, format!("/v1/sandboxes/{ida}/network"), Some(json!({"mode": "allow-all"}))),
        (Method::GET, format!("/v1/sandboxes/{ida}/commands"), None),
        (Method::GET, format!("/v1/sandboxes/{ida}/metrics"), None),
        (Method::GET, format!("/v1/sandboxes/{ida}/usage"), None),
        (Method::GET, format!("/v1/sandboxes/{ida}/egress"), None),
        (Method::POST, format!("/v1/sandboxes/{ida}/pty"), Some(json!({"cols": 80, "rows": 24}))),
        (Method::POST, format!("/v1/sandboxes/{ida}/pty/1/resize"), Some(json!({"cols": 80, "rows": 24}))),
        (Method::GET, format!("/v1/sandboxes/{ida}/pty/1/ws"), None),
        (Method::DELETE, format!("/v1/sandboxes/{ida}"), None),
    ];
    for (m, path, body) in &probes {
        let (st, v) = as_key(&d, &kb, m.clone(), path, body.as_ref());
        assert_eq!(st, 404, "{m} {path} as tenant B: {v}");
        assert_eq!(v["error"]["code"], "sandbox_not_found", "{v}");
    }
    // …and it is still there, untouched.
    let (st, v) = as_key(&d, &ka, Method::GET, &format!("/v1/sandboxes/{ida}"), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["expires_at"], a["expires_at"], "B's set_timeout must not have applied");

    // B's own sandbox is B's; the admin sees both.
    let (st, b) = create_as(&d, &kb, sandbox_body(json!({})));
    assert_eq!(st, 201, "{b}");
    let idb = b["id"].as_str().unwrap().to_string();
    let (_, l) = as_key(&d, &ka, Method::GET, "/v1/sandboxes", None);
    let ids: Vec<&str> = l["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![ida.as_str()]);
    let (_, l) = d.get("/v1/sandboxes");
    assert_eq!(l["sandboxes"].as_array().unwrap().len(), 2, "{l}");

    // Key management is the admin's.
    let (st, v) = as_key(&d, &ka, Method::POST, "/v1/keys", Some(&json!({"tenant": "tenant-a"})));
    assert_eq!((st, v["error"]["code"].as_str()), (403, Some("forbidden")), "{v}");
    let (st, v) = as_key(&d, &ka, Method::GET, "/v1/keys", None);
    assert_eq!(st, 403, "{v}");
    let (st, v) = as_key(&d, &ka, Method::GET, "/metrics", None);
    assert_eq!(st, 403, "{v}");
    let (st, keys) = d.get("/v1/keys");
    assert_eq!(st, 200);
    let listed = keys.to_string();
    assert!(!listed.contains(&ka) && !listed.contains(&kb), "plain keys must never be listed: {listed}");
    assert_eq!(keys["keys"].as_array().unwrap().len(), 2);
    // Bad input.
    let (st, v) = d.post("/v1/keys", &json!({"tenant": "Not Valid"}));
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");

    // Revoking B's key locks B out at once; an ended sandbox of A stays A's (410 for A, 404
    // for others).
    let (st, _) = d.delete(&format!("/v1/keys/{kb_id}"));
    assert_eq!(st, 200);
    let (st, v) = as_key(&d, &kb, Method::GET, "/v1/sandboxes", None);
    assert_eq!((st, v["error"]["code"].as_str()), (401, Some("unauthorized")), "{v}");
    let (st, _) = as_key(&d, &ka, Method::DELETE, &format!("/v1/sandboxes/{ida}"), None);
    assert_eq!(st, 204);
    let (st, v) = as_key(&d, &ka, Method::GET, &format!("/v1/sandboxes/{ida}"), None);
    assert_eq!((st, v["error"]["reason"].as_str()), (410, Some("killed")), "{v}");
    let (kc, _) = key_for(&d, "tenant-c");
    let (st, _) = as_key(&d, &kc, Method::GET, &format!("/v1/sandboxes/{ida}"), None);
    assert_eq!(st, 404);
    let (st, _) = d.delete(&format!("/v1/sandboxes/{idb}"));
    assert_eq!(st, 204);
    d.shutdown_and_check_leaks();
}

#[test]
fn quota_overflow_is_429_naming_the_limit() {
    require_root!();
    let d = Daemon::start();
    let (k, _) = key_for(&d, "small");
    let q = json!({ "max_sandboxes": 2, "max_memory_mb": 384 });
    let (st, v) = d.send(d.req(Method::PUT, "/v1/tenants/small/quota").json(&q));
    assert_eq!(st, 200, "{v}");
    let (st, v) = as_key(&d, &k, Method::GET, "/v1/tenants/small/quota", None);
    assert_eq!((st, v["max_sandboxes"].as_u64()), (200, Some(2)), "{v}");
    // Tenants cannot raise their own quota.
    let (st, _) = as_key(&d, &k, Method::PUT, "/v1/tenants/small/quota", Some(&json!({"max_sandboxes": 100})));
    assert_eq!(st, 403);

    let mem = |mb: u64| sandbox_body(json!({ "resources": { "memory_mb": mb } }));
    let (st, s1) = create_as(&d, &k, mem(128));
    assert_eq!(st, 201, "{s1}");
    // 128 + 320 > 384: the memory quota speaks first.
    let (st, v) = create_as(&d, &k, mem(320));
    assert_eq!((st, v["error"]["code"].as_str()), (429, Some("quota_exceeded")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("384 MiB"), "{v}");
    let (st, s2) = create_as(&d, &k, mem(128));
    assert_eq!(st, 201, "{s2}");
    let (st, v) = create_as(&d, &k, mem(64));
    assert_eq!(st, 429, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("at most 2 concurrent sandboxes"), "{v}");
    // Other tenants are not affected; the admin (default tenant) neither.
    let other = d.create(sandbox_body(json!({})));
    // Ending one frees its share.
    let id1 = s1["id"].as_str().unwrap();
    assert_eq!(as_key(&d, &k, Method::DELETE, &format!("/v1/sandboxes/{id1}"), None).0, 204);
    let (st, s3) = create_as(&d, &k, mem(128));
    assert_eq!(st, 201, "{s3}");

    // The create rate.
    let (st, _) = d.send(d.req(Method::PUT, "/v1/tenants/small/quota").json(&json!({"creates_per_minute": 3})));
    assert_eq!(st, 200);
    // Three creates happened within the minute already.
    let (st, v) = create_as(&d, &k, mem(64));
    assert_eq!(st, 429, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("3 sandboxes per minute"), "{v}");

    for s in [&s2, &s3] {
        let id = s["id"].as_str().unwrap();
        assert_eq!(as_key(&d, &k, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).0, 204);
    }
    assert_eq!(d.delete(&format!("/v1/sandboxes/{other}")).0, 204);
    d.shutdown_and_check_leaks();
}

#[test]
fn usage_of_two_cpu_seconds_is_metered_within_ten_percent() {
    require_root!();
    let d = Daemon::start();
    let (k, _) = key_for(&d, "meter");
    let (st, s) = create_as(&d, &k, sandbox_body(json!({ "resources": { "cpus": 1 } })));
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    // What the sandbox used before the burn (the agent's own start-up work): the burn is
    // measured on top of it.
    let (_, u0) = as_key(&d, &k, Method::GET, &format!("/v1/sandboxes/{id}/usage"), None);
    let cpu0 = u0["cpu_seconds"].as_f64().unwrap();
    assert!(cpu0 < 0.5, "a fresh sandbox has used almost no CPU: {u0}");
    burn_cpu(&d, &k, &id, 2.0);
    std::thread::sleep(Duration::from_millis(300));
    let (st, u) = as_key(&d, &k, Method::GET, &format!("/v1/sandboxes/{id}/usage"), None);
    assert_eq!(st, 200, "{u}");
    let cpu = u["cpu_seconds"].as_f64().unwrap();
    assert!((1.8..=2.2).contains(&(cpu - cpu0)), "cpu_seconds {cpu} - {cpu0} should be 2 ± 10%: {u}");
    assert!(u["memory_peak_bytes"].as_u64().unwrap() > 1 << 20, "{u}");
    assert!(u["wall_seconds"].as_f64().unwrap() >= 2.0, "{u}");
    assert!(u["ended_at"].is_null());
    // After the end: still there, frozen, and in the tenant's totals.
    assert_eq!(as_key(&d, &k, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).0, 204);
    let (st, u2) = as_key(&d, &k, Method::GET, &format!("/v1/sandboxes/{id}/usage"), None);
    assert_eq!(st, 200, "{u2}");
    assert!(u2["ended_at"].is_string(), "{u2}");
    let cpu2 = u2["cpu_seconds"].as_f64().unwrap();
    assert!((cpu..cpu + 0.2).contains(&cpu2), "{u2}");
    assert!(u2["memory_gib_seconds"].as_f64().unwrap() > 0.0, "{u2}");
    let (st, rep) = as_key(&d, &k, Method::GET, "/v1/usage", None);
    assert_eq!(st, 200, "{rep}");
    let tenants = rep["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 1, "a tenant sees only its own usage: {rep}");
    assert_eq!(tenants[0]["tenant"], "meter");
    assert_eq!(tenants[0]["sandboxes"], 1);
    assert!((tenants[0]["cpu_seconds"].as_f64().unwrap() - cpu2).abs() < 1e-6, "{rep}");
    let (st, _) = as_key(&d, &k, Method::GET, "/v1/usage?tenant=default", None);
    assert_eq!(st, 403);
    // The CLI prints the same numbers for the admin.
    let o = run_bounded(d.cli().args(["usage", "--tenant", "meter"]), None, Duration::from_secs(20));
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    assert!(o.stdout_str().lines().any(|l| l.starts_with("meter ")), "{}", o.stdout_str());
    d.shutdown_and_check_leaks();
}

#[test]
fn keys_cli_creates_lists_and_revokes() {
    require_root!();
    let d = Daemon::start();
    let o = run_bounded(
        d.cli().args(["keys", "create", "--tenant", "cli-t", "--name", "laptop"]),
        None,
        Duration::from_secs(20),
    );
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let key = o.stdout_str().trim().to_string();
    assert!(key.starts_with("e2b_") && key.len() == 44, "{key}");
    let (st, _) = as_key(&d, &key, Method::GET, "/v1/sandboxes", None);
    assert_eq!(st, 200);
    let o = run_bounded(d.cli().args(["keys", "ls"]), None, Duration::from_secs(20));
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let line = o.stdout_str().lines().find(|l| l.contains("cli-t")).expect("listed").to_string();
    assert!(line.contains("active") && !line.contains(&key), "{line}");
    let id = line.split_whitespace().next().unwrap().to_string();
    let o = run_bounded(d.cli().args(["keys", "revoke", &id]), None, Duration::from_secs(20));
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let (st, _) = as_key(&d, &key, Method::GET, "/v1/sandboxes", None);
    assert_eq!(st, 401);
    // A tenant key cannot manage keys: the CLI says so and exits 125.
    let mut c = d.cli();
    let (k2, _) = key_for(&d, "cli-u");
    c.env("GLOVEBOX_API_KEY", &k2).args(["keys", "ls"]);
    let o = run_bounded(&mut c, None, Duration::from_secs(20));
    assert_eq!(o.code(), Some(125));
    assert!(o.stderr_str().contains("admin"), "{}", o.stderr_str());
    let o = run_bounded(
        d.cli().args(["quota", "set", "cli-u", "--max-sandboxes", "3", "--max-memory", "1G"]),
        None,
        Duration::from_secs(20),
    );
    assert_eq!(o.code(), Some(0), "{}", o.stderr_str());
    let (_, q) = d.get("/v1/tenants/cli-u/quota");
    assert_eq!((q["max_sandboxes"].as_u64(), q["max_memory_mb"].as_u64()), (Some(3), Some(1024)), "{q}");
    d.shutdown_and_check_leaks();
}

#[test]
fn keys_quotas_and_usage_survive_a_restart() {
    require_root!();
    let d = Daemon::start();
    let (k, _) = key_for(&d, "durable");
    let (st, _) = d.send(d.req(Method::PUT, "/v1/tenants/durable/quota").json(&json!({"max_sandboxes": 1})));
    assert_eq!(st, 200);
    let (st, s) = create_as(&d, &k, sandbox_body(json!({})));
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    assert_eq!(as_key(&d, &k, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).0, 204);
    let mut d = d;
    d.crash();
    let d = d.restart();
    let (st, v) = as_key(&d, &k, Method::GET, &format!("/v1/sandboxes/{id}/usage"), None);
    assert_eq!(st, 200, "the key and the usage record outlive the daemon: {v}");
    assert_eq!(v["tenant"], "durable");
    let (_, q) = d.get("/v1/tenants/durable/quota");
    assert_eq!(q["max_sandboxes"], 1, "{q}");
    let (_, rep) = as_key(&d, &k, Method::GET, "/v1/usage", None);
    assert_eq!(rep["tenants"][0]["sandboxes"], 1, "{rep}");
    // Another tenant still cannot see the ended sandbox.
    let (k2, _) = key_for(&d, "other");
    assert_eq!(as_key(&d, &k2, Method::GET, &format!("/v1/sandboxes/{id}/usage"), None).0, 404);
    d.shutdown_and_check_leaks();
}

#[test]
fn a_tenant_cannot_see_or_use_another_tenants_secrets() {
    require_root!();
    let d = Daemon::start();
    let (ka, _) = key_for(&d, "sec-a");
    let (kb, _) = key_for(&d, "sec-b");
    let value = format!("tok-{}", rand_token(24));
    let (st, v) = as_key(&d, &ka, Method::POST, "/v1/secrets", Some(&json!({ "name": "api_token", "value": value })));
    assert_eq!(st, 201, "{v}");
    assert!(!v.to_string().contains(&value), "a secret's value is never returned: {v}");
    // B does not see it, cannot read its metadata, cannot delete it.
    let (st, l) = as_key(&d, &kb, Method::GET, "/v1/secrets", None);
    assert_eq!(st, 200);
    assert_eq!(l["secrets"].as_array().map(Vec::len), Some(0), "{l}");
    assert_eq!(as_key(&d, &kb, Method::GET, "/v1/secrets/api_token", None).0, 404);
    assert_eq!(as_key(&d, &kb, Method::DELETE, "/v1/secrets/api_token", None).0, 404);
    // A policy of B that references the name finds nothing to inject: refused, for create
    // and for a live update alike.
    let policy = json!({ "mode": "allow-list", "allow": [
        { "domain": "api.good.test", "inject_headers": { "Authorization": "Bearer ${secret:api_token}" } }
    ] });
    let (st, v) = create_as(&d, &kb, sandbox_body(json!({ "network": policy })));
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_request")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("api_token"), "{v}");
    let (st, b) = create_as(&d, &kb, sandbox_body(json!({})));
    assert_eq!(st, 201, "{b}");
    let idb = b["id"].as_str().unwrap().to_string();
    let (st, v) = as_key(&d, &kb, Method::PUT, &format!("/v1/sandboxes/{idb}/network"), Some(&policy));
    assert_eq!(st, 400, "{v}");
    // B's own secret of the same name is B's, and A's is untouched.
    let (st, _) = as_key(&d, &kb, Method::PUT, "/v1/secrets/api_token", Some(&json!({ "value": "b-value" })));
    assert_eq!(st, 201);
    let (_, l) = as_key(&d, &ka, Method::GET, "/v1/secrets", None);
    assert_eq!(l["secrets"].as_array().map(Vec::len), Some(1), "{l}");
    // A may use its own.
    let (st, a) = create_as(&d, &ka, sandbox_body(json!({ "network": policy })));
    assert_eq!(st, 201, "{a}");
    assert!(!a.to_string().contains(&value), "{a}");
    for (k, s) in [(&ka, &a), (&kb, &b)] {
        let id = s["id"].as_str().unwrap();
        assert_eq!(as_key(&d, k, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).0, 204);
    }
    assert!(!d.log().contains(&value), "the daemon log must not contain a secret value");
    d.shutdown_and_check_leaks();
}

#[test]
fn cpu_burned_before_a_daemon_crash_stays_metered_after_re_adoption() {
    require_root!();
    let mut d = Daemon::start();
    let (k, _) = key_for(&d, "crashy");
    let (st, s) = create_as(&d, &k, sandbox_body(json!({ "resources": { "cpus": 1 } })));
    assert_eq!(st, 201, "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    burn_cpu(&d, &k, &id, 1.0);
    d.crash();
    let d = d.restart();
    let (st, u) = as_key(&d, &k, Method::GET, &format!("/v1/sandboxes/{id}/usage"), None);
    assert_eq!(st, 200, "re-adopted, same owner: {u}");
    let cpu = u["cpu_seconds"].as_f64().unwrap();
    assert!((0.9..1.5).contains(&cpu), "the second burned before the crash is still metered: {u}");
    assert!(u["wall_seconds"].as_f64().unwrap() >= 1.0, "wall time counts from the creation: {u}");
    assert_eq!(as_key(&d, &k, Method::DELETE, &format!("/v1/sandboxes/{id}"), None).0, 204);
    d.shutdown_and_check_leaks();
}
